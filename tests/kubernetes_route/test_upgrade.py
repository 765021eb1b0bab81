"""kubectl exec/attach/port-forward through the tunnel: connection upgrades under gunicorn.

A raw TLS client speaks to the real ``bcs-middleware serve`` gateway (its default
gevent worker; ``BCS_TEST_WORKER_CLASS=gthread`` for the other) of ``conftest.py``;
the fake apiserver's ``on_upgrade`` handlers answer ``101`` and echo, or refuse.
One test runs the proxy under a *sync* worker.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from bcs_middleware.apps.proxy import UpstreamProxy
from bcs_middleware.core import environ as env
from tests.support.fake_apiserver import FakeAPIServer, UpgradeRequest
from tests.support.kube import kubectl
from tests.support.polling import wait_for, wait_until
from tests.support.servers import gunicorn
from tests.support.websocket import as_a_kubelet_starts, frame, read_frame

from .conftest import CLUSTER, SA_TOKEN, Gateway

ROOT = Path(__file__).resolve().parents[2]
EXEC = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods/p/exec"
QUERY = "command=sh&command=-c&command=cat&container=app&stdin=true&stdout=true"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
BANNER = b"ready\n"  # sent by the fake right behind its 101, before any client byte


# --------------------------------------------------------------------------- fake handlers


class Handlers:
    """The fake apiserver's upgrade side: what it saw, and how it answers."""

    def __init__(self, apiserver: FakeAPIServer) -> None:
        self.apiserver = apiserver
        self.mode = "echo"
        self.seen: list[UpgradeRequest] = []
        self.after_refusal: list[bytes | None] = []
        self.lock = threading.Lock()

    def __call__(self, req: UpgradeRequest) -> None:
        with self.lock:
            self.seen.append(req)
        if self.mode in ("echo", "hangup"):
            self._echo(req)
        else:
            self._refuse(req, 403 if self.mode == "403" else 500)

    def _echo(self, req: UpgradeRequest) -> None:
        headers = req.info.headers
        upgrade = headers.get("Upgrade") or ""
        lines = ["HTTP/1.1 101 Switching Protocols", "Connection: Upgrade", f"Upgrade: {upgrade}"]
        if upgrade.lower() == "websocket":
            key = headers.get("Sec-WebSocket-Key") or ""
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode(), usedforsecurity=False).digest()).decode()
            lines.append(f"Sec-WebSocket-Accept: {accept}")
            offered = [p.strip() for p in (headers.get("Sec-WebSocket-Protocol") or "").split(",")]
            if "v5.channel.k8s.io" in offered:
                lines.append("Sec-WebSocket-Protocol: v5.channel.k8s.io")
            req.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode())
            recorded = self.apiserver.requests.last(req.info.path)
            params = recorded.params if recorded is not None else {}
            if params.get("stdin") in ("true", "1"):
                _websocket_echo(req)
            else:  # a command without input: its "output", then the exit status
                command = recorded.query if recorded is not None else ""
                words = [v for k, v in urllib.parse.parse_qsl(command) if k == "command"]
                as_a_kubelet_starts()
                _ws_write(req.wfile, b"\x01" + " ".join(words).encode() + b"\n")
                _ws_write(req.wfile, b"\x03" + json.dumps({"metadata": {}, "status": "Success"}).encode())
                req.wfile.write(b"\x88\x02\x03\xe8")
                req.sock.settimeout(5)
                with contextlib.suppress(OSError):
                    while read_frame(req.rfile)[0] not in (None, 0x8):
                        pass
            return
        lines.append("X-Stream-Protocol-Version: v4.channel.k8s.io")
        req.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode() + BANNER)
        if self.mode == "hangup":
            return  # the upstream ends the session (the fake closes the connection)
        req.sock.settimeout(20)
        while True:
            try:
                data = req.rfile.read1(65536)
            except OSError:
                return
            if not data:
                return
            req.wfile.write(data)

    def _refuse(self, req: UpgradeRequest, code: int) -> None:
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "message": "pods \"p\" is forbidden: exec refused", "reason": "Forbidden",
                           "code": code}).encode()
        # Announces keep-alive: the gateway must close this connection anyway.
        req.wfile.write(f"HTTP/1.1 {code} Refused\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        req.sock.settimeout(10)
        try:
            data: bytes | None = req.rfile.read1(1)
        except OSError:
            data = None
        with self.lock:
            self.after_refusal.append(data)


def _websocket_echo(req: UpgradeRequest) -> None:
    """Minimal k8s channel protocol: echo stdin (channel 0) as stdout (1), then a status on 3."""
    req.sock.settimeout(20)
    while True:
        opcode, payload = read_frame(req.rfile)
        if opcode is None or opcode == 0x8:
            return
        if opcode == 0x2 and payload[:1] == b"\x00":
            _ws_write(req.wfile, b"\x01" + payload[1:])
        elif opcode == 0x2 and payload[:2] == b"\xff\x00":  # v5: close stdin
            _ws_write(req.wfile, b"\x03" + json.dumps({"status": "Success"}).encode())
            req.wfile.write(b"\x88\x02\x03\xe8")
            return


def _ws_write(wfile: Any, payload: bytes) -> None:
    wfile.write(frame(0x2, payload))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def handlers(apiserver: FakeAPIServer) -> Iterator[Handlers]:
    apiserver.create("pods", {"metadata": {"name": "p", "namespace": "default"},
                              "spec": {"containers": [{"name": "app", "image": "busybox"}]}}, "default")
    h = Handlers(apiserver)
    apiserver.on_upgrade(h)
    yield h
    apiserver.on_upgrade(None)


@pytest.fixture()
def echo(handlers: Handlers) -> Iterator[Handlers]:
    handlers.mode = "echo"
    handlers.seen.clear()
    yield handlers


@pytest.fixture(scope="module")
def alice(gateway: Gateway) -> str:
    token = gateway.user("alice-upgrade")
    gateway.grant("alice-upgrade")
    return token


@pytest.fixture()
def connections(apiserver: FakeAPIServer, monkeypatch: pytest.MonkeyPatch) -> list[socket.socket]:
    """Every connection the fake apiserver accepts from now on."""
    opened: list[socket.socket] = []
    track = apiserver._track

    def counting(sock: socket.socket, *, add: bool) -> None:
        if add:
            opened.append(sock)
        track(sock, add=add)

    monkeypatch.setattr(apiserver, "_track", counting)
    return opened


# --------------------------------------------------------------------------- raw client


class Upgraded:
    def __init__(self, sock: ssl.SSLSocket, status: int, headers: dict[str, str], rest: bytes) -> None:
        self.sock = sock
        self.status = status
        self.headers = headers
        self.rest = rest

    def read_exactly(self, n: int) -> bytes:
        out = bytearray(self.rest[:n])
        self.rest = self.rest[n:]
        while len(out) < n:
            piece = self.sock.recv(min(n - len(out), 1 << 16))
            if not piece:
                raise AssertionError(f"connection closed after {len(out)} of {n} bytes")
            out += piece
        return bytes(out)

    def read_to_eof(self, limit: int = 1 << 20) -> bytes:
        out = bytearray(self.rest)
        self.rest = b""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(out) <= limit:
            try:
                piece = self.sock.recv(65536)
            except (ssl.SSLEOFError, ConnectionResetError):
                break
            if not piece:
                break
            out += piece
        else:
            raise AssertionError("the gateway did not close the connection")
        return bytes(out)


def upgrade(gateway: Gateway, token: str, *, path: str = EXEC, query: str = QUERY,
            protocol: str = "SPDY/3.1", method: str = "POST",
            extra: dict[str, str] | None = None) -> Upgraded:
    ctx = ssl.create_default_context(cafile=gateway.ca_file)
    raw = socket.create_connection(("127.0.0.1", gateway.server.port), timeout=15)
    sock = ctx.wrap_socket(raw, server_hostname="localhost")
    headers = {
        "Host": f"localhost:{gateway.server.port}",
        "Authorization": f"Bearer {token}",
        "Connection": "Upgrade",
        "Upgrade": protocol,
        "X-Stream-Protocol-Version": "v4.channel.k8s.io",
        **(extra or {}),
    }
    if method == "POST":
        headers["Content-Length"] = "0"
    head = f"{method} {path}?{query} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall((head + "\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"closed before a response head: {data!r}"
        data += piece
        assert len(data) < 65536
    raw_head, rest = data.split(b"\r\n\r\n", 1)
    lines = raw_head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    parsed = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        parsed[name.strip().lower()] = value.strip()
    return Upgraded(sock, status, parsed, rest)


def half_close(sock: socket.socket) -> None:
    # The TCP half-close only: SSLSocket.shutdown would drop the TLS state we still read with.
    socket.socket.shutdown(sock, socket.SHUT_WR)


# --------------------------------------------------------------------------- tests


def test_exec_upgrades_and_echoes_both_ways(gateway: Gateway, echo: Handlers, alice: str) -> None:
    conn = upgrade(gateway, alice)
    try:
        assert conn.status == 101, conn.rest
        assert conn.headers["upgrade"] == "SPDY/3.1"
        assert "upgrade" in conn.headers["connection"].lower()
        assert conn.headers["x-stream-protocol-version"] == "v4.channel.k8s.io"
        assert conn.headers.get("x-request-id")
        assert conn.read_exactly(len(BANNER)) == BANNER
        for message in (b"ls -l\n", b"\x00" * 3, b"exit\n"):
            conn.sock.sendall(message)
            assert conn.read_exactly(len(message)) == message
    finally:
        conn.sock.close()


def test_ten_mebibytes_round_trip_intact(gateway: Gateway, echo: Handlers, alice: str) -> None:
    payload = os.urandom(10 * 1024 * 1024)
    conn = upgrade(gateway, alice)
    try:
        assert conn.status == 101
        assert conn.read_exactly(len(BANNER)) == BANNER
        received = hashlib.sha256()
        step = 256 * 1024
        # Lock-step pieces: a TLS socket is not used from two threads at once.
        for offset in range(0, len(payload), step):
            piece = payload[offset:offset + step]
            conn.sock.sendall(piece)
            received.update(conn.read_exactly(len(piece)))
        assert received.hexdigest() == hashlib.sha256(payload).hexdigest()
    finally:
        conn.sock.close()


def test_upstream_sees_gateway_credentials_and_impersonation(
    gateway: Gateway, apiserver: FakeAPIServer, echo: Handlers, alice: str
) -> None:
    conn = upgrade(gateway, alice, extra={"X-Custom": "kept"})
    conn.sock.close()
    assert conn.status == 101
    seen = echo.seen[-1].info
    assert seen.headers.get("Authorization") == f"Bearer {SA_TOKEN}"
    assert seen.headers.get("Impersonate-User") == "alice-upgrade"
    assert "system:authenticated" in seen.headers.getlist("Impersonate-Group")
    assert seen.headers.get("X-Stream-Protocol-Version") == "v4.channel.k8s.io"
    assert seen.headers.get("X-Custom") == "kept"
    assert (seen.headers.get("Upgrade") or "").lower() == "spdy/3.1"
    assert seen.user == "alice-upgrade"
    recorded = apiserver.requests.last("/api/v1/namespaces/default/pods/p/exec")
    assert recorded is not None and recorded.params["container"] == "app"


@pytest.mark.parametrize("header", [
    pytest.param("Impersonate-User", id="user"),
    pytest.param("Impersonate-Group", id="group"),
])
def test_client_impersonate_header_is_refused_on_upgrade(
    gateway: Gateway, echo: Handlers, alice: str, header: str
) -> None:
    conn = upgrade(gateway, alice, extra={header: "system:admin"})
    try:
        assert conn.status == 403
        status = json.loads(conn.read_exactly(int(conn.headers["content-length"])))
        assert status["kind"] == "Status" and "not allowed" in status["message"]
    finally:
        conn.sock.close()
    assert not echo.seen


@pytest.mark.parametrize("mode,code", [
    pytest.param("403", 403, id="forbidden"),
    pytest.param("500", 500, id="server-error"),
])
def test_refused_upgrade_is_relayed_and_both_connections_close(
    gateway: Gateway, handlers: Handlers, alice: str, connections: list[socket.socket],
    mode: str, code: int,
) -> None:
    handlers.mode = mode
    handlers.after_refusal.clear()
    try:
        conn = upgrade(gateway, alice)
        try:
            assert conn.status == code
            rest = conn.read_to_eof()  # the gateway closes after the answer
            assert b"exec refused" in rest
        finally:
            conn.sock.close()
        wait_until(lambda: handlers.after_refusal, 15)
        # The upstream connection was closed by the gateway, not kept for reuse.
        assert handlers.after_refusal == [b""]
    finally:
        handlers.mode = "echo"
    # One fresh connection carried the upgrade, and the gateway closed it.
    assert len(connections) == 1
    assert wait_until(lambda: connections[0].fileno() == -1, 15), "the refused upgrade's connection stayed open"
    # The tunnel keeps working on connections of its own.
    status, body = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods/p")
    assert status == 200, body


def test_half_closed_client_ends_the_splice(gateway: Gateway, echo: Handlers, alice: str) -> None:
    conn = upgrade(gateway, alice)
    try:
        assert conn.status == 101
        assert conn.read_exactly(len(BANNER)) == BANNER
        conn.sock.sendall(b"last words")
        assert conn.read_exactly(10) == b"last words"
        half_close(conn.sock)
        assert_closed(conn)
    finally:
        conn.sock.close()
    assert_upstream_closed(echo.seen[-1])


def assert_closed(conn: Upgraded) -> None:
    """The gateway ends the connection (bounded wait).

    A TCP half-close under TLS arrives at the gateway as an unexpected EOF,
    after which OpenSSL 3 cannot write on that connection any more (it sends a
    ``decode_error`` alert): the client sees an end of stream or that alert.
    """
    try:
        assert conn.read_to_eof() == b""
    except ssl.SSLError as exc:
        assert "DECODE_ERROR" in str(exc) or "EOF" in str(exc), exc


def assert_upstream_closed(seen: UpgradeRequest) -> None:
    assert wait_until(lambda: seen.sock.fileno() == -1, 15), "the upstream connection stayed open"


def test_upstream_closing_ends_the_client_connection(gateway: Gateway, echo: Handlers, alice: str) -> None:
    """The exec'd process exits (the apiserver closes): the client's session ends at once too."""
    echo.mode = "hangup"
    try:
        conn = upgrade(gateway, alice)
        try:
            assert conn.status == 101
            assert conn.read_exactly(len(BANNER)) == BANNER
            started = time.monotonic()
            assert_closed(conn)
            assert time.monotonic() - started < 2
        finally:
            conn.sock.close()
    finally:
        echo.mode = "echo"


def test_closed_client_frees_the_upstream_connection(
    gateway: Gateway, echo: Handlers, alice: str
) -> None:
    conn = upgrade(gateway, alice)
    assert conn.status == 101
    conn.sock.close()
    # The handler's read ends when the gateway closes its upstream connection.
    assert_upstream_closed(echo.seen[-1])


def test_websocket_client_v5_channel(gateway: Gateway, echo: Handlers, alice: str) -> None:
    import websocket

    ws = websocket.create_connection(
        f"wss://localhost:{gateway.server.port}{EXEC}?{QUERY}",
        header=[f"Authorization: Bearer {alice}"],
        subprotocols=["v5.channel.k8s.io", "v4.channel.k8s.io"],
        sslopt={"ca_certs": gateway.ca_file},
        timeout=15,
    )
    try:
        assert ws.getsubprotocol() == "v5.channel.k8s.io"
        ws.send_binary(b"\x00hello websocket")
        assert ws.recv() == b"\x01hello websocket"
        ws.send_binary(b"\xff\x00")  # v5: close stdin
        status = ws.recv()
        assert status[:1] == b"\x03" and json.loads(status[1:])["status"] == "Success"
    finally:
        ws.close()
    assert (echo.seen[-1].info.headers.get("Sec-WebSocket-Protocol") or "").startswith("v5.channel.k8s.io")


def test_without_gunicorn_socket_answers_501_status() -> None:
    class NoTransport:
        def send(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("nothing may be sent upstream")

        def open_upgrade(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("nothing may be sent upstream")

        def close(self) -> None:
            pass

    proxy = UpstreamProxy(transport=NoTransport())
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/api/v1/namespaces/default/pods/p/exec",
        "QUERY_STRING": QUERY, "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
        "wsgi.input": None, "HTTP_CONNECTION": "Upgrade", "HTTP_UPGRADE": "SPDY/3.1",
        env.ERROR_STYLE: "kubernetes",
        env.UPSTREAM: env.Upstream(base_urls=("https://127.0.0.1:1",), path="/api/v1/namespaces/default/pods/p/exec"),
    }
    answer: list[str] = []
    body = b"".join(proxy(environ, lambda status, headers, exc_info=None: answer.append(status)))
    assert answer[0].startswith("501")
    status = json.loads(body)
    assert status["kind"] == "Status" and status["code"] == 501
    assert "gunicorn" in status["message"]


# --------------------------------------------------------------------------- sync worker


@pytest.fixture(scope="module")
def sync_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    ca = trustme.CA()
    folder = tmp_path_factory.mktemp("sync")
    cert = ca.issue_cert("localhost", "127.0.0.1")
    pem = folder / "server.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca_file = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    env_ = {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = gunicorn("tests.apps.routed_app:app", worker_class="sync", threads=1, certfile=str(pem),
                      env=env_, extra=["--timeout", "60"])
    try:
        yield f"127.0.0.1:{server.port}", str(ca_file)
    finally:
        server.stop()


def test_sync_worker_splices_too(
    sync_proxy: tuple[str, str], apiserver: FakeAPIServer, echo: Handlers
) -> None:
    from tests.apps.routed_app import encode_upstream

    address, ca_file = sync_proxy
    spec = encode_upstream(base_urls=[apiserver.url], path="/api/v1/namespaces/default/pods/p/exec",
                           query=QUERY, ca_pem=apiserver.ca_pem, bearer_token=SA_TOKEN)
    ctx = ssl.create_default_context(cafile=ca_file)
    host, port = address.split(":")
    sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=15), server_hostname="localhost")
    try:
        sock.sendall(
            (f"POST /x HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
             f"Content-Length: 0\r\nX-Test-Upstream: {spec}\r\n\r\n").encode()
        )
        conn = Upgraded(sock, 0, {}, b"")
        data = b""
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            assert piece, data
            data += piece
        head, conn.rest = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        assert conn.read_exactly(len(BANNER)) == BANNER
        sock.sendall(b"through sync")
        assert conn.read_exactly(12) == b"through sync"
        half_close(sock)
        assert_closed(conn)
    finally:
        sock.close()


