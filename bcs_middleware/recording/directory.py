"""Recordings as files: ``ID.cast`` (asciicast v2, plays in ``asciinema`` as it is) and ``ID.json``
(the session's description) in one directory, both 0600 in a 0700 directory.

The default store: one instance, or instances sharing the directory over a network file system.
Instances with a database of their own use :mod:`.database` instead.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from .catalog import RecordingUnavailable, SessionInfo, SessionQuery
from .retention import Retention, Stored, doomed

__all__ = ["DirectoryStore"]

log = logging.getLogger(__name__)

#: A recording's id: what the recorder makes (uuid4 hex). Anything else names no file.
ID = re.compile(r"^[0-9a-f]{32}$")
_READ = 256 * 1024


class _FileSink:
    def __init__(self, store: DirectoryStore, session_id: str, fh: IO[bytes]) -> None:
        self._store = store
        self._id = session_id
        self._fh = fh

    def write(self, text: str) -> None:
        try:
            self._fh.write(text.encode("utf-8"))
            self._fh.flush()
        except (OSError, ValueError) as exc:
            raise RecordingUnavailable(f"writing recording {self._id}: {_reason(exc)}") from None

    def close(self, info: SessionInfo) -> None:
        try:
            self._fh.close()
        except OSError as exc:
            log.warning("closing recording %s: %s", self._id, _reason(exc))
        size = self._store.cast_path(self._id).stat().st_size if self._store.cast_path(self._id).exists() else 0
        self._store.describe(info.ended(size=size))


class DirectoryStore:
    """Recordings in ``directory`` (created 0700 on first use).

    :param directory: where the files go.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def cast_path(self, session_id: str) -> Path:
        return self.directory / f"{session_id}.cast"

    def _meta_path(self, session_id: str) -> Path:
        return self.directory / f"{session_id}.json"

    def create(self, info: SessionInfo) -> _FileSink:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.cast_path(info.id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise RecordingUnavailable(f"recording directory {self.directory}: {_reason(exc)}") from None
        fh = os.fdopen(fd, "wb")
        try:
            self.describe(info)
        except RecordingUnavailable:
            fh.close()
            raise
        return _FileSink(self, info.id, fh)

    def describe(self, info: SessionInfo) -> None:
        """Write the session's description (atomically: a reader never sees half of it)."""
        path = self._meta_path(info.id)
        tmp = path.with_suffix(".json.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(info.as_json(), fh)
            os.replace(tmp, path)
        except OSError as exc:
            raise RecordingUnavailable(f"recording directory {self.directory}: {_reason(exc)}") from None

    def get(self, session_id: str) -> SessionInfo | None:
        if not ID.match(session_id):
            return None
        try:
            return SessionInfo.from_json(json.loads(self._meta_path(session_id).read_text("utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def _all(self) -> list[SessionInfo]:
        found = []
        try:
            paths = list(self.directory.glob("*.json"))
        except OSError:
            return []
        for path in paths:
            info = self.get(path.stem)
            if info is not None:
                found.append(info)
        return found

    def sessions(self, query: SessionQuery) -> list[SessionInfo]:
        found = [info for info in self._all() if query.matches(info)]
        found.sort(key=lambda info: info.started_at, reverse=True)
        return found[:query.limit]

    def read(self, session_id: str) -> Iterator[bytes]:
        if not ID.match(session_id):
            raise FileNotFoundError(session_id)
        fh = open(self.cast_path(session_id), "rb")  # noqa: SIM115 -- closed by the generator

        def pieces() -> Iterator[bytes]:
            with fh:
                while piece := fh.read(_READ):
                    yield piece

        return pieces()

    def _delete(self, session_id: str) -> None:
        for path in (self.cast_path(session_id), self._meta_path(session_id)):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def in_progress(self) -> list[SessionInfo]:
        """Sessions still marked ``recording``; the ``.cast`` file's modification time is the
        last heartbeat (every write and every :meth:`heartbeat` sets it)."""
        found = []
        for info in self._all():
            if info.status != "recording":
                continue
            try:
                stat = self.cast_path(info.id).stat()
            except OSError:
                found.append(info)
                continue
            found.append(info.ended(size=stat.st_size,
                                    heartbeat_at=datetime.fromtimestamp(stat.st_mtime, UTC)))
        return found

    def interrupt(self, info: SessionInfo) -> None:
        path = self.cast_path(info.id)
        try:
            with open(path, "r+b") as fh:
                size = fh.seek(0, os.SEEK_END)
                # asciicast v2 is one JSON value a line: a line cut short by the crash would
                # stop a player, so the file ends at its last newline.
                tail = min(size, 64 * 1024)
                fh.seek(size - tail)
                last = fh.read(tail).rfind(b"\n")
                keep = size - tail + last + 1 if last >= 0 else (0 if tail == size else size)
                if keep != size:
                    fh.truncate(keep)
                size = keep
        except FileNotFoundError:
            size = 0
        except OSError as exc:
            raise RecordingUnavailable(f"recording {info.id}: {_reason(exc)}") from None
        self.describe(info.ended(size=size))

    def heartbeat(self, session_ids: Sequence[str], now: datetime) -> None:
        stamp = now.timestamp()
        for session_id in session_ids:
            try:
                os.utime(self.cast_path(session_id), (stamp, stamp))
            except OSError as exc:
                log.warning("heartbeat of recording %s: %s", session_id, _reason(exc))

    def prune(self, *, now: datetime, retention: Retention) -> int:
        stored = [Stored(info.id, info.user, self._size(info.id),
                         None if info.status == "recording" else info.ended_at or info.started_at)
                  for info in self._all()]
        ids = doomed(stored, now=now, retention=retention)
        for session_id in ids:
            self._delete(session_id)
        return len(ids)

    def _size(self, session_id: str) -> int:
        try:
            return self.cast_path(session_id).stat().st_size
        except OSError:
            return 0


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__
