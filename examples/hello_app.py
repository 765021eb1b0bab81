"""An existing WSGI application that knows nothing of bcs-middleware (what the examples wrap).

It echoes what it received: the authenticated user the token auth layer found
(``bcs.user``) and the request body (which the admission layer may have rewritten).
"""

from __future__ import annotations

import json
from typing import Any


def application(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    user = environ.get("bcs.user")
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    try:
        parsed: Any = json.loads(body) if body else None
    except ValueError:
        parsed = body.decode("utf-8", "replace")
    payload = json.dumps({
        "hello": getattr(user, "name", "anonymous"),
        "method": environ["REQUEST_METHOD"],
        "path": environ.get("PATH_INFO", ""),
        "body": parsed,
    }).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
    return [payload]


def app_factory(global_conf: dict[str, Any], **local_conf: Any) -> Any:
    """``paste.app_factory = hello_app:app_factory`` (run gunicorn with ``--pythonpath examples``)."""
    return application
