"""Path safety for routes that map a client path onto an upstream path (tunnel, Mesos).

A client must never reach outside the prefix it was routed under: no ``.``/``..``
segments, no backslash or NUL, and no percent-encoded ``/`` or ``\\`` (which the
server decodes in ``PATH_INFO`` but an upstream may treat as separators). The
rest is re-encoded for the upstream request line.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from .errors import BadRequest

_UNSAFE_RAW = re.compile(r"%(2f|5c)", re.IGNORECASE)
_SAFE = "/:@!$&'()*+,;=-._~"
# A path made only of characters quote() leaves alone needs no quoting (the usual case).
_PLAIN = re.compile(r"[A-Za-z0-9_/:@!$&'()*+,;=.~-]*")


def refuse_encoded_separators(raw_uri: str | None) -> None:
    """400 when the raw request line encodes a ``/`` or ``\\`` (``RAW_URI``/``REQUEST_URI``)."""
    if raw_uri is not None and _UNSAFE_RAW.search(raw_uri.split("?", 1)[0]):
        raise BadRequest("encoded '/' or '\\' is not allowed in the path", code_name="BAD_PATH")


def safe_rest(rest: str) -> str:
    """``rest`` (decoded, relative to a route prefix) checked and percent-encoded; 400 when unsafe."""
    if any(seg in (".", "..") for seg in rest.split("/")) or "\\" in rest or "\x00" in rest:
        raise BadRequest("the path may not contain '.' or '..' segments", code_name="BAD_PATH")
    return rest if _PLAIN.fullmatch(rest) else quote(rest, safe=_SAFE)
