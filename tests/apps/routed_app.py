"""A gunicorn-servable app that plays the routing layer: ``bcs.upstream`` comes from a test header.

``X-Test-Upstream`` carries base64 JSON of :class:`~bcs_middleware.core.environ.Upstream`
fields; ``X-Test-Error-Style: kubernetes`` asks for Kubernetes ``Status`` errors;
``X-Test-Superuser: 1`` makes the caller a superuser (who reads upstream failures in detail).
Short timeouts so timeout tests stay fast.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from bcs_middleware.apps.proxy import UpstreamProxy
from bcs_middleware.core import environ as env

proxy = UpstreamProxy(connect_timeout=1.0, read_timeout=1.5, stream_idle_timeout=10.0)


def encode_upstream(**fields: Any) -> str:
    return base64.b64encode(json.dumps(fields).encode()).decode()


def app(environ: dict[str, Any], start_response: Any) -> Any:
    spec = environ.pop("HTTP_X_TEST_UPSTREAM", None)
    if spec:
        fields = json.loads(base64.b64decode(spec))
        for key in ("base_urls", "client_cert"):
            if fields.get(key) is not None:
                fields[key] = tuple(fields[key])
        fields["set_headers"] = tuple(tuple(pair) for pair in fields.get("set_headers", ()))
        environ[env.UPSTREAM] = env.Upstream(**fields)
    if environ.pop("HTTP_X_TEST_SUPERUSER", None) == "1":
        environ[env.USER] = env.User(0, "root", is_superuser=True)
    if environ.pop("HTTP_X_TEST_ERROR_STYLE", None) == "kubernetes":
        environ[env.ERROR_STYLE] = "kubernetes"
    return proxy(environ, start_response)
