"""The counts and buckets the workers of one instance share: a fixed table in a shared file.

A user's limits are the user's across the instance, whichever worker its connections land on:
gunicorn hands connections to whichever worker accepts first, and a client that keeps one
connection alive (kubectl, client-go) has every request served by one worker. A per-worker
share of a limit would give such a client ``1/workers`` of what it is allowed (measured in
``bench/README.md``). So the state is one table in a file every worker maps
(``mmap``, ``MAP_SHARED``), changed under a lock (``fcntl`` record lock between processes,
a ``threading`` lock between a worker's threads or greenlets); a critical section is a few
reads and writes, no I/O, so a gevent worker never yields holding it.

Layout: ``slots`` entries, found by open addressing over a 128-bit digest of the key
(``user:alice``, ``group:ops``, ``cluster:c1``). Each holds a token bucket (tokens, the time
they were counted, the time it is full again), the totals in flight (ordinary and
long-running) and the same counts per worker column. A worker takes a column when it
first counts (one whose process is gone, or a free one) and, taking it, subtracts what the
dead process left counted from the totals: a worker killed mid-request does not hold a
user's seats forever. A slot whose counts are zero and whose bucket is full is free to
be taken by another key, so the table holds only what is in use; when a key finds no
slot (every one in its probe window busy), it is admitted uncounted and
:attr:`CounterTable.overflows` says so.

Without a shared directory (a gateway not run by ``serve``, one process) the table is an
ordinary in-memory buffer with the same code.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

from ..core.cache import Cache
from ..core.forksafe import PerProcess, process_alive

__all__ = ["BUCKET", "INFLIGHT", "LONG_RUNNING", "OK", "CounterTable", "key_digest"]

INFLIGHT = 0
LONG_RUNNING = 1
#: :meth:`CounterTable.admit`'s answers besides the index of the refusing claim.
OK = -1
BUCKET = -2

_MAGIC = b"bcslim01"
_HEADER = struct.Struct("<8sqq")  # magic, slots, workers
_PROBE = 32
_FLOATS = 3  # tokens, counted_at, full_at
_EMPTY = bytes(16)


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).digest()


_digests: Cache[str, bytes] = Cache(max_entries=8192, loader=_digest, admit=lambda key: len(key) <= 512)


def key_digest(key: str) -> bytes:
    """The table's key for ``key`` (a ``kind:name`` string); never all zeros."""
    digest = _digests.load(key)
    return digest if digest != _EMPTY else b"\x01" + digest[1:]


class _Mapped:
    """One process's view of the table: the mapping, its lock and its worker column."""

    def __init__(self, path: Path | None, slots: int, workers: int) -> None:
        self.size = _HEADER.size + workers * 8 + slots * (16 + _FLOATS * 8 + 2 * 8 + workers * 2 * 8)
        self.fd: int | None = None
        if path is None:
            self.buffer: mmap.mmap | bytearray = bytearray(self.size)
        else:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            if os.fstat(self.fd).st_size < self.size:
                os.ftruncate(self.fd, self.size)
            self.buffer = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED)
        self.local = threading.Lock()
        self.slots, self.workers = slots, workers
        view = memoryview(self.buffer)
        offset = _HEADER.size
        self.pids = view[offset:offset + workers * 8].cast("q")
        offset += workers * 8
        self.keys = view[offset:offset + slots * 16]
        offset += slots * 16
        self.floats = view[offset:offset + slots * _FLOATS * 8].cast("d")
        offset += slots * _FLOATS * 8
        self.totals = view[offset:offset + slots * 2 * 8].cast("q")
        offset += slots * 2 * 8
        self.columns = view[offset:offset + workers * slots * 2 * 8].cast("q")
        self.column = -1
        # Where this process last found each key: checked against the slot's key before use
        # (another key may have taken the slot since), so it only saves the probing.
        self.found: dict[bytes, int] = {}
        with self:
            magic, have_slots, have_workers = _HEADER.unpack_from(self.buffer, 0)
            if magic != _MAGIC:
                _HEADER.pack_into(self.buffer, 0, _MAGIC, slots, workers)
            elif (have_slots, have_workers) != (slots, workers):
                raise ValueError(f"the limits table {path} has another shape ({have_slots} slots, "
                                 f"{have_workers} workers); another server uses it")

    def __enter__(self) -> None:
        self.local.acquire()
        if self.fd is not None:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)
            except BaseException:
                self.local.release()
                raise

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
        self.local.release()

    def own_column(self) -> int:
        """This process's worker column (taken on first use, under the lock)."""
        if self.column >= 0:
            return self.column
        pid = os.getpid()
        chosen = -1
        for index in range(self.workers):
            holder = self.pids[index]
            if holder == pid:
                chosen = index
                break
            if chosen < 0 and (holder == 0 or not process_alive(holder)):
                chosen = index
        if chosen < 0:
            raise RuntimeError(f"the limits table has no column left for another worker ({self.workers})")
        self._clear_column(chosen)
        self.pids[chosen] = pid
        self.column = chosen
        return chosen

    def _clear_column(self, column: int) -> None:
        base = column * self.slots * 2
        columns, totals = self.columns, self.totals
        for index in range(self.slots * 2):
            left = columns[base + index]
            if left:
                totals[index] -= left
                columns[base + index] = 0


