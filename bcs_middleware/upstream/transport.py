"""Pooled, verified, time-bounded HTTP connections to upstreams — the only module that opens them.

:class:`PooledTransport` keeps one urllib3 connection pool per distinct
upstream *identity* — scheme, host, port and every TLS setting (CA bundle,
server name, verification, client certificate) — so two clusters that happen
to share an address never share a connection verified against the other's CA.

Behaviour of :meth:`PooledTransport.send`:

* The response is returned unread (``preload_content=False``) and raw
  (``decode_content=False``); redirects are never followed and urllib3 never
  retries on its own: failover is decided here.
* **Failover**: ``Upstream.base_urls`` are tried in order. An address whose
  connection failed less than ``failure_cooldown`` seconds ago is skipped
  (unless every address did). The next address is tried only when
  connecting failed — before a single body byte left — so a request is never
  sent twice. One exception: a body-less ``GET``/``HEAD``/``OPTIONS`` that hit
  a pooled connection the upstream had just closed is retried once.
* **Errors** are translated into the project's errors at this boundary:
  connection refused/reset/unreachable on every address → :class:`BadGateway`;
  connect timeout or a read timeout before the response headers →
  :class:`GatewayTimeout`; a certificate that does not verify →
  :class:`BadGateway` saying so and naming the upstream host. Messages carry
  host names only, never a credential.
* **Timeouts**: ``connect_timeout`` to connect (and TLS handshake),
  ``read_timeout`` between bytes until the headers arrive and for bodies with a
  ``Content-Length``; a response *without* ``Content-Length`` (a watch, a log
  follow) switches its socket to ``stream_idle_timeout`` once the headers are
  in, because such streams may legitimately stay quiet for a long time.

**Fork safety**: pools are created lazily on first use, never at import or
construction, but a transport that has been *used* must not be shared across
a fork — call :meth:`PooledTransport.reset` in gunicorn's ``post_fork`` (or
build the transport after the fork, as :class:`~bcs_middleware.upstream.proxy.UpstreamProxy`
does through its lazy pools).
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import urllib3
from urllib3 import exceptions as u3exc
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ..environ import Upstream
from ..errors import BadGateway, BCSError, GatewayTimeout

log = logging.getLogger(__name__)

Body = Iterable[bytes] | None

# Methods that may be replayed when a pooled keep-alive connection turned out
# to be closed by the upstream just as we reused it (RFC 9110 §9.2.2).
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})


class Transport(Protocol):
    """What :class:`~bcs_middleware.upstream.proxy.UpstreamProxy` needs from a transport."""

    def send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
    ) -> urllib3.BaseHTTPResponse: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _PoolKey:
    scheme: str
    host: str
    port: int
    ca_pem: str | None
    server_name: str | None
    verify: bool
    client_cert: tuple[str, str] | None


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self) -> None:
        with self._lock:
            self.value += 1


# Counting happens in connect() rather than in the pool's _new_conn():
# urllib3 reconnects a dropped connection object in place, which _new_conn
# never sees.
class _CountingHTTPConnection(HTTPConnection):
    counter: _Counter | None = None

    def connect(self) -> None:
        super().connect()
        if self.counter is not None:
            self.counter.add()


class _CountingHTTPSConnection(HTTPSConnection):
    counter: _Counter | None = None

    def connect(self) -> None:
        super().connect()
        if self.counter is not None:
            self.counter.add()


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _CountingHTTPConnection

    def __init__(self, *args: Any, counter: _Counter, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counter = counter

    def _new_conn(self) -> Any:
        conn: Any = super()._new_conn()
        conn.counter = self._counter
        return conn


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _CountingHTTPSConnection

    def __init__(self, *args: Any, counter: _Counter, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counter = counter

    def _new_conn(self) -> Any:
        conn: Any = super()._new_conn()
        conn.counter = self._counter
        return conn


def _cert_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ssl.SSLCertVerificationError):
            return item
        stack.extend(arg for arg in item.args if isinstance(arg, BaseException))
        for linked in (item.__cause__, item.__context__):
            if linked is not None:
                stack.append(linked)
    return None


class PooledTransport:
    """Keep-alive connection pools to upstreams, with failover, TLS and timeouts.

    :param connect_timeout: seconds to establish a connection (TCP and TLS).
    :param read_timeout: seconds of silence tolerated until the response
        headers arrive, and within bodies that have a ``Content-Length``.
    :param stream_idle_timeout: seconds of silence tolerated within a response
        body without ``Content-Length`` (watches); ``None`` waits forever.
    :param pool_maxsize: idle connections kept per upstream identity; more are
        opened under load but closed instead of pooled.
    :param failure_cooldown: seconds an address that failed to connect is
        skipped while other addresses remain.

    ``connections_opened`` counts every upstream connection established, so
    tests and benchmarks can check keep-alive works (connections per request).
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        stream_idle_timeout: float | None = 3600.0,
        pool_maxsize: int = 32,
        failure_cooldown: float = 10.0,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.pool_maxsize = pool_maxsize
        self.failure_cooldown = failure_cooldown
        self._timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        self._lock = threading.Lock()
        self._pools: dict[_PoolKey, HTTPConnectionPool] = {}
        self._origins: dict[str, tuple[str, str, int, str]] = {}
        self._failed: dict[str, float] = {}
        self._warned_unverified: set[str] = set()
        self._counter = _Counter()

    @property
    def connections_opened(self) -> int:
        """Upstream connections established so far by this transport."""
        return self._counter.value

    def send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request, failing over across ``upstream.base_urls``.

        :param headers: the final header list (hop-by-hop and credentials
            already handled by the caller); ``Host`` is set here.
        :param body: ``None`` for no body, else an iterable of byte chunks,
            consumed once.
        :param content_length: the exact body length, or ``None`` to send the
            body chunked.
        :raises BCSError: :class:`BadGateway` or :class:`GatewayTimeout`.
        """
        target = upstream.path or "/"
        if upstream.query:
            target = f"{target}?{upstream.query}"
        # A multi-dict: Impersonate-Group, for one, must go out as repeated headers.
        header_map = urllib3.HTTPHeaderDict()
        for name, value in headers:
            header_map.add(name, value)
        chunked = body is not None and content_length is None
        if content_length is not None:
            header_map["Content-Length"] = str(content_length)

        candidates = self._candidates(upstream.base_urls)
        if not candidates:
            raise BadGateway(f"upstream {upstream.name or '?'} has no address")
        last_error: BCSError | None = None
        for base in candidates:
            scheme, host, port, prefix = self._origin(base)
            pool = self._pool(upstream, scheme, host, port)
            label = upstream.name or host
            attempts = 2 if body is None and method in _REPLAYABLE else 1
            for attempt in range(attempts):
                try:
                    resp = pool.urlopen(
                        method,
                        prefix + target,
                        body=body,
                        headers=header_map,
                        retries=False,
                        redirect=False,
                        assert_same_host=False,
                        timeout=self._timeout,
                        preload_content=False,
                        decode_content=False,
                        release_conn=False,
                        chunked=chunked,
                    )
                except (u3exc.NewConnectionError, u3exc.ConnectTimeoutError) as exc:
                    self._failed[base] = time.monotonic()
                    last_error = self._translate(exc, label, host)
                    break  # next address: nothing was sent
                except u3exc.ProtocolError as exc:
                    # A pooled connection the upstream had closed: retry once
                    # on a fresh one, only when nothing can be sent twice.
                    last_error = self._translate(exc, label, host)
                    if attempt + 1 < attempts:
                        continue
                    raise last_error from None
                except (u3exc.HTTPError, OSError) as exc:
                    raise self._translate(exc, label, host) from None
                self._failed.pop(base, None)
                if resp.headers.get("Content-Length") is None:
                    self._set_idle_timeout(resp)
                return resp
        assert last_error is not None
        raise last_error

    def _candidates(self, base_urls: tuple[str, ...]) -> list[str]:
        if not self._failed:
            return list(base_urls)
        now = time.monotonic()
        fresh = [
            base for base in base_urls
            if now - self._failed.get(base, -self.failure_cooldown) >= self.failure_cooldown
        ]
        return fresh or list(base_urls)

    def _origin(self, base: str) -> tuple[str, str, int, str]:
        origin = self._origins.get(base)
        if origin is None:
            parts = urlsplit(base)
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https") or not parts.hostname:
                raise BadGateway("upstream address is not an http(s) URL")
            port = parts.port or (443 if scheme == "https" else 80)
            origin = (scheme, parts.hostname, port, parts.path.rstrip("/"))
            self._origins[base] = origin
        return origin

    def _pool(self, upstream: Upstream, scheme: str, host: str, port: int) -> HTTPConnectionPool:
        https = scheme == "https"
        key = _PoolKey(
            scheme,
            host,
            port,
            upstream.ca_pem if https else None,
            upstream.server_name if https else None,
            upstream.verify if https else True,
            upstream.client_cert if https else None,
        )
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._new_pool(key, upstream.name or host)
                self._pools[key] = pool
        return pool

    def _new_pool(self, key: _PoolKey, label: str) -> HTTPConnectionPool:
        common: dict[str, Any] = {
            "timeout": self._timeout,
            "maxsize": self.pool_maxsize,
            "block": False,
            "retries": False,
            "counter": self._counter,
            "blocksize": 65536,
        }
        if key.scheme == "http":
            return _HTTPPool(key.host, key.port, **common)
        if not key.verify:
            if label not in self._warned_unverified:
                self._warned_unverified.add(label)
                log.warning(
                    "TLS verification is OFF for upstream %s (explicitly configured); "
                    "its identity is not checked", label,
                )
            # The operator chose this and it is logged above; urllib3 would
            # otherwise warn on every single request.
            warnings.filterwarnings("ignore", category=u3exc.InsecureRequestWarning)
        cert_file, key_file = key.client_cert or (None, None)
        return _HTTPSPool(
            key.host,
            key.port,
            cert_reqs="CERT_REQUIRED" if key.verify else "CERT_NONE",
            ca_cert_data=key.ca_pem,
            server_hostname=key.server_name,
            assert_hostname=(key.server_name or None) if key.verify else False,
            cert_file=cert_file,
            key_file=key_file,
            **common,
        )

    def _set_idle_timeout(self, resp: urllib3.BaseHTTPResponse) -> None:
        conn = resp.connection
        sock = getattr(conn, "sock", None)
        if sock is not None:
            sock.settimeout(self.stream_idle_timeout)

    @staticmethod
    def _translate(exc: BaseException, label: str, host: str) -> BCSError:
        cert = _cert_error(exc)
        if cert is not None:
            reason = cert.verify_message or "certificate verify failed"
            return BadGateway(
                f"upstream {label}: the TLS certificate of {host} did not verify ({reason})",
                code_name="UPSTREAM_TLS_ERROR",
            )
        # NewConnectionError subclasses ConnectTimeoutError in urllib3: test it first.
        if isinstance(exc, u3exc.NewConnectionError):
            return BadGateway(f"upstream {label}: cannot connect to {host} (connection refused "
                              "or unreachable)")
        if isinstance(exc, u3exc.ConnectTimeoutError):
            return GatewayTimeout(f"upstream {label}: connecting to {host} timed out")
        if isinstance(exc, u3exc.ReadTimeoutError | TimeoutError):
            return GatewayTimeout(f"upstream {label}: no response from {host} in time")
        if isinstance(exc, u3exc.SSLError):
            return BadGateway(f"upstream {label}: TLS handshake with {host} failed")
        if isinstance(exc, u3exc.ProtocolError):
            return BadGateway(f"upstream {label}: {host} closed or reset the connection")
        return BadGateway(f"upstream {label}: request to {host} failed")

    def close(self) -> None:
        """Close every pooled connection; the transport stays usable (pools are rebuilt)."""
        with self._lock:
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

    def reset(self) -> None:
        """Forget pools inherited from a parent process (call in ``post_fork``).

        The sockets belong to the parent; they are dropped without a
        shutdown that would disturb the parent's use of them.
        """
        with self._lock:
            self._pools = {}
            self._failed = {}
            self._lock = threading.Lock()
