"""Schema upgrades with Alembic, safe when several processes start at once.

Every gunicorn worker (and every gateway machine) may call :func:`upgrade` at
start-up; a database-level lock (PostgreSQL advisory lock, MySQL ``GET_LOCK``,
a file lock beside a SQLite file) makes exactly one of them migrate while the
others wait and then find nothing left to do.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url

MIGRATIONS = Path(__file__).with_name("migrations")
_LOCK_ID = 0x6263_7331  # "bcs1": any constant shared by every process of this project


class Migratable(Protocol):
    """What a migration needs of a database (:class:`~.database.Database` has it)."""

    url: str

    @property
    def engine(self) -> Engine: ...


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(database: Migratable) -> str | None:
    with database.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def upgrade(database: Migratable, revision: str = "head") -> None:
    url = make_url(database.url)
    backend = url.get_backend_name()
    if backend == "sqlite" and url.database and url.database != ":memory:":
        with _file_lock(Path(url.database + ".migrate.lock")), database.engine.begin() as conn:
            command.upgrade(alembic_config(conn), revision)
        return
    with database.engine.begin() as conn:
        if backend == "postgresql":
            # Released at commit, after the new schema is visible to the next waiter.
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
        elif backend in ("mysql", "mariadb"):
            conn.execute(text("SELECT GET_LOCK('bcs_middleware_migrate', 120)"))
        command.upgrade(alembic_config(conn), revision)
        if backend in ("mysql", "mariadb"):
            conn.execute(text("SELECT RELEASE_LOCK('bcs_middleware_migrate')"))
