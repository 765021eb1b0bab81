"""Retention's rules (:mod:`bcs_middleware.recording.retention`), the settings that feed them, and
the recorder's pass that ends sessions whose writer is gone — in a real directory store."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bcs_middleware.recording.catalog import RecordingSink, SessionInfo, SessionQuery
from bcs_middleware.recording.directory import DirectoryStore
from bcs_middleware.recording.liveness import holder_gone, process_identity
from bcs_middleware.recording.recorder import SessionRecorder
from bcs_middleware.recording.retention import Retention, Stored, doomed
from bcs_middleware.recording.settings import RecordingSettings

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _at(hours: float) -> datetime:
    return NOW - timedelta(hours=hours)


@pytest.mark.parametrize(("recordings", "retention", "gone"), [
    pytest.param([Stored("a", "alice", 10, _at(5)), Stored("b1", "bob", 60, _at(4)), Stored("b2", "bob", 60, _at(3))],
                 Retention(max_bytes=100, max_bytes_per_user=80), ["b1"], id="the-flooder-pays-first"),
    pytest.param([Stored("a", "alice", 10, _at(5)), Stored("b1", "bob", 60, _at(4)), Stored("b2", "bob", 60, _at(3))],
                 Retention(max_bytes=100), ["a", "b1"], id="no-per-user-bound-oldest-first"),
    pytest.param([Stored("a", "alice", 10, _at(5)), Stored("b1", "bob", 50, _at(4)), Stored("b2", "bob", 500, None)],
                 Retention(max_bytes=100, max_bytes_per_user=60), ["b1"], id="a-running-flood-evicts-nobody-else"),
    pytest.param([Stored("a", "alice", 40, _at(5)), Stored("b", "bob", 40, _at(4)), Stored("c", "carol", 40, _at(3))],
                 Retention(max_bytes=100, max_bytes_per_user=50), ["a"], id="then-the-total-oldest-first"),
    pytest.param([Stored("a", "alice", 10, _at(50)), Stored("r", "bob", 10, None)],
                 Retention(max_age=86400.0), ["a"], id="age-never-a-running-one"),
])
def test_what_retention_deletes(recordings: list[Stored], retention: Retention, gone: list[str]) -> None:
    assert doomed(recordings, now=NOW, retention=retention) == gone


def test_the_per_user_bound_defaults_to_a_tenth_of_the_total() -> None:
    assert RecordingSettings(max_bytes=1000).max_bytes_per_user == 100
    assert RecordingSettings(max_bytes=None).max_bytes_per_user is None
    assert RecordingSettings.from_options({"recording_max_size_per_user": 0}).max_bytes_per_user is None
    assert RecordingSettings.from_options({"recording_max_size_per_user": 5}).max_bytes_per_user == 5
    with pytest.raises(ValueError, match="cannot be more than"):
        RecordingSettings(max_bytes=10, max_bytes_per_user=11)
    with pytest.raises(ValueError, match="must be positive"):
        RecordingSettings(heartbeat_timeout=0)


def test_a_live_recording_is_bounded_by_the_users_bound_else_the_totals() -> None:
    assert RecordingSettings(max_bytes=1000).max_bytes_per_recording == 100
    assert RecordingSettings(max_bytes=1000, max_bytes_per_user=None).max_bytes_per_recording == 1000
    assert RecordingSettings(max_bytes=None).max_bytes_per_recording is None
    assert RecordingSettings(max_bytes=0).max_bytes_per_recording is None  # 0: no bound, not "nothing"


def test_a_process_is_named_so_a_reused_pid_is_not_taken_for_it() -> None:
    me = process_identity()
    assert holder_gone(me) is False
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    name = process_identity(child.pid)
    child.wait()
    assert holder_gone(name) is True
    host, pid, _start = me.split("/")
    assert holder_gone(f"{host}/{pid}/1") is True  # this pid, but a process that started at another time
    assert holder_gone(f"another-host/{pid}/{_start}") is None  # only its heartbeats can tell
    assert holder_gone("") is None


def _running(store: DirectoryStore, number: int, holder: str, *, started: datetime) -> RecordingSink:
    info = SessionInfo(id=f"{number:032x}", cluster_id="c1", user="u", started_at=started, holder=holder,
                       status="recording")
    sink = store.create(info)
    sink.write('{"version": 2, "width": 80, "height": 24, "timestamp": 0}\n')
    return sink


def test_the_recorders_pass_ends_sessions_whose_writer_is_gone_or_silent(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "recordings")
    recorder = SessionRecorder(store, RecordingSettings(mode="on", heartbeat_timeout=60.0))
    now = datetime.now(UTC)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = process_identity(child.pid)
    child.wait()
    sinks = [
        _running(store, 1, dead, started=now),                                    # its process is gone
        _running(store, 2, process_identity(), started=now),                      # alive, here
        _running(store, 3, "another-host/1/1", started=now - timedelta(hours=1)),  # another host's, silent
        _running(store, 4, "another-host/1/1", started=now - timedelta(hours=1)),  # another host's, beating
    ]
    old = (now - timedelta(hours=1)).timestamp()
    os.utime(store.cast_path(f"{3:032x}"), (old, old))
    store.heartbeat([f"{4:032x}"], now)
    assert recorder.recover() == 2
    status = {info.id[-1]: info.status for info in store.sessions(SessionQuery())}
    assert status == {"1": "interrupted", "2": "recording", "3": "interrupted", "4": "recording"}
    silent = store.get(f"{3:032x}")
    assert silent is not None and "no sign of life for 60s" in silent.failure
    assert silent.ended_at is not None and abs(silent.ended_at.timestamp() - old) < 1
    assert recorder.recover() == 0  # ended once
    for number, sink in enumerate(sinks, 1):
        info = store.get(f"{number:032x}")
        assert info is not None
        sink.close(info)


def test_a_gateway_that_records_nothing_now_still_keeps_its_recordings_by_the_rules(tmp_path: Path) -> None:
    """The policy turned off after sessions were recorded (``serve`` without ``--record``): the
    workers still end the sessions a dead writer left ``recording`` and still apply retention."""
    from tests.support.gateway import served_gateway
    from tests.support.polling import wait_for

    store = DirectoryStore(tmp_path / "recordings")  # the directory store's default place
    now = datetime.now(UTC)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = process_identity(child.pid)
    child.wait()
    stale = _running(store, 1, dead, started=now)
    old = _running(store, 2, process_identity(), started=now - timedelta(days=2))
    old_info = store.get(f"{2:032x}")
    assert old_info is not None
    old.close(old_info.ended(status="complete", ended_at=now - timedelta(days=2)))
    kept = _running(store, 3, process_identity(), started=now)
    kept_info = store.get(f"{3:032x}")
    assert kept_info is not None
    kept.close(kept_info.ended(status="complete", ended_at=now))
    with served_gateway(tmp_path, args=["--recording-max-age", "24h", "--no-access-log"], workers=1) as gw:
        def settled() -> dict[str, str] | None:
            sessions = gw.json("GET", "/rest/sessions")["sessions"]
            status = {s["id"][-1]: s["status"] for s in sessions}
            return status if status == {"1": "interrupted", "3": "complete"} else None

        wait_for(settled, 30, "the idle writer's first pass")
    stale_info = store.get(f"{1:032x}")
    assert stale_info is not None and "writer process is gone" in stale_info.failure
    stale.close(stale_info)