def test_kubectl_exec_over_websocket(gateway: Gateway, echo: Handlers, alice: str, tmp_path: Path) -> None:
    """kubectl 1.32 (the default binary) runs exec over websockets (v5.channel.k8s.io)."""
    kubeconfig = gateway.kubeconfig(alice, tmp_path / "kubeconfig")
    result = kubectl("exec", "p", "-c", "app", "--", "echo", "through", "the", "tunnel",
                     kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "echo through the tunnel\n"
    seen = echo.seen[-1].info.headers
    assert (seen.get("Upgrade") or "").lower() == "websocket"
    assert "v5.channel.k8s.io" in (seen.get("Sec-WebSocket-Protocol") or "")
    assert seen.get("Impersonate-User") == "alice-upgrade"


def test_upgrades_are_audited_and_counted(gateway: Gateway, echo: Handlers, alice: str) -> None:
    conn = upgrade(gateway, alice, query="command=id&container=app&stdout=true")
    conn.sock.close()
    assert conn.status == 101
    line = wait_for(lambda: next((entry for entry in gateway.server.output().splitlines()
                                  if "action=tunnel.exec" in entry and '"command": ["id"]' in entry), ""),
                    15, "no audit line", step=0.05)
    assert "actor=alice-upgrade" in line and "target=default/p" in line
    assert '"container": "app"' in line and '"status": 101' in line
    assert alice not in gateway.server.output() and SA_TOKEN not in gateway.server.output()
    status, body = gateway.call("GET", "/metrics")
    assert status == 200
    text = body.decode()
    assert 'bcs_upgrades_total{outcome="spliced"}' in text
    assert "bcs_open_upgraded_streams" in text


# --------------------------------------------------------------------------- splice itself (plain TCP)


def _spliced(**limits: Any) -> tuple[socket.socket, socket.socket, dict[str, Any]]:
    """client_end <-> [gateway_client | splice | gateway_upstream] <-> upstream_end, in a thread."""
    from bcs_middleware.apps.upgrade import splice

    client_end, gateway_client = socket.socketpair()
    gateway_upstream, upstream_end = socket.socketpair()
    for sock in (client_end, upstream_end):
        sock.settimeout(10)
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = splice(gateway_client, gateway_upstream, to_client=b"head", **limits)
        finally:
            gateway_upstream.close()
            gateway_client.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return client_end, upstream_end, out


def test_plain_half_close_is_passed_on_and_the_rest_still_flows() -> None:
    client, upstream, out = _spliced()
    try:
        assert client.recv(4) == b"head"
        client.sendall(b"question")
        client.shutdown(socket.SHUT_WR)
        assert upstream.recv(8) == b"question"
        assert upstream.recv(1) == b""  # the half-close arrived
        upstream.sendall(b"answer after EOF")
        upstream.shutdown(socket.SHUT_WR)
        received = b""
        while piece := client.recv(1024):
            received += piece
        assert received == b"answer after EOF"
        out["thread"].join(10)
        assert out["result"].ended_by == "closed"
        assert (out["result"].to_upstream, out["result"].to_client) == (8, 4 + 16)
    finally:
        client.close()
        upstream.close()


@pytest.mark.parametrize("limits,reason", [
    pytest.param({"idle_timeout": 0.2}, "idle", id="idle"),
    pytest.param({"max_duration": 0.2}, "max_duration", id="max-duration"),
])
def test_limits_cut_both_connections(limits: dict[str, float], reason: str) -> None:
    client, upstream, out = _spliced(**limits)
    try:
        assert client.recv(4) == b"head"
        out["thread"].join(10)
        assert not out["thread"].is_alive()
        assert out["result"].ended_by == reason
        assert client.recv(1) == b"" and upstream.recv(1) == b""
    finally:
        client.close()
        upstream.close()
