"""Real ``kubectl exec -it`` and ``attach -it`` through a real gateway, recorded and replayed.

kubectl runs in a pseudo-terminal (it has a tty, sends the terminal's size and its changes);
the fake apiserver's :class:`~.terminal_pod.TerminalPod` plays the container. What the pod
sent must be what the recording holds, byte for byte; ``asciinema cat`` (the real player,
from PyPI) and ``bcs-middleware sessions play --raw`` must print the same bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bcs_middleware.recording import asciicast
from tests.support.gateway import CLI, Gateway
from tests.support.polling import wait_for
from tests.support.servers import BIN

from .conftest import CLUSTER, SPDY_KUBECTL
from .terminal_pod import BANNER, EXIT_CODE, PtyKubectl, Seen, TerminalPod

needs_spdy_kubectl = pytest.mark.skipif(SPDY_KUBECTL is None, reason="no kubectl older than 1.30 installed")
TRANSPORTS = [pytest.param(None, id="websocket"),
              pytest.param(SPDY_KUBECTL, id="spdy", marks=needs_spdy_kubectl)]


def session_ids(gw: Gateway, token: str, cluster: str = CLUSTER) -> set[str]:
    return {s["id"] for s in gw.json("GET", f"/rest/sessions?cluster={cluster}", token=token)["sessions"]}


def finished_session(gw: Gateway, token: str, before: set[str], cluster: str = CLUSTER) -> dict:
    """The one session recorded since ``before``, once its recording is closed."""
    found: list[dict] = []

    def done() -> dict | None:
        found[:] = [s for s in gw.json("GET", f"/rest/sessions?cluster={cluster}", token=token)["sessions"]
                    if s["id"] not in before]
        return found[0] if len(found) == 1 and found[0]["status"] != "recording" else None

    try:
        return wait_for(done, 30, "the session's recording to be closed")
    except AssertionError:
        raise AssertionError(f"new sessions: {found}\n{gw.server.output()[-3000:]}") from None


def interactive(kubeconfig: Path, version: str | None, subresource: str, pod: TerminalPod) -> tuple[int, Seen]:
    """Run the session a user would: wait for the prompt, type, resize, type ``exit``."""
    count = len(pod.sessions)
    args = ["exec", "-it", "p", "-c", "app", "--", "sh", "-l"] if subresource == "exec" \
        else ["attach", "-it", "p", "-c", "app"]
    kubectl = PtyKubectl(args, kubeconfig=kubeconfig, version=version, size=(100, 30))
    try:
        kubectl.wait_for(b"$ ")
        kubectl.type("echo recorded\r")
        kubectl.wait_for(b"echo recorded\r\n")
        seen = pod.sessions[count]
        wait_for(lambda: (100, 30) in seen.sizes, 30, f"the first size to reach the pod; it saw {seen.sizes}")
        kubectl.resize(132, 43)
        wait_for(lambda: (132, 43) in seen.sizes, 30, f"the new size to reach the pod; it saw {seen.sizes}")
        kubectl.type("exit\r")
        kubectl.wait_for(b"bye\r\n")
    finally:
        code = kubectl.finish()
    return code, pod.sessions[count]


def cast_of(gw: Gateway, token: str, session_id: str, folder: Path) -> Path:
    status, body = gw.call("GET", f"/rest/sessions/{session_id}/recording", token=token)
    assert status == 200, body
    path = folder / f"{session_id}.cast"
    path.write_bytes(body)
    return path


@pytest.mark.parametrize("subresource", ["exec", "attach"])
@pytest.mark.parametrize("version", TRANSPORTS)
def test_an_interactive_session_is_recorded_as_the_pod_sent_it(
    gateway: Gateway, alice: str, kubeconfigs: dict[str, Path], pod: TerminalPod, version: str | None,
    subresource: str, tmp_path: Path,
) -> None:
    before = session_ids(gateway, alice)
    code, seen = interactive(kubeconfigs["alice"], version, subresource, pod)
    assert code == EXIT_CODE
    assert seen.subresource == subresource and seen.transport == ("spdy/3.1" if version else "websocket")
    info = finished_session(gateway, alice, before)
    assert info["status"] == "complete", info
    assert (info["user"], info["cluster_id"], info["namespace"], info["pod"], info["container"]) == \
        ("alice-rec", CLUSTER, "default", "p", "app")
    assert info["subresource"] == subresource and info["tty"] is True and info["exit_code"] == EXIT_CODE
    if subresource == "exec":
        assert info["command"] == ["sh", "-l"]
    assert info["bytes_to_client"] > len(seen.stdout) and info["bytes_to_upstream"] > len(seen.stdin)
    cast = cast_of(gateway, alice, info["id"], tmp_path)
    header, events = asciicast.parse(cast.read_text("utf-8").splitlines(keepends=True))
    events_list = list(events)
    output = "".join(e.data for e in events_list if e.code == "o")
    # Byte for byte what the pod sent: the check mark cut across two frames is one character.
    assert output.encode("utf-8") == bytes(seen.stdout)
    assert BANNER[0] in output
    # The header has the first size kubectl reported (attach reports one more column and row
    # first, to make the program redraw), and every size is a resize event.
    assert (header.width, header.height) == seen.sizes[0]
    assert [e.data for e in events_list if e.code == "r"] == [f"{c}x{r}" for c, r in seen.sizes]
    # Typed text is absent: no "i" events (the echo the pod printed is output, as on screen).
    assert not [e for e in events_list if e.code == "i"]
    times = [e.time for e in events_list]
    assert times == sorted(times) and times[-1] > 0
    # The real player reads the file as it is and prints the same bytes.
    played = subprocess.run([str(BIN / "asciinema"), "cat", str(cast)], capture_output=True, timeout=60)
    assert played.returncode == 0, played.stderr
    assert played.stdout == bytes(seen.stdout)


def test_sessions_play_raw_prints_the_bytes_the_pod_sent(gateway: Gateway, alice: str, kubeconfigs: dict[str, Path],
                                                         pod: TerminalPod) -> None:
    before = session_ids(gateway, alice)
    _code, seen = interactive(kubeconfigs["alice"], None, "exec", pod)
    info = finished_session(gateway, alice, before)
    env = {**os.environ, "BCS_SERVER": gateway.url, "BCS_CA_FILE": gateway.ca_file, "BCS_TOKEN": alice}
    played = subprocess.run([CLI, "sessions", "play", info["id"], "--raw"], capture_output=True, env=env, timeout=60)
    assert played.returncode == 0, played.stderr
    assert played.stdout == bytes(seen.stdout)
    # With the timing, ten times faster: the same bytes.
    played = subprocess.run([CLI, "sessions", "play", info["id"], "--speed", "10"], capture_output=True, env=env,
                            timeout=60)
    assert played.returncode == 0, played.stderr
    assert played.stdout == bytes(seen.stdout)
    listed = subprocess.run([CLI, "sessions", "list", "--cluster", CLUSTER, "-o", "json"], capture_output=True,
                            env=env, timeout=60, text=True)
    assert listed.returncode == 0, listed.stderr
    assert info["id"] in [s["id"] for s in json.loads(listed.stdout)]


def test_recordings_are_for_edit_holders_only(gateway: Gateway, alice: str, bob: str,
                                              kubeconfigs: dict[str, Path], pod: TerminalPod) -> None:
    before = session_ids(gateway, alice)
    code, _seen = interactive(kubeconfigs["bob"], None, "exec", pod)  # bob may use the cluster (view)
    assert code == EXIT_CODE
    info = finished_session(gateway, alice, before)
    assert info["user"] == "bob-rec"
    # bob cannot read it, not even his own: recordings are the cluster's editors' to read.
    assert gateway.call("GET", f"/rest/sessions/{info['id']}/recording", token=bob)[0] == 404
    assert gateway.call("GET", f"/rest/sessions/{info['id']}", token=bob)[0] == 404
    assert gateway.json("GET", "/rest/sessions", token=bob)["sessions"] == []
    assert gateway.call("GET", f"/rest/sessions?cluster={CLUSTER}", token=bob)[0] in (403, 404)
    assert gateway.call("GET", f"/rest/sessions/{info['id']}/recording", token="")[0] == 401
    # The admin (a superuser) and alice (edit) can; filters narrow.
    assert info["id"] in {s["id"] for s in gateway.json("GET", "/rest/sessions?user=bob-rec")["sessions"]}
    assert info["id"] not in {s["id"] for s in gateway.json("GET", "/rest/sessions?user=alice-rec")["sessions"]}
    assert gateway.json("GET", "/rest/sessions?until=2000-01-01T00:00:00Z")["sessions"] == []
    assert gateway.call("GET", "/rest/sessions?since=yesterday")[0] == 400
    assert gateway.call("GET", "/rest/sessions/../../etc/passwd/recording")[0] == 404


def test_the_audit_event_of_a_session_carries_its_record(gateway: Gateway, alice: str,
                                                         kubeconfigs: dict[str, Path], pod: TerminalPod) -> None:
    before = session_ids(gateway, alice)
    interactive(kubeconfigs["alice"], None, "exec", pod)
    info = finished_session(gateway, alice, before)
    audit = gateway.data / "audit.jsonl"

    def event() -> dict | None:
        for line in audit.read_text().splitlines() if audit.exists() else []:
            doc = json.loads(line)
            notes = doc.get("annotations", {})
            if doc["stage"] == "ResponseComplete" and notes.get("bcs-middleware/recording-id") == info["id"]:
                return doc
        return None

    found = wait_for(event, 30, "the session's ResponseComplete event")
    notes = found["annotations"]
    assert found["user"]["username"] == "alice-rec" and "system:authenticated" in found["user"]["groups"]
    assert found["objectRef"]["subresource"] == "exec" and found["objectRef"]["name"] == "p"
    assert notes["bcs-middleware/cluster"] == CLUSTER
    assert notes["bcs-middleware/session-container"] == "app"
    assert json.loads(notes["bcs-middleware/session-command"]) == ["sh", "-l"]
    assert notes["bcs-middleware/session-tty"] == "true"
    assert notes["bcs-middleware/session-exit-code"] == str(EXIT_CODE)
    assert notes["bcs-middleware/recording"] == "complete"
    assert int(notes["bcs-middleware/bytes-to-client"]) == info["bytes_to_client"]
    assert notes["bcs-middleware/session-start"] <= notes["bcs-middleware/session-end"]
