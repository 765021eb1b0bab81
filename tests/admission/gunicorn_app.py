"""The admission layer (built by its paste factory) in front of the echo app, for gunicorn."""

from __future__ import annotations

import json
import os

from bcs_middleware.layers.admission import filter_factory

from .apps import echo_app

app = filter_factory(
    {},
    definitions_file=os.environ["ADMISSION_DEFINITIONS"],
    address_map="\n".join(f"{k} = {v}" for k, v in
                          json.loads(os.environ["ADMISSION_ADDRESS_MAP"]).items()),
    total_budget="5s",
    mode="bcs",
)(echo_app)
