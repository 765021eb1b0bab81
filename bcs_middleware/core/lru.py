"""The package's one cache: a least-recently-used table bounded in count, idle time and age.

For per-process state keyed by something outside our control (one entry per
upstream, per cluster, per user, per credential rotation): without a bound such a
table grows for as long as the process lives. An entry is dropped when it has not
been used for ``ttl`` seconds, when it was put more than ``max_age`` seconds ago,
or when it is the least recently used one and the table is over ``max_entries``;
``on_evict`` is told, so a value holding a resource (idle sockets) can release it.

Two policies, one table:

* :class:`LRUCache` — state kept while it is used (the transport's idle connections,
  TLS contexts, parsed addresses, failure marks): bounded by count and idle time.
* :class:`LoadingCache` — answers of the store kept for at most ``ttl`` seconds
  after they were loaded (the cluster directory, the tunnel's permission checks,
  the token cache of :mod:`bcs_middleware.layers.auth`, the admission engine's
  namespace labels):
  ``ttl`` is how long a change made in the store (new credentials, a revoked
  permission) may go unseen by a worker, however often the entry is used.

Left on purpose outside it: ``functools.lru_cache`` on pure functions of their
arguments (a parsed path, a user's impersonation headers — nothing to expire), the
admission engine's definitions per cluster (invalidated by the store's version, not
by time; one entry per cluster with definitions).

:class:`LRUCache` is not thread-safe on its own: callers hold their own lock,
because their updates usually span more than one call (take a connection from a
list, put one back). :class:`LoadingCache` locks for them; its hit path does not.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Expired entries are looked for at most this often (seconds) when nothing is inserted.
_PRUNE_EVERY = 1.0
_RECENT = 1.0


class LRUCache(Generic[K, V]):
    """``get``/``put``/``pop`` over an insertion-ordered dict kept in recency order.

    :param max_entries: entries kept at most; the least recently used go first.
    :param ttl: seconds an entry may go unused before it is dropped; ``None`` never.
    :param max_age: seconds after :meth:`put` an entry is dropped however it is used;
        ``None`` never.
    :param on_evict: called with ``(key, value)`` for every entry dropped by a bound
        (not for :meth:`pop`, whose caller has the value).
    """

    def __init__(self, *, max_entries: int, ttl: float | None = None, max_age: float | None = None,
                 on_evict: Callable[[K, V], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.ttl = ttl
        self.max_age = max_age
        self._on_evict = on_evict
        self._clock = clock
        # key -> [last use, value, put at]; a list so a hit updates the time in place.
        self._entries: OrderedDict[K, list] = OrderedDict()
        self._next_prune = 0.0
        self._recent = _RECENT if ttl is None else min(_RECENT, ttl / 2)

    def get(self, key: K) -> V | None:
        """The value for ``key`` (now the most recently used), or ``None``."""
        now = self._clock()
        if now >= self._next_prune:
            self._prune(now)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.max_age is not None and now - entry[2] > self.max_age:
            self._evict(key)
            return None
        # Recency to the second is enough to choose what to drop: a hot key is not
        # moved on every use.
        if now - entry[0] > self._recent:
            if self.ttl is not None and now - entry[0] > self.ttl:
                self._evict(key)
                return None
            entry[0] = now
            self._entries.move_to_end(key)
        value: V = entry[1]
        return value

    def peek(self, key: K) -> V | None:
        """The value for ``key`` without marking it used: one dict read, safe without a lock.

        For values that are cheap to rebuild: an entry only peeked at ages out after
        ``ttl`` and is put again by its user.
        """
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def fresh(self, key: K) -> tuple[V] | None:
        """``(value,)`` when ``key`` is held and younger than ``max_age``, else ``None``.

        Like :meth:`peek` (one dict read, safe without a lock, recency untouched), for
        tables whose values may be ``None`` and whose entries expire by age.
        """
        entry = self._entries.get(key)
        if entry is None or (self.max_age is not None and self._clock() - entry[2] > self.max_age):
            return None
        return (entry[1],)

    def put(self, key: K, value: V) -> None:
        """Set ``key`` (most recently used), then drop what is over a bound."""
        now = self._clock()
        self._entries[key] = [now, value, now]
        self._entries.move_to_end(key)
        self._prune(now)

    def pop(self, key: K) -> V | None:
        """Remove ``key`` and return its value (``on_evict`` is not called)."""
        entry = self._entries.pop(key, None)
        return None if entry is None else entry[1]

    def clear(self) -> list[V]:
        """Remove every entry and return the values (``on_evict`` is not called)."""
        values = [entry[1] for entry in self._entries.values()]
        self._entries.clear()
        return values

    def values(self) -> Iterator[V]:
        return (entry[1] for entry in self._entries.values())

    def held_keys(self) -> list[K]:
        """The keys now held (a copy: safe to pop while looping over it)."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def prune(self) -> None:
        """Drop what is over a bound now (``get`` and ``put`` also do, as they go)."""
        self._prune(self._clock())

    def _prune(self, now: float) -> None:
        # Entries are in recency order: the expired and the surplus ones are at the front.
        entries = self._entries
        while entries:
            key, entry = next(iter(entries.items()))
            if len(entries) <= self.max_entries and (self.ttl is None or now - entry[0] <= self.ttl):
                break
            self._evict(key)
        self._next_prune = now + _PRUNE_EVERY

    def _evict(self, key: K) -> None:
        entry = self._entries.pop(key)
        if self._on_evict is not None:
            self._on_evict(key, entry[1])


class LoadingCache(Generic[K, V]):
    """``cache.get(key, load)`` is ``load(key)``, remembered for ``ttl`` seconds after loading.

    The hit path takes no lock (one dict read is atomic under the GIL). Beyond
    ``max_entries`` the least recently loaded entries go first. ``ttl <= 0`` caches
    nothing.
    """

    def __init__(self, *, ttl: float, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._table: LRUCache[K, V] = LRUCache(max_entries=max_entries, max_age=max(ttl, 0.0), clock=clock)

    def get(self, key: K, load: Callable[[K], V]) -> V:
        if self.ttl <= 0:
            return load(key)
        hit = self._table.fresh(key)
        if hit is not None:
            return hit[0]
        value = load(key)
        with self._lock:
            self._table.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._table.clear()

    def forget(self, key: K) -> None:
        """Drop ``key``'s answer: the next ``get`` loads it again."""
        with self._lock:
            self._table.pop(key)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, key: object) -> bool:
        return key in self._table
