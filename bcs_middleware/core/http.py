"""HTTP header facts every layer agrees on: hop-by-hop fields, ``Connection`` options, and
whether a request is a connection upgrade — decided once, here.

Is this request a connection upgrade?

The admission layer and the upstream proxy must agree on this: if admission
treated a request as an upgrade (and skipped the webhooks) while the proxy
forwarded it as an ordinary request, any client could create objects without
admission by adding an ``Upgrade`` header. So there is one answer per request:
:func:`upgrade_protocol` computes it on first use and keeps it in the environ
(``bcs.upgrade``); later layers read the same value.

A request is an upgrade only when it asks for one the gateway splices
(RFC 9110 §7.8): a ``Connection`` header naming ``upgrade`` **and** an ``Upgrade``
value of ``SPDY/3.1`` or ``websocket`` (kubectl exec/attach/port-forward). Any other
combination — ``Upgrade`` without ``Connection``, an unknown protocol such as
``h2c`` — is an ordinary request: the proxy drops the hop-by-hop headers and admission
admits it like any other.
"""

from __future__ import annotations

from typing import Any

from . import environ as env
from .cache import Cache

# Header fields that concern one connection only, never relayed by a proxy (RFC 9110 §7.6.1);
# so are the fields a ``Connection`` header names.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "proxy-connection",
})
# Connection values up to this long are remembered parsed (a client's can be 8 KiB).
_CACHED_VALUE = 256


def connection_tokens(value: str | None) -> frozenset[str]:
    """The lower-cased options of a ``Connection`` header value."""
    if not value:
        return frozenset()
    return _tokens(value)


def named_by_connection(value: str) -> frozenset[str]:
    """Fields a ``Connection`` value names beyond the fixed hop-by-hop set (usually none)."""
    return _named(value)


def _parse_tokens(value: str) -> frozenset[str]:
    return frozenset(token.strip().lower() for token in value.split(",") if token.strip())


def _short(value: str) -> bool:
    return len(value) <= _CACHED_VALUE


_tokens: Cache[str, frozenset[str]] = Cache(max_entries=256, loader=_parse_tokens, admit=_short)
_named: Cache[str, frozenset[str]] = Cache(
    max_entries=256, loader=lambda value: _tokens(value) - HOP_BY_HOP, admit=_short)


#: ``Upgrade`` values spliced (lower case); anything else is proxied as plain HTTP.
PROTOCOLS = frozenset({"spdy/3.1", "websocket"})


def upgrade_protocol(environ: dict[str, Any]) -> str | None:
    """The ``Upgrade`` value of a request asking for an upgrade the gateway splices, else ``None``."""
    decided = environ.get(env.UPGRADE)
    if not isinstance(decided, str):
        decided = _decide(environ)
        environ[env.UPGRADE] = decided
    return decided or None


def _decide(environ: dict[str, Any]) -> str:
    connection = environ.get("HTTP_CONNECTION")
    if not connection or "upgrade" not in connection_tokens(connection):
        return ""
    value = str(environ.get("HTTP_UPGRADE", "")).strip()
    return value if value.lower() in PROTOCOLS else ""
