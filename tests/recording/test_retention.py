"""Retention and crashed writers through a real gateway, in both stores.

* One user's flood of sessions costs that user their own oldest recordings, never another
  user's (``--recording-max-size-per-user``), although the other's is the oldest of all.
* A worker killed (SIGKILL) in the middle of a recorded session leaves it marked
  ``recording``; the worker gunicorn starts in its place ends it as ``interrupted``, with
  what was written kept and playable, and retention may then take it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bcs_middleware.recording import asciicast
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.kube import kubectl
from tests.support.polling import wait_for
from tests.support.servers import BIN

from .conftest import CLUSTER
from .terminal_pod import EXIT_CODE, PtyKubectl, TerminalPod

#: Each of bob's sessions prints this much; the bounds below are in these units.
FLOOD_SESSION = 60 * 1024


@pytest.fixture(scope="module", params=["directory", "database"])
def retained(request: pytest.FixtureRequest, apiserver: FakeAPIServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp(f"retained-{request.param}")
    args = ["--record", "on", "--recording-store", request.param,
            "--recording-max-size", "400KiB", "--recording-max-size-per-user", "100KiB",
            "--recording-retention-interval", "1s", "--recording-heartbeat-timeout", "1h",
            "--audit-log", str(data / "audit.jsonl")]
    with served_gateway(data, args=args, workers=1) as gw:
        register_cluster(gw, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gw
    assert SA_TOKEN not in gw.server.output()


def _user_kubeconfig(gw: Gateway, name: str, folder: Path) -> Path:
    token = gw.user(name)
    gw.grant(name, "view", CLUSTER)
    return gw.kubeconfig(token, folder / name, cluster=CLUSTER)


def _sessions(gw: Gateway, user: str) -> list[dict]:
    return list(gw.json("GET", f"/rest/sessions?cluster={CLUSTER}&user={user}")["sessions"])


def _run(kubeconfig: Path, count: int = 1) -> None:
    for _ in range(count):
        done = kubectl("exec", "p", "-c", "app", "--", "cat", "/big", kubeconfig=kubeconfig)
        assert done.returncode == EXIT_CODE, done.stderr


def test_one_users_flood_does_not_evict_another_users_recordings(
    retained: Gateway, pod: TerminalPod, tmp_path: Path,
) -> None:
    alice = _user_kubeconfig(retained, "alice-kept", tmp_path)
    bob = _user_kubeconfig(retained, "bob-flood", tmp_path)
    _run(alice)  # the oldest recording of all
    [kept] = wait_for(lambda: [s for s in _sessions(retained, "alice-kept") if s["status"] == "complete"] or None,
                      30, "alice's recording")
    pod.big = FLOOD_SESSION
    try:
        _run(bob, 8)  # 480 KiB: more than the 400 KiB all recordings may take
    finally:
        pod.big = 0

    def settled() -> bool:
        # Retention (every second) brought everything within 400 KiB, and either bob within his
        # 100 KiB or alice's recording was taken for his.
        alices, bobs = _sessions(retained, "alice-kept"), _sessions(retained, "bob-flood")
        return sum(s["size"] for s in alices + bobs) <= 400 * 1024 and (
            sum(s["size"] for s in bobs) <= 100 * 1024 or not alices)

    wait_for(settled, 60, "retention to delete recordings")
    assert [s["id"] for s in _sessions(retained, "alice-kept")] == [kept["id"]], "bob's flood evicted alice"
    [bobs] = _sessions(retained, "bob-flood")  # his newest; his own older ones went
    assert bobs["size"] > FLOOD_SESSION
    status, body = retained.call("GET", f"/rest/sessions/{kept['id']}/recording")
    assert status == 200 and body.startswith(b'{"version": 2'), body[:200]


def test_a_session_whose_worker_was_killed_is_ended_as_interrupted(
    retained: Gateway, pod: TerminalPod, tmp_path: Path,
) -> None:
    carol = _user_kubeconfig(retained, "carol-crash", tmp_path)
    kubectl_session = PtyKubectl(["exec", "-it", "p", "-c", "app", "--", "sh"], kubeconfig=carol)
    try:
        kubectl_session.wait_for(b"$ ")
        kubectl_session.type("echo before the crash\r")
        kubectl_session.wait_for(b"echo before the crash\r\n")
        [running] = wait_for(lambda: _sessions(retained, "carol-crash") or None, 30, "the session to be listed")
        assert running["status"] == "recording"
        # The session names the process writing it: that worker dies without a chance to say so.
        host, pid, _start = running["holder"].split("/")
        assert host == os.uname().nodename
        # What was shown so far is in the store before the worker dies (the writer writes every 20 ms).
        wait_for(lambda: b"before the crash" in retained.call("GET", f"/rest/sessions/{running['id']}/recording")[1],
                 30, "the output to be recorded")
        os.kill(int(pid), signal.SIGKILL)
    finally:
        kubectl_session.finish()
    # gunicorn starts another worker; on its start it ends the session the dead one left.
    ended = wait_for(lambda: next((s for s in _sessions(retained, "carol-crash") if s["status"] != "recording"),
                                  None), 60, "the session to be ended")
    assert ended["id"] == running["id"] and ended["status"] == "interrupted", ended
    assert "writer process is gone" in ended["failure"]
    assert ended["ended_at"] is not None and ended["ended_at"] >= ended["started_at"]
    assert ended["size"] > 0 and ended["exit_code"] is None
    status, body = retained.call("GET", f"/rest/sessions/{ended['id']}/recording")
    assert status == 200 and len(body) == ended["size"]
    cast = tmp_path / "interrupted.cast"
    cast.write_bytes(body)
    _header, events = asciicast.parse(cast.read_text("utf-8").splitlines(keepends=True))
    assert "before the crash" in "".join(e.data for e in events if e.code == "o")
    played = subprocess.run([str(BIN / "asciinema"), "cat", str(cast)], capture_output=True, timeout=60)
    assert played.returncode == 0 and b"before the crash" in played.stdout, played.stderr
    # Listed as ended for good: the next passes leave it as it is, and it no longer counts as running.
    assert json.loads(retained.call("GET", f"/rest/sessions/{ended['id']}")[1])["status"] == "interrupted"


def test_a_live_session_is_recorded_up_to_its_users_bound_and_goes_on(
    retained: Gateway, pod: TerminalPod, tmp_path: Path,
) -> None:
    dave = _user_kubeconfig(retained, "dave-huge", tmp_path)
    pod.big = 300 * 1024  # three times dave's 100 KiB
    try:
        done = kubectl("exec", "p", "-c", "app", "--", "cat", "/big", kubeconfig=dave)
    finally:
        pod.big = 0
    assert done.returncode == EXIT_CODE, done.stderr  # policy on: the session went on to its end
    assert len(done.stdout) >= 300 * 1024
    [recording] = wait_for(lambda: [s for s in _sessions(retained, "dave-huge") if s["status"] != "recording"] or None,
                           30, "dave's recording to end")
    assert recording["status"] == "failed" and "bound of 102400 bytes" in recording["failure"], recording
    assert 0 < recording["size"] <= 100 * 1024
    status, body = retained.call("GET", f"/rest/sessions/{recording['id']}/recording")
    assert status == 200 and body.startswith(b'{"version": 2') and len(body) == recording["size"]
