"""A foreign WSGI app that echoes what reached it (method, length, body)."""

from __future__ import annotations

import json
from typing import Any


def echo_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    length = environ.get("CONTENT_LENGTH") or ""
    raw = environ["wsgi.input"].read(int(length)) if length else environ["wsgi.input"].read()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("latin-1")
    payload = json.dumps({
        "method": environ["REQUEST_METHOD"],
        "path": environ.get("PATH_INFO", ""),
        "query": environ.get("QUERY_STRING", ""),
        "content_type": environ.get("CONTENT_TYPE", ""),
        "content_length": length,
        "received": len(raw),
        "transfer_encoding": environ.get("HTTP_TRANSFER_ENCODING"),
        "body": body,
    }).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(payload)))])
    return [payload]
