"""The example stacks built in Python around an existing WSGI app (no ini file).

    gunicorn 'wrap_app:protected' --pythonpath examples      # token auth in front of hello_app
    gunicorn 'wrap_app:admitted' --pythonpath examples       # admission in front of hello_app
    gunicorn 'wrap_app:proxied()' --pythonpath examples      # a reverse proxy (env UPSTREAM)

Each layer is ``XMiddleware(app, *, options)``; collaborators (token store, definitions store,
transport) are plain objects you can build however you like.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hello_app import application as hello

from bcs_middleware.admission.store import load_definitions_file
from bcs_middleware.apps.proxy import UpstreamProxy
from bcs_middleware.layers.admission import AdmissionMiddleware
from bcs_middleware.layers.auth import (
    Authenticator,
    CachingAuthenticator,
    StaticAuthenticator,
    StoreAuthenticator,
    TokenAuthMiddleware,
    open_gateway_store,
)

HERE = Path(__file__).resolve().parent


def token_auth(app: Any, tokens_file: str | None = None) -> TokenAuthMiddleware:
    """Token auth: the gateway's tokens, or digests from a file.

    By default the tokens of the gateway whose data directory is ``BCS_DATA_DIR``
    (default ``./bcs-data``, where ``bcs-middleware serve`` keeps it); with
    ``BCS_TOKENS_FILE`` a file of ``NAME SHA256_HEX [superuser]`` lines.
    """
    path = tokens_file or os.environ.get("BCS_TOKENS_FILE")
    inner: Authenticator
    if path:
        inner = StaticAuthenticator.from_file(path)
    else:
        inner = StoreAuthenticator(open_gateway_store(data_dir=os.environ.get("BCS_DATA_DIR", "bcs-data")))
    return TokenAuthMiddleware(app, authenticator=CachingAuthenticator(inner, ttl=5.0), public_paths=["/healthz"])


def admission(app: Any, definitions_file: str | None = None) -> AdmissionMiddleware:
    path = definitions_file or os.environ.get("BCS_DEFINITIONS_FILE", str(HERE / "admission-definitions.yaml"))
    address_map = dict(item.split("=", 1) for item in os.environ.get("BCS_ADDRESS_MAP", "").split() if "=" in item)
    return AdmissionMiddleware(app, store=load_definitions_file(path), address_map=address_map, total_budget=15.0)


def proxied() -> UpstreamProxy:
    return UpstreamProxy(upstream=os.environ.get("UPSTREAM", "https://backend.internal:8443"))


def __getattr__(name: str) -> Any:
    # Built on first access, so importing this module never reads files it may not need.
    if name == "protected":
        return token_auth(hello)
    if name == "admitted":
        return admission(hello)
    raise AttributeError(name)
