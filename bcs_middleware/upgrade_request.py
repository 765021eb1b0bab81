"""Is this request a connection upgrade? — decided once, here, for every layer.

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

# The proxy imports this module as a whole (``from .. import upgrade_request``), so the
# transport import below may run while the upstream package is still loading.
from . import environ as env
from .upstream.transport import connection_tokens

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
