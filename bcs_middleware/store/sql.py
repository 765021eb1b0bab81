"""The SQL store: SQLite by default, PostgreSQL or MySQL by URL.

The only module (with ``models`` and the migrations) that imports SQLAlchemy.
Uniqueness is left to the database's constraints, so two gateway processes
racing to create the same user or cluster get one success and one
:class:`~bcs_middleware.core.errors.Conflict` — never a duplicate, never a 500.

The connection, migrations and keys are the :class:`~.database.Database`'s (one per URL
per process, its engine remade after a fork), so a ``SQLStore`` may be built in the master
and used in every worker.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement

from ..core.errors import Conflict, NotFound
from ..core.quotas import QuotaExceeded
from ..core.records import (
    AuditRecord,
    ClusterRecord,
    CredentialRecord,
    Holder,
    PermissionRecord,
    PlacementRecord,
    TokenRecord,
    UserRecord,
)
from . import models as m
from .crypto import digests_equal, new_token, token_digest
from .database import Database, open_database

log = logging.getLogger(__name__)
audit_log = logging.getLogger("bcs_middleware.audit")

#: The revision topic bumped on every change to admission webhook definitions.
WEBHOOKS_TOPIC = "webhooks"
#: The instance fact encrypted with the secret key (re-encrypted by :meth:`SQLStore.rotate_secrets`).
SECRET_CHECK_FACT = "secret_key_check"
#: The instance fact naming the key every stored secret is encrypted with (:meth:`SecretBox.key_id`).
SECRET_KEY_ID_FACT = "secret_key_id"

#: Where a bootstrap token comes from (:meth:`SQLStore.claim_bootstrap_token`).
BootstrapMode = Literal["configured", "generated", "replace"]
BootstrapClaim = Literal["current", "installed", "replaced", "joined", "conflict", "revoked", "taken"]


# Ids per IN (...) query: well below SQLite's and PostgreSQL's bind-parameter limits.
_IN_BATCH = 500

# What a ClusterRecord holds (created_by is the quota's business, read where it counts).
_CLUSTER_COLUMNS = (m.clusters.c.id, m.clusters.c.project_id, m.clusters.c.cluster_type, m.clusters.c.created_at)


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything we store is UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class SQLStore:
    """Users, tokens, clusters, credentials, webhook definitions and the audit trail.

    :param db: the database (its engine, migrations and the key that encrypts secrets at rest).
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- users and tokens ---------------------------------------------------------

    @staticmethod
    def _user(row: Any) -> UserRecord:
        return UserRecord(row.id, row.name, bool(row.is_superuser), _aware(row.created_at))  # type: ignore[arg-type]

    @staticmethod
    def _token(row: Any) -> TokenRecord:
        return TokenRecord(
            id=row.id,
            user_id=row.user_id,
            token_type=row.token_type,
            created_at=_aware(row.created_at),  # type: ignore[arg-type]
            expires_at=_aware(row.expires_at),
            last_used_at=_aware(row.last_used_at),
            revoked_at=_aware(row.revoked_at),
        )

    def create_user(self, name: str, *, is_superuser: bool = False) -> UserRecord:
        try:
            with self.db.transaction() as conn:
                result = conn.execute(
                    insert(m.users).values(name=name, is_superuser=is_superuser, created_at=_now())
                )
                user_id = result.inserted_primary_key[0]  # type: ignore[index]
                row = conn.execute(select(m.users).where(m.users.c.id == user_id)).one()
        except IntegrityError:
            raise Conflict(f"user {name!r} already exists", code_name="USER_EXISTS") from None
        return self._user(row)

    def ensure_user(self, name: str, *, is_superuser: bool) -> UserRecord:
        """The bootstrap path: create if absent, and make the flag match configuration."""
        existing = self.find_user(name)
        if existing is None:
            try:
                return self.create_user(name, is_superuser=is_superuser)
            except Conflict:
                existing = self.find_user(name)
                assert existing is not None
        if existing.is_superuser != is_superuser:
            with self.db.transaction() as conn:
                conn.execute(
                    update(m.users).where(m.users.c.id == existing.id).values(is_superuser=is_superuser)
                )
            existing = self.get_user(existing.id)
        return existing

    def find_user(self, name: str) -> UserRecord | None:
        with self.db.connection() as conn:
            row = conn.execute(select(m.users).where(m.users.c.name == name)).first()
        return self._user(row) if row else None

    def get_user(self, user_id: int) -> UserRecord:
        with self.db.connection() as conn:
            row = conn.execute(select(m.users).where(m.users.c.id == user_id)).first()
        if row is None:
            raise NotFound(f"user {user_id} not found", code_name="USER_NOT_FOUND")
        return self._user(row)

    def list_users(self) -> list[UserRecord]:
        with self.db.connection() as conn:
            rows = conn.execute(select(m.users).order_by(m.users.c.name)).all()
        return [self._user(r) for r in rows]

    def _lock_superusers(self, conn: Connection) -> set[int]:
        # Locked so two superusers demoting or deleting each other are serialised:
        # one of them always remains.
        return {
            row.id
            for row in conn.execute(
                select(m.users.c.id).where(m.users.c.is_superuser.is_(True)).with_for_update()
            )
        }

    def _refuse_last_superuser(self, conn: Connection, user: UserRecord, doing: str) -> None:
        if user.is_superuser and self._lock_superusers(conn) <= {user.id}:
            raise Conflict(
                f"cannot {doing} user {user.name!r}: it is the last superuser (promote another user first)",
                code_name="LAST_SUPERUSER",
            )

    def set_superuser(self, name: str, is_superuser: bool) -> tuple[UserRecord, bool]:
        """Make ``name`` a superuser or not; the updated user and the previous flag.

        Demoting the last superuser is refused (409 ``LAST_SUPERUSER``), in the same
        transaction as the change.
        """
        with self.db.transaction() as conn:
            row = conn.execute(select(m.users).where(m.users.c.name == name)).first()
            if row is None:
                raise NotFound(f"user {name!r} not found", code_name="USER_NOT_FOUND")
            user = self._user(row)
            if not is_superuser:
                self._refuse_last_superuser(conn, user, "demote")
            conn.execute(update(m.users).where(m.users.c.id == user.id).values(is_superuser=is_superuser))
        return UserRecord(user.id, user.name, is_superuser, user.created_at), user.is_superuser

    def delete_user(self, name: str) -> tuple[UserRecord, list[tuple[str, str]], int]:
        """Delete a user with their tokens and cluster permissions, in one transaction.

        Returns the user, the ``(cluster_id, permission)`` pairs removed and how many
        usable tokens stopped working. The last superuser is never deleted
        (409 ``LAST_SUPERUSER``).
        """
        tokens, perms = m.user_tokens, m.cluster_permissions
        with self.db.transaction() as conn:
            row = conn.execute(select(m.users).where(m.users.c.name == name)).first()
            if row is None:
                raise NotFound(f"user {name!r} not found", code_name="USER_NOT_FOUND")
            user = self._user(row)
            self._refuse_last_superuser(conn, user, "delete")
            removed = [
                (str(r.cluster_id), str(r.permission))
                for r in conn.execute(
                    select(perms.c.cluster_id, perms.c.permission)
                    .where(perms.c.user_id == user.id)
                    .order_by(perms.c.cluster_id)
                )
            ]
            now = _now()
            usable = len([
                r
                for r in conn.execute(select(m.user_tokens).where(tokens.c.user_id == user.id))
                if self._token(r).usable(now)
            ])
            # Explicit rather than left to ON DELETE CASCADE, which SQLite honours
            # only with its foreign_keys pragma on.
            conn.execute(delete(perms).where(perms.c.user_id == user.id))
            conn.execute(delete(tokens).where(tokens.c.user_id == user.id))
            conn.execute(update(m.clusters).where(m.clusters.c.created_by == user.id).values(created_by=None))
            conn.execute(delete(m.users).where(m.users.c.id == user.id))
        return user, removed, usable

    def create_token(
        self, user_id: int, *, token_type: str = "user", expires_at: datetime | None = None,
        limit: int | None = None,
    ) -> tuple[TokenRecord, str]:
        """Issue a token; the value is returned here and never again.

        :param limit: the ``tokens_per_user`` quota: refused (:class:`QuotaExceeded`) when the
            user already has that many usable tokens. Counted under the user's row lock, so
            tokens issued at once by several processes cannot pass it. Superusers have no limit.
        """
        value = new_token()
        with self.db.transaction() as conn:
            user = self._lock_user(conn, user_id)
            if limit is not None and not user.is_superuser:
                tokens = m.user_tokens.c
                now = _now()
                used = int(conn.execute(
                    select(func.count()).select_from(m.user_tokens).where(
                        tokens.user_id == user_id, tokens.revoked_at.is_(None),
                        or_(tokens.expires_at.is_(None), tokens.expires_at > now))
                ).scalar() or 0)
                if used >= limit:
                    raise QuotaExceeded("tokens_per_user", limit, f"user {user.name!r}", used)
            result = conn.execute(
                insert(m.user_tokens).values(
                    user_id=user_id,
                    token_hash=token_digest(value),
                    token_type=token_type,
                    created_at=_now(),
                    expires_at=expires_at,
                )
            )
            token_id = result.inserted_primary_key[0]  # type: ignore[index]
            row = conn.execute(select(m.user_tokens).where(m.user_tokens.c.id == token_id)).one()
        return self._token(row), value

    def claim_bootstrap_token(self, user_id: int, digest: str, *, mode: BootstrapMode) -> BootstrapClaim:
        """Make ``digest`` the user's bootstrap token, or say why not — one transaction.

        Several gateway instances share one database; each brings its configured token
        (``configured``), a token it just generated because it has none (``generated``), or
        an operator's explicit rotation (``replace``). Outcomes:

        * ``current``: ``digest`` is the user's usable bootstrap token already (``replace``:
          any other was revoked);
        * ``installed``: the user had no usable bootstrap token; ``digest`` is it now;
        * ``replaced``: (``replace``) ``digest`` is it now and every other was revoked;
        * ``joined``: (``generated``) the user has a usable bootstrap token already, so the
          generated one was not stored: another instance holds the token;
        * ``conflict``: (``configured``) another usable bootstrap token exists — this
          instance would lock out whoever holds it;
        * ``revoked``: (``configured``) ``digest`` was revoked (rotated away, or through
          the API): a restart must not bring it back;
        * ``taken``: ``digest`` is another user's token, or not a bootstrap token.
        """
        tokens = m.user_tokens.c
        now = _now()
        with self.db.transaction() as conn:
            # Instances starting at once are serialised on the user's row (SQLite: the
            # write transaction's BEGIN IMMEDIATE already is).
            conn.execute(select(m.users.c.id).where(m.users.c.id == user_id).with_for_update())
            mine = conn.execute(select(m.user_tokens).where(tokens.token_hash == digest)).first()
            if mine is not None and (mine.user_id != user_id or mine.token_type != "bootstrap"):
                return "taken"
            others = [
                row for row in conn.execute(
                    select(m.user_tokens).where(tokens.user_id == user_id, tokens.token_type == "bootstrap",
                                                tokens.token_hash != digest))
                if self._token(row).usable(now)
            ]
            mine_usable = mine is not None and self._token(mine).usable(now)
            if mode != "replace":
                if mine_usable:
                    return "current"
                if mine is not None:
                    return "revoked"
                if others:
                    return "joined" if mode == "generated" else "conflict"
                conn.execute(insert(m.user_tokens).values(user_id=user_id, token_hash=digest,
                                                          token_type="bootstrap", created_at=now))
                return "installed"
            if mine is None:
                conn.execute(insert(m.user_tokens).values(user_id=user_id, token_hash=digest,
                                                          token_type="bootstrap", created_at=now))
            elif not mine_usable:
                conn.execute(update(m.user_tokens).where(tokens.id == mine.id)
                             .values(revoked_at=None, expires_at=None))
            if others:
                conn.execute(update(m.user_tokens).where(tokens.id.in_([row.id for row in others]))
                             .values(revoked_at=now))
            return "replaced" if others or not mine_usable else "current"

    def has_bootstrap_token(self, user_name: str) -> bool:
        """Whether ``user_name`` exists and has a usable bootstrap token."""
        now = _now()
        with self.db.connection() as conn:
            rows = conn.execute(
                select(m.user_tokens)
                .join(m.users, m.users.c.id == m.user_tokens.c.user_id)
                .where(m.users.c.name == user_name, m.user_tokens.c.token_type == "bootstrap")
            ).all()
        return any(self._token(row).usable(now) for row in rows)

    def _lock_user(self, conn: Connection, user_id: int) -> UserRecord:
        """The user, its row locked until the transaction ends (what per-user quotas count under)."""
        row = conn.execute(select(m.users).where(m.users.c.id == user_id).with_for_update()).first()
        if row is None:
            raise NotFound(f"user {user_id} not found", code_name="USER_NOT_FOUND")
        return self._user(row)

    def list_tokens(self, user_id: int) -> list[TokenRecord]:
        self.get_user(user_id)
        with self.db.connection() as conn:
            rows = conn.execute(
                select(m.user_tokens).where(m.user_tokens.c.user_id == user_id).order_by(m.user_tokens.c.id)
            ).all()
        return [self._token(r) for r in rows]

    def revoke_token(self, user_id: int, token_id: int) -> TokenRecord:
        with self.db.transaction() as conn:
            row = conn.execute(
                select(m.user_tokens).where(
                    m.user_tokens.c.id == token_id, m.user_tokens.c.user_id == user_id
                )
            ).first()
            if row is None:
                raise NotFound(f"token {token_id} of user {user_id} not found", code_name="TOKEN_NOT_FOUND")
            if row.revoked_at is None:
                conn.execute(
                    update(m.user_tokens).where(m.user_tokens.c.id == token_id).values(revoked_at=_now())
                )
            row = conn.execute(select(m.user_tokens).where(m.user_tokens.c.id == token_id)).one()
        return self._token(row)

    def authenticate(self, token: str) -> tuple[UserRecord, TokenRecord] | None:
        """The user and token behind a token value, if it is usable now."""
        digest = token_digest(token)
        with self.db.connection() as conn:
            row = conn.execute(
                select(
                    m.user_tokens, m.users.c.name, m.users.c.is_superuser, m.users.c.created_at.label("user_created")
                )
                .join(m.users, m.users.c.id == m.user_tokens.c.user_id)
                .where(m.user_tokens.c.token_hash == digest)
            ).first()
        if row is None or not digests_equal(row.token_hash, digest):
            return None
        token_rec = self._token(row)
        if not token_rec.usable(_now()):
            return None
        user = UserRecord(row.user_id, row.name, bool(row.is_superuser), _aware(row.user_created))  # type: ignore[arg-type]
        return user, token_rec

    def touch_token(self, token_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                update(m.user_tokens).where(m.user_tokens.c.id == token_id).values(last_used_at=_now())
            )

    # -- clusters, register tokens, credentials -------------------------------------------

    @staticmethod
    def _cluster(row: Any) -> ClusterRecord:
        return ClusterRecord(row.id, row.project_id, row.cluster_type, _aware(row.created_at))  # type: ignore[arg-type]

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
                now = _now()
                if creator_id is not None:
                    creator = self._lock_user(conn, creator_id)
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
                row = conn.execute(select(*_CLUSTER_COLUMNS).where(m.clusters.c.id == cluster_id)).one()
        except IntegrityError:
            raise Conflict(f"cluster {cluster_id!r} already exists", code_name="CLUSTER_EXISTS") from None
        return self._cluster(row)

    def list_clusters(self) -> list[ClusterRecord]:
        with self.db.connection() as conn:
            rows = conn.execute(select(*_CLUSTER_COLUMNS).order_by(m.clusters.c.id)).all()
        return [self._cluster(r) for r in rows]

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
                self.bump_revision(conn, WEBHOOKS_TOPIC)
            conn.execute(delete(m.clusters).where(m.clusters.c.id == cluster_id))
        return {
            "register_token": bool(register_token),
            "credentials": bool(credentials),
            "permissions": permissions,
            "admission_configurations": configurations,
        }

    def find_cluster(self, cluster_id: str) -> ClusterRecord | None:
        with self.db.connection() as conn:
            row = conn.execute(select(*_CLUSTER_COLUMNS).where(m.clusters.c.id == cluster_id)).first()
        return self._cluster(row) if row else None

    def get_cluster(self, cluster_id: str) -> ClusterRecord:
        cluster = self.find_cluster(cluster_id)
        if cluster is None:
            raise NotFound(f"cluster {cluster_id!r} not found", code_name="CLUSTER_NOT_FOUND")
        return cluster

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
                        created_at=_now(),
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
        return self.db.secrets.decrypt(row.token_encrypted), _aware(row.created_at)  # type: ignore[return-value]

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
        return _aware(row.created_at)  # type: ignore[return-value]

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
            for start in range(0, len(cluster_ids), _IN_BATCH):
                batch = cluster_ids[start:start + _IN_BATCH]
                rows = conn.execute(
                    select(m.register_tokens.c.cluster_id, m.register_tokens.c.token_hash)
                    .where(m.register_tokens.c.cluster_id.in_(batch))
                )
                found.update((row.cluster_id, row.token_hash) for row in rows)
        return found

    def put_credentials(
        self, cluster_id: str, *, server_addresses: list[str], cacert_pem: str, user_token: str
    ) -> CredentialRecord:
        return self.report_credentials(
            cluster_id, server_addresses=server_addresses, cacert_pem=cacert_pem, user_token=user_token
        )[1]

    def report_credentials(
        self, cluster_id: str, *, server_addresses: list[str], cacert_pem: str, user_token: str,
        via_tunnel: bool = False,
    ) -> tuple[tuple[str, ...] | None, CredentialRecord]:
        """Store a kube-agent's report; also the addresses it replaced (``None``: first report).

        :param via_tunnel: the report came with the agent's tunnel: the apiserver is
            reached through that connection, not directly.
        """
        self.get_cluster(cluster_id)
        blob = self.db.secrets.encrypt(
            json.dumps(
                {"server_addresses": server_addresses, "cacert_pem": cacert_pem, "user_token": user_token}
            )
        )
        now = _now()
        previous: tuple[str, ...] | None = None
        with self.db.transaction() as conn:
            old = conn.execute(
                select(m.cluster_credentials.c.secret_encrypted).where(
                    m.cluster_credentials.c.cluster_id == cluster_id
                )
            ).first()
            if old is not None:
                previous = tuple(json.loads(self.db.secrets.decrypt(old.secret_encrypted))["server_addresses"])
            changed = conn.execute(
                update(m.cluster_credentials)
                .where(m.cluster_credentials.c.cluster_id == cluster_id)
                .values(secret_encrypted=blob, updated_at=now, via_tunnel=via_tunnel)
            ).rowcount
            if not changed:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(m.cluster_credentials).values(
                                cluster_id=cluster_id, secret_encrypted=blob, updated_at=now,
                                via_tunnel=via_tunnel,
                            )
                        )
                except IntegrityError:
                    # Another reporter inserted first: last writer wins, like the update.
                    conn.execute(
                        update(m.cluster_credentials)
                        .where(m.cluster_credentials.c.cluster_id == cluster_id)
                        .values(secret_encrypted=blob, updated_at=now, via_tunnel=via_tunnel)
                    )
        return previous, CredentialRecord(cluster_id, tuple(server_addresses), cacert_pem, user_token, now,
                                          via_tunnel)

    def get_credentials(self, cluster_id: str) -> CredentialRecord | None:
        with self.db.connection() as conn:
            row = conn.execute(
                select(m.cluster_credentials).where(m.cluster_credentials.c.cluster_id == cluster_id)
            ).first()
        if row is None:
            return None
        data = json.loads(self.db.secrets.decrypt(row.secret_encrypted))
        return CredentialRecord(
            cluster_id,
            tuple(data["server_addresses"]),
            data["cacert_pem"],
            data["user_token"],
            _aware(row.updated_at),
            bool(row.via_tunnel),
        )

    # -- agent placements (which process holds a cluster's agent tunnel) ---------------------

    @staticmethod
    def _placement(row: Any) -> PlacementRecord:
        return PlacementRecord(str(row.cluster_id), str(row.holder_id), row.peer_address, row.peer_fingerprint,
                               _aware(row.connected_at), _aware(row.seen_at))  # type: ignore[arg-type]

    def put_placement(self, cluster_id: str, holder: Holder) -> PlacementRecord:
        """Record that ``holder`` holds ``cluster_id``'s agent now (the newest connection wins)."""
        now = _now()
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
                update(table).where(table.c.holder_id == holder_id).values(seen_at=_now())
            ).rowcount)

    def adopt_placements(self, cluster_ids: list[str], holder: Holder, *, stale_after: float) -> int:
        """Record ``holder`` for those of ``cluster_ids`` nobody live holds: no placement, or one
        whose heartbeat is older than ``stale_after`` seconds. A live holder's stays (several
        workers hold connections of one agent; one placement names any of them)."""
        if not cluster_ids:
            return 0
        now = _now()
        stale = now - timedelta(seconds=stale_after)
        values = {"holder_id": holder.id, "peer_address": holder.peer_address,
                  "peer_fingerprint": holder.peer_fingerprint, "connected_at": now, "seen_at": now}
        table = m.agent_placements
        adopted = 0
        with self.db.transaction() as conn:
            placed: dict[str, Any] = {}
            for start in range(0, len(cluster_ids), _IN_BATCH):
                batch = cluster_ids[start:start + _IN_BATCH]
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
                elif (_aware(seen) or now) < stale:
                    adopted += conn.execute(update(table).where(
                        table.c.cluster_id == cluster_id, table.c.seen_at == seen).values(**values)).rowcount
        return adopted

    # -- cluster permissions ------------------------------------------------------------

    def cluster_permission(self, cluster_id: str, user_id: int) -> str | None:
        """``"view"``, ``"edit"`` or ``None``: what the permission table says (superusers aside)."""
        with self.db.connection() as conn:
            value = conn.execute(
                select(m.cluster_permissions.c.permission).where(
                    m.cluster_permissions.c.cluster_id == cluster_id, m.cluster_permissions.c.user_id == user_id
                )
            ).scalar()
        return str(value) if value is not None else None

    def list_cluster_permissions(self, cluster_id: str, user_id: int | None = None) -> list[PermissionRecord]:
        query = (
            select(m.cluster_permissions, m.users.c.name)
            .join(m.users, m.users.c.id == m.cluster_permissions.c.user_id)
            .where(m.cluster_permissions.c.cluster_id == cluster_id)
            .order_by(m.users.c.name)
        )
        if user_id is not None:
            query = query.where(m.cluster_permissions.c.user_id == user_id)
        with self.db.connection() as conn:
            rows = conn.execute(query).all()
        return [
            PermissionRecord(r.cluster_id, r.user_id, r.name, r.permission, _aware(r.updated_at))  # type: ignore[arg-type]
            for r in rows
        ]

    def user_cluster_permissions(self, user_id: int) -> dict[str, str]:
        """Every cluster the permission table gives ``user_id`` something on: ``{cluster_id: permission}``."""
        table = m.cluster_permissions
        with self.db.connection() as conn:
            rows = conn.execute(select(table.c.cluster_id, table.c.permission).where(table.c.user_id == user_id))
            return {str(r.cluster_id): str(r.permission) for r in rows}

    def set_cluster_permission(
        self, cluster_id: str, user_id: int, permission: str | None, *, keep_an_editor: bool = True,
        limit: int | None = None,
    ) -> str | None:
        """Give ``user_id`` ``permission`` on the cluster (``None`` removes it); the previous one.

        With ``keep_an_editor`` a change that would leave the cluster without any
        ``edit`` holder is refused (409 ``LAST_EDIT_HOLDER``); the check and the
        change are one transaction, so two holders removing each other cannot both win.
        ``limit`` is the ``permissions_per_cluster`` quota: a grant to one more user past it
        is refused (:class:`QuotaExceeded`); changing or removing a grant never is.
        """
        table = m.cluster_permissions
        with self.db.transaction() as conn:
            # The cluster's row lock serialises every change of its permissions: rows inserted
            # by another process meanwhile are counted, not only the rows that existed.
            if conn.execute(
                select(m.clusters.c.id).where(m.clusters.c.id == cluster_id).with_for_update()
            ).first() is None:
                raise NotFound(f"cluster {cluster_id!r} not found", code_name="CLUSTER_NOT_FOUND")
            editors = {
                row.user_id: row.permission
                for row in conn.execute(
                    select(table.c.user_id, table.c.permission)
                    .where(table.c.cluster_id == cluster_id)
                    .with_for_update()
                )
            }
            previous = editors.get(user_id)
            if previous is None and permission is not None and limit is not None and len(editors) >= limit:
                raise QuotaExceeded("permissions_per_cluster", limit, f"cluster {cluster_id!r}", len(editors))
            if (
                keep_an_editor
                and previous == "edit"
                and permission != "edit"
                and not any(uid != user_id and p == "edit" for uid, p in editors.items())
            ):
                raise Conflict(
                    f"this would leave cluster {cluster_id!r} without an edit holder: grant edit to another "
                    "user first (a superuser may do it; the cluster is then managed by superusers only)",
                    code_name="LAST_EDIT_HOLDER",
                )
            where = (table.c.cluster_id == cluster_id, table.c.user_id == user_id)
            if permission is None:
                conn.execute(delete(table).where(*where))
            elif previous is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(table).values(cluster_id=cluster_id, user_id=user_id, permission=permission,
                                                 updated_at=_now())
                        )
                except IntegrityError:
                    # A concurrent grant to the same user inserted first: last writer wins.
                    conn.execute(update(table).where(*where).values(permission=permission, updated_at=_now()))
            else:
                conn.execute(update(table).where(*where).values(permission=permission, updated_at=_now()))
        return previous

    # -- RBAC subscription grants (which clusters a subject has anything on) ---------------

    def replace_rbac_grants(self, entries: set[tuple[str, str, str]]) -> None:
        """Make the table hold exactly ``(subject_kind, subject, cluster)`` ``entries``."""
        table = m.rbac_cluster_grants
        with self.db.transaction() as conn:
            conn.execute(delete(table))
            if entries:
                conn.execute(
                    insert(table),
                    [{"subject_kind": k, "subject": s, "cluster": c} for k, s, c in sorted(entries)],
                )

    def rbac_grants_cluster(self, user_name: str, groups: tuple[str, ...], cluster_id: str) -> bool:
        """Whether the subscription grants the user (or one of ``groups``) anything on the cluster."""
        table = m.rbac_cluster_grants
        subject: ColumnElement[bool] = (table.c.subject_kind == "User") & (table.c.subject == user_name)
        if groups:
            subject = or_(subject, (table.c.subject_kind == "Group") & table.c.subject.in_(groups))
        with self.db.connection() as conn:
            row = conn.execute(
                select(table.c.cluster).where(subject, table.c.cluster.in_((cluster_id, "*"))).limit(1)
            ).first()
        return row is not None

    def rbac_granted_clusters(self, user_name: str, groups: tuple[str, ...]) -> set[str]:
        """The clusters the subscription grants the user (or one of ``groups``) anything on; ``"*"`` = all."""
        table = m.rbac_cluster_grants
        subject: ColumnElement[bool] = (table.c.subject_kind == "User") & (table.c.subject == user_name)
        if groups:
            subject = or_(subject, (table.c.subject_kind == "Group") & table.c.subject.in_(groups))
        with self.db.connection() as conn:
            return {str(r.cluster) for r in conn.execute(select(table.c.cluster).where(subject).distinct())}

    # -- instance facts (what the instances sharing this database agree on) ----------------

    def get_fact(self, name: str) -> str | None:
        with self.db.connection() as conn:
            value = conn.execute(select(m.instance_facts.c.value).where(m.instance_facts.c.name == name)).scalar()
        return str(value) if value is not None else None

    def put_fact(self, name: str, value: str, *, replace: bool = False) -> str:
        """Record ``value`` as ``name`` unless a value is recorded already (``replace``: overwrite it);
        returns the value recorded now — another instance's, when it was first."""
        table = m.instance_facts
        with self.db.transaction() as conn:
            if replace and conn.execute(
                update(table).where(table.c.name == name).values(value=value, updated_at=_now())
            ).rowcount:
                return value
            try:
                with conn.begin_nested():
                    conn.execute(insert(table).values(name=name, value=value, updated_at=_now()))
                return value
            except IntegrityError:
                pass  # recorded meanwhile by another instance: theirs stands
            return str(conn.execute(select(table.c.value).where(table.c.name == name)).scalar_one())

    def sample_secrets(self) -> list[str]:
        """The newest encrypted register token and cluster credential, as stored (for a key check)."""
        with self.db.connection() as conn:
            token = conn.execute(select(m.register_tokens.c.token_encrypted)
                                 .order_by(m.register_tokens.c.id.desc()).limit(1)).scalar()
            credential = conn.execute(select(m.cluster_credentials.c.secret_encrypted)
                                      .order_by(m.cluster_credentials.c.updated_at.desc()).limit(1)).scalar()
        return [str(value) for value in (token, credential) if value is not None]

    # -- secrets rotation -------------------------------------------------------------

    def rotate_secrets(self) -> int:
        """Re-encrypt every stored secret with the current (first) key, in one transaction; how
        many. Records that key's id (:data:`SECRET_KEY_ID_FACT`) with them.

        :raises ConfigError: a stored secret that none of the keys decrypts (nothing changes).
        """
        count = 0
        with self.db.transaction() as conn:
            for row in conn.execute(select(m.register_tokens.c.id, m.register_tokens.c.token_encrypted)).all():
                conn.execute(
                    update(m.register_tokens)
                    .where(m.register_tokens.c.id == row.id)
                    .values(token_encrypted=self.db.secrets.rotate(row.token_encrypted))
                )
                count += 1
            rows = conn.execute(
                select(m.cluster_credentials.c.cluster_id, m.cluster_credentials.c.secret_encrypted)
            ).all()
            for row in rows:
                conn.execute(
                    update(m.cluster_credentials)
                    .where(m.cluster_credentials.c.cluster_id == row.cluster_id)
                    .values(secret_encrypted=self.db.secrets.rotate(row.secret_encrypted))
                )
                count += 1
            check = conn.execute(select(m.instance_facts.c.value)
                                 .where(m.instance_facts.c.name == SECRET_CHECK_FACT)).scalar()
            if check is not None:
                conn.execute(update(m.instance_facts).where(m.instance_facts.c.name == SECRET_CHECK_FACT)
                             .values(value=self.db.secrets.rotate(check), updated_at=_now()))
            key_id = self.db.secrets.key_id()
            if not conn.execute(update(m.instance_facts).where(m.instance_facts.c.name == SECRET_KEY_ID_FACT)
                                .values(value=key_id, updated_at=_now())).rowcount:
                conn.execute(insert(m.instance_facts).values(name=SECRET_KEY_ID_FACT, value=key_id,
                                                             updated_at=_now()))
        return count

    # -- audit ---------------------------------------------------------------------------

    def record_audit(self, actor: str, action: str, target: str, detail: dict[str, Any] | None = None) -> None:
        """Persist and log a management change. ``detail`` must hold no secret."""
        detail = detail or {}
        with self.db.transaction() as conn:
            conn.execute(
                insert(m.audit_log).values(at=_now(), actor=actor, action=action, target=target, detail=detail)
            )
        audit_log.info(
            "audit actor=%s action=%s target=%s detail=%s", actor, action, target, json.dumps(detail, sort_keys=True)
        )

    def list_audit(self, limit: int = 100) -> list[AuditRecord]:
        with self.db.connection() as conn:
            rows = conn.execute(select(m.audit_log).order_by(m.audit_log.c.id.desc()).limit(limit)).all()
        return [AuditRecord(r.id, _aware(r.at), r.actor, r.action, r.target, r.detail) for r in rows]  # type: ignore[arg-type]

    # -- revisions (cheap cache invalidation across processes) ----------------------------

    def bump_revision(self, conn: Connection, topic: str) -> None:
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

    def revision(self, topic: str) -> int:
        with self.db.connection() as conn:
            value = conn.execute(select(func.max(m.revisions.c.revision)).where(m.revisions.c.topic == topic)).scalar()
        return int(value or 0)


def open_store(
    url: str | None = None,
    *,
    data_dir: str | Path | None = None,
    secret_key: str | None = None,
    migrate: bool = True,
) -> SQLStore:
    """The store over the process's database for a URL (or SQLite in ``data_dir``) and key
    source (:func:`~.database.open_database`: every caller naming the same one shares it)."""
    return SQLStore(open_database(url, data_dir=data_dir, secret_key=secret_key, migrate=migrate))