class CounterTable:
    """Token buckets and in-flight counts shared by one instance's workers (see the module docs).

    :param path: the shared file (made 0600 if missing); ``None``: this process's memory only.
    :param slots: keys held at once (users, groups and clusters with something counted).
    :param workers: worker processes that may count at once (their columns).
    """

    def __init__(self, path: Path | None, *, slots: int = 16384, workers: int = 64) -> None:
        self.path = path
        self.slots = slots
        self._mapped = PerProcess(lambda: _Mapped(path, slots, workers))
        #: Keys admitted uncounted because their probe window was full (a metric reads it).
        self.overflows = 0
        self._mapped.get()  # the file's shape is checked at start, not on a first request

    def _slot(self, table: _Mapped, key: bytes, now: float) -> int:
        """The slot of ``key``, taken if it has none; ``-1`` when none can be taken."""
        slot, free = self._scan(table, key, now)
        if slot < 0 and free >= 0:
            slot = free
            table.keys[slot * 16:(slot + 1) * 16] = key
            table.floats[slot * _FLOATS] = -1.0  # a full bucket, whatever its size
            table.floats[slot * _FLOATS + 1] = now
            table.floats[slot * _FLOATS + 2] = now
        if slot >= 0:
            if len(table.found) >= 2 * self.slots:
                table.found.clear()
            table.found[key] = slot
        return slot

    def _find(self, table: _Mapped, key: bytes) -> int:
        """The slot of ``key``, ``-1`` when it has none."""
        return self._scan(table, key, None)[0]

    def _scan(self, table: _Mapped, key: bytes, now: float | None) -> tuple[int, int]:
        """``key``'s slot (``-1``: none) and, with ``now``, the first slot it may take (``-1``: none:
        an empty one, or one whose counts are zero and whose bucket is full by ``now``)."""
        known = table.found.get(key)
        if known is not None and table.keys[known * 16:(known + 1) * 16] == key:
            return known, -1
        start = int.from_bytes(key[:8], "little") % self.slots
        free = -1
        for step in range(_PROBE):
            slot = (start + step) % self.slots
            held = table.keys[slot * 16:(slot + 1) * 16]
            if held == key:
                return slot, -1
            if held == _EMPTY:
                return -1, slot if free < 0 else free
            if now is not None and free < 0 and table.totals[2 * slot] == 0 and table.totals[2 * slot + 1] == 0 \
                    and table.floats[slot * _FLOATS + 2] <= now:
                free = slot
        return -1, free

    def admit(self, now: float, bucket: tuple[bytes, float, int] | None, kind: int,
              claims: Sequence[tuple[bytes, int | None]]) -> tuple[int, float]:
        """Take a token from ``bucket`` (key, rate, burst) and count one ``kind`` request
        against each claim (key, cap) — all or nothing, under one lock.

        :returns: ``(OK, 0)``; ``(BUCKET, seconds until a token)`` when the bucket is empty;
            or ``(i, 0)`` when claim ``i`` is at its cap. Refused, nothing is taken or counted.
        """
        table = self._mapped.get()
        with table:
            column = table.own_column()
            token = -1
            if bucket is not None:
                token, wait = self._refill(table, now, *bucket)
                if wait > 0:
                    return BUCKET, wait
            slots: list[int] = []
            for key, cap in claims:
                slot = self._slot(table, key, now)
                if slot >= 0 and cap is not None and table.totals[2 * slot + kind] >= cap:
                    return len(slots), 0.0
                slots.append(slot)
            if token >= 0:
                self._take(table, token, now, *bucket[1:])  # type: ignore[index]
            base = column * self.slots * 2
            for slot in slots:
                if slot < 0:
                    self.overflows += 1
                    continue
                table.totals[2 * slot + kind] += 1
                table.columns[base + 2 * slot + kind] += 1
        return OK, 0.0

    def _refill(self, table: _Mapped, now: float, key: bytes, rate: float, burst: int) -> tuple[int, float]:
        """The bucket's slot with its tokens counted up to ``now``, and the seconds until it holds
        one (``0``: it does); slot ``-1`` when the table has no room (admitted uncounted)."""
        slot = self._slot(table, key, now)
        if slot < 0:
            self.overflows += 1
            return -1, 0.0
        at = slot * _FLOATS
        tokens, counted = table.floats[at], table.floats[at + 1]
        tokens = float(burst) if tokens < 0 else min(float(burst), tokens + max(0.0, now - counted) * rate)
        table.floats[at], table.floats[at + 1] = tokens, now
        return slot, (0.0 if tokens >= 1.0 else (1.0 - tokens) / rate)

    def _take(self, table: _Mapped, slot: int, now: float, rate: float, burst: int) -> None:
        at = slot * _FLOATS
        tokens = table.floats[at] - 1.0
        table.floats[at] = tokens
        table.floats[at + 2] = now + (burst - tokens) / rate

    def release(self, kind: int, keys: Sequence[bytes]) -> None:
        """Count one ``kind`` request less for each of ``keys`` (those :meth:`admit` counted)."""
        table = self._mapped.get()
        with table:
            base = table.own_column() * self.slots * 2
            for key in keys:
                slot = self._find(table, key)
                if slot < 0:
                    continue
                at = base + 2 * slot + kind
                if table.columns[at] > 0:  # a column cleared meanwhile is not counted twice
                    table.columns[at] -= 1
                    table.totals[2 * slot + kind] -= 1


    def counts(self, key: bytes) -> tuple[int, int]:
        """``(in flight, long-running)`` of ``key`` across the instance (tests, the status page)."""
        table = self._mapped.get()
        with table:
            slot = self._find(table, key)
            return (0, 0) if slot < 0 else (table.totals[2 * slot], table.totals[2 * slot + 1])
