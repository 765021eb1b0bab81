"""What the store's repositories share: rows to records, the user lock quotas count under,
revision bumps, and the :class:`Repository` base (a repository is its database's methods for
one aggregate)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from ..core.errors import NotFound
from ..core.records import ClusterRecord, TokenRecord, UserRecord
from . import models as m
from .database import Database

#: The revision topic bumped on every change to admission webhook definitions.
WEBHOOKS_TOPIC = "webhooks"
# Ids per IN (...) query: well below SQLite's and PostgreSQL's bind-parameter limits.
IN_BATCH = 500

# What a ClusterRecord holds (created_by is the quota's business, read where it counts).
CLUSTER_COLUMNS = (m.clusters.c.id, m.clusters.c.project_id, m.clusters.c.cluster_type, m.clusters.c.created_at)


class Repository:
    """:param db: the database (its engine, migrations and the key that encrypts secrets at rest)."""

    def __init__(self, db: Database) -> None:
        self.db = db


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything we store is UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def user_record(row: Any) -> UserRecord:
    return UserRecord(row.id, row.name, bool(row.is_superuser), aware(row.created_at))  # type: ignore[arg-type]


def token_record(row: Any) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        user_id=row.user_id,
        token_type=row.token_type,
        created_at=aware(row.created_at),  # type: ignore[arg-type]
        expires_at=aware(row.expires_at),
        last_used_at=aware(row.last_used_at),
        revoked_at=aware(row.revoked_at),
    )


def cluster_record(row: Any) -> ClusterRecord:
    return ClusterRecord(row.id, row.project_id, row.cluster_type, aware(row.created_at))  # type: ignore[arg-type]


def get_user(db: Database, user_id: int) -> UserRecord:
    with db.connection() as conn:
        row = conn.execute(select(m.users).where(m.users.c.id == user_id)).first()
    if row is None:
        raise NotFound(f"user {user_id} not found", code_name="USER_NOT_FOUND")
    return user_record(row)


def lock_user(conn: Connection, user_id: int) -> UserRecord:
    """The user, its row locked until the transaction ends (what per-user quotas count under)."""
    row = conn.execute(select(m.users).where(m.users.c.id == user_id).with_for_update()).first()
    if row is None:
        raise NotFound(f"user {user_id} not found", code_name="USER_NOT_FOUND")
    return user_record(row)


def find_cluster(db: Database, cluster_id: str) -> ClusterRecord | None:
    with db.connection() as conn:
        row = conn.execute(select(*CLUSTER_COLUMNS).where(m.clusters.c.id == cluster_id)).first()
    return cluster_record(row) if row else None


def get_cluster(db: Database, cluster_id: str) -> ClusterRecord:
    cluster = find_cluster(db, cluster_id)
    if cluster is None:
        raise NotFound(f"cluster {cluster_id!r} not found", code_name="CLUSTER_NOT_FOUND")
    return cluster


def bump_revision(conn: Connection, topic: str) -> None:
    """Bump ``topic``'s revision in the transaction ``conn`` (cheap cache invalidation across processes)."""
    changed = conn.execute(
        update(m.revisions).where(m.revisions.c.topic == topic).values(revision=m.revisions.c.revision + 1)
    ).rowcount
    if not changed:
        try:
            with conn.begin_nested():
                conn.execute(insert(m.revisions).values(topic=topic, revision=1))
        except IntegrityError:
            conn.execute(
                update(m.revisions)
                .where(m.revisions.c.topic == topic)
                .values(revision=m.revisions.c.revision + 1)
            )
