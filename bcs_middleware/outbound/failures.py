"""The one translation of what goes wrong towards an upstream into the project's errors.

Everything the transport calls can fail with a foreign exception: ``socket``
(``OSError``, ``TimeoutError``), ``ssl`` (``SSLError``, ``SSLCertVerificationError``),
``httptools`` and the codec (:class:`~bcs_middleware.outbound.codec.UpstreamProtocolError`),
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

from ..core.errors import BadGateway, BCSError, GatewayTimeout
from .codec import UpstreamProtocolError

#: What the transport catches at each step; anything else is a bug and propagates.
FOREIGN = (OSError, ValueError, httptools.HttpParserError, UpstreamProtocolError)

#: ``connect``: TCP; ``tls``: the handshake; ``response``: sending the request and
#: reading the answer's head; ``body``: reading the answer's body.
Stage = Literal["connect", "tls", "response", "body"]

TLS_ERROR = "UPSTREAM_TLS_ERROR"

#: Why an exchange failed, for callers that tell causes apart (the webhook client's
#: metric labels): ``refused`` nothing listens or the host is unreachable, ``timeout``,
#: ``tls`` the handshake or the certificate, ``hostname`` the certificate names another
#: host, ``malformed`` the answer broke HTTP/1.1, ``broken`` the connection dropped.
Kind = Literal["refused", "timeout", "tls", "hostname", "malformed", "broken"]


class UpstreamFailure(BadGateway):
    """A 502 from :func:`translate`, with the stage and kind of failure it reports."""

    def __init__(self, message: str, *, stage: Stage, kind: Kind, code_name: str | None = None) -> None:
        super().__init__(message, code_name=code_name)
        self.stage = stage
        self.kind = kind


class UpstreamTimeout(GatewayTimeout):
    """A 504 from :func:`translate` (``kind`` is always ``timeout``)."""

    kind: Kind = "timeout"

    def __init__(self, message: str, *, stage: Stage) -> None:
        super().__init__(message)
        self.stage = stage


def translate(exc: BaseException, stage: Stage, label: str, host: str) -> BCSError:
    """The error a caller gets for ``exc``, raised at ``stage`` towards ``host``."""
    where = f"upstream {label}"
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"{where}: {_TIMED_OUT[stage].format(host=host)}", stage=stage)
    if stage == "connect":
        return UpstreamFailure(f"{where}: cannot connect to {host} (connection refused or unreachable)",
                               stage=stage, kind="refused")
    if stage == "tls":
        if isinstance(exc, ssl.SSLCertVerificationError):
            reason = exc.verify_message or "certificate verify failed"
            kind: Kind = "hostname" if exc.verify_code == _HOSTNAME_MISMATCH else "tls"
            return UpstreamFailure(f"{where}: the TLS certificate of {host} did not verify ({reason})",
                                   stage=stage, kind=kind, code_name=TLS_ERROR)
        return UpstreamFailure(f"{where}: TLS handshake with {host} failed", stage=stage, kind="tls",
                               code_name=TLS_ERROR)
    if isinstance(exc, (UpstreamProtocolError, httptools.HttpParserError)):
        # The codec's reasons are fixed phrases (llhttp's included), never upstream bytes.
        return UpstreamFailure(f"{where}: {host} sent a malformed answer ({exc})", stage=stage, kind="malformed")
    if stage == "response":
        return UpstreamFailure(f"{where}: {host} closed or reset the connection", stage=stage, kind="broken")
    return UpstreamFailure(f"{where}: {host} broke off its answer", stage=stage, kind="broken")


_TIMED_OUT: dict[Stage, str] = {
    "connect": "connecting to {host} timed out",
    "tls": "TLS handshake with {host} timed out",
    "response": "no response from {host} in time",
    "body": "{host} stopped sending its answer",
}
# X509_V_ERR_HOSTNAME_MISMATCH: the certificate verified but names another host.
_HOSTNAME_MISMATCH = 62
