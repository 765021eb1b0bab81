"""Every WebSocket subprotocol kube-apiserver answers exec with is recorded as the pod sent it.

Browser terminals (the BlueKing SaaS web console among them) speak ``base64.channel.k8s.io``
or ``v4.base64.channel.k8s.io``: TEXT frames whose first character is the channel digit and the
rest standard base64 (``k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go``). A raw
WebSocket client negotiates each protocol through a real ``serve``; the fake apiserver's pod
answers in it as the kubelet does. The recording must hold what the pod sent and every size
the client reported, and the session's record its exit code where the protocol carries one
(``v4`` and later: a ``metav1.Status`` on the error channel; before ``v4`` only its message).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bcs_middleware.recording import asciicast
from tests.support.gateway import Gateway
from tests.support.polling import wait_for

from .conftest import CLUSTER
from .terminal_pod import EXIT_CODE, FAILURE, RawTerminal, Seen, TerminalPod
from .test_kubectl_sessions import cast_of, finished_session, session_ids

EXEC = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods/p/exec"
QUERY = "container=app&command=sh&stdin=true&stdout=true&tty=true"
PROTOCOLS = [
    pytest.param("v4.base64.channel.k8s.io", True, id="v4.base64"),
    pytest.param("base64.channel.k8s.io", False, id="base64"),
    pytest.param("v5.channel.k8s.io", True, id="v5"),
    pytest.param("v4.channel.k8s.io", True, id="v4"),
    pytest.param("channel.k8s.io", False, id="v1"),
]


def browser_session(gw: Gateway, token: str, pod: TerminalPod, protocol: str) -> tuple[RawTerminal, Seen]:
    """What a web console does: open, report its size, type, resize, type ``exit``, read to the close."""
    count = len(pod.sessions)
    term = RawTerminal(f"wss://localhost:{gw.server.port}{EXEC}?{QUERY}", token=token, ca_file=gw.ca_file,
                       protocol=protocol)
    try:
        assert term.negotiated == protocol
        term.resize(120, 40)
        term.read_until(1, b"$ ")
        seen = pod.sessions[count]
        term.type("echo over " + protocol + "\r")
        term.read_until(1, f"echo over {protocol}\r\n".encode())
        term.resize(90, 20)
        wait_for(lambda: (90, 20) in seen.sizes, 30, f"the new size to reach the pod; it saw {seen.sizes}")
        term.type("exit\r")
        term.read_to_end()
    finally:
        term.close()
    assert seen.subprotocol == protocol
    return term, seen


@pytest.mark.parametrize(("protocol", "reports_exit_code"), PROTOCOLS)
def test_a_session_on_each_websocket_protocol_is_recorded_as_the_pod_sent_it(
    gateway: Gateway, alice: str, pod: TerminalPod, tmp_path: Path, protocol: str, reports_exit_code: bool,
) -> None:
    before = session_ids(gateway, alice)
    term, seen = browser_session(gateway, alice, pod, protocol)
    assert bytes(term.streams[1]) == bytes(seen.stdout)  # the client got what the pod sent
    info = finished_session(gateway, alice, before)
    assert info["status"] == "complete", info
    cast = cast_of(gateway, alice, info["id"], tmp_path)
    header, events = asciicast.parse(cast.read_text("utf-8").splitlines(keepends=True))
    events_list = list(events)
    output = "".join(e.data for e in events_list if e.code == "o")
    assert output.encode("utf-8") == bytes(seen.stdout)
    assert seen.sizes == [(120, 40), (90, 20)]
    assert (header.width, header.height) == (120, 40)
    assert [e.data for e in events_list if e.code == "r"] == ["120x40", "90x20"]
    assert not [e for e in events_list if e.code == "i"]  # stdin is not recorded by default
    if reports_exit_code:
        assert info["exit_code"] == EXIT_CODE
        assert json.loads(bytes(term.streams[3]))["reason"] == "NonZeroExitCode"
    else:  # before v4 the error channel carries the message only, no code to report
        assert info["exit_code"] is None
        assert bytes(term.streams[3]).decode() == FAILURE["message"]


def _audit_event(gw: Gateway, recording_id: str) -> dict | None:
    audit = gw.data / "audit.jsonl"
    for line in audit.read_text().splitlines() if audit.exists() else []:
        doc = json.loads(line)
        notes = doc.get("annotations", {})
        if doc["stage"] == "ResponseComplete" and notes.get("bcs-middleware/recording-id") == recording_id:
            return doc
    return None


def test_the_audit_event_of_a_base64_session_carries_its_exit_code(gateway: Gateway, alice: str,
                                                                   pod: TerminalPod) -> None:
    before = session_ids(gateway, alice)
    browser_session(gateway, alice, pod, "v4.base64.channel.k8s.io")
    info = finished_session(gateway, alice, before)
    event = wait_for(lambda: _audit_event(gateway, info["id"]), 30, "the session's ResponseComplete event")
    notes = event["annotations"]
    assert notes["bcs-middleware/session-exit-code"] == str(EXIT_CODE)
    assert notes["bcs-middleware/recording"] == "complete"
    assert notes["bcs-middleware/session-tty"] == "true"

