"""A recording store that hangs in the kernel never stalls the gevent worker.

The store's calls run on operating-system threads (``bcs_middleware/core/offload.py``). To hang
one for real, a session's description file is made a FIFO nobody reads, right before the
session ends: the writer's ``open(ID.json.tmp, O_WRONLY)`` then blocks in the kernel, as an
``open`` or ``write`` on a dead NFS server or a full FUSE mount does. Under gevent a call
blocked in the kernel stops every greenlet of its thread — before the store's calls left the
event loop, it was the whole worker. Now: other requests of the same (only) worker are answered
at once, a ``required`` session that cannot be recorded is refused (``503``) or cut, and an
``on`` session goes on unrecorded, each failure counted. The same for what ``/rest/sessions``
reads (a recording's file, the descriptions a listing reads): ``503`` after the stall timeout,
the worker's other requests answered meanwhile.
"""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
import websocket

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import wait_for

from .conftest import CLUSTER, REQUIRED
from .terminal_pod import RawTerminal, TerminalPod
from .test_policy import metric

QUERY = "container=app&command=sh&stdin=true&stdout=true&tty=true"
STALL = 1.0  # --recording-stall-timeout: a store call may take this long (a write twice this)


@pytest.fixture(scope="module")
def hung(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("hung")
    args = ["--record", "on", "--record-cluster", f"{REQUIRED}=required", "--recording-stall-timeout", f"{STALL:g}s",
            "--worker-class", "gevent", "--audit-log", str(data / "audit.jsonl")]
    with served_gateway(data, args=args, workers=1) as gw:  # one worker: every request shares its event loop
        for cluster in (CLUSTER, REQUIRED):
            register_cluster(gw, cluster, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gw
    assert SA_TOKEN not in gw.server.output()


@pytest.fixture(scope="module")
def carol(hung: Gateway) -> str:
    token = hung.user("carol-hung")
    for cluster in (CLUSTER, REQUIRED):
        hung.grant("carol-hung", "edit", cluster)
    return token


def _terminal(gw: Gateway, token: str, cluster: str) -> RawTerminal:
    return RawTerminal(f"wss://localhost:{gw.server.port}/tunnels/clusters/{cluster}/api/v1/namespaces/default/pods/"
                       f"p/exec?{QUERY}", token=token, ca_file=gw.ca_file, protocol="v5.channel.k8s.io")


def _short_session(gw: Gateway, token: str, cluster: str) -> None:
    """A session that waits for the prompt and exits."""
    with _terminal(gw, token, cluster) as term:
        term.exit_at_prompt()


def _casts(gw: Gateway) -> set[str]:
    folder = gw.data / "recordings"
    return {p.stem for p in folder.glob("*.cast")} if folder.exists() else set()


def _session_with_a_hung_end(gw: Gateway, token: str) -> Path:
    """A recorded session whose description becomes a FIFO nobody reads just before it ends."""
    before = _casts(gw)
    term = _terminal(gw, token, CLUSTER)
    try:
        term.read_until(1, b"$ ")
        new = wait_for(lambda: _casts(gw) - before, 30, "the session's recording file")
        (session_id,) = new
        fifo = gw.data / "recordings" / f"{session_id}.json.tmp"
        os.mkfifo(fifo, 0o600)
        term.type("exit\r")
        term.read_to_end()
    finally:
        term.close()
    return fifo


def _held_in_the_kernel(gw: Gateway) -> int:
    """Threads of the gateway's workers blocked opening a FIFO nobody reads (the kernel's wait)."""
    master = gw.server.proc.pid
    workers = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    held = 0
    for pid in workers:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                held += (task / "wchan").read_text() == "wait_for_partner"
            except OSError:
                continue  # the thread ended meanwhile
    return held


def _session_event(gw: Gateway, cluster: str, user: str) -> dict | None:
    """The audit event of ``user``'s recorded session on ``cluster`` (not of a refused one)."""
    audit = gw.data / "audit.jsonl"
    for line in audit.read_text().splitlines() if audit.exists() else []:
        doc = json.loads(line)
        notes = doc.get("annotations", {})
        if doc["stage"] == "ResponseComplete" and doc["user"]["username"] == user \
                and notes.get("bcs-middleware/cluster") == cluster and "bcs-middleware/recording-id" in notes:
            return doc
    return None


def _answered_within(gw: Gateway, token: str, seconds: float) -> float:
    """A proxied request's answer time; fails if it takes longer than ``seconds``."""
    started = time.monotonic()
    try:
        status, body = gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods/p", token=token,
                               timeout=seconds)
    except (TimeoutError, urllib.error.URLError):
        raise AssertionError(f"the worker did not answer within {seconds:g}s") from None
    assert status == 200, body
    return time.monotonic() - started


def _release(fifo: Path) -> None:
    """Let the blocked open() return (a reader comes), then take away the FIFO it was renamed to."""
    try:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    try:
        renamed = fifo.with_suffix("")  # ID.json: os.replace moves the FIFO there once written
        wait_for(lambda: renamed.exists() and stat.S_ISFIFO(renamed.stat().st_mode), 30, "the writer to go on")
        renamed.unlink()
    finally:
        os.close(reader)


def test_a_hung_store_stalls_no_request_and_each_policy_holds(hung: Gateway, carol: str, pod: TerminalPod) -> None:
    # A required session already running when the store hangs.
    required = _terminal(hung, carol, REQUIRED)
    fifos: list[Path] = []
    try:
        required.read_until(1, b"$ ")
        fifos.append(_session_with_a_hung_end(hung, carol))
        # A thread of the worker is stuck in the kernel on that open(): the worker answers all the same.
        wait_for(lambda: _held_in_the_kernel(hung) >= 1, 30, "the writer's open() to block")
        assert _answered_within(hung, carol, 5) < 3
        fifos.append(_session_with_a_hung_end(hung, carol))
        wait_for(lambda: _held_in_the_kernel(hung) >= 2, 30, "a second open() to block: every store thread held")
        assert _answered_within(hung, carol, 5) < 3
        wait_for(lambda: metric(hung, "bcs_recording_failures_total", 'stage="finish"') >= 2, 30,
                 "both hung recordings to be counted as failed")

        # required: a session whose recording cannot be created is refused, nothing reaches the pod.
        created = metric(hung, "bcs_recording_failures_total", 'stage="create"')
        count = len(pod.sessions)
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            _terminal(hung, carol, REQUIRED)
        assert refused.value.status_code == 503
        assert len(pod.sessions) == count
        # on: the same session goes through, unrecorded, counted.
        _short_session(hung, carol, CLUSTER)
        assert len(pod.sessions) == count + 1
        assert metric(hung, "bcs_recording_failures_total", 'stage="create"') >= created + 2

        # required, in progress: what it prints cannot be written, so it is cut (at its first
        # bytes after the store hung: it may be gone already).
        try:
            required.type("echo still here\r")
        except (websocket.WebSocketConnectionClosedException, OSError):
            pass
        required.read_to_end()
        assert required.closed
        event = wait_for(lambda: _session_event(hung, REQUIRED, "carol-hung"), 30, "the required session's event")
        assert event["annotations"]["bcs-middleware/recording"] == "failed"
        assert _answered_within(hung, carol, 5) < 3
    finally:
        required.close()
        for fifo in fifos:
            _release(fifo)


def _release_reader(fifo: Path, saved: bytes) -> None:
    """Let an open() for reading blocked on ``fifo`` return (a writer comes and goes), then put
    the file back."""
    try:
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader waits (ENXIO): nothing to release
        pass
    else:
        os.close(writer)
    fifo.unlink(missing_ok=True)
    fifo.write_bytes(saved)


def test_a_hung_store_stalls_no_listing_or_download(hung: Gateway, carol: str, pod: TerminalPod) -> None:
    # A finished recording, then its file (and later its description) hangs every open() for reading.
    before = _casts(hung)
    _short_session(hung, carol, CLUSTER)
    (session_id,) = wait_for(lambda: _casts(hung) - before, 30, "the session's recording file")
    wait_for(lambda: hung.json("GET", f"/rest/sessions/{session_id}")["status"] == "complete", 30,
             "the recording to be complete")
    folder = hung.data / "recordings"
    cast, meta = folder / f"{session_id}.cast", folder / f"{session_id}.json"
    saved_cast, saved_meta = cast.read_bytes(), meta.read_bytes()
    cast.unlink()
    os.mkfifo(cast, 0o600)
    try:
        started = time.monotonic()
        status, body = hung.call("GET", f"/rest/sessions/{session_id}/recording", timeout=10)
        assert status == 503 and b"RECORDING_STORE_UNAVAILABLE" in body, body
        assert time.monotonic() - started < STALL + 3
        wait_for(lambda: _held_in_the_kernel(hung) >= 1, 30, "the download's open() to block")
        assert _answered_within(hung, carol, 5) < 3
        # The listing reads every description: one that hangs makes it a 503, not a stalled worker.
        meta.unlink()
        os.mkfifo(meta, 0o600)
        status, body = hung.call("GET", f"/rest/sessions?cluster={CLUSTER}", timeout=10)
        assert status == 503 and b"RECORDING_STORE_UNAVAILABLE" in body, body
        assert _answered_within(hung, carol, 5) < 3
    finally:
        _release_reader(cast, saved_cast)
        if not meta.exists() or stat.S_ISFIFO(meta.stat().st_mode):
            _release_reader(meta, saved_meta)
    # Once the store answers again, so does the API.
    wait_for(lambda: hung.call("GET", f"/rest/sessions/{session_id}/recording")[0] == 200, 30,
             "the recording to be served again")
