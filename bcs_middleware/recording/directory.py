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
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO

from .catalog import RecordingUnavailable, SessionInfo, SessionQuery

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

    def prune(self, *, now: datetime, max_age: float | None, max_bytes: int | None) -> int:
        finished = sorted((i for i in self._all() if i.status != "recording"),
                          key=lambda info: info.ended_at or info.started_at)
        deleted = 0
        if max_age is not None:
            for info in list(finished):
                if (now - (info.ended_at or info.started_at)).total_seconds() > max_age:
                    self._delete(info.id)
                    finished.remove(info)
                    deleted += 1
        if max_bytes is not None:
            total = sum(self._size(info.id) for info in self._all())
            for info in finished:
                if total <= max_bytes:
                    break
                total -= self._size(info.id)
                self._delete(info.id)
                deleted += 1
        return deleted

    def _size(self, session_id: str) -> int:
        try:
            return self.cast_path(session_id).stat().st_size
        except OSError:
            return 0


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__
