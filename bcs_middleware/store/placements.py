"""Which process holds a cluster's agent tunnel (agent placements, with a heartbeat).

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ..core.records import Holder, PlacementRecord
from . import models as m
from .rows import IN_BATCH, Repository, aware, utcnow


class PlacementRepository(Repository):
    """Which process holds a cluster's agent tunnel (agent placements, with a heartbeat)."""

    @staticmethod
    def _placement(row: Any) -> PlacementRecord:
        return PlacementRecord(str(row.cluster_id), str(row.holder_id), row.peer_address, row.peer_fingerprint,
                               aware(row.connected_at), aware(row.seen_at))  # type: ignore[arg-type]

    def put_placement(self, cluster_id: str, holder: Holder) -> PlacementRecord:
        """Record that ``holder`` holds ``cluster_id``'s agent now (the newest connection wins)."""
        now = utcnow()
        values = {"holder_id": holder.id, "peer_address": holder.peer_address,
                  "peer_fingerprint": holder.peer_fingerprint, "connected_at": now, "seen_at": now}
        table = m.agent_placements
        with self.db.transaction() as conn:
            changed = conn.execute(update(table).where(table.c.cluster_id == cluster_id).values(**values)).rowcount
            if not changed:
                try:
                    with conn.begin_nested():
                        conn.execute(insert(table).values(cluster_id=cluster_id, **values))
                except IntegrityError:
                    # Another process inserted first (or the cluster is gone): last writer wins.
                    conn.execute(update(table).where(table.c.cluster_id == cluster_id).values(**values))
        return PlacementRecord(cluster_id, holder.id, holder.peer_address, holder.peer_fingerprint, now, now)

    def clear_placement(self, cluster_id: str, holder_id: str) -> bool:
        """Forget ``cluster_id``'s placement if ``holder_id`` still holds it (a newer holder stays)."""
        table = m.agent_placements
        with self.db.transaction() as conn:
            return bool(conn.execute(
                delete(table).where(table.c.cluster_id == cluster_id, table.c.holder_id == holder_id)
            ).rowcount)

    def get_placement(self, cluster_id: str) -> PlacementRecord | None:
        table = m.agent_placements
        with self.db.connection() as conn:
            row = conn.execute(select(table).where(table.c.cluster_id == cluster_id)).first()
        return self._placement(row) if row else None

    def touch_placements(self, holder_id: str) -> int:
        """The holder's heartbeat: mark every placement it holds as seen now."""
        table = m.agent_placements
        with self.db.transaction() as conn:
            return int(conn.execute(
                update(table).where(table.c.holder_id == holder_id).values(seen_at=utcnow())
            ).rowcount)

    def adopt_placements(self, cluster_ids: list[str], holder: Holder, *, stale_after: float) -> int:
        """Record ``holder`` for those of ``cluster_ids`` nobody live holds: no placement, or one
        whose heartbeat is older than ``stale_after`` seconds. A live holder's stays (several
        workers hold connections of one agent; one placement names any of them)."""
        if not cluster_ids:
            return 0
        now = utcnow()
        stale = now - timedelta(seconds=stale_after)
        values = {"holder_id": holder.id, "peer_address": holder.peer_address,
                  "peer_fingerprint": holder.peer_fingerprint, "connected_at": now, "seen_at": now}
        table = m.agent_placements
        adopted = 0
        with self.db.transaction() as conn:
            placed: dict[str, Any] = {}
            for start in range(0, len(cluster_ids), IN_BATCH):
                batch = cluster_ids[start:start + IN_BATCH]
                placed.update((row.cluster_id, row.seen_at) for row in conn.execute(
                    select(table.c.cluster_id, table.c.seen_at).where(table.c.cluster_id.in_(batch))))
            for cluster_id in cluster_ids:
                seen = placed.get(cluster_id)
                if seen is None:
                    try:
                        with conn.begin_nested():
                            conn.execute(insert(table).values(cluster_id=cluster_id, **values))
                        adopted += 1
                    except IntegrityError:  # placed meanwhile by another process, or the cluster is gone
                        pass
                elif (aware(seen) or now) < stale:
                    adopted += conn.execute(update(table).where(
                        table.c.cluster_id == cluster_id, table.c.seen_at == seen).values(**values)).rowcount
        return adopted
