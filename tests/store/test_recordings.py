"""Recordings in the database (``recording_store = database``), on SQLite and PostgreSQL: what one
instance writes another lists and serves; retention by age and by total size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from bcs_middleware.recording.catalog import RecordingStore, SessionInfo, SessionQuery
from bcs_middleware.recording.directory import DirectoryStore
from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.migrate import upgrade
from bcs_middleware.store.recordings import RecordingRepository


@pytest.fixture
def repositories(database_url: str):  # type: ignore[no-untyped-def]
    box = SecretBox([Fernet.generate_key()])
    first, second = Database(database_url, secrets=box), Database(database_url, secrets=box)
    upgrade(first)
    yield RecordingRepository(first), RecordingRepository(second)
    first.dispose()
    second.dispose()


def _info(number: int, *, cluster: str = "c1", user: str = "alice", started: datetime | None = None) -> SessionInfo:
    return SessionInfo(id=f"{number:032x}", cluster_id=cluster, user=user,
                       started_at=started or datetime.now(UTC), pod="p", command=("sh",))


def _record(store: RecordingStore, info: SessionInfo, pieces: list[str], *, ended: datetime | None = None) -> None:
    sink = store.create(info)
    for piece in pieces:
        sink.write(piece)
    sink.close(info.ended(status="complete", ended_at=ended or datetime.now(UTC), exit_code=0))


def test_what_one_instance_records_another_lists_and_serves(repositories) -> None:  # type: ignore[no-untyped-def]
    writer, reader = repositories
    info = _info(1)
    sink = writer.create(info)
    assert [s.status for s in reader.sessions(SessionQuery())] == ["recording"]  # listed while it runs
    pieces = ['{"version": 2, "width": 80, "height": 24, "timestamp": 0}\n'] + \
        [f'[{i}.0, "o", "{"x" * 1000}"]\n' for i in range(40)]  # more chunks than one read takes
    for piece in pieces:
        sink.write(piece)
    sink.close(info.ended(status="complete", ended_at=datetime.now(UTC), exit_code=3))
    found = reader.get(info.id)
    assert found is not None and found.status == "complete" and found.exit_code == 3
    assert found.size == sum(len(p) for p in pieces) and found.command == ("sh",)
    assert b"".join(reader.read(info.id)) == "".join(pieces).encode()
    assert reader.get("0" * 32) is None


def test_listing_filters(repositories) -> None:  # type: ignore[no-untyped-def]
    store, _ = repositories
    now = datetime.now(UTC)
    _record(store, _info(1, cluster="c1", user="alice", started=now - timedelta(hours=3)), ["a"],
            ended=now - timedelta(hours=2))
    _record(store, _info(2, cluster="c2", user="bob", started=now - timedelta(hours=1)), ["b"])
    ids = lambda q: [s.id[-1] for s in store.sessions(q)]  # noqa: E731
    assert ids(SessionQuery()) == ["2", "1"]
    assert ids(SessionQuery(cluster_id="c1")) == ["1"] and ids(SessionQuery(user="bob")) == ["2"]
    assert ids(SessionQuery(since=now - timedelta(minutes=90))) == ["2"]
    assert ids(SessionQuery(until=now - timedelta(minutes=150))) == ["1"]
    assert ids(SessionQuery(clusters=frozenset({"c2"}))) == ["2"] and ids(SessionQuery(clusters=frozenset())) == []


def _retention(store: RecordingStore) -> None:
    now = datetime.now(UTC)
    for number, age in ((1, 50), (2, 20), (3, 10)):  # days since the end
        _record(store, _info(number, started=now - timedelta(days=age, minutes=1)), ["x" * 1000],
                ended=now - timedelta(days=age))
    running = _info(4, started=now - timedelta(days=90))
    sink = store.create(running)  # still recording: never pruned
    assert store.prune(now=now, max_age=30 * 86400.0, max_bytes=None) == 1
    assert sorted(s.id[-1] for s in store.sessions(SessionQuery())) == ["2", "3", "4"]
    assert store.prune(now=now, max_age=None, max_bytes=1500) == 1  # the oldest goes first
    assert sorted(s.id[-1] for s in store.sessions(SessionQuery())) == ["3", "4"]
    assert store.prune(now=now, max_age=None, max_bytes=None) == 0
    sink.close(running)  # described as it still is (a process that died mid-session leaves this)


def test_retention_in_the_database(repositories) -> None:  # type: ignore[no-untyped-def]
    _retention(repositories[0])


def test_retention_in_a_directory(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "recordings")
    _retention(store)
    assert sorted(p.name for p in (tmp_path / "recordings").iterdir()) == sorted(
        f"{n:032x}.{ext}" for n in (3, 4) for ext in ("cast", "json"))
    assert oct((tmp_path / "recordings").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "recordings" / f"{3:032x}.cast").stat().st_mode & 0o777) == "0o600"
