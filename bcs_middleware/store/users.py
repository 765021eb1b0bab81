"""Users, and who among them is a superuser (never fewer than one).

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ..core.errors import Conflict, NotFound
from ..core.records import UserRecord
from . import models as m
from .rows import Repository, get_user, token_record, user_record, utcnow


class UserRepository(Repository):
    """Users, and who among them is a superuser (never fewer than one)."""

    def create_user(self, name: str, *, is_superuser: bool = False) -> UserRecord:
        try:
            with self.db.transaction() as conn:
                result = conn.execute(
                    insert(m.users).values(name=name, is_superuser=is_superuser, created_at=utcnow())
                )
                user_id = result.inserted_primary_key[0]  # type: ignore[index]
                row = conn.execute(select(m.users).where(m.users.c.id == user_id)).one()
        except IntegrityError:
            raise Conflict(f"user {name!r} already exists", code_name="USER_EXISTS") from None
        return user_record(row)

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
        return user_record(row) if row else None

    def get_user(self, user_id: int) -> UserRecord:
        return get_user(self.db, user_id)

    def list_users(self) -> list[UserRecord]:
        with self.db.connection() as conn:
            rows = conn.execute(select(m.users).order_by(m.users.c.name)).all()
        return [user_record(r) for r in rows]

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
            user = user_record(row)
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
            user = user_record(row)
            self._refuse_last_superuser(conn, user, "delete")
            removed = [
                (str(r.cluster_id), str(r.permission))
                for r in conn.execute(
                    select(perms.c.cluster_id, perms.c.permission)
                    .where(perms.c.user_id == user.id)
                    .order_by(perms.c.cluster_id)
                )
            ]
            now = utcnow()
            usable = len([
                r
                for r in conn.execute(select(m.user_tokens).where(tokens.c.user_id == user.id))
                if token_record(r).usable(now)
            ])
            # Explicit rather than left to ON DELETE CASCADE, which SQLite honours
            # only with its foreign_keys pragma on.
            conn.execute(delete(perms).where(perms.c.user_id == user.id))
            conn.execute(delete(tokens).where(tokens.c.user_id == user.id))
            conn.execute(update(m.clusters).where(m.clusters.c.created_by == user.id).values(created_by=None))
            conn.execute(delete(m.users).where(m.users.c.id == user.id))
        return user, removed, usable
