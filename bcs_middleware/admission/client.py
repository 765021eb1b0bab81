"""Calling webhooks: pooled, TLS-verified, time-bounded, size-bounded, circuit-broken.

:class:`WebhookClient` is the only code that calls webhooks, over the gateway's one
outbound stack (:mod:`bcs_middleware.outbound.transport`).
Every failure leaves it as a :class:`WebhookCallError` with a short ``cause``
(``timeout``, ``connect``, ``tls``, ``status``, ``malformed``, ``circuit_open``)
— the metric label — and a ``detail`` safe to show a client (names, addresses
and status codes only).

Who reads a failure: a webhook's address is chosen by whoever defined it — a
cluster's ``edit`` holder, not only an operator — and which failure it was (refused,
reset, silent, not TLS, another CA, refused by the address policy) says what listens
at that address. So callers that are not superusers get one message for every
failure (:data:`PUBLIC_FAILURE`, chosen by the engine) and, when ``uniform``, the
answer no sooner than the call's timeout: a closed port, an open one and a silent
one take the same time. The detail goes to the log and to superusers.

The circuit breaker counts only faults of the webhook — no connection, TLS,
a timeout it had its whole ``timeoutSeconds`` for, a 5xx, an unusable answer —
never an outcome a caller's own request can cause: a 4xx (the webhook refusing
this object), a timeout cut short by the request's spent admission budget, a
denial, or a patch that does not apply to this object (see
:mod:`~bcs_middleware.admission.answers`). Otherwise one user sending bad objects
would open the breaker for everyone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..core import environ as env
from ..outbound.causes import AddressRefused, ConnectionBroken, HostnameMismatch, OutboundError, Timeout
from ..outbound.transport import Transport, default_transport
from .definitions import ClientConfig
from .webhook_failure import Cause, WebhookCallError

#: What a caller who is not a superuser reads for any failure to call a webhook.
PUBLIC_FAILURE = "the webhook could not be called or gave no usable answer (the gateway's log has the cause)"
#: Largest webhook answer accepted; the apiserver's own limit for a request body is 3 MiB.
DEFAULT_MAX_RESPONSE = 3 * 1024 * 1024 + 64 * 1024
_HEADERS = (("Content-Type", "application/json"), ("Accept", "application/json"))


@dataclass(frozen=True)
class Target:
    """A resolved webhook address: connect to ``host:port``, verify ``server_name``."""

    host: str
    port: int
    path: str
    server_name: str
    ca_pem: str | None


class CircuitBreaker:
    """Per-webhook breaker: ``threshold`` consecutive failures open it for ``cooldown`` seconds.

    After the cool-down one trial call goes through; its failure opens the
    breaker again at once, its success closes it.
    """

    def __init__(
        self,
        threshold: int = 5,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._open_until: dict[str, float] = {}

    def allow(self, key: str) -> bool:
        until = self._open_until.get(key)
        return until is None or self._clock() >= until

    def success(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)
            self._open_until.pop(key, None)

    def failure(self, key: str) -> None:
        if self.threshold <= 0:
            return
        with self._lock:
            count = self._failures.get(key, 0) + 1
            self._failures[key] = count
            if count >= self.threshold:
                self._open_until[key] = self._clock() + self.cooldown
                # One trial after the cool-down: a single failure re-opens.
                self._failures[key] = self.threshold - 1


class WebhookClient:
    """POST JSON to webhooks over verified HTTPS, on the gateway's one outbound transport.

    A call is a POST to an :class:`~bcs_middleware.core.environ.Upstream` (the caBundle as
    ``ca_pem``, the service or URL host as ``server_name``) through
    :class:`~bcs_middleware.outbound.transport.PooledTransport`: its strict codec, its
    bounded pool (keep-alive connections per webhook identity), its address policy
    (a webhook URL at the metadata service or the gateway's own port is refused before
    connecting) and its one error translation, mapped here to a ``cause``.

    :param transport: the process's transport (the gateway passes the one all layers
        share); default :func:`~bcs_middleware.outbound.transport.default_transport`.
    :param address_map: ``{"name.namespace": "host:port"}`` — connect there while
        still verifying the certificate against the service name (the gateway
        usually cannot resolve cluster service names).
    :param max_response: largest answer body read, in bytes.
    :param breaker: the circuit breaker shared by every call.
    """

    def __init__(
        self,
        *,
        transport: Transport | None = None,
        address_map: Mapping[str, str] | None = None,
        max_response: int = DEFAULT_MAX_RESPONSE,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self._transport = transport
        self.address_map = {k.lower(): _split_address(v) for k, v in (address_map or {}).items()}
        self.max_response = max_response
        self.breaker = breaker or CircuitBreaker()

    @property
    def transport(self) -> Transport:
        return self._transport or default_transport()

    def target(self, client: ClientConfig) -> Target:
        if client.url:
            parts = urlsplit(client.url)
            host = parts.hostname or ""
            path = parts.path or "/"
            if parts.query:
                path += "?" + parts.query
            return Target(host, parts.port or 443, path, host, client.ca_pem)
        name = client.service_host
        host, port = self.address_map.get(name.lower(), (name, client.port))
        return Target(host, port, client.path, name, client.ca_pem)

    def post(
        self, target: Target, body: bytes | Sequence[bytes], timeout: float, *, breaker_key: str,
        full_timeout: bool = True, uniform: bool = False,
    ) -> bytes:
        """POST ``body`` (bytes, or its pieces in order — sent as they are, not joined); return
        the 200 answer's bytes or raise :class:`WebhookCallError`.

        :param full_timeout: ``False`` when ``timeout`` is shorter than the webhook's own
            (the request's admission budget is nearly spent): a timeout is then not the
            webhook's fault.
        :param uniform: a failed call raises no sooner than ``timeout`` after it began,
            whatever failed, so its timing tells nothing about the address (an open
            breaker, which makes no call, still fails at once).
        """
        if not self.breaker.allow(breaker_key):
            raise WebhookCallError("circuit_open", "circuit open after repeated failures")
        started = time.monotonic()
        try:
            data = self._post(target, body, timeout)
        except WebhookCallError as err:
            if err.cause == "timeout" and not full_timeout:
                err.webhook_fault = False
            if err.webhook_fault:
                self.breaker.failure(breaker_key)
            if uniform:
                _sleep_until(started + timeout)
            raise
        return data

    def _post(self, target: Target, body: bytes | Sequence[bytes], timeout: float) -> bytes:
        timeout = max(timeout, 0.001)
        deadline = time.monotonic() + timeout
        shown = f"[{target.host}]" if ":" in target.host else target.host
        path, _, query = target.path.partition("?")
        upstream = env.Upstream(
            base_urls=(f"https://{shown}:{target.port}",), path=path or "/", query=query,
            ca_pem=target.ca_pem, server_name=target.server_name, name=f"webhook {target.server_name}",
        )
        try:
            pieces = [body] if isinstance(body, bytes) else list(body)
            response = self.transport.send(upstream, "POST", list(_HEADERS), pieces, sum(map(len, pieces)),
                                           timeout=timeout)
        except OutboundError as cause:
            raise _cause(cause, timeout) from None
        try:
            if response.status != 200:
                # A 4xx is the webhook refusing what it was sent — this request's object.
                raise WebhookCallError("status", f"webhook answered HTTP {response.status}",
                                       webhook_fault=not 400 <= response.status < 500)
            declared = response.length_remaining
            if declared is not None and declared > self.max_response:
                raise WebhookCallError("malformed", f"answer larger than {self.max_response} bytes")
            chunks: list[bytes] = []
            size = 0
            try:
                while piece := response.read1(65536):
                    size += len(piece)
                    if size > self.max_response:
                        raise WebhookCallError("malformed", f"answer larger than {self.max_response} bytes")
                    if time.monotonic() > deadline:
                        raise WebhookCallError("timeout", f"timed out after {timeout:.3g}s")
                    chunks.append(piece)
            except OutboundError as cause:
                raise _cause(cause, timeout) from None
            return b"".join(chunks)
        finally:
            # Only a fully read answer lets its connection back into the pool (the
            # transport decides); anything else closes it.
            response.release_conn()

    def close(self) -> None:
        """Nothing of its own to close: connections belong to the shared transport."""


def _sleep_until(deadline: float) -> None:
    # Sleeps cooperatively under the gevent worker (time.sleep is patched there).
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def _split_address(value: str) -> tuple[str, int]:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {value!r}")
    return host.strip("[]"), int(port)


_DETAILS: dict[str, tuple[Cause, str]] = {
    "connect": ("connect", "connection refused or host unreachable"),  # never "timeout"
    "tls": ("tls", "certificate verification failed"),
    "malformed": ("malformed", "answer is not well-formed HTTP"),
}


def _cause(cause: OutboundError, timeout: float) -> WebhookCallError:
    """The one place an outbound cause becomes a webhook failure (details name no address).

    The webhook's causes are the outbound causes' labels, but for a broken connection,
    which is the webhook's failing to answer: ``connect``.
    """
    if isinstance(cause, Timeout):
        return WebhookCallError("timeout", f"timed out after {timeout:.3g}s")
    if isinstance(cause, AddressRefused):
        return WebhookCallError("connect", "the gateway does not connect to this address")
    if isinstance(cause, HostnameMismatch):
        return WebhookCallError("tls", "certificate does not match the webhook host name")
    if isinstance(cause, ConnectionBroken):
        return WebhookCallError("connect", "connection broken")
    name, detail = _DETAILS.get(cause.label, ("connect", "call failed"))
    return WebhookCallError(name, detail)
