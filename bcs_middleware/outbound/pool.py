"""The bounded pool of idle keep-alive connections to upstreams.

:class:`IdlePool` keeps idle connections per upstream identity (:class:`PoolKey`),
bounded three ways, so a worker that talked to 10,000 clusters once does not keep
10,000 sockets and TLS sessions: at most ``per_key`` connections per identity, at
most ``max_keys`` identities (the least recently used go first), and a connection
idle for ``idle_timeout`` seconds is closed — shorter than the keep-alive timeout of
common servers (nginx 75 s, Go 90 s+), so we rarely reuse one the upstream is
closing.
"""

from __future__ import annotations

import threading
import time

from ..core.cache import Cache
from .identity import PoolKey
from .streams import Connection


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
