"""The database: one object per URL (and key source) per process, shared by every component.

A :class:`Database` owns what every repository of the store needs: the SQLAlchemy engine
(with SQLite's pragmas), the migrations, the :class:`~.crypto.SecretBox` that encrypts
secrets at rest, ``ping`` and ``dispose``. Its engine is a
:class:`~bcs_middleware.core.forksafe.PerProcess` value: made on first use, and forgotten in
a forked child (gunicorn workers), which makes its own — a child never uses its parent's
pooled connections.

:func:`open_database` keeps one ``Database`` per URL and key source in a process, so a paste
pipeline whose filters and app name the same ``database_url`` opens one engine, not one per
filter.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, InterfaceError, OperationalError

from ..core.errors import ConfigError, ServiceUnavailable
from ..core.forksafe import PerProcess
from .crypto import SecretBox, load_key_source

log = logging.getLogger(__name__)

#: driver name → (module, the extra that installs it)
_DRIVERS = {"postgresql+psycopg": ("psycopg", "postgresql"), "mysql+pymysql": ("pymysql", "mysql")}
# The database and the files SQLite keeps beside it (same content, in pieces).
_SQLITE_FILES = ("", "-wal", "-shm", "-journal", ".migrate.lock")


def normalize_url(url: str) -> str:
    """Pick drivers we ship extras for when the URL names none."""
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername == "mysql":
        parsed = parsed.set(drivername="mysql+pymysql")
    return parsed.render_as_string(hide_password=False)


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'bcs.sqlite3'}"


def _require_driver(url: str) -> None:
    """A clear ConfigError at start, not a ModuleNotFoundError traceback, when a driver is missing."""
    driver = make_url(url).drivername
    if driver not in _DRIVERS:
        return
    module, extra = _DRIVERS[driver]
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"the database URL needs the {module} driver, which is not installed: "
            f"pip install 'bcs-middleware[{extra}]'"
        ) from None


def _private_sqlite_files(database: str) -> None:
    """Make a SQLite database and its companion files readable by this user only.

    They hold every token hash and the encrypted cluster credentials. The database
    is created 0600 before SQLite opens it — SQLite gives the ``-wal``/``-shm``/
    ``-journal`` files it creates the database's mode — and files left with a
    looser mode (an older version, a copied backup) are tightened.
    """
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT, 0o600))
    except FileNotFoundError:
        return  # no such directory: SQLite's own error says so
    for suffix in _SQLITE_FILES:
        path = database + suffix
        try:
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
        except FileNotFoundError:
            continue
        except PermissionError:
            log.warning("%s is readable by other users and not ours to chmod", path)


#: SQLAlchemy's own pool defaults: connections kept, and opened beyond them under a burst.
DEFAULT_POOL = (5, 10)


def _create_engine(url: str, pool: tuple[int, int] = DEFAULT_POOL) -> Engine:
    size, overflow = pool
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
            _private_sqlite_files(parsed.database)
        database = parsed.database or ""
        in_memory = database in ("", ":memory:") or "mode=memory" in database
        engine = create_engine(
            url,
            # Several gunicorn workers share the file: wait for the lock instead of
            # failing at once, and let readers run beside a writer (WAL).
            connect_args={"timeout": 30, "check_same_thread": False},
            # A file gets SQLAlchemy's queue pool; a memory database one connection per thread.
            **({} if in_memory else {"pool_size": size, "max_overflow": overflow}),
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take over transaction control from pysqlite so BEGIN IMMEDIATE works.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # A write transaction that reads first would otherwise fail with
            # SQLITE_BUSY (no wait) when it upgrades its lock under contention.
            if conn.get_execution_options().get("bcs_write"):
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.exec_driver_sql("BEGIN")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=size, max_overflow=overflow, pool_recycle=1800)


def _drop_inherited(engine: Engine) -> None:
    # The parent's pooled sockets: let go of them without closing them under its feet.
    engine.dispose(close=False)


class Database:
    """One database: its engine (per process), migrations and the key that encrypts its secrets.

    :param url: SQLAlchemy URL (``sqlite:///…``, ``postgresql://…``, ``mysql://…``).
    :param secrets: encrypts register tokens and cluster credentials at rest.
    :raises ConfigError: the URL is not one, or its driver is not installed.
    """

    def __init__(self, url: str, *, secrets: SecretBox) -> None:
        try:
            self.url = normalize_url(url)
        except ArgumentError:
            # Not the URL itself in the message: it may carry a password.
            raise ConfigError("the database URL is not a valid URL (expected e.g. "
                              "postgresql://user@host/db or sqlite:///path)") from None
        _require_driver(self.url)
        self.secrets = secrets
        self.pool = DEFAULT_POOL
        self._engine = PerProcess(lambda: _create_engine(self.url, self.pool), on_fork=_drop_inherited)

    def size_pool(self, connections: int, overflow: int) -> None:
        """Keep ``connections`` open per process and open up to ``overflow`` more under a burst
        (``clients.database_*`` of the limits file); an engine this process already made is
        remade with them (workers make their own after the fork)."""
        if (connections, overflow) != self.pool:
            self.pool = (connections, overflow)
            engine = self._engine.take()
            if engine is not None:
                engine.dispose()

    @property
    def engine(self) -> Engine:
        return self._engine.get()

    @property
    def display_url(self) -> str:
        """The database URL for messages: its password hidden."""
        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def backend(self) -> str:
        return make_url(self.url).get_backend_name()

    def dispose(self) -> None:
        """Close this process's pooled connections (the engine opens new ones when next used)."""
        engine = self._engine.peek()
        if engine is not None:
            engine.dispose()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                yield conn
        except OperationalError as exc:
            log.error("store unavailable: %s", type(exc.orig).__name__)
            raise ServiceUnavailable("the gateway's database is unavailable") from None

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                conn = conn.execution_options(bcs_write=True)
                with conn.begin():
                    yield conn
        except OperationalError as exc:
            log.error("store unavailable: %s", type(exc.orig).__name__)
            raise ServiceUnavailable("the gateway's database is unavailable") from None

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            return True
        except OperationalError:
            return False

    def migrate(self) -> None:
        """Bring the schema up to date (safe from many processes at once).

        :raises ConfigError: the database cannot be reached or opened — the message names
            it (password hidden) and the driver's reason.
        """
        from .migrate import upgrade

        try:
            upgrade(self)
        except (OperationalError, InterfaceError) as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
            raise ConfigError(f"cannot open the database {self.display_url}: {reason}") from None


_opened: dict[tuple[str, str], Database] = {}
_opened_lock = threading.Lock()


def open_database(
    url: str | None = None,
    *,
    data_dir: str | Path | None = None,
    secret_key: str | None = None,
    migrate: bool = True,
) -> Database:
    """The process's :class:`Database` for a URL (or SQLite in ``data_dir``) and key source.

    Every caller naming the same URL with the same keys gets the same object, so the filters
    and apps of one paste pipeline share one engine. ``migrate``: bring the schema up to date
    (under the migration lock; a no-op when it is).
    """
    data_path = Path(data_dir) if data_dir is not None else None
    if url is None:
        if data_path is None:
            raise ValueError("open_database needs a database URL or a data directory")
        data_path.mkdir(parents=True, exist_ok=True)
        url = sqlite_url(data_path)
    keys, origin = load_key_source(secret_key, data_path)
    # The keys as a digest: the registry must tell key sources apart, not hold them twice.
    material = hashlib.sha256("\0".join(keys).encode()).hexdigest()
    with _opened_lock:
        database = _opened.get((url, material))
        if database is None:
            database = _opened[(url, material)] = Database(url, secrets=SecretBox(keys, origin=origin))
    if migrate:
        database.migrate()
    return database
