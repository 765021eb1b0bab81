"""Clusters and their register tokens (encrypted at rest, looked up by digest).

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import IntegrityError

from ..core.errors import Conflict, NotFound
from ..core.quotas import QuotaExceeded
from ..core.records import ClusterRecord
from . import models as m
from .crypto import digests_equal, new_token, token_digest
from .rows import (
    CLUSTER_COLUMNS,
    IN_BATCH,
    WEBHOOKS_TOPIC,
    Repository,
    aware,
    bump_revision,
    cluster_record,
    find_cluster,
    get_cluster,
    lock_user,
    utcnow,
)


class ClusterRepository(Repository):
    """Clusters and their register tokens (encrypted at rest, looked up by digest)."""

    def create_cluster(
        self, cluster_id: str, *, project_id: str, cluster_type: str, creator_id: int | None = None,
        limit: int | None = None,
    ) -> ClusterRecord:
        """Create a cluster; its creator (a user id) gets ``edit`` in the same transaction.

        :param limit: the ``clusters_per_user`` quota: refused (:class:`QuotaExceeded`) when the
            creator already registered that many clusters that still exist — counted under the
            creator's row lock, so creates racing in several processes cannot pass it.
        """
        try:
            with self.db.transaction() as conn:
                now = utcnow()
                if creator_id is not None:
                    creator = lock_user(conn, creator_id)
                    if limit is not None:
                        used = int(conn.execute(
                            select(func.count()).select_from(m.clusters).where(m.clusters.c.created_by == creator_id)
                        ).scalar() or 0)
                        if used >= limit:
                            raise QuotaExceeded("clusters_per_user", limit, f"user {creator.name!r}", used)
                values: dict[str, Any] = {"id": cluster_id, "project_id": project_id,
                                          "cluster_type": cluster_type, "created_at": now}
                if creator_id is not None:
                    values["created_by"] = creator_id
                conn.execute(insert(m.clusters).values(**values))
                if creator_id is not None:
                    conn.execute(
                        insert(m.cluster_permissions).values(
                            cluster_id=cluster_id, user_id=creator_id, permission="edit", updated_at=now
                        )
                    )
                row = conn.execute(select(*CLUSTER_COLUMNS).where(m.clusters.c.id == cluster_id)).one()
        except IntegrityError:
            raise Conflict(f"cluster {cluster_id!r} already exists", code_name="CLUSTER_EXISTS") from None
        return cluster_record(row)

    def list_clusters(self) -> list[ClusterRecord]:
        with self.db.connection() as conn:
            rows = conn.execute(select(*CLUSTER_COLUMNS).order_by(m.clusters.c.id)).all()
        return [cluster_record(r) for r in rows]

    def delete_cluster(self, cluster_id: str) -> dict[str, Any]:
        """Delete a cluster and everything hanging off it, in one transaction.

        Its register token (which stops authenticating at once), the credentials its
        kube-agent reported, every user's permission on it and its Kubernetes
        admission configurations go with it. Returns what was removed, free of secrets.
        """
        perms, webhooks = m.cluster_permissions, m.webhook_definitions
        with self.db.transaction() as conn:
            if conn.execute(select(m.clusters.c.id).where(m.clusters.c.id == cluster_id)).first() is None:
                raise NotFound(f"cluster {cluster_id!r} not found", code_name="CLUSTER_NOT_FOUND")
            permissions = {
                str(r.name): str(r.permission)
                for r in conn.execute(
                    select(m.users.c.name, perms.c.permission)
                    .join(m.users, m.users.c.id == perms.c.user_id)
                    .where(perms.c.cluster_id == cluster_id)
                )
            }
            # Its own admission: Kubernetes configurations and, for a Mesos cluster, the bcs
            # definitions its editors made (its drivers read them by cluster id): an id
            # registered again, by anyone, starts with none.
            configurations = [
                f"{r.kind}/{r.name}"
                for r in conn.execute(
                    select(webhooks.c.kind, webhooks.c.name)
                    .where(webhooks.c.cluster_id == cluster_id)
                    .order_by(webhooks.c.kind, webhooks.c.name)
                )
            ]
            register_token = conn.execute(
                delete(m.register_tokens).where(m.register_tokens.c.cluster_id == cluster_id)
            ).rowcount
            credentials = conn.execute(
                delete(m.cluster_credentials).where(m.cluster_credentials.c.cluster_id == cluster_id)
            ).rowcount
            conn.execute(delete(perms).where(perms.c.cluster_id == cluster_id))
            conn.execute(delete(m.agent_placements).where(m.agent_placements.c.cluster_id == cluster_id))
            if configurations:
                conn.execute(delete(webhooks).where(webhooks.c.cluster_id == cluster_id))
                bump_revision(conn, WEBHOOKS_TOPIC)
            conn.execute(delete(m.clusters).where(m.clusters.c.id == cluster_id))
        return {
            "register_token": bool(register_token),
            "credentials": bool(credentials),
            "permissions": permissions,
            "admission_configurations": configurations,
        }

    def find_cluster(self, cluster_id: str) -> ClusterRecord | None:
        return find_cluster(self.db, cluster_id)

    def get_cluster(self, cluster_id: str) -> ClusterRecord:
        return get_cluster(self.db, cluster_id)

    def create_register_token(self, cluster_id: str) -> str:
        self.get_cluster(cluster_id)
        value = new_token()
        try:
            with self.db.transaction() as conn:
                conn.execute(
                    insert(m.register_tokens).values(
                        cluster_id=cluster_id,
                        token_hash=token_digest(value),
                        token_encrypted=self.db.secrets.encrypt(value),
                        created_at=utcnow(),
                    )
                )
        except IntegrityError:
            raise Conflict(
                f"cluster {cluster_id!r} already has a register token", code_name="REGISTER_TOKEN_EXISTS"
            ) from None
        return value

    def get_register_token(self, cluster_id: str) -> tuple[str, datetime]:
        self.get_cluster(cluster_id)
        with self.db.connection() as conn:
            row = conn.execute(
                select(m.register_tokens).where(m.register_tokens.c.cluster_id == cluster_id)
            ).first()
        if row is None:
            raise NotFound(
                f"cluster {cluster_id!r} has no register token", code_name="REGISTER_TOKEN_NOT_FOUND"
            )
        return self.db.secrets.decrypt(row.token_encrypted), aware(row.created_at)  # type: ignore[return-value]

    def revoke_register_token(self, cluster_id: str) -> datetime:
        """Delete the cluster's register token (its creation time is returned); 404 if none.

        The token stops authenticating credential reports at once; a new one can
        then be created.
        """
        self.get_cluster(cluster_id)
        with self.db.transaction() as conn:
            row = conn.execute(
                select(m.register_tokens.c.created_at).where(m.register_tokens.c.cluster_id == cluster_id)
            ).first()
            if row is None:
                raise NotFound(
                    f"cluster {cluster_id!r} has no register token", code_name="REGISTER_TOKEN_NOT_FOUND"
                )
            conn.execute(delete(m.register_tokens).where(m.register_tokens.c.cluster_id == cluster_id))
        return aware(row.created_at)  # type: ignore[return-value]

    def authenticate_register_token(self, token: str) -> str | None:
        """The cluster id a register token belongs to, if any."""
        digest = token_digest(token)
        with self.db.connection() as conn:
            row = conn.execute(
                select(m.register_tokens.c.cluster_id, m.register_tokens.c.token_hash).where(
                    m.register_tokens.c.token_hash == digest
                )
            ).first()
        if row is None or not digests_equal(row.token_hash, digest):
            return None
        return str(row.cluster_id)

    def check_register_token(self, cluster_id: str, token: str) -> bool | None:
        """Whether ``token`` is ``cluster_id``'s register token; ``None`` when the cluster has none
        (never created, revoked, or no such cluster — one answer for all three).

        The digests are compared in constant time; the token itself is never stored.
        """
        digest = token_digest(token)
        with self.db.connection() as conn:
            row = conn.execute(
                select(m.register_tokens.c.token_hash).where(m.register_tokens.c.cluster_id == cluster_id)
            ).first()
        if row is None:
            return None
        return digests_equal(row.token_hash, digest)

    def register_token_digests(self, cluster_ids: list[str]) -> dict[str, str]:
        """The current register-token digests of ``cluster_ids`` that have one (read in batches)."""
        found: dict[str, str] = {}
        with self.db.connection() as conn:
            for start in range(0, len(cluster_ids), IN_BATCH):
                batch = cluster_ids[start:start + IN_BATCH]
                rows = conn.execute(
                    select(m.register_tokens.c.cluster_id, m.register_tokens.c.token_hash)
                    .where(m.register_tokens.c.cluster_id.in_(batch))
                )
                found.update((row.cluster_id, row.token_hash) for row in rows)
        return found
