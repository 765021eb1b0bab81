"""The connection pool: pooled, verified, time-bounded HTTP/1.1 exchanges with upstreams, with failover.

:class:`PooledTransport` sends a request and hands back the answer's head with its
body unread — the shape of httpcore's ``ConnectionPool``. Its parts, one module each:

* :mod:`.backend` — opens a stream (TCP under the address policy, or an agent
  tunnel's) and starts TLS on it (:mod:`.streams`, :mod:`.stream_connection`);
* :mod:`.http11` — one HTTP/1.1 exchange on a connection: all the framing, on top of
  the strict codec (:mod:`.codec`, llhttp through ``httptools``);
* :mod:`.pool` — the bounded pool of idle connections, keyed by upstream *identity*
  (:class:`~.identity.PoolKey`: scheme, host, port, every TLS setting and the tunnel),
  so two clusters sharing an address never share a connection verified against the
  other's CA;
* :mod:`.causes` — what went wrong, by cause and stage, translated in one place.

This module owns what is between them: which addresses to try, when a request may be
replayed, which connections go back to the pool, and the periodic sweep.

Why not urllib3 or requests: measured on the proxy's hot path (bench/README.md),
urllib3's ``urlopen`` plus ``http.client``'s e-mail based header parser cost more CPU
per request than gunicorn spends serving it, and the proxy needs none of their
features (it never decodes, redirects, retries on its own or buffers).

Behaviour of :meth:`PooledTransport.send`:

* The answer is returned with its head parsed and its body unread; the body is
  relayed raw (``Content-Encoding`` untouched). Redirects are never followed;
  interim ``1xx`` answers are skipped; a ``101`` is refused (only
  :meth:`~PooledTransport.open_upgrade` accepts one).
* **Failover**: ``Upstream.base_urls`` are tried in order. An address whose
  connection failed less than ``failure_cooldown`` seconds ago is skipped (unless
  every address did). The next address is tried only when connecting failed —
  before a single request byte left — so a request is never sent twice. One
  exception: a body-less ``GET``/``HEAD``/``OPTIONS`` that found a pooled
  connection closed by the upstream is retried once on a fresh one (RFC 9110 §9.2.2).
  A TLS failure or a missing agent ends the failover: the next address would be the
  same cluster with the same certificate or the same agent.
* **Errors**: an :class:`~.causes.OutboundError` naming the cause (and
  ``BadRequest`` for a header that cannot be sent); body reads raise causes too. What
  a cause means (an HTTP status, a webhook failure) is the caller's to decide.
* **Bounded state**: idle connections, TLS contexts, parsed addresses and
  failure marks are kept per upstream in tables bounded by count
  (``max_upstreams``) and by idle time, so a worker that served 10,000 clusters
  once holds no more than a busy one (bench/pool_memory_bench.py).

**Upgrades** (:meth:`PooledTransport.open_upgrade`): the same connect, failover,
TLS and error rules, but always on a fresh connection that is never pooled; a
``101`` answer's socket is handed to the caller (``detach()``).

**One per process.** Every outbound call of a process goes through one instance:
the gateway (:func:`bcs_middleware.compose.gateway.build_gateway`) makes it from its
configuration (timeouts, the address policy) and hands it to the proxy (tunnel and
Mesos drivers), the webhook client, the admission layer's cluster reads and the RBAC
source and sync; layers assembled on their own share :func:`default_transport`, a
:class:`~bcs_middleware.core.forksafe.PerProcess` value: nothing is opened at import
or construction, and a forked child makes its own.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import urlsplit

from ..core.cache import Cache
from ..core.environ import Upstream
from ..core.forksafe import PerProcess
from .addresses import DEFAULT_POLICY, AddressPolicy
from .backend import DirectOrTunnel, NetworkBackend, TunnelDialer
from .causes import (
    FOREIGN,
    AgentUnreachable,
    ConnectionBroken,
    OutboundError,
    TLSError,
    UnusableAddress,
    translate,
)
from .codec import request_head
from .http11 import UpstreamResponse, exchange
from .identity import PoolKey
from .pool import IdlePool
from .streams import Connection
from .tls_contexts import TLSContexts

__all__ = ["PooledTransport", "Response", "Transport", "UpgradeResponse", "UpgradeTransport", "default_transport"]

Body = Iterable[bytes] | None

# Seconds between sweeps of the per-upstream tables: some are only looked at when a
# connection is made, and would otherwise keep what a burst left behind.
_SWEEP_EVERY = 5.0
# Methods that may be replayed when a pooled keep-alive connection turned out
# to be closed by the upstream just as we reused it (RFC 9110 §9.2.2).
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})


class Response(Protocol):
    """The upstream's answer as :class:`~bcs_middleware.apps.proxy.UpstreamProxy` uses it."""

    status: int
    reason: str
    #: every header field as received, in order.
    headers: list[tuple[str, str]]
    #: ``headers`` without the hop-by-hop fields and those ``Connection`` names: what a
    #: proxy relays. A fresh list per response (callers may extend it).
    end_to_end_headers: list[tuple[str, str]]
    #: body bytes still to come when the length is known, else ``None``.
    length_remaining: int | None

    def read1(self, amt: int) -> bytes: ...

    def read(self) -> bytes: ...

    def release_conn(self) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """What :class:`~bcs_middleware.apps.proxy.UpstreamProxy` needs from a transport."""

    def send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
        *,
        timeout: float | None = None,
    ) -> Response: ...

    def close(self) -> None: ...


