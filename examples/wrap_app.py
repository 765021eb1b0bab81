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

from bcs_middleware.admission import load_definitions_file
from bcs_middleware.middleware.admission import AdmissionMiddleware
from bcs_middleware.middleware.auth import CachingAuthenticator, StaticAuthenticator, TokenAuthMiddleware
from bcs_middleware.upstream.proxy import UpstreamProxy

HERE = Path(__file__).resolve().parent


def token_auth(app: Any, tokens_file: str | None = None) -> TokenAuthMiddleware:
    """Token auth with digests from a file (``NAME SHA256_HEX [superuser]`` per line)."""
    path = tokens_file or os.environ.get("BCS_TOKENS_FILE", str(HERE / "tokens.txt"))
    authenticator = CachingAuthenticator(StaticAuthenticator.from_file(path), ttl=5.0)
    return TokenAuthMiddleware(app, authenticator=authenticator, public_paths=["/healthz"])


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
