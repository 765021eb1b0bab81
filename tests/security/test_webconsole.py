"""Mesos webconsole through real `serve` processes: gateway → driver → the console proxy of the host.

A WebSocket client (websocket-client) talks to ``/bcsapi/v1/webconsole/...`` on
the gateway; the driver (``serve --role driver``) connects to the fake console
proxy over TLS. Attacks: no token, a user without ``view``, hosts the driver
must never reach (metadata service, a denied network, names), a refused upgrade
that must not be spliced.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import websocket

from tests.support.fake_console import FakeConsole
from tests.support.fake_scheduler import FakeScheduler
from tests.support.gateway import Gateway, served_gateway
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, TrapListener, free_port

MESOS = "BCS-MESOS-CONSOLE"
PATH = "/bcsapi/v1/webconsole"


@dataclass
class World:
    gw: Gateway
    console: FakeConsole
    denied: FakeConsole
    alice: str
    mallory: str
    driver_port: int


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("webconsole")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "127.0.0.2")
    console = FakeConsole("allowed", cert, host="127.0.0.1")
    denied = FakeConsole("denied", cert, host="127.0.0.2", port=console.port)
    ca.cert_pem.write_to_path(str(tmp / "console-ca.pem"))
    scheduler = FakeScheduler("scheduler")
    driver_data, driver_port = tmp / "driver", free_port()
    driver = ServerProcess(
        [str(BIN / "bcs-middleware"), "serve", "--role", "driver", "--cluster-id", MESOS,
         "--scheduler", scheduler.url, "--data-dir", str(driver_data), "--bind", f"127.0.0.1:{driver_port}",
         "--workers", "1", "--threads", "8", "--graceful-timeout", "2", "--console-port", str(console.port),
         "--console-ca-file", str(tmp / "console-ca.pem"), "--upstream-deny", "127.0.0.2/32"],
        port=driver_port, scheme="https", timeout=60)
    try:
        with served_gateway(tmp / "gateway", args=[
                "--static-driver", f"{MESOS}=https://127.0.0.1:{driver_port}",
                "--driver-ca-file", str(driver_data / "tls" / "ca.crt")]) as gw:
            alice, mallory = gw.user("alice"), gw.user("mallory")
            # Mesos clusters are registered by superusers (issue 25); Alice manages hers.
            gw.json("POST", "/rest/clusters/bcs", body={"id": MESOS, "project_id": "p1", "cluster_type": "mesos"})
            gw.grant("alice", "edit", cluster=MESOS)
            yield World(gw, console, denied, alice, mallory, driver_port)
            output = gw.server.output() + driver.output()
            assert alice not in output and mallory not in output
    finally:
        driver.stop()
        scheduler.stop()
        console.stop()
        denied.stop()


def _connect(world: World, token: str | None, query: str, *, uri: str = "exec",
             headers: dict[str, str] | None = None) -> websocket.WebSocket:
    header = [f"BCS-ClusterID: {MESOS}"] + ([f"Authorization: Bearer {token}"] if token else [])
    header += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return websocket.create_connection(f"wss://localhost:{world.gw.server.port}{PATH}/{uri}?{query}",
                                       header=header, sslopt={"ca_certs": world.gw.ca_file}, timeout=15)


def _refused(world: World, token: str | None, query: str) -> tuple[int, dict[str, Any]]:
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        _connect(world, token, query)
    body = refused.value.resp_body or b""
    return refused.value.status_code, json.loads(body) if body else {}


def test_websocket_reaches_the_console_of_the_host_through_gateway_and_driver(world: World) -> None:
    before = len(world.console.seen)
    ws = _connect(world, world.alice, "host_ip=127.0.0.1&container_id=c0ffee",
                  headers={"Impersonate-User": "admin", "Cookie": "session=1"})
    try:
        ws.send("ls -l")
        assert ws.recv() == "echo:allowed:ls -l"
        ws.send_binary(b"\x00\x01")
        assert ws.recv() == b"echo:allowed:\x00\x01"
    finally:
        ws.close()
    seen = world.console.seen[before:]
    assert len(seen) == 1
    assert seen[0].path == "/bcsapi/v1/consoleproxy/exec?host_ip=127.0.0.1&container_id=c0ffee"
    headers = {k.lower(): v for k, v in seen[0].headers.items()}
    assert "authorization" not in headers and "impersonate-user" not in headers  # no client identity upstream
    assert world.alice not in json.dumps(seen[0].headers)
    assert headers.get("cookie") == "session=1"  # the source forwards cookies to the console


def test_plain_requests_are_proxied_too(world: World) -> None:
    status, body = world.gw.call("POST", f"{PATH}/api/resize?host_ip=127.0.0.1", token=world.alice, body={"rows": 10},
                                 headers={"BCS-ClusterID": MESOS, "Content-Type": "application/json"})
    assert status == 200, body
    answer = json.loads(body)
    assert answer["console"] == "allowed" and answer["path"] == "/bcsapi/v1/consoleproxy/api/resize?host_ip=127.0.0.1"
    status, _ = world.gw.call("DELETE", f"{PATH}/api?host_ip=127.0.0.1", token=world.alice,
                              headers={"BCS-ClusterID": MESOS})
    assert status == 405  # the source routes GET and POST only


@pytest.mark.parametrize("who", ["nobody", "mallory"])
def test_only_users_with_view_on_the_cluster_reach_a_console(world: World, who: str) -> None:
    before = len(world.console.seen)
    token = {"nobody": None, "mallory": world.mallory}[who]
    status, body = _refused(world, token, "host_ip=127.0.0.1")
    assert status == {"nobody": 401, "mallory": 404}[who], body
    assert len(world.console.seen) == before


@pytest.mark.parametrize(
    ("host_ip", "status"),
    [
        pytest.param("169.254.169.254", 502, id="metadata-service"),
        pytest.param("127.0.0.2", 502, id="denied-network"),
        pytest.param("localhost", 400, id="a-name"),
        pytest.param("127.0.0.1:22", 400, id="with-a-port"),
        pytest.param("", 400, id="missing"),
        pytest.param("127.0.0.1&host_ip=169.254.169.254", 400, id="twice"),
    ],
)
def test_the_driver_reaches_only_allowed_console_addresses(world: World, host_ip: str, status: int) -> None:
    before = len(world.console.seen), len(world.denied.seen)
    got, body = _refused(world, world.alice, f"host_ip={host_ip}")
    assert got == status, body
    assert (len(world.console.seen), len(world.denied.seen)) == before


def test_a_refused_upgrade_is_relayed_and_never_spliced(world: World) -> None:
    context = ssl.create_default_context(cafile=world.gw.ca_file)
    raw = socket.create_connection(("127.0.0.1", world.gw.server.port), timeout=15)
    sock = context.wrap_socket(raw, server_hostname="localhost")
    try:
        sock.sendall((f"GET {PATH}/refuse?host_ip=127.0.0.1 HTTP/1.1\r\nHost: localhost\r\n"
                      f"Authorization: Bearer {world.alice}\r\nBCS-ClusterID: {MESOS}\r\n"
                      "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode())
        response = b""
        deadline = time.monotonic() + 15
        while b"console refused" not in response and time.monotonic() < deadline:
            piece = sock.recv(4096)
            if not piece:
                break
            response += piece
        assert response.startswith(b"HTTP/1.1 403"), response
        try:
            sock.sendall(b"\x81\x05hello")  # would reach the console if the connection had been spliced
        except OSError:
            pass
    finally:
        sock.close()
    wait_until(lambda: world.console.seen[-1].after_refusal is not None, 10)
    assert world.console.seen[-1].path.startswith("/bcsapi/v1/consoleproxy/refuse")
    assert world.console.seen[-1].after_refusal in (b"", None)


def test_driver_paths_need_the_drivers_cluster_id(world: World) -> None:
    context = ssl.create_default_context(cafile=str(Path(world.gw.data).parent / "driver" / "tls" / "ca.crt"))
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"https://127.0.0.1:{world.driver_port}/mesosdriver/v4/webconsole/x"
                                     "?host_ip=127.0.0.1", headers={"BCS-ClusterID": "BCS-MESOS-OTHER"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=15, context=context)
    refused.value.close()
    assert refused.value.code == 400


def test_a_user_reads_one_answer_whatever_listens_at_the_console_host(world: World) -> None:
    """``host_ip`` is the caller's choice (an IP literal, the port the operator's): nothing listening,
    a plain-TCP service, an address the driver's policy refuses, a TLS server of another CA — one answer."""
    speaking = TrapListener("127.0.0.5", answer=b"SSH-2.0-OpenSSH_9.2\r\n", port=world.console.port)
    stranger = FakeConsole("stranger", trustme.CA().issue_cert("127.0.0.6"), host="127.0.0.6",
                           port=world.console.port)
    try:
        answers = {host: _refused(world, world.alice, f"host_ip={host}")
                   for host in ("127.0.0.4", "127.0.0.5", "127.0.0.2", "127.0.0.6")}
    finally:
        speaking.close()
        stranger.stop()
    assert len({json.dumps(answer, sort_keys=True) for answer in answers.values()}) == 1, answers
    status, body = answers["127.0.0.4"]
    assert status == 502 and body["message"] == "cannot reach the upstream", body
    assert not stranger.seen
