"""An exec/attach session that is not recorded (``record: off``) still gets its one audit event
with the session's record — container, command, tty, start and end, bytes each way and the exit
code the apiserver reported on the error channel — read as the stream passes, nothing stored:
real kubectl through a real gateway, over WebSocket and SPDY."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.kube import kubectl
from tests.support.polling import wait_for

from .conftest import CLUSTER, SPDY_KUBECTL
from .terminal_pod import EXIT_CODE, PtyKubectl, RawTerminal, TerminalPod

needs_spdy_kubectl = pytest.mark.skipif(SPDY_KUBECTL is None, reason="no kubectl older than 1.30 installed")
TRANSPORTS = [pytest.param(None, id="websocket"),
              pytest.param(SPDY_KUBECTL, id="spdy", marks=needs_spdy_kubectl)]
SECRET = "hunter2-typed-at-a-prompt"


@pytest.fixture(scope="module")
def unrecorded(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("unrecorded")
    with served_gateway(data, args=["--audit-log", str(data / "audit.jsonl")], workers=1) as gw:  # record: off
        register_cluster(gw, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gw
    assert SA_TOKEN not in gw.server.output()


@pytest.fixture(scope="module")
def dave(unrecorded: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Path:
    token = unrecorded.user("dave-unrec")
    unrecorded.grant("dave-unrec", "view", CLUSTER)
    return unrecorded.kubeconfig(token, tmp_path_factory.mktemp("kc") / "dave", cluster=CLUSTER)


def _session_events(gw: Gateway) -> list[dict]:
    audit = gw.data / "audit.jsonl"
    found = []
    for line in audit.read_text().splitlines() if audit.exists() else []:
        doc = json.loads(line)
        if doc["stage"] == "ResponseComplete" and doc.get("objectRef", {}).get("subresource") in ("exec", "attach") \
                and doc["user"]["username"] == "dave-unrec":
            found.append(doc)
    return found


def _next_event(gw: Gateway, before: int) -> dict:
    return wait_for(lambda: _session_events(gw)[before] if len(_session_events(gw)) > before else None, 30,
                    "the session's ResponseComplete event")


@pytest.mark.parametrize("version", TRANSPORTS)
def test_an_unrecorded_sessions_event_carries_its_exit_code(unrecorded: Gateway, dave: Path, pod: TerminalPod,
                                                           version: str | None) -> None:
    before = len(_session_events(unrecorded))
    count = len(pod.sessions)
    done = kubectl("exec", "p", "-c", "app", "--", "ls", "-l", kubeconfig=dave, version=version)
    assert done.returncode == EXIT_CODE, done.stderr
    seen = pod.sessions[count]
    notes = _next_event(unrecorded, before)["annotations"]
    assert notes["bcs-middleware/session-exit-code"] == str(EXIT_CODE)
    assert notes["bcs-middleware/recording"] == "off" and "bcs-middleware/recording-id" not in notes
    assert notes["bcs-middleware/session-container"] == "app"
    assert json.loads(notes["bcs-middleware/session-command"]) == ["ls", "-l"]
    assert notes["bcs-middleware/session-tty"] == "false"
    assert int(notes["bcs-middleware/bytes-to-client"]) > len(seen.stdout)
    assert notes["bcs-middleware/session-start"] <= notes["bcs-middleware/session-end"]


@pytest.mark.parametrize("version", TRANSPORTS)
def test_an_unrecorded_interactive_session_keeps_nothing_typed(unrecorded: Gateway, dave: Path, pod: TerminalPod,
                                                              version: str | None) -> None:
    before = len(_session_events(unrecorded))
    count = len(pod.sessions)
    session = PtyKubectl(["exec", "-it", "p", "-c", "app", "--", "sh"], kubeconfig=dave, version=version)
    try:
        session.wait_for(b"$ ")
        session.type(f"{SECRET}\r")
        session.wait_for(SECRET.encode() + b"\r\n")
        session.type("exit\r")
        session.wait_for(b"bye\r\n")
    finally:
        code = session.finish()
    assert code == EXIT_CODE
    seen = pod.sessions[count]
    assert SECRET.encode() in seen.stdin
    notes = _next_event(unrecorded, before)["annotations"]
    assert notes["bcs-middleware/session-exit-code"] == str(EXIT_CODE)
    assert notes["bcs-middleware/session-tty"] == "true"
    assert int(notes["bcs-middleware/bytes-to-upstream"]) >= len(seen.stdin)
    # Not recorded, so nowhere: no recording, no listing, and what was typed in no file of the gateway.
    assert unrecorded.json("GET", "/rest/sessions")["sessions"] == []
    assert not (unrecorded.data / "recordings").exists()
    for path in unrecorded.data.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in unrecorded.server.output()


def test_an_unrecorded_base64_sessions_event_carries_its_exit_code(unrecorded: Gateway, pod: TerminalPod) -> None:
    # A browser terminal's protocol (TEXT frames, base64): the error channel is read all the same.
    token = unrecorded.user("erin-unrec")
    unrecorded.grant("erin-unrec", "view", CLUSTER)
    with RawTerminal(f"wss://localhost:{unrecorded.server.port}/tunnels/clusters/{CLUSTER}/api/v1/namespaces/"
                     "default/pods/p/exec?container=app&command=sh&stdin=true&stdout=true&tty=true",
                     token=token, ca_file=unrecorded.ca_file, protocol="v4.base64.channel.k8s.io") as term:
        term.exit_at_prompt()

    def event() -> dict | None:
        audit = unrecorded.data / "audit.jsonl"
        for line in audit.read_text().splitlines() if audit.exists() else []:
            doc = json.loads(line)
            if doc["stage"] == "ResponseComplete" and doc["user"]["username"] == "erin-unrec" \
                    and doc.get("objectRef", {}).get("subresource") == "exec":
                return doc
        return None

    notes = wait_for(event, 30, "the session's ResponseComplete event")["annotations"]
    assert notes["bcs-middleware/session-exit-code"] == str(EXIT_CODE)
    assert notes["bcs-middleware/recording"] == "off"
