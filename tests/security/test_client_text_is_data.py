"""Text a client chooses is data, through a real ``bcs-middleware serve``: no line forged, no terminal escape.

An attacker puts newlines, carriage returns, ESC sequences, NUL, DEL and C1 controls (raw where
gunicorn lets them through, percent-encoded where it does not) into every field it controls — the
path (a tunnel exec path above all), the query, ``User-Agent``, ``X-Request-Id``, a user name, a
cluster id in the path, ``Impersonate-*`` and ``BCS-ClusterID`` — with the access log (stdout), the
server's log (stderr: the upgrade audit line among others) and ``--audit-log`` on. Afterwards no file
and no stream holds a raw control byte, every JSON line parses, and no line starts with the text the
attacker tried to start one with. ``/metrics`` holds none either, and shows its labels (cluster ids)
to no anonymous caller.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLUSTER, SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import wait_until

METRICS_TOKEN = "scraper-token-" + "m" * 40
FORGED = "FORGED-LINE"
# Control characters a log reader's terminal or a line-based parser acts on.
RAW_CONTROLS = ("\x1b", "\x00", "\x7f", "\x9b", "\r", "\x07", "\x08", "\u2028", "\u202e")


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gw(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("text-gw")
    with served_gateway(data, args=["--audit-log", str(data / "audit.jsonl")], workers=1,
                        env={"BCS_METRICS_TOKEN": METRICS_TOKEN}) as gateway:
        register_cluster(gateway, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gateway


def raw(gw: Gateway, head: bytes) -> bytes:
    """Send a request head exactly as given (raw bytes); the response head's status line, or b"" if cut."""
    context = ssl.create_default_context(cafile=gw.ca_file)
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=30) as plain, \
            context.wrap_socket(plain, server_hostname="localhost") as sock:
        sock.sendall(head)
        data = b""
        while b"\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
        return data.split(b"\r\n", 1)[0]


def request(gw: Gateway, method: str, target: bytes, headers: dict[bytes, bytes], *, admin: bool) -> bytes:
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: localhost", b"Connection: close"]
    if admin:
        lines.append(b"Authorization: Bearer " + gw.admin.encode())
    lines += [name + b": " + value for name, value in headers.items()]
    return raw(gw, b"\r\n".join(lines) + b"\r\n\r\n")


