"""User tokens (stored as digests), bootstrap tokens included.

One aggregate of the SQL store (:mod:`.sql`), over the process's :class:`~.database.Database`:
the same SQL, transactions and quota locks as every other repository."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Literal

from sqlalchemy import func, insert, or_, select, update

from ..core.errors import NotFound
from ..core.quotas import QuotaExceeded
from ..core.records import TokenRecord, UserRecord
from . import models as m
from .crypto import digests_equal, new_token, token_digest
from .rows import Repository, aware, get_user, lock_user, token_record, utcnow

log = logging.getLogger(__name__)

#: Where a bootstrap token comes from (:meth:`TokenRepository.claim_bootstrap_token`).
BootstrapMode = Literal["configured", "generated", "replace"]
BootstrapClaim = Literal["current", "installed", "replaced", "joined", "conflict", "revoked", "taken"]


class TokenRepository(Repository):
    """User tokens (stored as digests), bootstrap tokens included."""

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
            user = lock_user(conn, user_id)
            if limit is not None and not user.is_superuser:
                tokens = m.user_tokens.c
                now = utcnow()
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
                    created_at=utcnow(),
                    expires_at=expires_at,
                )
            )
            token_id = result.inserted_primary_key[0]  # type: ignore[index]
            row = conn.execute(select(m.user_tokens).where(m.user_tokens.c.id == token_id)).one()
        return token_record(row), value

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
        now = utcnow()
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
                if token_record(row).usable(now)
            ]
            mine_usable = mine is not None and token_record(mine).usable(now)
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
        now = utcnow()
        with self.db.connection() as conn:
            rows = conn.execute(
                select(m.user_tokens)
                .join(m.users, m.users.c.id == m.user_tokens.c.user_id)
                .where(m.users.c.name == user_name, m.user_tokens.c.token_type == "bootstrap")
            ).all()
        return any(token_record(row).usable(now) for row in rows)

    def list_tokens(self, user_id: int) -> list[TokenRecord]:
        get_user(self.db, user_id)
        with self.db.connection() as conn:
            rows = conn.execute(
                select(m.user_tokens).where(m.user_tokens.c.user_id == user_id).order_by(m.user_tokens.c.id)
            ).all()
        return [token_record(r) for r in rows]

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
                    update(m.user_tokens).where(m.user_tokens.c.id == token_id).values(revoked_at=utcnow())
                )
            row = conn.execute(select(m.user_tokens).where(m.user_tokens.c.id == token_id)).one()
        return token_record(row)

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
        token_rec = token_record(row)
        if not token_rec.usable(utcnow()):
            return None
        user = UserRecord(row.user_id, row.name, bool(row.is_superuser), aware(row.user_created))  # type: ignore[arg-type]
        return user, token_rec

    def touch_token(self, token_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                update(m.user_tokens).where(m.user_tokens.c.id == token_id).values(last_used_at=utcnow())
            )
