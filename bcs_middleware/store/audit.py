"""The audit trail of management changes, and the revision counters other processes poll.

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import Connection, func, insert, select

from ..core.records import AuditRecord
from . import models as m
from .rows import Repository, aware, bump_revision, utcnow

audit_log = logging.getLogger("bcs_middleware.audit")


class AuditRepository(Repository):
    """The audit trail of management changes, and the revision counters other processes poll."""

    def record_audit(self, actor: str, action: str, target: str, detail: dict[str, Any] | None = None) -> None:
        """Persist and log a management change. ``detail`` must hold no secret."""
        detail = detail or {}
        with self.db.transaction() as conn:
            conn.execute(
                insert(m.audit_log).values(at=utcnow(), actor=actor, action=action, target=target, detail=detail)
            )
        audit_log.info(
            "audit actor=%s action=%s target=%s detail=%s", actor, action, target, json.dumps(detail, sort_keys=True)
        )

    def list_audit(self, limit: int = 100) -> list[AuditRecord]:
        with self.db.connection() as conn:
            rows = conn.execute(select(m.audit_log).order_by(m.audit_log.c.id.desc()).limit(limit)).all()
        return [AuditRecord(r.id, aware(r.at), r.actor, r.action, r.target, r.detail) for r in rows]  # type: ignore[arg-type]

    def bump_revision(self, conn: Connection, topic: str) -> None:
        """Bump ``topic``'s revision inside the caller's transaction ``conn``."""
        bump_revision(conn, topic)

    def revision(self, topic: str) -> int:
        with self.db.connection() as conn:
            value = conn.execute(select(func.max(m.revisions.c.revision)).where(m.revisions.c.topic == topic)).scalar()
        return int(value or 0)
