"""Text a client or a remote peer chose, made safe to write to a log, a terminal or a label.

A path, a header, a user or cluster name from a request is data: written raw into a
text log, a newline in it forges a line and an ESC sequence drives the terminal of
whoever reads the log. :func:`escape` is the one helper every log line, CLI message
and metric label passes such text through: characters that are not printable
(``str.isprintable``: C0 and C1 controls, DEL, line and paragraph separators, format
characters such as bidirectional overrides, unassigned code points) become ``\\xNN``,
``\\uNNNN`` or ``\\UNNNNNNNN``; printable text, non-ASCII letters included, stays as it
is.

JSON lines (the access log, audit events) go through :func:`json_line`: an ASCII-only
encoder, which writes every control character (DEL and C1 included) and every
non-ASCII one as a ``\\uNNNN`` escape.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["escape", "json_line"]


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(text: Any) -> str:
    """``str(text)`` with every non-printable character escaped (a space stays a space)."""
    value = text if isinstance(text, str) else str(text)
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in value)


# One encoder for every line (json.dumps would configure a new one per call); ensure_ascii
# is what keeps every control and format character out of the line as raw text.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def json_line(document: Any) -> str:
    """``document`` as one line of JSON in which no control character is left raw."""
    return _encode(document)
