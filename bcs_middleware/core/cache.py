"""The package's one cache: a thread-safe table bounded in count, idle time and age, with an
optional loader.

For state keyed by something outside our control (one entry per upstream, per cluster, per
user, per client header shape, per request line): without a bound such a table grows for as
long as the process lives. An entry is dropped when it has not been used for ``ttl`` seconds,
when it was put more than ``max_age`` seconds ago, or when it is the least recently used one
and the table is over ``max_entries``; ``on_evict`` is told, so a value holding a resource
(idle sockets) can release it.

Three uses, one class:

* state kept while it is used (the transport's idle connections, TLS contexts, parsed
  addresses, failure marks): ``max_entries`` and ``ttl``, with :meth:`Cache.get`/:meth:`Cache.put`;
* answers of the store kept for at most ``max_age`` seconds after they were loaded (the
  cluster directory, the tunnel's permission checks, the token cache of
  :mod:`bcs_middleware.layers.auth`, the admission engine's namespace labels): ``max_age`` is
  how long a change made in the store (new credentials, a revoked permission) may go unseen by
  a worker, however often the entry is used — :meth:`Cache.load`;
* pure functions of their argument remembered (a parsed path, a classified request line, a
  scan of an environ's keys): a ``loader`` and only ``max_entries``. When the key is a
  client's (header names up to the server's field-size limit), ``admit`` keeps the large ones
  out: they are computed every time instead of remembered, which bounds the memory.

Every method is safe to call from any thread. The loader runs outside the lock: two threads
missing the same key at once both load it (the second answer is kept), and a slow load never
holds up the hits of other keys.

A hit of :meth:`load` takes no lock: it reads the table once (one ``dict`` lookup, atomic in
CPython) and changes nothing of the table's order. Under gevent the lock is a greenlet lock
written in Python, and these lookups come several times per request. So a remembered function's
recency is kept the CLOCK way (a "referenced" mark set on a hit; an entry due for eviction that
carries the mark is spared once and moved to the back) — the usual approximation of least
recently used that needs nothing from the reader but a flag.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Expired entries are looked for at most this often (seconds) when nothing is put: an idle
# connection is released on time even when no new one comes.
_PRUNE_EVERY = 1.0


class _Entry(Generic[V]):
    __slots__ = ("put_at", "referenced", "used_at", "value")

    def __init__(self, value: V, now: float) -> None:
        self.value = value
        self.used_at = now
        self.put_at = now
        self.referenced = False


class Cache(Generic[K, V]):
    """A least-recently-used table (see the module docs).

    :param max_entries: entries kept at most; the least recently used go first (for the hits
        of :meth:`load`, nearly: see the module docs).
    :param ttl: seconds an entry may go unused before it is dropped; ``None``: never.
    :param max_age: seconds after it was put that an entry is dropped however it is used;
        ``None``: never; ``0``: nothing is kept (every :meth:`load` loads).
    :param loader: what :meth:`load` calls on a miss when it is given no loader of its own.
    :param admit: whether a key may be remembered (a size guard for keys a client chose);
        a key refused is loaded every time.
    :param on_evict: called with ``(key, value)`` for every entry dropped by a bound (not for
        :meth:`pop` or :meth:`clear`, whose caller has the values).
    :param clock: seconds, monotonic (tests drive it by hand).
    """

    def __init__(self, *, max_entries: int, ttl: float | None = None, max_age: float | None = None,
                 loader: Callable[[K], V] | None = None, admit: Callable[[K], bool] | None = None,
                 on_evict: Callable[[K, V], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.ttl = ttl
        self.max_age = max_age
        self._loader = loader
        self._admit = admit
        self._on_evict = on_evict
        self._clock = clock
        self._timed = ttl is not None or max_age is not None
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._next_prune = 0.0
        # Not re-entrant: on_evict is called after the lock is released (it may close sockets,
        # or use this cache), and a plain lock is what gevent makes cheap.
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value for ``key`` (now the most recently used), or ``None``."""
        now = self._clock() if self._timed else 0.0
        evicted: list[tuple[K, V]] = []
        value: V | None = None
        with self._lock:
            if self._timed and now >= self._next_prune:
                self._prune(now, evicted)
            entry = self._entries.get(key)
            if entry is not None:
                if self._expired(entry, now):
                    self._evict(key, evicted)
                else:
                    entry.used_at = now
                    self._entries.move_to_end(key)
                    value = entry.value
        if evicted:
            self._tell(evicted)
        return value

    def load(self, key: K, loader: Callable[[K], V] | None = None) -> V:
        """The value for ``key``; on a miss ``loader(key)`` (default: the cache's), remembered
        unless ``admit`` refuses the key or ``max_age`` is 0."""
        entry = self._entries.get(key)  # no lock (module docs)
        if entry is not None:
            if not self._timed:
                entry.referenced = True
                return entry.value
            # Kept max_age after it was loaded however often it is used: recency untouched.
            if self.max_age is None or self._clock() - entry.put_at <= self.max_age:
                return entry.value
        load = loader or self._loader
        if load is None:
            raise TypeError("Cache.load needs a loader")
        value = load(key)
        if self.max_age != 0 and (self._admit is None or self._admit(key)):
            self.put(key, value)
        return value

    def __call__(self, key: K) -> V:
        """``load(key)`` with the cache's loader: a cache with a loader is a bounded memoized
        function."""
        return self.load(key)

    def peek(self, key: K) -> V | None:
        """The value for ``key`` without marking it used or checking its age (cheap values that
        age out after ``ttl`` and are put again by their user)."""
        entry = self._entries.get(key)  # one dict read: atomic, no lock needed
        return None if entry is None else entry.value

    def fresh(self, key: K) -> tuple[V] | None:
        """``(value,)`` when ``key`` is held and younger than ``max_age``, else ``None`` (for
        tables whose values may be ``None``); recency is untouched."""
        entry = self._entries.get(key)
        if entry is None or (self.max_age is not None and self._clock() - entry.put_at > self.max_age):
            return None
        return (entry.value,)

    def put(self, key: K, value: V) -> None:
        """Set ``key`` (most recently used), then drop what is over a bound."""
        now = self._clock()
        evicted: list[tuple[K, V]] = []
        with self._lock:
            self._entries[key] = _Entry(value, now)
            self._entries.move_to_end(key)
            self._prune(now, evicted)
        if evicted:
            self._tell(evicted)

    def pop(self, key: K) -> V | None:
        """Remove ``key`` and return its value (``on_evict`` is not called)."""
        with self._lock:
            entry = self._entries.pop(key, None)
        return None if entry is None else entry.value

    def forget(self, key: K) -> None:
        """Drop ``key``: the next :meth:`load` loads it again."""
        self.pop(key)

    def clear(self) -> list[V]:
        """Remove every entry and return the values (``on_evict`` is not called)."""
        with self._lock:
            values = [entry.value for entry in self._entries.values()]
            self._entries.clear()
        return values

    def values(self) -> list[V]:
        """The values now held (a copy)."""
        with self._lock:
            return [entry.value for entry in self._entries.values()]

    def held_keys(self) -> list[K]:
        """The keys now held (a copy: safe to pop while looping over it)."""
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def prune(self) -> None:
        """Drop what is over a bound now (:meth:`put` also does; :meth:`get` drops what it finds
        expired)."""
        now = self._clock()
        evicted: list[tuple[K, V]] = []
        with self._lock:
            self._prune(now, evicted)
        if evicted:
            self._tell(evicted)

    def _expired(self, entry: _Entry[V], now: float) -> bool:
        return ((self.ttl is not None and now - entry.used_at > self.ttl)
                or (self.max_age is not None and now - entry.put_at > self.max_age))

    def _prune(self, now: float, evicted: list[tuple[K, V]]) -> None:
        # Entries are in recency order (put and get move one to the end; load and fresh do
        # not): the idle, the oldest and the surplus are at the front. An expired entry behind
        # a live one is dropped when it is read, or pushed out by the count.
        entries = self._entries
        while entries:
            key, entry = next(iter(entries.items()))
            if len(entries) <= self.max_entries and not self._expired(entry, now):
                break
            if entry.referenced and not self._timed:
                entry.referenced = False  # used since it last came to the front: spared once
                entries.move_to_end(key)
                continue
            self._evict(key, evicted)
        self._next_prune = now + _PRUNE_EVERY

    def _evict(self, key: K, evicted: list[tuple[K, V]]) -> None:
        entry = self._entries.pop(key)
        if self._on_evict is not None:
            evicted.append((key, entry.value))

    def _tell(self, evicted: list[tuple[K, V]]) -> None:
        """Call ``on_evict`` for what a bound dropped, outside the lock."""
        on_evict = self._on_evict
        assert on_evict is not None
        for key, value in evicted:
            on_evict(key, value)
