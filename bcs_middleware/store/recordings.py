"""Recorded exec/attach sessions in the database (``recording_store = database``).

One aggregate of the SQL store over the process's :class:`~.database.Database`: each session's
description in ``session_recordings`` and its asciicast text in ``session_recording_chunks``,
appended as the session runs. Every instance sharing the database lists and serves every
recording; any of them prunes (deleting is idempotent, so two pruning at once do no harm).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from ..core.errors import ServiceUnavailable
from ..recording.catalog import RecordingUnavailable, SessionInfo, SessionQuery
from ..recording.retention import Retention, Stored, doomed
from . import models as m
from .rows import Repository, aware

__all__ = ["RecordingRepository"]

log = logging.getLogger(__name__)

_READ_CHUNKS = 16


def _info(row: Any) -> SessionInfo:
    info = SessionInfo.from_json(dict(row.info))
    return info.ended(started_at=aware(row.started_at), ended_at=aware(row.ended_at), size=int(row.size))


class _DatabaseSink:
    def __init__(self, repo: RecordingRepository, session_id: str) -> None:
        self._repo = repo
        self._id = session_id
        self._seq = 0
        self._size = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8")
        table = m.session_recording_chunks
        try:
            with self._repo.db.transaction() as conn:
                conn.execute(insert(table).values(recording_id=self._id, seq=self._seq, data=data))
                conn.execute(update(m.session_recordings).where(m.session_recordings.c.id == self._id)
                             .values(size=self._size + len(data)))
        except ServiceUnavailable:
            raise RecordingUnavailable(f"writing recording {self._id}: the database is unavailable") from None
        self._seq += 1
        self._size += len(data)

    def close(self, info: SessionInfo) -> None:
        self._repo.describe(info.ended(size=self._size))


class RecordingRepository(Repository):
    """Recordings in the database (the :class:`~bcs_middleware.recording.catalog.RecordingStore` interface)."""

    def create(self, info: SessionInfo) -> _DatabaseSink:
        try:
            with self.db.transaction() as conn:
                conn.execute(insert(m.session_recordings).values(
                    id=info.id, cluster_id=info.cluster_id, user_name=info.user, started_at=info.started_at,
                    ended_at=None, status=info.status, size=0, info=info.as_json()))
        except ServiceUnavailable:
            raise RecordingUnavailable("recording store: the database is unavailable") from None
        return _DatabaseSink(self, info.id)

    def describe(self, info: SessionInfo) -> None:
        try:
            with self.db.transaction() as conn:
                conn.execute(update(m.session_recordings).where(m.session_recordings.c.id == info.id).values(
                    ended_at=info.ended_at, status=info.status, size=info.size, info=info.as_json()))
        except ServiceUnavailable:
            raise RecordingUnavailable("recording store: the database is unavailable") from None

    def sessions(self, query: SessionQuery) -> list[SessionInfo]:
        t = m.session_recordings
        stmt = select(t).order_by(t.c.started_at.desc()).limit(query.limit)
        if query.cluster_id is not None:
            stmt = stmt.where(t.c.cluster_id == query.cluster_id)
        if query.user is not None:
            stmt = stmt.where(t.c.user_name == query.user)
        if query.until is not None:
            stmt = stmt.where(t.c.started_at <= query.until)
        if query.since is not None:
            stmt = stmt.where(func.coalesce(t.c.ended_at, t.c.started_at) >= query.since)
        if query.clusters is not None:
            if not query.clusters:
                return []
            stmt = stmt.where(t.c.cluster_id.in_(sorted(query.clusters)))
        with self.db.connection() as conn:
            return [_info(row) for row in conn.execute(stmt).all()]

    def get(self, session_id: str) -> SessionInfo | None:
        with self.db.connection() as conn:
            row = conn.execute(select(m.session_recordings).where(m.session_recordings.c.id == session_id)).first()
        return _info(row) if row is not None else None

    def read(self, session_id: str) -> Iterator[bytes]:
        """The chunks in order, a few per query (a recording of any size is never held whole)."""
        t = m.session_recording_chunks
        seq = -1
        while True:
            with self.db.connection() as conn:
                rows = conn.execute(select(t.c.seq, t.c.data).where(t.c.recording_id == session_id, t.c.seq > seq)
                                    .order_by(t.c.seq).limit(_READ_CHUNKS)).all()
            if not rows:
                return
            for row in rows:
                yield bytes(row.data)
                seq = row.seq

    def in_progress(self) -> list[SessionInfo]:
        t = m.session_recordings
        with self.db.connection() as conn:
            rows = conn.execute(select(t).where(t.c.status == "recording")).all()
        return [_info(row).ended(heartbeat_at=aware(row.heartbeat_at)) for row in rows]

    def heartbeat(self, session_ids: Sequence[str], now: datetime) -> None:
        if not session_ids:
            return
        t = m.session_recordings
        try:
            with self.db.transaction() as conn:
                conn.execute(update(t).where(t.c.id.in_(list(session_ids)), t.c.status == "recording")
                             .values(heartbeat_at=now))
        except ServiceUnavailable:
            log.warning("heartbeat of %d recordings: the database is unavailable", len(session_ids))

    def interrupt(self, info: SessionInfo) -> None:
        # Each chunk was written whole in its own transaction: nothing to trim.
        t = m.session_recordings
        try:
            with self.db.transaction() as conn:
                # Only a session still marked recording: a writer that was slow, not dead, may
                # have closed it meanwhile, and its own description wins.
                conn.execute(update(t).where(t.c.id == info.id, t.c.status == "recording").values(
                    ended_at=info.ended_at, status=info.status, size=info.size, info=info.as_json()))
        except ServiceUnavailable:
            raise RecordingUnavailable("recording store: the database is unavailable") from None

    def prune(self, *, now: datetime, retention: Retention) -> int:
        t = m.session_recordings
        with self.db.connection() as conn:
            rows = conn.execute(select(t.c.id, t.c.user_name, t.c.status, t.c.ended_at, t.c.started_at,
                                       t.c.size)).all()
        stored = [Stored(row.id, row.user_name, int(row.size),
                         None if row.status == "recording" else aware(row.ended_at or row.started_at))
                  for row in rows]
        ids = doomed(stored, now=now, retention=retention)
        for at in range(0, len(ids), 500):
            batch = ids[at:at + 500]
            with self.db.transaction() as conn:
                conn.execute(delete(m.session_recording_chunks).where(
                    m.session_recording_chunks.c.recording_id.in_(batch)))
                conn.execute(delete(t).where(t.c.id.in_(batch)))
        return len(ids)
