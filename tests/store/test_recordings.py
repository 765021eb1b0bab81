"""Recordings in the database (``recording_store = database``), on SQLite and PostgreSQL: what one
instance writes another lists and serves; retention by age and by total size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from bcs_middleware.recording.catalog import RecordingStore, SessionInfo, SessionQuery
from bcs_middleware.recording.directory import DirectoryStore
from bcs_middleware.recording.retention import Retention
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
    assert store.prune(now=now, retention=Retention(max_age=30 * 86400.0)) == 1
    assert sorted(s.id[-1] for s in store.sessions(SessionQuery())) == ["2", "3", "4"]
    assert store.prune(now=now, retention=Retention(max_bytes=1500)) == 1  # the oldest goes first
    assert sorted(s.id[-1] for s in store.sessions(SessionQuery())) == ["3", "4"]
    assert store.prune(now=now, retention=Retention()) == 0
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


def _per_user_retention(store: RecordingStore) -> None:
    """bob's flood of big sessions costs bob his own oldest recordings, never alice's."""
    now = datetime.now(UTC)
    _record(store, _info(1, user="alice", started=now - timedelta(hours=10)), ["a" * 1000],
            ended=now - timedelta(hours=9))  # the oldest of all
    for number in range(2, 8):
        _record(store, _info(number, user="bob", started=now - timedelta(hours=9 - number)), ["b" * 3000],
                ended=now - timedelta(hours=8 - number))
    running = _info(8, user="bob", started=now - timedelta(minutes=5))
    sink = store.create(running)
    sink.write("b" * 9000)  # bob's session in progress, already over his bound alone
    retention = Retention(max_bytes=10_000, max_bytes_per_user=5_000)
    # bob loses every finished recording (his running one stays); alice keeps hers although it is the oldest.
    assert store.prune(now=now, retention=retention) == 6
    assert sorted(s.id[-1] for s in store.sessions(SessionQuery())) == ["1", "8"]
    assert store.prune(now=now, retention=retention) == 0
    sink.close(running.ended(status="complete", ended_at=now))
    # Ended, bob's session is his alone again over his bound: it goes, alice's stays.
    assert store.prune(now=now, retention=retention) == 1
    assert [s.id[-1] for s in store.sessions(SessionQuery())] == ["1"]
    # Without a per-user bound the oldest goes first, whoever's it is (the old behaviour).
    _record(store, _info(9, user="bob"), ["b" * 9500])
    assert store.prune(now=now + timedelta(hours=1), retention=Retention(max_bytes=10_000)) == 1
    assert [s.id[-1] for s in store.sessions(SessionQuery())] == ["9"]


def test_per_user_retention_in_the_database(repositories) -> None:  # type: ignore[no-untyped-def]
    _per_user_retention(repositories[0])


def test_per_user_retention_in_a_directory(tmp_path: Path) -> None:
    _per_user_retention(DirectoryStore(tmp_path / "recordings"))


def _interrupted(store: RecordingStore) -> None:
    """A session left "recording" is listed in progress with its heartbeat; interrupting it ends
    it with what was written (a torn last line dropped), and retention may then take it."""
    info = _info(1)
    sink = store.create(info)
    sink.write('{"version": 2, "width": 80, "height": 24, "timestamp": 0}\n[0.5, "o", "hi"]\n')
    beat = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=5)
    store.heartbeat([info.id], beat)
    [running] = store.in_progress()
    assert running.id == info.id and running.heartbeat_at is not None
    assert abs((running.heartbeat_at - beat).total_seconds()) < 1.0 and running.size > 0
    store.interrupt(running.ended(status="interrupted", ended_at=running.heartbeat_at, failure="gone"))
    assert store.in_progress() == []
    found = store.get(info.id)
    assert found is not None and found.status == "interrupted" and found.ended_at is not None
    text = b"".join(store.read(info.id)).decode()
    assert text.endswith('"hi"]\n') and found.size == len(text.encode())
    assert store.prune(now=datetime.now(UTC) + timedelta(days=2), retention=Retention(max_age=86400.0)) == 1
    sink.close(found)  # the file the dead writer held (the kernel closes it)


def test_an_interrupted_session_in_the_database(repositories) -> None:  # type: ignore[no-untyped-def]
    _interrupted(repositories[0])


def test_an_interrupted_session_in_a_directory_loses_its_torn_line(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "recordings")
    info = _info(2)
    sink = store.create(info)
    sink.write('{"version": 2, "width": 80, "height": 24, "timestamp": 0}\n[0.5, "o", "kept"]\n[0.7, "o", "cu')
    [running] = store.in_progress()
    store.interrupt(running.ended(status="interrupted", ended_at=running.heartbeat_at))
    assert b"".join(store.read(info.id)).endswith(b'"kept"]\n')
    sink.close(running.ended(status="interrupted"))


def test_an_interrupted_session_in_a_directory(tmp_path: Path) -> None:
    _interrupted(DirectoryStore(tmp_path / "recordings"))
