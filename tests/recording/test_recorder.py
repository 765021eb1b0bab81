"""The bounded buffer between the splice and the store: a stalled store never blocks the splice.

Real sockets (socket pairs) and the real splice; the store is an in-memory sink whose writes
block until released, as a hung disk or database would.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime

import pytest

from bcs_middleware.core.splice import splice
from bcs_middleware.recording.catalog import SessionInfo
from bcs_middleware.recording.recorder import SessionRecorder
from bcs_middleware.recording.settings import RecordingSettings
from tests.support.polling import wait_until
from tests.support.websocket import frame

MiB = 1024 * 1024


class StuckSink:
    """Takes the first write, then blocks every later one until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.written: list[str] = []
        self.closed: SessionInfo | None = None

    def write(self, text: str) -> None:
        if self.written:
            self.release.wait(60)
        self.written.append(text)

    def close(self, info: SessionInfo) -> None:
        self.closed = info


class StuckStore:
    def __init__(self) -> None:
        self.sink = StuckSink()

    def create(self, info: SessionInfo) -> StuckSink:
        return self.sink

    def prune(self, **_: object) -> int:
        return 0

    def in_progress(self) -> list[SessionInfo]:
        return []

    def heartbeat(self, *_: object) -> None:
        pass


def _session() -> SessionInfo:
    return SessionInfo(id="", cluster_id="c1", user="u", started_at=datetime.now(UTC), transport="websocket")


def _run(mode: str) -> tuple[float, int, object, StuckStore]:
    """Splice 16 MiB of stdout messages from a fake upstream to a reading client, recorded into a stuck store."""
    store = StuckStore()
    recorder = SessionRecorder(store, RecordingSettings(mode=mode, buffer=256 * 1024, stall_timeout=0.5))  # type: ignore[arg-type]
    recording = recorder.begin(_session(), mode)  # type: ignore[arg-type]
    recording.start("websocket")
    client_near, client_far = socket.socketpair()
    upstream_near, upstream_far = socket.socketpair()
    message = frame(0x2, b"\x01" + b"x" * 65535)
    total = 256 * len(message)
    received = [0]

    def pod() -> None:
        try:
            for _ in range(256):
                upstream_far.sendall(message)
            upstream_far.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the splice was cut

    def client() -> None:
        while data := client_far.recv(1 << 20):
            received[0] += len(data)

    threads = [threading.Thread(target=pod), threading.Thread(target=client)]
    for t in threads:
        t.start()
    client_far.shutdown(socket.SHUT_WR)
    started = time.monotonic()
    result = splice(client_near, upstream_near, idle_timeout=30, max_duration=60, tap=recording)
    seconds = time.monotonic() - started
    for sock in (client_near, upstream_near):
        sock.close()
    for t in threads:
        t.join(30)
    upstream_far.close()
    client_far.close()
    store.sink.release.set()
    recorder.finish(recording, recording.info)
    assert received[0] <= total
    return seconds, received[0], result, store


def test_a_stalled_store_lets_an_on_session_go_on_unrecorded() -> None:
    seconds, received, result, store = _run("on")
    assert result.ended_by == "closed"  # type: ignore[attr-defined]
    assert received == 256 * len(frame(0x2, b"\x01" + b"x" * 65535))  # every byte reached the client
    assert seconds < 20
    assert store.sink.closed is not None and store.sink.closed.status == "failed"
    assert "took nothing" in store.sink.closed.failure


def test_a_stalled_store_cuts_a_required_session() -> None:
    seconds, received, result, store = _run("required")
    assert result.ended_by == "tap"  # type: ignore[attr-defined]
    assert received < 256 * 65540  # cut before the end
    assert seconds < 20
    assert store.sink.closed is not None and store.sink.closed.status == "failed"


@pytest.mark.parametrize("mode", ["on", "required"])
def test_the_buffer_bounds_what_a_session_holds(mode: str) -> None:
    store = StuckStore()
    store.sink.written.append("")  # every write blocks
    recorder = SessionRecorder(store, RecordingSettings(buffer=64 * 1024, stall_timeout=0.2))
    recording = recorder.begin(_session(), mode)  # type: ignore[arg-type]
    recording.start("websocket")
    piece = frame(0x2, b"\x01" + b"b" * (300 * 1024))  # past the header's hold: written at once
    recording.observe(False, piece)
    assert recording.hold() == "wait"  # full (the writer holds it, stuck in the store): the splice stops reading
    assert wait_until(lambda: recording.hold() != "wait", timeout=5)  # the store took nothing for 0.2 s
    assert recording.hold() == ("cut" if mode == "required" else "go")
    held = recording.produced
    recording.observe(False, piece)  # a failed recording takes nothing more
    assert recording.produced == held
    store.sink.release.set()
    info = recorder.finish(recording, recording.info)
    assert info.status == "failed" and "took nothing" in info.failure


@pytest.mark.parametrize("mode", ["on", "required"])
def test_a_recording_stops_at_its_users_bound_while_the_session_runs(mode: str) -> None:
    # Retention deletes finished recordings only: a session that prints without end would hold
    # whatever it printed, past every bound, until it ends.
    store = StuckStore()
    store.sink.release.set()  # a store that takes everything at once
    recorder = SessionRecorder(store, RecordingSettings(max_bytes=4 * MiB, max_bytes_per_user=256 * 1024))
    recording = recorder.begin(_session(), mode)  # type: ignore[arg-type]
    recording.start("websocket")
    piece = frame(0x2, b"\x01" + b"y" * (64 * 1024))
    for _ in range(8):  # 512 KiB of output, taken by the writer piece by piece
        assert recording.hold() in ("go", "cut")
        recording.observe(False, piece)
        assert wait_until(lambda: recording.consumed == recording.produced, timeout=5)
    assert recording.hold() == ("cut" if mode == "required" else "go")
    info = recorder.finish(recording, recording.info)
    assert info.status == "failed" and "bound of 262144 bytes" in info.failure
    written = sum(len(text.encode()) for text in store.sink.written)
    assert 128 * 1024 < written <= 256 * 1024  # what fitted was kept


def test_a_recording_within_its_bound_is_complete() -> None:
    store = StuckStore()
    store.sink.release.set()
    recorder = SessionRecorder(store, RecordingSettings(max_bytes=4 * MiB, max_bytes_per_user=256 * 1024))
    recording = recorder.begin(_session(), "required")
    recording.start("websocket")
    recording.observe(False, frame(0x2, b"\x01" + b"y" * (100 * 1024)))
    assert recording.hold() == "go"
    info = recorder.finish(recording, recording.info)
    assert info.status == "complete" and not info.failure


def test_an_idle_writer_sleeps_until_its_next_retention_pass_and_a_new_session_wakes_it() -> None:
    now = [1000.0]
    store = StuckStore()
    store.sink.release.set()
    recorder = SessionRecorder(store, RecordingSettings(mode="on", retention_interval=600.0), clock=lambda: now[0])
    writer = recorder._writer.get()
    assert recorder._next_wait(writer) < 1  # its first pass is due at once
    writer.last_pass = now[0]
    now[0] += 100
    assert recorder._next_wait(writer) == 500  # no recording: nothing to do before the next pass
    recording = recorder.begin(_session(), "on")  # starts the writer and wakes it
    assert recorder._next_wait(writer) < 1  # a recording: served every period
    recording.start("websocket")
    recording.observe(False, frame(0x2, b"\x01" + b"z" * 1000))
    info = recorder.finish(recording, recording.info)
    assert info.status == "complete"
