"""The recording policy through a real gateway: ``required`` fails closed, ``on`` fails open and
counts, the database store serves what the directory would, stdin only when enabled."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bcs_middleware.recording import asciicast
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.kube import kubectl

from .conftest import CLUSTER
from .terminal_pod import EXIT_CODE, TerminalPod
from .test_kubectl_sessions import finished_session, interactive, session_ids


def metric(gw: Gateway, name: str, label: str) -> float:
    status, body = gw.call("GET", "/metrics")
    assert status == 200, body
    for line in body.decode().splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_required_recording_that_cannot_be_written_refuses_the_session(
    gateway: Gateway, alice: str, kubeconfigs: dict[str, Path], pod: TerminalPod,
) -> None:
    recordings = gateway.data / "recordings"
    shutil.rmtree(recordings, ignore_errors=True)
    # Unwritable whoever runs the tests (root ignores modes): a file where the folder should be.
    recordings.write_text("not a folder")
    try:
        failures = metric(gateway, "bcs_recording_failures_total", 'stage="create"')
        count = len(pod.sessions)
        refused = kubectl("exec", "p", "-c", "app", "--", "true", kubeconfig=kubeconfigs["alice-required"])
        assert refused.returncode != 0
        assert "must be recorded" in refused.stderr, refused.stderr
        assert len(pod.sessions) == count  # nothing reached the pod
        # "on": the same failure lets the session through, unrecorded, and counts it.
        passed = kubectl("exec", "p", "-c", "app", "--", "true", kubeconfig=kubeconfigs["alice"])
        assert passed.returncode == EXIT_CODE, passed.stderr
        assert len(pod.sessions) == count + 1
        # kubectl 1.32 tries WebSocket, then SPDY, on a refusal: at least one failure per session.
        assert metric(gateway, "bcs_recording_failures_total", 'stage="create"') >= failures + 2
        assert metric(gateway, "bcs_session_recordings_total", 'outcome="refused"') >= 1
        assert metric(gateway, "bcs_session_recordings_total", 'outcome="unrecorded"') >= 1
    finally:
        recordings.unlink()
    # Writable again: the required cluster's sessions go through, recorded.
    before = session_ids(gateway, alice, "BCS-K8S-REC02")
    code, _seen = interactive(kubeconfigs["alice-required"], None, "exec", pod)
    assert code == EXIT_CODE
    assert finished_session(gateway, alice, before, "BCS-K8S-REC02")["status"] == "complete"


@pytest.fixture(scope="module")
def db_gateway(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("dbgateway")
    args = ["--record", "required", "--recording-store", "database", "--record-stdin"]
    with served_gateway(data, args=args, workers=1) as gw:
        register_cluster(gw, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gw
    assert SA_TOKEN not in gw.server.output()


def test_the_database_store_records_stdin_when_enabled(db_gateway: Gateway, pod: TerminalPod,
                                                        tmp_path: Path) -> None:
    kubeconfig = db_gateway.kubeconfig(db_gateway.admin, tmp_path / "kc", cluster=CLUSTER)
    before = session_ids(db_gateway, db_gateway.admin)
    code, seen = interactive(kubeconfig, None, "exec", pod)
    assert code == EXIT_CODE
    info = finished_session(db_gateway, db_gateway.admin, before)
    assert info["status"] == "complete" and info["stdin_recorded"] is True
    assert not (db_gateway.data / "recordings").exists()  # the database holds it
    status, body = db_gateway.call("GET", f"/rest/sessions/{info['id']}/recording")
    assert status == 200
    _header, events = asciicast.parse(body.decode().splitlines(keepends=True))
    events_list = list(events)
    typed = "".join(e.data for e in events_list if e.code == "i")
    assert typed.encode() == bytes(seen.stdin) and "echo recorded\r" in typed
    assert "".join(e.data for e in events_list if e.code == "o").encode() == bytes(seen.stdout)
    assert info["size"] == len(body)