class UpgradeTransport(Transport, Protocol):
    """A transport that can also open connection upgrades (``kubectl exec`` and the like)."""

    def open_upgrade(
        self, upstream: Upstream, method: str, headers: list[tuple[str, str]]
    ) -> UpgradeResponse: ...


class UpgradeResponse(Response, Protocol):
    """The answer to an upgrade request: a ``101``'s socket can be taken over."""

    def detach(self) -> tuple[socket.socket, bytes]: ...


class PooledTransport:
    """Keep-alive connections to upstreams, with failover, TLS, timeouts and bounded state.

    :param connect_timeout: seconds to establish a connection (TCP and TLS).
    :param read_timeout: seconds of silence tolerated until the response
        head arrives, and within bodies that have a ``Content-Length``.
    :param stream_idle_timeout: seconds of silence tolerated within a response
        body without ``Content-Length`` (watches); ``None`` waits forever.
    :param pool_maxsize: idle connections kept per upstream identity; more are
        opened under load but closed instead of kept.
    :param failure_cooldown: seconds an address that failed to connect is
        skipped while other addresses remain.
    :param address_policy: where connections may go, checked on every resolved
        address (:mod:`bcs_middleware.outbound.addresses`); default the built-in
        refusals (link-local, multicast, ... and this process's listeners).
    :param max_upstreams: upstream identities (and addresses) whose idle
        connections, TLS context and parsed address are kept; the least recently
        used beyond it are dropped.
    :param idle_timeout: seconds an idle connection is kept.
    :param state_ttl: seconds a TLS context or parsed address is kept unused.
    :param tunnels: how upstreams with a ``tunnel`` are dialled (through the
        cluster's kube-agent); without it such upstreams are
        :class:`~bcs_middleware.outbound.causes.AgentUnreachable`.
    :param backend: opens the connections (default :class:`~.backend.DirectOrTunnel`
        with ``address_policy`` and ``tunnels``); tests give one without sockets.

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
        address_policy: AddressPolicy | None = None,
        max_upstreams: int = 512,
        idle_timeout: float = 55.0,
        state_ttl: float = 600.0,
        tunnels: TunnelDialer | None = None,
        backend: NetworkBackend | None = None,
    ) -> None:
        self.address_policy = address_policy or DEFAULT_POLICY
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.pool_maxsize = pool_maxsize
        self.failure_cooldown = failure_cooldown
        self.max_upstreams = max_upstreams
        self.idle_timeout = idle_timeout
        self.state_ttl = state_ttl
        self._opened = 0
        self._lock = threading.Lock()
        self._pool = IdlePool(per_key=pool_maxsize, max_keys=max_upstreams, idle_timeout=idle_timeout)
        self._tls = TLSContexts(max_entries=max_upstreams, ttl=state_ttl)
        self._backend = backend or DirectOrTunnel(self.address_policy, self._tls, tunnels)
        self._origins: Cache[str, tuple[str, str, int, str, str]] = Cache(
            max_entries=max_upstreams, ttl=state_ttl)
        # A mark older than the cooldown means nothing: its age bounds it, not its last use
        # (every request looks it up, and a use would keep it alive while traffic flows).
        self._failed: Cache[str, float] = Cache(max_entries=max_upstreams, ttl=failure_cooldown,
                                                      max_age=failure_cooldown)
        self._next_sweep = 0.0
        # Agent tunnels whose connection was replaced by a newer one of the same cluster:
        # their connections are not pooled again (retire_tunnel). Kept as long as a stream
        # over the old connection may last.
        self._tunnel_generations: Cache[str, int] = Cache(
            max_entries=max_upstreams, ttl=stream_idle_timeout or 3600.0)


    @property
    def connections_opened(self) -> int:
        """Upstream connections established so far by this transport."""
        return self._opened

    def send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
        *,
        timeout: float | None = None,
    ) -> UpstreamResponse:
        """Send one request, failing over across ``upstream.base_urls``.

        :param headers: the final header list (hop-by-hop and credentials
            already handled by the caller); ``Host`` and framing are set here.
        :param body: ``None`` for no body, else an iterable of byte chunks,
            consumed once.
        :param content_length: the exact body length, or ``None`` to send a
            body chunked.
        :param timeout: this call's own bound on every wait (connecting, each
            read) instead of the transport's ``connect_timeout``/``read_timeout``/
            ``stream_idle_timeout`` — a webhook's ``timeoutSeconds``.
        :raises OutboundError: the cause (:mod:`.causes`), with its stage.
        """
        return self._send(upstream, method, headers, body, content_length, upgrade=False, timeout=timeout)

    def open_upgrade(
        self, upstream: Upstream, method: str, headers: list[tuple[str, str]]
    ) -> UpstreamResponse:
        """Send a body-less request that asked to upgrade, on a **fresh** connection.

        The caller has decided the request asks to upgrade; only here is a ``101``
        accepted. The connection never comes from the pool and never goes back to
        it, whatever the answer: after an upgrade the bytes on it are another
        protocol, and after a refused upgrade it is closed so nothing the client
        sends later can ride on it (CVE-2018-1002105). Failover, timeouts, TLS and
        causes are those of :meth:`send`.

        :param headers: as for :meth:`send`, including ``Connection`` and
            ``Upgrade``.
        :returns: the response head; on ``101`` take the socket with
            :meth:`UpstreamResponse.detach`, otherwise read the body as usual
            (the connection closes when it is released).
        """
        return self._send(upstream, method, headers, None, None, upgrade=True, timeout=None)

    def _send(self, upstream: Upstream, method: str, headers: list[tuple[str, str]], body: Body,
              content_length: int | None, *, upgrade: bool, timeout: float | None) -> UpstreamResponse:
        if time.monotonic() >= self._next_sweep:
            self._sweep()
        target = upstream.path or "/"
        if upstream.query:
            target = f"{target}?{upstream.query}"
        candidates = self._candidates(upstream.base_urls)
        if not candidates:
            raise UnusableAddress(f"upstream {upstream.name or '?'} has no address", stage="connect")
        last: OutboundError | None = None
        for base in candidates:
            scheme, host, port, prefix, host_header = self._origin(base)
            key = PoolKey(
                scheme, host, port,
                *((upstream.ca_pem, upstream.server_name, upstream.verify, upstream.client_cert)
                  if scheme == "https" else (None, None, True, None)),
                upstream.tunnel,
            )
            head = request_head(method, f"{prefix}{target}", host_header, headers,
                                content_length, body is not None)
            answer = self._send_to(key, upstream.name or host, method, head, body, content_length,
                                   upgrade=upgrade, timeout=timeout)
            if isinstance(answer, UpstreamResponse):
                return answer
            with self._lock:
                self._failed.put(base, time.monotonic())
            last = answer
        assert last is not None
        raise last

    def _send_to(self, key: PoolKey, label: str, method: str, head: bytes, body: Body, content_length: int | None,
                 *, upgrade: bool, timeout: float | None) -> UpstreamResponse | OutboundError:
        """The answer from one address, or why connecting to it failed (nothing was sent: try the next)."""
        replayable = body is None and method in _REPLAYABLE and not upgrade
        for _attempt in range(2):
            conn = None if upgrade else self._pool.get(key)
            if conn is None:
                try:
                    conn = self._connect(key, label, timeout, upgrade=upgrade)
                except (TLSError, AgentUnreachable):
                    raise  # the next address is the same cluster: same certificate, same agent
                except OutboundError as cause:
                    return cause
            try:
                return exchange(conn, label, method, head, body, content_length, upgrade=upgrade,
                                read_timeout=self.read_timeout if timeout is None else timeout,
                                stream_timeout=self.stream_idle_timeout if timeout is None else timeout,
                                keep=self._keep)
            except FOREIGN as exc:
                conn.close()
                if conn.reused and replayable and isinstance(exc, ConnectionError):
                    # The upstream closed idle connections (a restart, its
                    # keep-alive timeout): drop the rest, retry on a fresh one.
                    self._pool.drop(key)
                    continue
                raise translate(exc, "response", label, key.host) from None
            except BaseException:
                conn.close()  # e.g. the client's body broke off: never reuse
                raise
        raise ConnectionBroken(f"upstream {label}: {key.host} keeps closing connections", stage="response")

    def _connect(self, key: PoolKey, label: str, timeout: float | None, *, upgrade: bool) -> Connection:
        """A new connection from the backend, counted, bounded by the connect timeout."""
        seconds = self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)
        # Read before dialling: a stream opened as its agent connection is replaced counts as the old one's.
        generation = 0 if key.tunnel is None else (self._tunnel_generations.peek(key.tunnel) or 0)
        conn = self._backend.connect(key, label, seconds, generation=generation, upgrade=upgrade)
        with self._lock:
            self._opened += 1
        return conn

    def retire_tunnel(self, cluster_id: str) -> None:
        """A newer agent connection serves ``cluster_id``: stop reusing connections over the older one.

        Idle ones are closed now, busy ones when released, so the older agent connection
        drains (its streams end) while every new request opens a stream over the newer.
        """
        with self._lock:
            generation = (self._tunnel_generations.peek(cluster_id) or 0) + 1
            self._tunnel_generations.put(cluster_id, generation)
        self._pool.drop_tunnel(cluster_id)

    def _keep(self, conn: Connection) -> None:
        """Pool a connection whose answer was complete, unless its agent connection was retired."""
        tunnel = conn.key.tunnel
        if tunnel is not None and conn.generation != (self._tunnel_generations.peek(tunnel) or 0):
            conn.close()
        else:
            self._pool.put(conn)

    def _candidates(self, base_urls: tuple[str, ...]) -> list[str]:
        if not len(self._failed):
            return list(base_urls)
        with self._lock:
            fresh = [base for base in base_urls if self._failed.get(base) is None]
        return fresh or list(base_urls)

    def _origin(self, base: str) -> tuple[str, str, int, str, str]:
        # Peeked, not looked up: re-parsing an address once per state_ttl costs less
        # than keeping its recency on every request.
        origin = self._origins.peek(base)
        if origin is None:
            origin = _parse_origin(base)
            with self._lock:
                self._origins.put(base, origin)
        return origin

    def _sweep(self) -> None:
        self._next_sweep = time.monotonic() + min(_SWEEP_EVERY, self.idle_timeout / 2)
        self._pool.prune()
        self._backend.prune()
        with self._lock:
            self._origins.prune()
            self._failed.prune()

    def close(self) -> None:
        """Close every idle connection; the transport stays usable."""
        self._pool.close()


def _parse_origin(base: str) -> tuple[str, str, int, str, str]:
    """``scheme://host[:port][/prefix]`` → (scheme, host, port, prefix, Host header)."""
    try:
        parts = urlsplit(base)
        scheme = parts.scheme.lower()
        host = parts.hostname
        port = parts.port
    except ValueError:  # a port out of range, a bad IPv6 literal
        host = None
    if host is None or scheme not in ("http", "https"):
        raise UnusableAddress("upstream address is not an http(s) URL", stage="connect")
    default = 443 if scheme == "https" else 80
    port = port or default
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default else f"{shown}:{port}"
    return scheme, host, port, parts.path.rstrip("/"), host_header


_default: PerProcess[PooledTransport] = PerProcess(PooledTransport)


def default_transport() -> PooledTransport:
    """This process's transport for layers assembled without one (ini filters, tests).

    The gateway (:func:`bcs_middleware.compose.gateway.build_gateway`) makes its own from its
    configuration (timeouts, address policy) and hands that one instance to every
    layer that calls out; a layer built on its own (a PasteDeploy filter, an admission
    API without an engine) shares this one instead of opening pools of its own. Made
    on first use, and made anew in a forked child: connections are never shared
    across a fork.
    """
    return _default.get()
