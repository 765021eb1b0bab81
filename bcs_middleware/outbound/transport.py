"""Pooled, verified, time-bounded HTTP/1.1 exchanges with upstreams — the only code that opens connections.

:class:`PooledTransport` sends a request and hands back the answer's head with its
body unread. Its parts, one module each:

* :mod:`.codec` — the request head we write and the strict reading of answers
  (llhttp through ``httptools``): every malformed or ambiguous frame is refused;
* :mod:`.pool` — connections, their timeouts, and the bounded pool of idle ones,
  keyed by upstream *identity* (scheme, host, port and every TLS setting), so two
  clusters sharing an address never share a connection verified against the
  other's CA;
* :mod:`.tls_contexts` — one client TLS context per identity, in a bounded table;
* :mod:`.failures` — the one translation of foreign exceptions into ours.

Why not urllib3 or requests: measured on the proxy's hot path (bench/README.md),
urllib3's ``urlopen`` plus ``http.client``'s e-mail based header parser cost
about 350 µs of CPU per request — more than gunicorn spends serving it — and the
proxy needs none of their features (it never decodes, redirects, retries on its
own or buffers).

Behaviour of :meth:`PooledTransport.send`:

* The answer is returned with its head parsed and its body unread; the body is
  relayed raw (``Content-Encoding`` untouched). Redirects are never followed;
  interim ``1xx`` answers are skipped; a ``101`` is refused (only
  :meth:`~PooledTransport.open_upgrade` accepts one).
* A connection goes back to the pool only after a complete, well framed answer
  that allows keep-alive, with nothing after it.
* **Failover**: ``Upstream.base_urls`` are tried in order. An address whose
  connection failed less than ``failure_cooldown`` seconds ago is skipped (unless
  every address did). The next address is tried only when connecting failed —
  before a single request byte left — so a request is never sent twice. One
  exception: a body-less ``GET``/``HEAD``/``OPTIONS`` that found a pooled
  connection closed by the upstream is retried once on a fresh one.
* **Errors**: only :class:`BadGateway` and :class:`GatewayTimeout` (and
  :class:`BadRequest` for a header that cannot be sent), from
  :func:`.failures.translate`; body reads raise them too. Messages carry the
  upstream's label and host, never a credential.
* **Timeouts**: ``connect_timeout`` to connect and finish the TLS handshake,
  ``read_timeout`` between bytes until the head arrives and within bodies that
  have a ``Content-Length``; a body *without* ``Content-Length`` (a watch, a log
  follow) switches its socket to ``stream_idle_timeout`` once the head is in,
  because such streams may legitimately stay quiet for long.
* **Bounded state**: idle connections, TLS contexts, parsed addresses and
  failure marks are kept per upstream in tables bounded by count
  (``max_upstreams``) and by idle time, so a worker that served 10,000 clusters
  once holds no more than a busy one (bench/pool_memory_bench.py).

**Agent tunnels**: an upstream whose ``tunnel`` names a cluster is dialled through
that cluster's kube-agent connection (``tunnels``, a
:class:`~bcs_middleware.agent_tunnel.registry.TunnelDialer`) instead of TCP. The stream
comes back in memory (a :class:`~.stream_connection.StreamConnection`: TLS over
memory BIOs, no socket between the transport and the tunnel), or as a connected
socket for an upgrade (spliced to the client) and where the agent is held by
another process; either way TLS (with the reported CA and server name), the codec,
the pool and the errors are the same as for a direct connection. The address
policy does not apply to that hop: the agent dials only its own apiserver.
No agent is :class:`~bcs_middleware.core.errors.AgentUnavailable` (503), raised as is.

**Upgrades** (:meth:`PooledTransport.open_upgrade`): the same connect, failover,
TLS and error rules, but always on a fresh connection that is never pooled; a
``101`` answer's socket is handed to the caller (``detach()``).

**One per process.** Every outbound call of a process goes through one instance:
the gateway (:func:`bcs_middleware.compose.gateway.build_gateway`) makes it from its
configuration (timeouts, the address policy) and hands it to the proxy (tunnel and
Mesos drivers), the webhook client, the admission layer's cluster reads and the RBAC
source and sync; layers assembled on their own share :func:`default_transport`. Both
the errors (:mod:`.failures`) and the address policy are therefore the same for
every call.

**Fork safety**: nothing is opened at import or construction; pools fill on first
use. ``serve`` builds the gateway in each worker after the fork, and
:func:`default_transport` makes a new instance in a forked child. A transport that
has been *used* must not be shared across a fork otherwise: call
:meth:`PooledTransport.reset` in gunicorn's ``post_fork``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import urlsplit

from ..core.cache import Cache
from ..core.environ import Upstream
from ..core.errors import AgentUnavailable, BadGateway, BCSError
from .addresses import DEFAULT_POLICY, AddressPolicy
from .codec import (
    HOP_BY_HOP,
    ResponseReader,
    UpstreamProtocolError,
    connection_tokens,
    named_by_connection,
    request_head,
)
from .failures import FOREIGN, TLS_ERROR, translate
from .pool import RECV, Connection, IdlePool, PoolKey, SocketConnection
from .stream_connection import ByteStream, StreamConnection
from .tls_contexts import TLSContexts

__all__ = [
    "HOP_BY_HOP", "PooledTransport", "Response", "Transport", "UpgradeResponse", "UpgradeTransport",
    "UpstreamProtocolError", "UpstreamResponse", "connection_tokens", "default_transport", "named_by_connection",
]

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


class TunnelDialer(Protocol):
    """Opens a stream to a cluster's apiserver through its kube-agent (:mod:`bcs_middleware.agent_tunnel.registry`)."""

    def dial(self, cluster_id: str, host: str, port: int, timeout: float, *,
             in_memory: bool = False) -> socket.socket | ByteStream:
        """A stream to ``host:port`` through the cluster's agent: a connected socket, or with
        ``in_memory`` a :class:`ByteStream` where the dialer can give one (a socket where not)."""
        ...


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


