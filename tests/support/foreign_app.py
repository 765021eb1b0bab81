"""A plain WSGI application that knows nothing of bcs-middleware (the thing layers wrap)."""

from __future__ import annotations

import json
from typing import Any


def application(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    user = environ.get("bcs.user")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    payload = json.dumps({
        "path": environ.get("PATH_INFO"),
        "user": getattr(user, "name", None),
        "superuser": getattr(user, "is_superuser", None),
        "body": body.decode("utf-8", "replace"),
        "content_length": environ.get("CONTENT_LENGTH"),
    }).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
    return [payload]


def app_factory(global_conf: dict[str, Any], **local_conf: Any) -> Any:
    return application
