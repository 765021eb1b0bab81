"""Suite-wide rules.

Under ``CI=true`` a test that needs a real service (PostgreSQL, ZooKeeper,
kubectl, gunicorn) must run: a skip there turns into a failure, so a missing
install step in ``.ci/run`` can never pass silently.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

# The example webhook servers (examples/webhooks/) are imported by tests as top-level modules.
EXAMPLE_WEBHOOKS = str(Path(__file__).resolve().parent.parent / "examples" / "webhooks")
if EXAMPLE_WEBHOOKS not in sys.path:
    sys.path.insert(0, EXAMPLE_WEBHOOKS)

# kazoo logs every reconnection attempt while a test has ZooKeeper stopped; the tests assert
# on behaviour, and the noise would bury real failures in CI's output.
logging.getLogger("kazoo").setLevel(logging.ERROR)

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under CI=true, where every test must run: {reason}"


#: Variables a command run in the pytest process sets for itself (``serve`` sets the metrics
#: directory before it forks): left set, every server a later test starts inherits them.
_PROCESS_ENVIRONMENT = ("PROMETHEUS_MULTIPROC_DIR",)
#: Signals a command run in the pytest process takes over (``kube-agent`` stops on them): left
#: installed, a Ctrl-C (or CI's SIGTERM) fails whichever test runs then and the session goes on.
_PROCESS_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _process_left_as_found():  # type: ignore[no-untyped-def]
    """Fail the test that changes :data:`_PROCESS_ENVIRONMENT` or the handlers of
    :data:`_PROCESS_SIGNALS` in the pytest process (and put them back), so a leak is found where
    it happens, not by a later test that miscounts or cannot be stopped."""
    environment = {name: os.environ.get(name) for name in _PROCESS_ENVIRONMENT}
    handlers = {signum: signal.getsignal(signum) for signum in _PROCESS_SIGNALS}
    yield
    changed = [name for name, value in environment.items() if os.environ.get(name) != value]
    for name in changed:
        if environment[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = environment[name]  # type: ignore[assignment]
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
            changed.append(f"the {signal.Signals(signum).name} handler")
    if changed:
        pytest.fail(f"the test left {', '.join(changed)} changed in the pytest process "
                    "(a command run in-process: restore it in the test)")


@pytest.fixture(scope="session")
def postgres_server():  # type: ignore[no-untyped-def]
    """A real PostgreSQL for the session (skips locally if absent; fails under CI)."""
    from tests.support.postgres import PostgresServer, pg_bindir

    if pg_bindir() is None:
        pytest.skip("PostgreSQL server binaries are not installed")
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server):  # type: ignore[no-untyped-def]
    """A fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):  # type: ignore[no-untyped-def]
    """Run a test against SQLite and against a real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'bcs.sqlite3'}"
    return request.getfixturevalue("postgres_url")


def _migrated(url: str) -> None:
    from cryptography.fernet import Fernet

    from bcs_middleware.store.sql import open_store

    open_store(url, secret_key=Fernet.generate_key().decode()).db.dispose()


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("migrated-sqlite") / "bcs.sqlite3"
    _migrated(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def _migrated_postgres(postgres_server):  # type: ignore[no-untyped-def]
    url = postgres_server.create_database()
    _migrated(url)
    return url.rsplit("/", 1)[1]


@pytest.fixture(params=["sqlite", "postgresql"])
def migrated_database_url(request, tmp_path):  # type: ignore[no-untyped-def]
    """:func:`database_url` with the schema already in place: a copy of a database migrated once
    per session (a test that opens the store gets the same schema without running the migrations
    again; the migrations themselves are tested from an empty database in ``tests/store``)."""
    if request.param == "sqlite":
        path = tmp_path / "bcs.sqlite3"
        shutil.copyfile(request.getfixturevalue("_migrated_sqlite"), path)
        return f"sqlite:///{path}"
    template = request.getfixturevalue("_migrated_postgres")
    return request.getfixturevalue("postgres_server").create_database(template=template)
