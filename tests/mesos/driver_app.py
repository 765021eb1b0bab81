"""The driver role built by its paste factory, for gunicorn (configured through the environment)."""

from __future__ import annotations

import json
import os

from bcs_middleware.compose.driver import app_factory

app = app_factory(
    {},
    cluster_id=os.environ["DRIVER_CLUSTER"],
    zookeeper_hosts=os.environ["ZK_HOSTS"],
    zookeeper_timeout="2s",
    definitions_file=os.environ["ADMISSION_DEFINITIONS"],
    address_map="\n".join(f"{k} = {v}" for k, v in json.loads(os.environ["ADMISSION_ADDRESS_MAP"]).items()),
    total_budget="5s",
)
