"""A per-process, size-bounded cache whose entries expire ``ttl`` seconds after they were looked up.

The cluster directory and the cluster permission checks of the tunnel use it so the
store stays off the hot path; ``ttl`` is how long a change made in the store (new
credentials, a revoked permission) may go unseen by a worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """``cache.get(key, load)`` is ``load(key)``, remembered for ``ttl`` seconds.

    The hit path takes no lock (one dict read is atomic under the GIL). A full cache
    starts over, which costs a few reloads and never a wrong answer. ``ttl <= 0``
    caches nothing.
    """

    def __init__(self, *, ttl: float, max_entries: int = 10_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: K, load: Callable[[K], V]) -> V:
        if self.ttl <= 0:
            return load(key)
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = load(key)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (now + self.ttl, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
