"""Bounded request-body reading: the one way a layer reads a whole body.

Only three places need a whole body — the management API (JSON), the admission
layer (the object it sends to webhooks) and the Mesos route (YAML to JSON); the
proxy streams everything else. Each reads through :func:`read_bounded`, so a
declared ``Content-Length`` over the limit is refused before reading anything, and
a chunked body (gunicorn sets ``wsgi.input_terminated``) is read to one byte past
the limit to tell "exactly at" from "over".
"""

from __future__ import annotations

import io
from typing import Any

from .errors import BadRequest, PayloadTooLarge

_PIECE = 64 * 1024


def _read(stream: Any, limit: int) -> bytes:
    chunks, remaining = [], limit
    while remaining > 0:
        piece = stream.read(min(remaining, _PIECE))
        if not piece:
            break
        chunks.append(piece)
        remaining -= len(piece)
    return b"".join(chunks)


def declared_length(environ: dict[str, Any]) -> int | None:
    """The request's ``Content-Length``, ``None`` when absent; 400 when not a non-negative number."""
    length_header = str(environ.get("CONTENT_LENGTH") or "").strip()
    if not length_header:
        return None
    try:
        length = int(length_header)
    except ValueError:
        raise BadRequest("invalid Content-Length") from None
    if length < 0:
        raise BadRequest("invalid Content-Length")
    return length


def read_bounded(environ: dict[str, Any], limit: int, *, what: str = "request body") -> bytes:
    """The whole body, at most ``limit`` bytes: 413 beyond it, 400 for a bad ``Content-Length``."""
    stream = environ["wsgi.input"]
    length = declared_length(environ)
    if length is not None:
        if length > limit:
            raise PayloadTooLarge(f"{what} exceeds the limit of {limit} bytes")
        return _read(stream, length)
    if environ.get("wsgi.input_terminated") or "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", "")).lower():
        data = _read(stream, limit + 1)
        if len(data) > limit:
            raise PayloadTooLarge(f"{what} exceeds the limit of {limit} bytes")
        return data
    return b""


def replace_body(environ: dict[str, Any], body: bytes, *, content_type: str | None = None) -> None:
    """Give the next layer ``body`` as its input, with the right length and no chunked framing."""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    if content_type is not None:
        environ["CONTENT_TYPE"] = content_type
