"""Calling webhooks: pooled, TLS-verified, time-bounded, size-bounded, circuit-broken.

:class:`WebhookClient` is the only code that opens connections to webhooks.
Every failure leaves it as a :class:`WebhookCallError` with a short ``cause``
(``timeout``, ``connect``, ``tls``, ``status``, ``malformed``, ``circuit_open``)
— the metric label — and a ``detail`` safe to show a client (names, addresses
and status codes only).

The circuit breaker counts only faults of the webhook — no connection, TLS,
a timeout it had its whole ``timeoutSeconds`` for, a 5xx, an unusable answer —
never an outcome a caller's own request can cause: a 4xx (the webhook refusing
this object), a timeout cut short by the request's spent admission budget, a
denial, or a patch that does not apply to this object (see
:mod:`~bcs_middleware.admission.engine`). Otherwise one user sending bad objects
would open the breaker for everyone.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)
from urllib3.util.ssl_ import create_urllib3_context

from .definitions import ClientConfig

#: Largest webhook answer accepted; the apiserver's own limit for a request body is 3 MiB.
DEFAULT_MAX_RESPONSE = 3 * 1024 * 1024 + 64 * 1024


class WebhookCallError(Exception):
    """A webhook could not be called or answered badly.

    :param webhook_fault: ``False`` for outcomes this request may have caused (a 4xx):
        they fail the request per its ``failurePolicy`` but do not count towards the breaker.
    """

    def __init__(self, cause: str, detail: str, *, webhook_fault: bool = True) -> None:
        super().__init__(detail)
        self.cause = cause
        self.detail = detail
        self.webhook_fault = webhook_fault


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
    """POST JSON to webhooks over verified HTTPS with pooled connections.

    :param address_map: ``{"name.namespace": "host:port"}`` — connect there while
        still verifying the certificate against the service name (the gateway
        usually cannot resolve cluster service names).
    :param max_response: largest answer body read, in bytes.
    :param breaker: the circuit breaker shared by every call.
    :param pool_size: connections kept per webhook address.
    """

    def __init__(
        self,
        *,
        address_map: Mapping[str, str] | None = None,
        max_response: int = DEFAULT_MAX_RESPONSE,
        breaker: CircuitBreaker | None = None,
        pool_size: int = 10,
    ) -> None:
        self.address_map = {k.lower(): _split_address(v) for k, v in (address_map or {}).items()}
        self.max_response = max_response
        self.breaker = breaker or CircuitBreaker()
        self.pool_size = pool_size
        self._lock = threading.Lock()
        self._pools: dict[tuple[str, int, str | None, str], urllib3.HTTPSConnectionPool] = {}
        self._pid = os.getpid()

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
        self, target: Target, body: bytes, timeout: float, *, breaker_key: str, full_timeout: bool = True
    ) -> bytes:
        """POST ``body``; return the 200 answer's bytes or raise :class:`WebhookCallError`.

        :param full_timeout: ``False`` when ``timeout`` is shorter than the webhook's own
            (the request's admission budget is nearly spent): a timeout is then not the
            webhook's fault.
        """
        if not self.breaker.allow(breaker_key):
            raise WebhookCallError("circuit_open", "circuit open after repeated failures")
        try:
            data = self._post(target, body, timeout)
        except WebhookCallError as err:
            if err.cause == "timeout" and not full_timeout:
                err.webhook_fault = False
            if err.webhook_fault:
                self.breaker.failure(breaker_key)
            raise
        return data

    def _post(self, target: Target, body: bytes, timeout: float) -> bytes:
        pool = self._pool(target)
        try:
            response = pool.urlopen(
                "POST",
                target.path,
                body=body,
                headers={"Content-Type": "application/json", "Accept": "application/json"},
                timeout=urllib3.Timeout(total=max(timeout, 0.001)),
                retries=False,
                redirect=False,
                preload_content=False,
                release_conn=False,
            )
        except Exception as exc:  # translated at this one boundary
            raise _translate(exc, timeout) from None
        try:
            if response.status != 200:
                # A 4xx is the webhook refusing what it was sent — this request's object.
                raise WebhookCallError("status", f"webhook answered HTTP {response.status}",
                                       webhook_fault=not 400 <= response.status < 500)
            try:
                data = response.read(self.max_response + 1)
            except Exception as exc:
                raise _translate(exc, timeout) from None
            if len(data) > self.max_response:
                raise WebhookCallError("malformed", f"answer larger than {self.max_response} bytes")
            return bytes(data)
        finally:
            # Only a fully read answer can leave its connection in the pool.
            if response.status == 200 and not response.closed and response.length_remaining == 0:
                response.release_conn()
            else:
                response.close()
                response.release_conn()

    def _pool(self, target: Target) -> urllib3.HTTPSConnectionPool:
        key = (target.host, target.port, target.ca_pem, target.server_name)
        with self._lock:
            if os.getpid() != self._pid:
                # Forked (gunicorn worker): never share the parent's sockets.
                self._pools.clear()
                self._pid = os.getpid()
            pool = self._pools.get(key)
            if pool is None:
                context = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED)
                if target.ca_pem:
                    context.load_verify_locations(cadata=target.ca_pem)
                else:
                    context.load_default_certs()
                pool = urllib3.HTTPSConnectionPool(
                    target.host,
                    target.port,
                    maxsize=self.pool_size,
                    block=False,
                    ssl_context=context,
                    server_hostname=target.server_name,
                    assert_hostname=target.server_name,
                    retries=False,
                )
                self._pools[key] = pool
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def _split_address(value: str) -> tuple[str, int]:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {value!r}")
    return host.strip("[]"), int(port)


def _translate(exc: BaseException, timeout: float) -> WebhookCallError:
    if isinstance(exc, MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    # urllib3's NewConnectionError subclasses ConnectTimeoutError, so it must be told
    # apart first: a refused or unreachable port is not a timeout.
    if isinstance(exc, NewConnectionError):
        if isinstance(exc.__context__, ConnectionRefusedError) or "refused" in str(exc).lower():
            return WebhookCallError("connect", "connection refused")
        return WebhookCallError("connect", "connection failed")
    if isinstance(exc, ConnectTimeoutError | ReadTimeoutError | TimeoutError):
        return WebhookCallError("timeout", f"timed out after {timeout:.3g}s")
    if isinstance(exc, SSLError | ssl.SSLError | ssl.CertificateError):
        reason = str(exc)
        if "hostname" in reason.lower() or "match" in reason.lower():
            return WebhookCallError("tls", "certificate does not match the webhook host name")
        return WebhookCallError("tls", "certificate verification failed")
    if isinstance(exc, NewConnectionError | ConnectionError):
        return WebhookCallError("connect", "connection failed")
    if isinstance(exc, ProtocolError | HTTPError | OSError):
        return WebhookCallError("connect", "connection broken")
    return WebhookCallError("connect", f"call failed ({type(exc).__name__})")
