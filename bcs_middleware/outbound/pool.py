"""Upstream connections and the bounded pool of idle keep-alive ones.

A :class:`Connection` is one connection to an upstream with its timeout: a
:class:`SocketConnection` (Python's socket timeout, which also works under gevent,
where sockets wait in its hub), or a
:class:`~bcs_middleware.outbound.stream_connection.StreamConnection` carried by an
agent tunnel's stream in memory.

:class:`IdlePool` keeps idle connections per upstream identity (:class:`PoolKey`),
bounded three ways, so a worker that talked to 10,000 clusters once does not keep
10,000 sockets and TLS sessions: at most ``per_key`` connections per identity, at
most ``max_keys`` identities (the least recently used go first), and a connection
idle for ``idle_timeout`` seconds is closed — shorter than the keep-alive timeout of
common servers (nginx 75 s, Go 90 s+), so we rarely reuse one the upstream is
closing.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from typing import NamedTuple

from ..core.cache import Cache
from ..core.sockets import send_all

# Below glibc's mmap threshold (128 KiB): recv(n) allocates an n-byte buffer first, and a
# 256 KiB one costs an mmap/munmap pair per call (bench/README.md). Bodies are relayed in
# 64 KiB pieces anyway.
RECV = 64 * 1024
# A pooled connection idle longer than this is checked for a close by the upstream
# before reuse. Not sooner: every syscall releases the GIL, and under load a hot
# connection was in use a moment ago (a stale one is still caught by the retry of
# replayable requests).
_CHECK_AFTER_IDLE = 1.0


class PoolKey(NamedTuple):
    """An upstream identity: address and every TLS setting. Connections are never shared across keys."""

    # A tuple, not a frozen dataclass: built and looked up on every request, and a
    # tuple's hash and equality are the C ones.
    scheme: str
    host: str
    port: int
    ca_pem: str | None
    server_name: str | None
    verify: bool
    client_cert: tuple[str, str] | None
    # The cluster whose agent tunnel carries the connection; None: dialled directly.
    tunnel: str | None = None


class Connection:
    """One connection to an upstream; ``sendall``/``recv`` raise ``TimeoutError`` when its timeout fires."""

    __slots__ = ("generation", "idle_since", "key", "reused", "timeout")

    def __init__(self, key: PoolKey, generation: int, timeout: float | None) -> None:
        self.key = key
        # For a connection through an agent tunnel: which of the cluster's agent
        # connections it rides (see PooledTransport.retire_tunnel).
        self.generation = generation
        self.reused = False
        self.idle_since = 0.0
        self.timeout = timeout

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send and receive."""
        self.timeout = seconds

    def sendall(self, data: bytes) -> None:
        raise NotImplementedError

    def recv(self, limit: int = 0) -> bytes:
        """Up to ``limit`` bytes as soon as any arrive; ``b""`` at the end."""
        raise NotImplementedError

    def take_socket(self) -> socket.socket:
        """The socket, for a caller that takes it over (an upgraded connection)."""
        raise NotImplementedError

    def looks_closed(self) -> bool:
        """Before reuse: has the upstream closed the idle connection (or sent garbage)?"""
        raise NotImplementedError

    def interrupt(self) -> None:
        """Wake a reader blocked on this connection (from another thread): its read ends."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SocketConnection(Connection):
    """A connection over a socket (TCP, TLS over TCP, or an agent tunnel's socket pair)."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket, key: PoolKey, generation: int = 0) -> None:
        super().__init__(key, generation, sock.gettimeout())
        self.sock = sock

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send and receive, re-programming the socket only on a change.

        ``settimeout`` is an ``ioctl`` (a GIL release) even when nothing changes.
        """
        if seconds != self.timeout:
            self.timeout = seconds
            self.sock.settimeout(seconds)

    def sendall(self, data: bytes) -> None:
        send_all(self.sock, data)

    def recv(self, limit: int = RECV) -> bytes:
        return self.sock.recv(limit)

    def take_socket(self) -> socket.socket:
        return self.sock

    def looks_closed(self) -> bool:
        """After a pause: is the idle socket readable (the upstream closed it, or sent garbage)?"""
        if time.monotonic() - self.idle_since <= _CHECK_AFTER_IDLE:
            return False
        sock = self.sock
        return bool((isinstance(sock, ssl.SSLSocket) and sock.pending())
                    or select.select([sock], [], [], 0)[0])

    def interrupt(self) -> None:
        # shutdown rather than close: closing a descriptor another thread is blocked on
        # does not wake it on Linux, and the number could be reused.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _close_all(_key: PoolKey, conns: list[Connection]) -> None:
    for conn in conns:
        conn.close()


class IdlePool:
    """Idle keep-alive connections per :class:`PoolKey`, bounded (see the module docs)."""

    def __init__(self, *, per_key: int, max_keys: int, idle_timeout: float) -> None:
        self.per_key = per_key
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._idle: Cache[PoolKey, list[Connection]] = Cache(
            max_entries=max_keys, ttl=idle_timeout, on_evict=_close_all)

    def get(self, key: PoolKey) -> Connection | None:
        """The most recently used idle connection for ``key`` that still looks usable."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                conn = idle.pop()
            if conn.looks_closed():
                conn.close()
                continue
            conn.reused = True
            return conn

    def put(self, conn: Connection) -> None:
        """Keep a connection whose last answer was complete and well framed (else close it)."""
        now = time.monotonic()
        conn.idle_since = now
        stale: Connection | None = None
        with self._lock:
            idle = self._idle.get(conn.key)
            if idle is None:
                self._idle.put(conn.key, [conn])
                return
            if len(idle) >= self.per_key:
                stale = conn
            else:
                idle.append(conn)
                # The oldest is at the bottom (the top is reused first): close it once idle too long.
                if now - idle[0].idle_since > self.idle_timeout:
                    stale = idle.pop(0)
        if stale is not None:
            stale.close()

    def prune(self) -> None:
        """Close what has been idle too long, for every key."""
        with self._lock:
            self._idle.prune()

    def drop(self, key: PoolKey) -> None:
        """Close every idle connection of ``key`` (the upstream closed them: a restart)."""
        with self._lock:
            idle = self._idle.pop(key)
        for conn in idle or ():
            conn.close()

    def drop_tunnel(self, cluster_id: str) -> None:
        """Close every idle connection through ``cluster_id``'s agent tunnel."""
        with self._lock:
            lists = [self._idle.pop(key) for key in self._idle.held_keys() if key.tunnel == cluster_id]
        for conns in lists:
            _close_all(None, conns or [])  # type: ignore[arg-type]

    def close(self) -> None:
        with self._lock:
            lists = self._idle.clear()
        for conns in lists:
            _close_all(None, conns)  # type: ignore[arg-type]

    def forget(self) -> None:
        """Drop everything without closing (sockets inherited from a parent process)."""
        self._lock = threading.Lock()
        self._idle.clear()

    def __len__(self) -> int:
        """Idle connections held."""
        with self._lock:
            return sum(len(conns) for conns in self._idle.values())

    @property
    def keys(self) -> int:
        """Upstream identities with an entry."""
        return len(self._idle)