ESC_PATH = b"/api/v1/namespaces/default/pods/x%0a" + FORGED.encode() + b"%1b%5b31m%0d%07%7f%c2%9b/exec"
ATTACKS = [
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + ESC_PATH
                 + b"?command=%0a" + FORGED.encode() + b"%1b%5b2J&container=a%0d%0ab&stdout=1",
                 {b"Connection": b"Upgrade", b"Upgrade": b"SPDY/3.1"}, id="exec-path-and-command"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + ESC_PATH,
                 {b"Connection": b"Upgrade", b"Upgrade": b"websocket", b"Sec-WebSocket-Key": b"dGhlIHNhbXBsZQ=="},
                 id="websocket-exec-path"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/namespaces/x%0a" + FORGED.encode()
                 + b"%1b/pods?labelSelector=a%0a" + FORGED.encode() + b"%1b", {}, id="namespace-and-query"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/pods?x=\x1b[31m\x7f",
                 {}, id="raw-escape-in-query"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/namespaces/a\x1b[1m/pods",
                 {}, id="raw-escape-in-path"),
    pytest.param("GET", b"/tunnels/clusters/BCS%0a" + FORGED.encode() + b"%1b%5b31m/api/v1/pods", {},
                 id="cluster-id-in-the-path"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/pods/%00x", {}, id="nul-in-the-path"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/pods",
                 {b"User-Agent": b"kubectl\x1b[31m\x07\x7f", b"X-Request-Id": b"id\x1b[2J"}, id="headers"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/pods",
                 {b"Impersonate-User": b"admin\x1b]0;owned\x07"}, id="impersonate-header"),
    pytest.param("GET", b"/bcsapi/v4/scheduler/mesos/namespaces/default/application",
                 {b"BCS-ClusterID": b"BCS-MESOS\x1b[31m"}, id="mesos-cluster-header"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/pods",
                 {b"User-Agent": b"a\x00b"}, id="nul-in-a-header"),
    pytest.param("GET", b"/tunnels/clusters/" + CLUSTER.encode() + b"/api/v1/pods",
                 {b"User-Agent": "kubectl\u202e\u2028\x9b".encode(), b"X-Request-Id": "r\u2028".encode()},
                 id="utf8-line-separator-bidi-and-c1-in-headers"),
    pytest.param("GET", b"/rest/users/a%0a" + FORGED.encode() + b"%1b", {}, id="user-name-in-rest-path"),
]


@pytest.mark.parametrize(("method", "target", "headers"), ATTACKS)
@pytest.mark.parametrize("who", ["admin", "anonymous"])
def test_control_characters_reach_no_log_raw(gw: Gateway, method: str, target: bytes,
                                             headers: dict[bytes, bytes], who: str) -> None:
    status = request(gw, method, target, headers, admin=who == "admin")
    assert status.startswith(b"HTTP/1.1 ") or status == b"", status  # refused or answered: never a crash


def test_a_user_name_with_control_characters_is_refused_and_written_nowhere(gw: Gateway) -> None:
    status, body = gw.call("POST", "/rest/users/", body={"user_name": f"eve\n{FORGED}\x1b[31m"})
    assert status == 400 and b"\x1b" not in body and b"\n" not in body.strip()


def _lines(text: str) -> list[str]:
    return text.split("\n")


def test_no_log_holds_a_raw_control_character_or_a_forged_line(gw: Gateway) -> None:
    """Runs after the attacks above (pytest keeps file order): everything the server wrote, checked."""
    audit = gw.data / "audit.jsonl"
    # The audit events and the access log are written every 50 ms: a last request's lines mark the end.
    assert gw.call("GET", f"/tunnels/clusters/{CLUSTER}/version", headers={"X-Request-Id": "text-final"})[0] == 200
    assert wait_until(lambda: audit.exists() and "text-final" in audit.read_text()
                      and '"request_id":"text-final"' in gw.server.output(), timeout=15)
    outputs = {"server output": gw.server.output(), "audit log": audit.read_text(encoding="utf-8")}
    for where, text in outputs.items():
        for char in RAW_CONTROLS:
            assert char not in text, f"raw {char!r} in the {where}"
        for line in _lines(text):
            assert not line.lstrip().startswith(FORGED), f"a forged line in the {where}: {line!r}"
    for line in _lines(outputs["audit log"]):
        if line:
            event = json.loads(line)
            assert "\n" not in event["requestURI"] and "\x1b" not in event["requestURI"]
    access = [json.loads(line) for line in _lines(outputs["server output"]) if line.startswith('{"time"')]
    assert any("exec" in entry["path"] for entry in access)
    assert any(FORGED in line and "actor=" in line for line in _lines(outputs["server output"])), \
        "the upgrade audit line (escaped) is missing"


def test_metrics_show_no_control_character_and_nothing_to_anonymous_callers(gw: Gateway) -> None:
    status, body = gw.call("GET", "/metrics", token="")
    assert status == 401 and CLUSTER.encode() not in body
    user = gw.user("metrics-nobody")
    status, body = gw.call("GET", "/metrics", token=user)
    assert status == 403 and CLUSTER.encode() not in body
    status, body = gw.call("GET", "/metrics", token="wrong-" + METRICS_TOKEN)
    assert status == 401
    for token in (METRICS_TOKEN, None):  # the scraper's token, then the admin's
        status, body = gw.call("GET", "/metrics", token=token)
        assert status == 200 and b"bcs_api_request_count" in body
        text = body.decode()
        assert not any(char in text for char in RAW_CONTROLS)
    assert wait_until(lambda: CLUSTER in gw.call("GET", "/metrics")[1].decode(), timeout=10)


def test_the_serve_log_formatter_escapes_what_a_log_call_did_not(tmp_path: Path) -> None:
    """The net under the log calls: a message with a newline and ESC stays one line."""
    import io
    import logging

    from bcs_middleware.telemetry.logsetup import EscapingFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(EscapingFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("bcs_middleware.test-escaping")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("path %s", f"/x\n{FORGED}\x1b[31m")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed on %s", "a\rb")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert text.startswith(f"WARNING path /x\\x0a{FORGED}\\x1b[31m\n")
    assert "ERROR failed on a\\x0db\nTraceback" in text  # the traceback keeps its lines
