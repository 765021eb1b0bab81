"""The one translation of what goes wrong towards an upstream into the project's errors.

Everything the transport calls can fail with a foreign exception: ``socket``
(``OSError``, ``TimeoutError``), ``ssl`` (``SSLError``, ``SSLCertVerificationError``),
``httptools`` and the codec (:class:`~bcs_middleware.upstream.codec.UpstreamProtocolError`),
and the odd ``ValueError`` from the standard library. The transport catches
:data:`FOREIGN` around each step and raises :func:`translate`'s answer, so its
callers only ever see :class:`BadGateway` and :class:`GatewayTimeout` (and
``BadRequest`` for a request that cannot be sent). Messages name the upstream and
its host, never a credential or a byte the upstream sent.

(All addresses down is a 502, as nginx answers, not a 503.)
"""

from __future__ import annotations

import ssl
from typing import Literal

import httptools

from ..errors import BadGateway, BCSError, GatewayTimeout
from .codec import UpstreamProtocolError

#: What the transport catches at each step; anything else is a bug and propagates.
FOREIGN = (OSError, ValueError, httptools.HttpParserError, UpstreamProtocolError)

#: ``connect``: TCP; ``tls``: the handshake; ``response``: sending the request and
#: reading the answer's head; ``body``: reading the answer's body.
Stage = Literal["connect", "tls", "response", "body"]

TLS_ERROR = "UPSTREAM_TLS_ERROR"


def translate(exc: BaseException, stage: Stage, label: str, host: str) -> BCSError:
    """The error a caller gets for ``exc``, raised at ``stage`` towards ``host``."""
    where = f"upstream {label}"
    if stage == "connect":
        if isinstance(exc, TimeoutError):
            return GatewayTimeout(f"{where}: connecting to {host} timed out")
        return BadGateway(f"{where}: cannot connect to {host} (connection refused or unreachable)")
    if stage == "tls":
        if isinstance(exc, ssl.SSLCertVerificationError):
            reason = exc.verify_message or "certificate verify failed"
            return BadGateway(f"{where}: the TLS certificate of {host} did not verify ({reason})",
                              code_name=TLS_ERROR)
        if isinstance(exc, TimeoutError):
            return GatewayTimeout(f"{where}: TLS handshake with {host} timed out")
        return BadGateway(f"{where}: TLS handshake with {host} failed", code_name=TLS_ERROR)
    if isinstance(exc, (UpstreamProtocolError, httptools.HttpParserError)):
        # The codec's reasons are fixed phrases (llhttp's included), never upstream bytes.
        return BadGateway(f"{where}: {host} sent a malformed answer ({exc})")
    if stage == "response":
        if isinstance(exc, TimeoutError):
            return GatewayTimeout(f"{where}: no response from {host} in time")
        return BadGateway(f"{where}: {host} closed or reset the connection")
    if isinstance(exc, TimeoutError):
        return GatewayTimeout(f"{where}: {host} stopped sending its answer")
    return BadGateway(f"{where}: {host} broke off its answer")
