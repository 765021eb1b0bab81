"""One database object per URL per process: shared by a paste pipeline, remade in a forked child."""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from paste.deploy import loadapp
from sqlalchemy import Engine, text
from werkzeug.test import Client

from bcs_middleware.store import database as database_module
from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database, open_database
from bcs_middleware.store.sql import SQLStore

KEY = Fernet.generate_key().decode()


@pytest.fixture
def engines_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Engine]]:
    """Every engine the store makes in this process from now on."""
    made: list[Engine] = []
    create = database_module._create_engine

    def counting(url: str, *args: Any) -> Engine:
        engine = create(url, *args)
        made.append(engine)
        return engine

    monkeypatch.setattr(database_module, "_create_engine", counting)
    yield made
    for engine in made:
        engine.dispose()


def _backends(url: str) -> int:
    """Connections PostgreSQL has open to the test's database, not counting the one asking."""
    import psycopg

    dbname = url.rsplit("/", 1)[1]
    base = url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/postgres", connect_timeout=10) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                           (dbname,)).fetchone()
    assert row is not None
    return int(row[0])


def _backends_settled(url: str, expected: int, timeout: float = 10.0) -> int:
    """The count once closed connections' backends have gone.

    A backend leaves pg_stat_activity a moment after its client closes (the setup's disposed
    engine here), so one read can still see it; poll, bounded, and return the last count.
    """
    deadline = time.monotonic() + timeout
    while (count := _backends(url)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def test_a_paste_pipeline_naming_one_url_opens_one_engine(database_url: str, tmp_path: Path,
                                                          engines_made: list[Engine]) -> None:
    # The database as a gateway left it: a user with a token (made by another "process": its own engine).
    setup = SQLStore(Database(database_url, secrets=SecretBox([KEY])))
    setup.db.migrate()
    alice = setup.create_user("alice", is_superuser=True)
    _, token = setup.create_token(alice.id)
    setup.db.dispose()
    engines_made.clear()
    ini = tmp_path / "pipeline.ini"
    ini.write_text(textwrap.dedent(f"""\
        [DEFAULT]
        database_url = {database_url}
        secret_key = {KEY}

        [pipeline:main]
        pipeline = token_auth cluster_routing admission management

        [filter:token_auth]
        use = egg:bcs-middleware#token_auth
        get database_url = database_url
        get secret_key = secret_key

        [filter:cluster_routing]
        use = egg:bcs-middleware#cluster_routing
        get database_url = database_url
        get secret_key = secret_key

        [filter:admission]
        use = egg:bcs-middleware#admission
        get database_url = database_url
        get secret_key = secret_key

        [app:management]
        use = egg:bcs-middleware#management_api
        get database_url = database_url
        get secret_key = secret_key
        """))
    app = loadapp(f"config:{ini}")
    client = Client(app)
    for _ in range(3):
        resp = client.get("/rest/users/alice", headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 200, resp.get_data(as_text=True)
        assert json.loads(resp.get_data())["name"] == "alice"
    assert len(engines_made) == 1  # four components, one URL: one engine
    if database_url.startswith("postgresql"):
        # Requests one after another: the one engine's pool holds one connection.
        assert _backends_settled(database_url, 1) == 1


def test_one_database_per_url_and_key_source(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bcs.sqlite3'}"
    first = open_database(url, secret_key=KEY)
    assert open_database(url, secret_key=KEY, migrate=False) is first
    other_key = Fernet.generate_key().decode()
    other = open_database(url, secret_key=other_key, migrate=False)
    assert other is not first and other.secrets.key_id() != first.secrets.key_id()
    first.dispose()
    other.dispose()


def _in_child(run: Any) -> dict[str, Any]:
    """Run ``run()`` in a forked child; what it returned (JSON), or its exception's text."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            os.close(reader)
            try:
                result = {"ok": run()}
            except BaseException as exc:  # report anything to the parent
                result = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(writer, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    outcome: dict[str, Any] = json.loads(data)
    assert "error" not in outcome, outcome["error"]
    return outcome


def test_a_forked_child_never_uses_the_parents_engine(database_url: str) -> None:
    db = Database(database_url, secrets=SecretBox([KEY]))
    db.migrate()
    store = SQLStore(db)
    store.create_user("parent")
    parent_engine = db.engine
    postgres = database_url.startswith("postgresql")

    def backend() -> int:
        with db.connection() as conn:
            return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()) if postgres else os.getpid()

    parent_backend = backend()  # a connection now pooled in the parent's engine

    def child() -> dict[str, Any]:
        engine = db.engine
        return {"same_engine": engine is parent_engine, "backend": backend(),
                "users": [u.name for u in store.list_users()]}

    seen = _in_child(child)["ok"]
    assert seen["same_engine"] is False
    assert seen["users"] == ["parent"]  # the child's own engine works
    if postgres:
        assert seen["backend"] != parent_backend  # its own connection, not the parent's socket
    # The child let go of the parent's pooled connection without closing it: still the parent's, still working.
    assert db.engine is parent_engine
    assert backend() == parent_backend
    assert [u.name for u in store.list_users()] == ["parent"]
    db.dispose()


def test_the_pool_is_sized_by_the_limits_file_and_holds_no_more(database_url: str) -> None:
    """``clients.database_connections``/``database_overflow``: an engine made before the sizing
    is remade with it; with no overflow, two connections are all the database ever sees."""
    database = Database(database_url, secrets=SecretBox([KEY]))
    database.migrate()
    before = database.engine
    database.size_pool(2, 0)
    engine = database.engine
    assert engine is not before
    assert engine.pool.size() == 2 and engine.pool._max_overflow == 0  # type: ignore[attr-defined]
    held = [engine.connect() for _ in range(2)]
    try:
        for conn in held:
            conn.execute(text("SELECT 1"))
        if database.backend == "postgresql":
            assert _backends_settled(database_url, 2) == 2
        engine.pool._timeout = 0.2  # type: ignore[attr-defined]
        from sqlalchemy.exc import TimeoutError as PoolTimeout
        with pytest.raises(PoolTimeout):
            engine.connect()  # a third waits for one of the two, then gives up
    finally:
        for conn in held:
            conn.close()
        database.dispose()
