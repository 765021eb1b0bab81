"""A durable, bounded, append-only spool of audit events: what a backend has not delivered yet.

One spool is a folder (a *slot*) that one process owns through an exclusive ``flock`` on its
``lock`` file for as long as it runs:

* ``NNNNNNNNNNNN.seg`` — segment files, appended only. A record is ``length`` and
  ``CRC-32`` (4 bytes each, big-endian) and then the event's JSON. A new segment starts
  when the current one would pass ``segment_bytes``;
* ``cursor`` — ``SEGMENT OFFSET``: where the first record not yet delivered starts.
  Replaced atomically (write, fsync, rename) after every delivery; a segment wholly
  before it is deleted.

**Bounded.** The segment files together never pass ``max_bytes``: a record that would
is dropped (and counted by the caller), never an older one — what is spooled is delivered.

**Durable.** With ``fsync`` each appended batch is on disk when :meth:`Spool.append`
returns, and so is each cursor; without it a process crash loses nothing (the page cache
holds it) but a machine crash may. A record cut short by a crash (its length or CRC does
not check out) ends its segment: it and anything after it in that segment are dropped,
counted, when the spool is opened.

**Once.** The cursor moves past a record only after its backend confirmed it
(:meth:`ack`), and only this process reads or moves it: after a restart the new owner
resumes at the cursor. A crash between a delivery and the cursor's rename is the one way a
record is delivered twice.

**Slots.** Each process of a server writes its own slot (:meth:`Spool.claim`: the first
whose lock is free). A process that restarts finds its predecessor's slot free and takes it;
a slot left over by a process that did not come back (fewer workers, a crashed server) is
drained by any live process that finds it unlocked (:func:`orphans`). Order is kept per slot
— per writing process — which is the order its requests were answered.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import struct
import sys
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["Spool", "SpoolLimits", "orphans"]

_HEADER = struct.Struct(">II")
_SEGMENT = re.compile(r"^(\d{12})\.seg$")
_CURSOR = "cursor"
_LOCK = "lock"
#: Slots a backend's spool folder may hold (a bound on what a crash loop can leave behind).
MAX_SLOTS = 256


@dataclass(frozen=True)
class SpoolLimits:
    """:param max_bytes: the segment files' total size at most.
    :param segment_bytes: a segment's size at which the next record starts a new one.
    :param fsync: make each append and each cursor durable before returning."""

    max_bytes: int = 256 * 1024 * 1024
    segment_bytes: int = 8 * 1024 * 1024
    fsync: bool = True


def _segment_name(number: int) -> str:
    return f"{number:012d}.seg"


def _fsync(fd: int) -> None:
    """``fsync`` without holding up the process: under the gevent worker it runs on gevent's
    thread pool, so the other greenlets (requests) go on meanwhile; it takes milliseconds."""
    monkey = sys.modules.get("gevent.monkey")  # a process gevent never patched never imported it
    if monkey is not None and monkey.is_module_patched("threading"):
        import gevent

        gevent.get_hub().threadpool.apply(os.fsync, (fd,))
    else:
        os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def _try_lock(directory: Path) -> int | None:
    """An exclusive lock on ``directory``'s lock file, or ``None`` when another process holds it."""
    fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class Spool:
    """One slot's segments and cursor, owned by this process (see the module docs).

    Thread-safe: one thread appends while another reads and acknowledges.

    :param directory: the slot's folder.
    :param lock_fd: the held lock on it (released by :meth:`close`).
    :param limits: size bound, segment size, fsync policy.
    """

    def __init__(self, directory: Path, lock_fd: int, limits: SpoolLimits) -> None:
        self.directory = directory
        self.limits = limits
        self._lock_fd: int | None = lock_fd
        self._mutex = threading.Lock()
        self._segments: list[int] = []
        self._sizes: dict[int, int] = {}
        #: records found cut short or corrupt when the spool was opened (dropped).
        self.damaged = 0
        self._open_segments()
        self._cursor = self._read_cursor()
        # Where the reader is: the cursor plus what was read but not acknowledged yet.
        self._read_at = self._cursor
        self._read_ends: list[tuple[int, int]] = []
        self._append_fd: int | None = None
        #: records appended since opened, plus those found pending then; and acknowledged.
        self.appended = self._count_pending()
        self.acked = 0

    # -- opening -----------------------------------------------------------------

    @classmethod
    def claim(cls, root: Path, limits: SpoolLimits) -> Spool:
        """The first slot under ``root`` whose lock is free (a new one when none is)."""
        # The events name users and what they did: the folders are the owner's only.
        root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.mkdir(mode=0o700, exist_ok=True)
        for number in range(MAX_SLOTS):
            directory = root / str(number)
            directory.mkdir(mode=0o700, exist_ok=True)
            fd = _try_lock(directory)
            if fd is not None:
                return cls(directory, fd, limits)
        raise OSError(f"{root}: all {MAX_SLOTS} spool slots are held by running processes")

    def _open_segments(self) -> None:
        numbers = sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _SEGMENT.match(p.name)))
        for number in numbers:
            self._segments.append(number)
            self._sizes[number] = self._check_segment(number)

    def _check_segment(self, number: int) -> int:
        """The size of the segment's intact records; a torn or corrupt tail is cut off."""
        path = self.directory / _segment_name(number)
        good = 0
        with open(path, "rb") as fh:
            data = fh.read()
        while good + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, good)
            end = good + _HEADER.size + length
            if end > len(data) or zlib.crc32(data[good + _HEADER.size:end]) != crc:
                break
            good = end
        if good != len(data):
            self.damaged += 1
            log.warning("audit spool %s: segment %s ends in a damaged record (a crash while writing?); "
                        "%d bytes cut off", self.directory, path.name, len(data) - good)
            with open(path, "r+b") as fh:
                fh.truncate(good)
        return good

    def _read_cursor(self) -> tuple[int, int]:
        try:
            segment, offset = (self.directory / _CURSOR).read_text().split()
            cursor = (int(segment), int(offset))
        except (OSError, ValueError):
            cursor = (self._segments[0], 0) if self._segments else (1, 0)
        if not self._segments:
            return (1, 0)
        if cursor[0] < self._segments[0]:
            cursor = (self._segments[0], 0)
        if cursor[0] in self._sizes and cursor[1] > self._sizes[cursor[0]]:
            cursor = (cursor[0], self._sizes[cursor[0]])
        return cursor

    def _count_pending(self) -> int:
        count = 0
        position = self._cursor
        while True:
            records, position, _ = self._read_from(position, 1 << 30, 1 << 62)
            if not records:
                return count
            count += len(records)

    # -- writing -----------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes in segment files now (what :attr:`SpoolLimits.max_bytes` bounds)."""
        return sum(self._sizes.values())

    def append(self, records: Sequence[bytes]) -> int:
        """Append ``records`` in order; return how many fit under the bound (the rest are dropped)."""
        with self._mutex:
            total = self.size
            frames: list[bytes] = []
            for record in records:
                frame_size = _HEADER.size + len(record)
                if total + frame_size > self.limits.max_bytes:
                    break  # dropped: and so is everything after it, to keep the order whole
                frames.append(_HEADER.pack(len(record), zlib.crc32(record)) + record)
                total += frame_size
            if frames:
                self._write(frames)
                self.appended += len(frames)
            return len(frames)

    def _write(self, frames: list[bytes]) -> None:
        batch: list[bytes] = []
        size = 0
        segment = self._segments[-1] if self._segments else None
        for frame in frames:
            current = self._sizes.get(segment, 0) if segment is not None else 0
            if segment is None or (current + size > 0 and current + size + len(frame) > self.limits.segment_bytes):
                if batch:
                    self._write_segment(segment, batch, size)  # type: ignore[arg-type]
                    batch, size = [], 0
                segment = self._new_segment()
            batch.append(frame)
            size += len(frame)
        if batch:
            self._write_segment(segment, batch, size)  # type: ignore[arg-type]

    def _new_segment(self) -> int:
        number = self._segments[-1] + 1 if self._segments else max(self._cursor[0], 1)
        if self._append_fd is not None:
            os.close(self._append_fd)
            self._append_fd = None
        self._segments.append(number)
        self._sizes[number] = 0
        return number

    def _write_segment(self, segment: int, frames: list[bytes], size: int) -> None:
        if self._append_fd is None or self._segments[-1] != segment:
            path = self.directory / _segment_name(segment)
            self._append_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            if self.limits.fsync:
                _fsync_dir(self.directory)
        data = b"".join(frames)
        view = memoryview(data)
        while view:
            written = os.write(self._append_fd, view)
            view = view[written:]
        if self.limits.fsync:
            _fsync(self._append_fd)
        self._sizes[segment] += size

    # -- reading -----------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Records appended and not acknowledged yet."""
        return self.appended - self.acked

    def read(self, max_records: int, max_bytes: int) -> list[bytes]:
        """Up to ``max_records`` records (at least one, whatever its size) after those read
        already and not acknowledged; ``[]`` when there are none."""
        with self._mutex:
            records, position, ends = self._read_from(self._read_at, max_records, max_bytes)
            self._read_at = position
            self._read_ends.extend(ends)
            return records

    def _read_from(self, position: tuple[int, int], max_records: int,
                   max_bytes: int) -> tuple[list[bytes], tuple[int, int], list[tuple[int, int]]]:
        records: list[bytes] = []
        ends: list[tuple[int, int]] = []
        taken = 0
        segment, offset = position
        while len(records) < max_records:
            size = self._sizes.get(segment)
            if size is None:
                later = [n for n in self._segments if n > segment]
                if not later:
                    break
                segment, offset = later[0], 0
                continue
            if offset >= size:
                if segment == (self._segments[-1] if self._segments else segment):
                    break
                segment, offset = segment + 1, 0
                continue
            with open(self.directory / _segment_name(segment), "rb") as fh:
                fh.seek(offset)
                while len(records) < max_records and offset < size:
                    length, _crc = _HEADER.unpack(fh.read(_HEADER.size))
                    if records and taken + length > max_bytes:
                        return records, (segment, offset), ends
                    records.append(fh.read(length))
                    taken += length
                    offset += _HEADER.size + length
                    ends.append((segment, offset))
        return records, (segment, offset), ends

    def rewind(self) -> None:
        """Forget what was read and not acknowledged: the next :meth:`read` starts at the cursor."""
        with self._mutex:
            self._read_at = self._cursor
            self._read_ends.clear()

    def ack(self, count: int) -> None:
        """The first ``count`` records read and not acknowledged are done: move the cursor past them."""
        if count <= 0:
            return
        with self._mutex:
            cursor = self._read_ends[count - 1]
            del self._read_ends[:count]
            self._cursor = cursor
            self.acked += count
            self._write_cursor(cursor)
            for number in [n for n in self._segments if n < cursor[0]]:
                self._drop_segment(number)
            if self._sizes.get(cursor[0]) == cursor[1]:
                # Everything in the cursor's segment is done: the segment goes, and the
                # cursor moves to the start of the next (made by the next append, if last).
                if cursor[0] == self._segments[-1] and self._append_fd is not None:
                    os.close(self._append_fd)
                    self._append_fd = None
                self._drop_segment(cursor[0])
                self._cursor = cursor = (cursor[0] + 1, 0)
                self._read_at = max(self._read_at, cursor)
                self._write_cursor(cursor)

    def _drop_segment(self, number: int) -> None:
        self._segments.remove(number)
        del self._sizes[number]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / _segment_name(number))

    def _write_cursor(self, cursor: tuple[int, int]) -> None:
        temporary = self.directory / (_CURSOR + ".new")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f"{cursor[0]} {cursor[1]}\n".encode())
            if self.limits.fsync:
                _fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.directory / _CURSOR)

    def close(self) -> None:
        """Close the segment being appended and release the slot."""
        with self._mutex:
            if self._append_fd is not None:
                os.close(self._append_fd)
                self._append_fd = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing the descriptor releases the flock
                self._lock_fd = None


def orphans(root: Path, limits: SpoolLimits) -> Iterator[Spool]:
    """Slots under ``root`` no process holds that still have records: each one locked (the
    caller drains and :meth:`~Spool.close`\\ s it). An empty one is left as it is."""
    if not root.is_dir():
        return
    for directory in sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        if not any(_SEGMENT.match(p.name) for p in directory.iterdir()):
            continue
        fd = _try_lock(directory)
        if fd is None:
            continue
        spool = Spool(directory, fd, limits)
        if spool.pending:
            yield spool
        else:
            spool.close()