class UpstreamResponse:
    """An upstream answer whose body is read on demand, raw.

    ``read1``/``read`` raise :class:`BadGateway` or :class:`GatewayTimeout` when the
    upstream breaks off, stalls or breaks the framing. ``release_conn()`` returns a
    fully read keep-alive connection to its pool and closes any other; ``close()``
    abandons the body and the connection.
    """

    def __init__(self, transport: PooledTransport, conn: Connection, reader: ResponseReader,
                 label: str, reusable: bool = True) -> None:
        self.status = reader.status
        self.reason = reader.reason
        self.headers = reader.headers
        self.end_to_end_headers = reader.end_to_end
        self.length_remaining: int | None = reader.length
        self._transport = transport
        self._conn: Connection | None = conn
        self._reader = reader
        self._label = label
        self._reusable = reusable and reader.keep_alive

    def header(self, name: str) -> str | None:
        """The first value of the field ``name`` (lower case), or ``None``."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def complete(self) -> bool:
        """The whole body has been read."""
        return self._reader.complete and not self._reader.pieces

    def read1(self, amt: int = RECV) -> bytes:
        """Up to ``amt`` body bytes as soon as any arrive; ``b""`` at the end."""
        reader = self._reader
        pieces = reader.pieces
        if not pieces:
            conn = self._conn
            if reader.complete or conn is None:
                return b""
            try:
                while not pieces and not reader.complete:
                    data = conn.recv(RECV)
                    if data:
                        reader.feed(data)
                    else:
                        reader.end_of_input()
            except FOREIGN as exc:
                raise translate(exc, "body", self._label, conn.key.host) from None
            if not pieces:
                return b""
        piece = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        if len(piece) > amt:
            pieces.append(piece[amt:])
            piece = piece[:amt]
        if self.length_remaining is not None:
            self.length_remaining -= len(piece)
        return piece

    def read(self) -> bytes:
        """The whole remaining body (callers bound it by ``length_remaining``)."""
        first = self.read1(RECV)
        if not first or self.complete:
            return first  # the usual small answer: one piece, no list to join
        pieces = [first]
        while True:
            piece = self.read1(RECV)
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)

    def release_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reader = self._reader
        reader.release()
        if reader.complete and not reader.pieces and reader.reusable and self._reusable:
            self._transport._keep(conn)
        else:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._reader.release()
        if conn is not None:
            conn.close()

    def interrupt(self) -> None:
        """Wake a reader blocked on this response (from another thread): its read ends."""
        conn = self._conn
        if conn is not None:
            conn.interrupt()

    def detach(self) -> tuple[socket.socket, bytes]:
        """Take the socket of a ``101`` answer and the bytes already read past its head.

        The caller owns (and must close) the socket; this response is done.
        """
        conn, self._conn = self._conn, None
        if conn is None or self.status != 101:
            raise RuntimeError("only a 101 answer's connection can be detached")
        return conn.take_socket(), self._reader.leftover


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
        cluster's kube-agent); without it such upstreams are :class:`AgentUnavailable`.

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
    ) -> None:
        self.address_policy = address_policy or DEFAULT_POLICY
        self.tunnels = tunnels
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.pool_maxsize = pool_maxsize
        self.failure_cooldown = failure_cooldown
        self.max_upstreams = max_upstreams
        self.idle_timeout = idle_timeout
        self.state_ttl = state_ttl
        self._opened = 0
        self._start()

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._pool = IdlePool(per_key=self.pool_maxsize, max_keys=self.max_upstreams,
                              idle_timeout=self.idle_timeout)
        self._tls = TLSContexts(max_entries=self.max_upstreams, ttl=self.state_ttl)
        self._origins: Cache[str, tuple[str, str, int, str, str]] = Cache(
            max_entries=self.max_upstreams, ttl=self.state_ttl)
        # A mark older than the cooldown means nothing: that is its ttl.
        self._failed: Cache[str, float] = Cache(
            max_entries=self.max_upstreams, ttl=self.failure_cooldown)
        self._next_sweep = 0.0
        # Agent tunnels whose connection was replaced by a newer one of the same cluster:
        # their connections are not pooled again (retire_tunnel). Kept as long as a stream
        # over the old connection may last.
        self._tunnel_generations: Cache[str, int] = Cache(
            max_entries=self.max_upstreams, ttl=self.stream_idle_timeout or 3600.0)

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
        :raises BCSError: :class:`BadGateway` or :class:`GatewayTimeout`
            (:mod:`.failures` subclasses saying which stage failed, and how).
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
        error translation are those of :meth:`send`.

        :param headers: as for :meth:`send`, including ``Connection`` and
            ``Upgrade``.
        :returns: the response head; on ``101`` take the socket with
            :meth:`UpstreamResponse.detach`, otherwise read the body as usual
            (the connection closes when it is released).
        """
        return self._send(upstream, method, headers, None, None, upgrade=True, timeout=None)

    def _send(
        self,
        upstream: Upstream,
        method: str,
        headers: list[tuple[str, str]],
        body: Body,
        content_length: int | None,
        *,
        upgrade: bool,
        timeout: float | None,
    ) -> UpstreamResponse:
        if time.monotonic() >= self._next_sweep:
            self._sweep()
        target = upstream.path or "/"
        if upstream.query:
            target = f"{target}?{upstream.query}"
        candidates = self._candidates(upstream.base_urls)
        if not candidates:
            raise BadGateway(f"upstream {upstream.name or '?'} has no address")
        last_error: BCSError | None = None
        replayable = body is None and method in _REPLAYABLE and not upgrade
        for base in candidates:
            scheme, host, port, prefix, host_header = self._origin(base)
            label = upstream.name or host
            key = PoolKey(
                scheme, host, port,
                *((upstream.ca_pem, upstream.server_name, upstream.verify, upstream.client_cert)
                  if scheme == "https" else (None, None, True, None)),
                upstream.tunnel,
            )
            head = request_head(method, f"{prefix}{target}", host_header, headers,
                                content_length, body is not None)
            for _attempt in range(2):
                conn = None if upgrade else self._pool.get(key)
                if conn is None:
                    try:
                        conn = self._connect(key, label, timeout, upgrade=upgrade)
                    except BCSError as exc:
                        if exc.code_name == TLS_ERROR or isinstance(exc, AgentUnavailable):
                            raise
                        with self._lock:
                            self._failed.put(base, time.monotonic())
                        last_error = exc
                        break  # next address: nothing was sent
                try:
                    return self._exchange(conn, label, method, head, body, content_length, upgrade, timeout)
                except FOREIGN as exc:
                    conn.close()
                    if conn.reused and replayable and isinstance(exc, ConnectionError):
                        # The upstream closed idle connections (a restart, its
                        # keep-alive timeout): drop the rest, retry on a fresh one.
                        self._pool.drop(key)
                        continue
                    raise translate(exc, "response", label, host) from None
                except BaseException:
                    conn.close()  # e.g. the client's body broke off: never reuse
                    raise
            else:
                raise BadGateway(f"upstream {label}: {host} keeps closing connections")
        assert last_error is not None
        raise last_error

    def _exchange(self, conn: Connection, label: str, method: str, head: bytes, body: Body,
                  content_length: int | None, upgrade: bool, timeout: float | None) -> UpstreamResponse:
        conn.set_timeout(self.read_timeout if timeout is None else timeout)
        conn.sendall(head)
        if body is not None:
            chunked = content_length is None
            for piece in body:
                if not piece:
                    continue
                if chunked:
                    conn.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
                else:
                    conn.sendall(piece)
            if chunked:
                conn.sendall(b"0\r\n\r\n")
        reader = ResponseReader(head_request=method == "HEAD", upgrade_requested=upgrade)
        try:
            while not reader.head_complete:
                data = conn.recv(RECV)
                if data:
                    reader.feed(data)
                else:
                    reader.end_of_input()
        except BaseException:
            reader.release()
            raise
        # An upgrade's connection is never pooled, refused or not.
        resp = UpstreamResponse(self, conn, reader, label, reusable=not upgrade)
        if reader.status == 101:
            return resp  # the caller detaches the socket; nothing to release
        if resp.length_remaining is None:
            conn.set_timeout(self.stream_idle_timeout if timeout is None else timeout)
        elif resp.complete:
            resp.release_conn()
        return resp

    def _connect(self, key: PoolKey, label: str, timeout: float | None = None, *,
                 upgrade: bool = False) -> Connection:
        """The one place a connection to an upstream is made (TCP, then TLS for https)."""
        seconds = self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)
        # Read before dialling: a stream opened as its agent connection is replaced counts as the old one's.
        generation = 0 if key.tunnel is None else (self._tunnel_generations.peek(key.tunnel) or 0)
        try:
            if key.tunnel is not None:
                if self.tunnels is None:
                    raise AgentUnavailable(f"upstream {label}: this gateway does not serve agent tunnels")
                # A stream through the cluster's own agent, which dials only its apiserver:
                # the address policy guards direct connections, not this hop. In memory
                # unless the connection may be upgraded (then spliced: it needs a descriptor).
                end = self.tunnels.dial(key.tunnel, key.host, key.port, seconds, in_memory=not upgrade)
                if not isinstance(end, socket.socket):
                    return self._over_stream(end, key, label, generation, seconds)
                sock = end
            else:
                # The address policy resolves and checks every address, and connects only to an
                # allowed one (AddressRefused, a BCSError, passes through to the failover).
                sock = self.address_policy.connect(key.host, key.port, seconds, label=label)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except FOREIGN as exc:
            raise translate(exc, "connect", label, key.host) from None
        if key.scheme == "https":
            try:
                sock = self._tls.wrap(sock, key, label)
            except FOREIGN as exc:
                sock.close()
                raise translate(exc, "tls", label, key.host) from None
        with self._lock:
            self._opened += 1
        return SocketConnection(sock, key, generation)

    def _over_stream(self, stream: ByteStream, key: PoolKey, label: str, generation: int,
                     seconds: float) -> StreamConnection:
        """A connection over a tunnel stream in memory: TLS over memory BIOs for https."""
        try:
            tls = self._tls.wrap_bio(key, label) if key.scheme == "https" else None
            conn = StreamConnection.open(stream, key, generation, seconds, tls)
        except FOREIGN as exc:
            stream.close()
            raise translate(exc, "tls", label, key.host) from None
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
        self._tls.prune()
        with self._lock:
            self._origins.prune()
            self._failed.prune()

    def close(self) -> None:
        """Close every idle connection; the transport stays usable."""
        self._pool.close()

    def reset(self) -> None:
        """Forget connections inherited from a parent process (call in ``post_fork``).

        Their sockets belong to the parent; they are dropped, not shut down.
        """
        self._pool.forget()
        self._start()


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
        raise BadGateway("upstream address is not an http(s) URL")
    default = 443 if scheme == "https" else 80
    port = port or default
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default else f"{shown}:{port}"
    return scheme, host, port, parts.path.rstrip("/"), host_header


_default: tuple[int, PooledTransport] | None = None
_default_lock = threading.Lock()


def default_transport() -> PooledTransport:
    """This process's transport for layers assembled without one (ini filters, tests).

    The gateway (:func:`bcs_middleware.compose.gateway.build_gateway`) makes its own from its
    configuration (timeouts, address policy) and hands that one instance to every
    layer that calls out; a layer built on its own (a PasteDeploy filter, an admission
    API without an engine) shares this one instead of opening pools of its own. Made
    on first use, and made anew in a forked child: connections are never shared
    across a fork.
    """
    global _default
    pid = os.getpid()
    current = _default
    if current is None or current[0] != pid:
        with _default_lock:
            current = _default
            if current is None or current[0] != pid:
                current = _default = (pid, PooledTransport())
    return current[1]
