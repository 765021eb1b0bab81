"""Why an outbound call failed: one exception class per cause, raised through one boundary.

Everything the outbound stack calls can fail with a foreign exception: ``socket``
(``OSError``, ``TimeoutError``), ``ssl`` (``SSLError``, ``SSLCertVerificationError``),
``httptools`` and the codec (:class:`~bcs_middleware.outbound.codec.UpstreamProtocolError`),
and the odd ``ValueError`` from the standard library. The stack catches :data:`FOREIGN`
around each step and raises :func:`translate`'s answer (:class:`map_exceptions` is the
same boundary as a ``with`` block), so callers only ever see an :class:`OutboundError`
naming the cause and the stage it happened at — the shape of httpcore's
``_exceptions.py``: the stack says *what* happened; each caller decides what it means
(the proxy an HTTP status, :func:`as_http_error`; the webhook client a webhook failure
cause; the RBAC source its own error).

:attr:`OutboundError.label` is the one vocabulary of causes: metric labels and the
webhook client's causes are drawn from it. Messages name the upstream's label and its
host, never a credential or a byte the upstream sent.
"""

from __future__ import annotations

import ssl
from types import TracebackType
from typing import ClassVar, Literal

import httptools

from ..core.errors import AgentUnavailable, BadGateway, BCSError, GatewayTimeout
from .codec import UpstreamProtocolError

#: What the stack catches at each step; anything else is a bug and propagates.
FOREIGN = (OSError, ValueError, httptools.HttpParserError, UpstreamProtocolError)

#: ``connect``: TCP (or the agent tunnel's stream); ``tls``: the handshake; ``response``:
#: sending the request and reading the answer's head; ``body``: reading the answer's body.
Stage = Literal["connect", "tls", "response", "body"]

#: The causes, as metric labels and the webhook client name them.
Label = Literal["connect", "timeout", "tls", "malformed", "broken", "agent"]


class OutboundError(Exception):
    """An outbound call failed; :attr:`label` says why, :attr:`stage` when.

    :param message: safe to show a superuser and to log (hosts, never credentials or
        upstream bytes).
    """

    label: ClassVar[Label]

    def __init__(self, message: str, *, stage: Stage) -> None:
        super().__init__(message)
        self.message = message
        self.stage = stage


class ConnectError(OutboundError):
    """Nothing listens, the host is unreachable, or it has no usable address (nothing was sent)."""

    label = "connect"


class AddressRefused(ConnectError):
    """Every address the upstream host resolves to is refused by the address policy (nothing was connected)."""


class UnusableAddress(ConnectError):
    """The upstream has no address, or one that is not an ``http(s)`` URL (nothing was tried)."""


class Timeout(OutboundError):
    """A wait ran out."""

    label = "timeout"


class ConnectTimeout(Timeout):
    """Connecting or the TLS handshake took longer than the connect timeout (nothing was sent)."""


class ReadTimeout(Timeout):
    """The upstream did not answer, or stopped sending its answer, in time."""


class TLSError(OutboundError):
    """The TLS handshake failed or the certificate did not verify."""

    label = "tls"


class HostnameMismatch(TLSError):
    """The certificate verified but names another host."""


class RemoteProtocolError(OutboundError):
    """The answer broke HTTP/1.1 (the codec's reason is a fixed phrase, never upstream bytes)."""

    label = "malformed"


class ConnectionBroken(OutboundError):
    """The upstream closed or reset the connection before its answer was complete."""

    label = "broken"


class AgentUnreachable(OutboundError):
    """The cluster is reached through its kube-agent, and no agent connection can carry the call."""

    label = "agent"


def translate(exc: BaseException, stage: Stage, label: str, host: str) -> OutboundError:
    """The cause a caller gets for ``exc``, raised at ``stage`` towards ``host``."""
    where = f"upstream {label}"
    if isinstance(exc, TimeoutError):
        cls = ConnectTimeout if stage in ("connect", "tls") else ReadTimeout
        return cls(f"{where}: {_TIMED_OUT[stage].format(host=host)}", stage=stage)
    if stage == "connect":
        return ConnectError(f"{where}: cannot connect to {host} (connection refused or unreachable)", stage=stage)
    if stage == "tls":
        if isinstance(exc, ssl.SSLCertVerificationError):
            reason = exc.verify_message or "certificate verify failed"
            tls = HostnameMismatch if exc.verify_code == _HOSTNAME_MISMATCH else TLSError
            return tls(f"{where}: the TLS certificate of {host} did not verify ({reason})", stage=stage)
        return TLSError(f"{where}: TLS handshake with {host} failed", stage=stage)
    if isinstance(exc, (UpstreamProtocolError, httptools.HttpParserError)):
        return RemoteProtocolError(f"{where}: {host} sent a malformed answer ({exc})", stage=stage)
    if stage == "response":
        return ConnectionBroken(f"{where}: {host} closed or reset the connection", stage=stage)
    return ConnectionBroken(f"{where}: {host} broke off its answer", stage=stage)


class map_exceptions:
    """``with map_exceptions(stage, label, host):`` — a foreign exception leaves as its cause."""

    __slots__ = ("host", "label", "stage")

    def __init__(self, stage: Stage, label: str, host: str) -> None:
        self.stage = stage
        self.label = label
        self.host = host

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 _tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, FOREIGN):
            raise translate(exc, self.stage, self.label, self.host) from None


def as_http_error(cause: OutboundError) -> BCSError:
    """The gateway's answer for ``cause``, on a request whose upstream could not be reached.

    A timeout is a 504, no agent connection a 503, anything else a 502 (all addresses
    down is a 502, as nginx answers, not a 503). The code names are those superusers
    read in the detail (:class:`~bcs_middleware.core.errors.UpstreamUnreachable`).
    """
    if isinstance(cause, Timeout):
        return GatewayTimeout(cause.message)
    if isinstance(cause, AgentUnreachable):
        return AgentUnavailable(cause.message)
    return BadGateway(cause.message, code_name=_CODE_NAMES.get(type(cause)))


_CODE_NAMES: dict[type[OutboundError], str] = {
    TLSError: "UPSTREAM_TLS_ERROR",
    HostnameMismatch: "UPSTREAM_TLS_ERROR",
    AddressRefused: "UPSTREAM_ADDRESS_REFUSED",
}

_TIMED_OUT: dict[Stage, str] = {
    "connect": "connecting to {host} timed out",
    "tls": "TLS handshake with {host} timed out",
    "response": "no response from {host} in time",
    "body": "{host} stopped sending its answer",
}
# X509_V_ERR_HOSTNAME_MISMATCH: the certificate verified but names another host.
_HOSTNAME_MISMATCH = 62
