"""One reconciler per deployment: a lease row in the shared database.

Every gateway process that runs the RBAC service calls :meth:`LeaderLease.acquire`
each tick. Taking or renewing the lease is one conditional ``UPDATE`` — *set me
as holder where the holder is me or the lease has expired* — which the database
applies atomically on SQLite and PostgreSQL alike, so two contenders can never
both see ``rowcount == 1``. The first ever contender inserts the row; a
concurrent insert loses on the primary key and simply is not the leader.

Expiry is compared with the contenders' own UTC clocks, so ``ttl`` must exceed
any clock skew between gateway machines by a wide margin (the default 30 s
assumes NTP). A leader renews every tick (well within ``ttl``); one that stalls
longer than ``ttl`` loses the lease at its next tick and stops reconciling —
what it was doing at that moment is idempotent.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from ..core.errors import ServiceUnavailable
from ..store.database import Database
from .tables import leases

log = logging.getLogger(__name__)


def default_holder() -> str:
    """``host:pid:random`` — unique per process, readable in the status page."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseStore(Protocol):
    """What a :class:`LeaderLease` (and the RBAC status it is read with) needs: the shared
    database its rows live in (``SQLStore`` has it)."""

    @property
    def db(self) -> Database: ...


class LeaderLease:
    """A named, expiring lock in the store.

    :param store: the shared database.
    :param name: the lock's name; every contender for one role uses the same.
    :param holder: this contender's id (unique per process).
    :param ttl: seconds a lease lasts without renewal.
    """

    def __init__(self, store: LeaseStore, *, name: str = "rbac", holder: str | None = None, ttl: float = 30.0) -> None:
        self.store = store
        self.name = name
        self.holder = holder or default_holder()
        self.ttl = ttl
        self.is_leader = False

    def acquire(self) -> bool:
        """Take or renew the lease; True while this contender holds it. Database errors mean 'not leader'."""
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=self.ttl)
        try:
            with self.store.db.transaction() as conn:
                taken = conn.execute(
                    update(leases)
                    .where(leases.c.name == self.name,
                           or_(leases.c.holder == self.holder, leases.c.expires_at < now))
                    .values(holder=self.holder, expires_at=expires)
                ).rowcount
                if not taken:
                    exists = conn.execute(select(leases.c.name).where(leases.c.name == self.name)).first()
                    if exists is None:
                        try:
                            with conn.begin_nested():
                                conn.execute(insert(leases).values(
                                    name=self.name, holder=self.holder, expires_at=expires, acquired_at=now))
                            taken = 1
                        except IntegrityError:
                            taken = 0
                if taken and not self.is_leader:
                    conn.execute(update(leases).where(leases.c.name == self.name).values(acquired_at=now))
        except ServiceUnavailable:
            taken = 0
        was, self.is_leader = self.is_leader, bool(taken)
        if self.is_leader and not was:
            log.info("rbac: %s is now the leader (lease %r, ttl %.0fs)", self.holder, self.name, self.ttl)
        elif was and not self.is_leader:
            log.warning("rbac: %s lost the lease %r; reconciling stops here", self.holder, self.name)
        return self.is_leader

    def release(self) -> None:
        """Give the lease up at once (clean stop), so another contender need not wait for expiry."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            with self.store.db.transaction() as conn:
                conn.execute(
                    update(leases)
                    .where(leases.c.name == self.name, leases.c.holder == self.holder)
                    .values(expires_at=datetime.now(UTC) - timedelta(seconds=1))
                )
        except ServiceUnavailable:
            pass  # the lease then simply expires
        log.info("rbac: %s released the lease %r", self.holder, self.name)

    def current(self) -> dict[str, Any] | None:
        """The lease row as the status page shows it, or ``None`` before anyone took it."""
        with self.store.db.connection() as conn:
            row = conn.execute(select(leases).where(leases.c.name == self.name)).first()
        if row is None:
            return None
        expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
        acquired = row.acquired_at if row.acquired_at.tzinfo else row.acquired_at.replace(tzinfo=UTC)
        return {"holder": row.holder, "expires_at": expires.isoformat(), "acquired_at": acquired.isoformat(),
                "active": expires > datetime.now(UTC)}
