"""What kubectl streams, through a real ``kube-agent --tunnel``: follow, forward, exec, attach, bulk.

The fake apiserver (unreachable for the gateway, see ``conftest.py``) plays the kubelet for
upgrades: SPDY/3.1 (``tests/support/spdy.py``) as older kubectl binaries and ``port-forward``
speak it, and WebSocket (``v5.channel.k8s.io``) as kubectl 1.32 runs ``exec``/``attach``.
Every test runs under the gateway's default worker (gevent) and with
``BCS_TEST_WORKER_CLASS=gthread``.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kubernetes_route.test_upgrade import WS_GUID, Handlers
from tests.support import fake_apiserver, spdy
from tests.support.fake_apiserver import FakeAPIServer, UpgradeRequest
from tests.support.kube import kubectl, kubectl_path, kubectl_watch
from tests.support.polling import seconds_until
from tests.support.servers import free_port

from .conftest import CLUSTER, SA_TOKEN, Agent, Gateway

POD = {"metadata": {"name": "p", "namespace": "default"},
       "spec": {"containers": [{"name": "app", "image": "busybox"}]}}
#: kubectl that still runs exec/attach over SPDY (websockets became the default in 1.30).
SPDY_KUBECTL = next((v for v in ("1.27", "1.28", "1.29") if kubectl_path(v)), None)
needs_spdy_kubectl = pytest.mark.skipif(SPDY_KUBECTL is None, reason="no kubectl older than 1.30 installed")
PORTFORWARD_WS = "SPDY/3.1+portforward.k8s.io"


class Kubelet:
    """The fake's upgrade side: SPDY exec/attach/port-forward, SPDY-in-WebSocket port-forward,
    and the WebSocket channel protocol (delegated to the direct-path suite's :class:`Handlers`)."""

    def __init__(self, apiserver: FakeAPIServer) -> None:
        self.apiserver = apiserver
        self.websocket = Handlers(apiserver)
        self.seen: list[UpgradeRequest] = []
        self.forwarded: list[dict[str, str]] = []

    def __call__(self, req: UpgradeRequest) -> None:
        self.seen.append(req)
        headers = req.info.headers
        upgrade = (headers.get("Upgrade") or "").lower()
        offered = [p.strip() for p in (headers.get("Sec-WebSocket-Protocol") or "").split(",")]
        recorded = self.apiserver.requests.last(req.info.path)
        query = recorded.query if recorded is not None else ""
        if upgrade == "websocket" and PORTFORWARD_WS in offered:
            key = headers.get("Sec-WebSocket-Key") or ""
            accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode(), usedforsecurity=False).digest())
            req.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                            b"Sec-WebSocket-Accept: " + accept + b"\r\n"
                            b"Sec-WebSocket-Protocol: " + PORTFORWARD_WS.encode() + b"\r\n\r\n")
            spdy.serve_portforward(spdy.over_websocket(req.sock, req.rfile, req.wfile), self.forwarded)
        elif upgrade == "websocket":
            self.websocket(req)
        elif upgrade == "spdy/3.1":
            protocol = "portforward.k8s.io" if req.info.subresource == "portforward" else "v4.channel.k8s.io"
            req.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                            b"X-Stream-Protocol-Version: " + protocol.encode() + b"\r\n\r\n")
            conn = spdy.over_socket(req.sock, req.rfile, req.wfile)
            if req.info.subresource == "portforward":
                spdy.serve_portforward(conn, self.forwarded)
            else:
                words = [v for k, v in urllib.parse.parse_qsl(query) if k == "command"]
                spdy.serve_remotecommand(conn, dict(urllib.parse.parse_qsl(query)), words)
        else:
            req.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@pytest.fixture(scope="module")
def kubelet(apiserver: FakeAPIServer) -> Iterator[Kubelet]:
    apiserver.create("pods", POD, "default")
    handler = Kubelet(apiserver)
    apiserver.on_upgrade(handler)
    yield handler
    apiserver.on_upgrade(None)


@pytest.fixture(scope="module")
def alice(gateway: Gateway, register_token: str) -> str:
    token = gateway.user("alice-streams")
    gateway.grant("alice-streams", cluster=CLUSTER)
    return token


@pytest.fixture(scope="module")
def kubeconfig(gateway: Gateway, agent: Agent, alice: str, kubelet: Kubelet,
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gateway.kubeconfig(alice, tmp_path_factory.mktemp("kc") / "kubeconfig", cluster=CLUSTER)


@pytest.fixture(scope="module")
def open_logs() -> Iterator[list[int]]:
    """How many ``pods/log`` requests the fake is serving right now (one counter, in a list)."""
    active = [0]
    lock = threading.Lock()
    original = fake_apiserver._Handler._pod_log

    def counted(self: fake_apiserver._Handler, info: fake_apiserver.RequestInfo) -> None:
        with lock:
            active[0] += 1
        try:
            original(self, info)
        finally:
            with lock:
                active[0] -= 1

    fake_apiserver._Handler._pod_log = counted  # type: ignore[method-assign]
    yield active
    fake_apiserver._Handler._pod_log = original  # type: ignore[method-assign]


# --------------------------------------------------------------------------- logs -f


def test_logs_follow_streams_and_leaving_frees_the_upstream(
    kubeconfig: Path, apiserver: FakeAPIServer, open_logs: list[int],
) -> None:
    apiserver.pod_logs[("default", "p")] = ["p started"]
    with kubectl_watch("logs", "-f", "p", "-c", "app", kubeconfig=kubeconfig) as follow:
        follow.wait_for("p started", timeout=15)
        follow.wait_for("p line 3", timeout=15)  # lines keep coming as the fake writes them
        assert open_logs[0] == 1
        follow.proc.kill()
        follow.proc.wait(5)
        # The client left: the gateway ends the stream over the agent, the agent its apiserver socket.
        took = seconds_until(lambda: open_logs[0] == 0, 5, "the apiserver still serves the log stream")
    assert took < 2.5, took
    seen = apiserver.requests.last("/api/v1/namespaces/default/pods/p/log")
    assert seen is not None and seen.params.get("follow") == "true"
    assert seen.headers.get("Impersonate-User") == "alice-streams"


# --------------------------------------------------------------------------- port-forward


def _echo_through(port: int, payload: bytes) -> bytes:
    """Send ``payload`` to the forwarded port (in a thread) while reading the echo back."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
        sender.start()
        received = bytearray()
        while len(received) < len(payload):
            piece = sock.recv(1 << 16)
            if not piece:
                break
            received += piece
        sender.join(10)
        return bytes(received)


@pytest.mark.parametrize("version", [
    pytest.param(None, id="websocket-tunnelled-spdy"),
    pytest.param(SPDY_KUBECTL, id="spdy", marks=needs_spdy_kubectl),
])
def test_port_forward_carries_real_bytes_both_ways(
    kubeconfig: Path, kubelet: Kubelet, apiserver: FakeAPIServer, version: str | None,
) -> None:
    kubelet.forwarded.clear()
    port = free_port()
    with kubectl_watch("port-forward", "pod/p", f"{port}:8080", "--address", "127.0.0.1",
                       kubeconfig=kubeconfig, version=version) as forward:
        forward.wait_for("Forwarding from", timeout=20)
        payloads = [os.urandom(1024 * 1024), b"second connection\n"]
        for payload in payloads:  # a connection each: each gets its own pair of streams
            assert hashlib.sha256(_echo_through(port, payload)).digest() == hashlib.sha256(payload).digest()
    assert {h.get("port") for h in kubelet.forwarded} == {"8080"}, kubelet.forwarded
    assert len({h.get("requestid") for h in kubelet.forwarded}) >= 2
    info = kubelet.seen[-1].info
    assert info.subresource == "portforward" and info.headers.get("Impersonate-User") == "alice-streams"
    expected = "websocket" if version is None else "spdy/3.1"
    assert (info.headers.get("Upgrade") or "").lower() == expected


# --------------------------------------------------------------------------- exec and attach


@needs_spdy_kubectl
def test_exec_over_spdy(kubeconfig: Path, kubelet: Kubelet) -> None:
    result = kubectl("exec", "p", "-c", "app", "--", "echo", "spdy", "through", "the", "agent",
                     kubeconfig=kubeconfig, version=SPDY_KUBECTL)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "echo spdy through the agent\n"
    text = "line one\n" + "x" * 200_000 + "\nlast line\n"
    result = kubectl("exec", "-i", "p", "-c", "app", "--", "cat", kubeconfig=kubeconfig, version=SPDY_KUBECTL,
                     input=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout == text
    info = kubelet.seen[-1].info
    assert (info.headers.get("Upgrade") or "").lower() == "spdy/3.1"
    assert info.headers.get("Impersonate-User") == "alice-streams"
    assert info.headers.get("Authorization") == f"Bearer {SA_TOKEN}"


def test_exec_over_websocket_with_stdin(kubeconfig: Path, kubelet: Kubelet) -> None:
    text = "hello through the agent\n" * 1000
    result = kubectl("exec", "-i", "p", "-c", "app", "--", "cat", kubeconfig=kubeconfig, input=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout == text
    info = kubelet.seen[-1].info
    assert (info.headers.get("Upgrade") or "").lower() == "websocket"
    assert info.headers.get("Impersonate-User") == "alice-streams"


@pytest.mark.parametrize("version", [
    pytest.param(None, id="websocket"),
    pytest.param(SPDY_KUBECTL, id="spdy", marks=needs_spdy_kubectl),
])
def test_attach_with_stdin(kubeconfig: Path, kubelet: Kubelet, version: str | None) -> None:
    result = kubectl("attach", "-i", "p", "-c", "app", kubeconfig=kubeconfig, version=version,
                     input="attached input\n")
    assert result.returncode == 0, result.stderr
    assert "attached input\n" in result.stdout
    info = kubelet.seen[-1].info
    assert info.subresource == "attach" and info.headers.get("Impersonate-User") == "alice-streams"


# --------------------------------------------------------------------------- bulk


def _connection(gateway: Gateway) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("localhost", gateway.server.port, timeout=60,
                                       context=ssl.create_default_context(cafile=gateway.ca_file))


def test_large_raw_upload_and_download(gateway: Gateway, agent: Agent, alice: str) -> None:
    payload = os.urandom(24 * 1024 * 1024)
    conn = _connection(gateway)
    try:
        conn.request("PUT", f"/tunnels/clusters/{CLUSTER}/__digest", body=payload,
                     headers={"Authorization": f"Bearer {alice}", "Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        assert resp.status == 200, answer
        assert answer == {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        # Faster than the client reads: the agent is paused and resumed all along (under gevent the
        # session's reader once kept the hub, and the gateway reset such a stream half the time).
        size = 48 * 1024 * 1024
        for _ in range(2):
            conn.request("GET", f"/tunnels/clusters/{CLUSTER}/__bytes?n={size}",
                         headers={"Authorization": f"Bearer {alice}"})
            resp = conn.getresponse()
            assert resp.status == 200
            received = 0
            while piece := resp.read(1 << 20):
                assert piece == b"x" * len(piece)
                received += len(piece)
            assert received == size
    finally:
        conn.close()


def test_kubectl_create_and_get_a_multi_mebibyte_configmap(kubeconfig: Path, apiserver: FakeAPIServer) -> None:
    data = {f"k{i}": base64.b64encode(os.urandom(96 * 1024)).decode() for i in range(20)}  # ~2.5 MiB
    manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "big", "namespace": "default"}, "data": data})
    created = kubectl("create", "-f", "-", kubeconfig=kubeconfig, input=manifest, request_timeout=30)
    assert created.returncode == 0, created.stderr
    assert apiserver.store.get("configmaps", "default", "big")["data"] == data
    got = kubectl("get", "configmap", "big", "-o", "json", kubeconfig=kubeconfig, request_timeout=30)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["data"] == data
    assert kubectl("delete", "configmap", "big", kubeconfig=kubeconfig).returncode == 0


# --------------------------------------------------------------------------- discovery


def _direct(apiserver: FakeAPIServer, path: str) -> bytes:
    conn = http.client.HTTPSConnection("127.0.0.1", apiserver.port, timeout=10,
                                       context=ssl.create_default_context(cafile=apiserver.ca_file))
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {SA_TOKEN}"})
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/api", "/apis", "/api/v1", "/apis/apps/v1", "/openapi/v3",
                                  "/openapi/v3/api/v1", "/version"])
def test_kubectl_get_raw_discovery_is_the_apiservers(kubeconfig: Path, apiserver: FakeAPIServer, path: str) -> None:
    # ``--raw`` replaces the kubeconfig server's path (client-go's RequestURI), as with any gateway
    # that serves clusters under a prefix: the prefix goes in the raw path.
    result = kubectl("get", "--raw", f"/tunnels/clusters/{CLUSTER}{path}", kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(_direct(apiserver, path))


def test_openapi_v2_protobuf_arrives_byte_for_byte(gateway: Gateway, agent: Agent, apiserver: FakeAPIServer,
                                                   alice: str) -> None:
    status, body = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/openapi/v2", token=alice,
                                headers={"Accept": fake_apiserver.OPENAPI_V2_PROTOBUF})
    assert status == 200
    assert body == _direct(apiserver, "/openapi/v2")


# --------------------------------------------------------------------------- a watcher that leaves


def test_a_client_leaving_mid_watch_ends_the_apiserver_watch(gateway: Gateway, agent: Agent,
                                                             apiserver: FakeAPIServer, alice: str) -> None:
    before = apiserver.open_watches
    raw = socket.create_connection(("127.0.0.1", gateway.server.port), timeout=15)
    sock = ssl.create_default_context(cafile=gateway.ca_file).wrap_socket(raw, server_hostname="localhost")
    try:
        sock.sendall((f"GET /tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\n"
                      f"Host: localhost\r\nAuthorization: Bearer {alice}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            piece = sock.recv(65536)
            assert piece, head
            head += piece
        assert head.startswith(b"HTTP/1.1 200"), head
        seconds_until(lambda: apiserver.open_watches == before + 1, 10, "the watch did not reach the apiserver")
    finally:
        # The client vanishes without a word (no TLS close_notify, no more reads).
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
        sock.close()
    took = seconds_until(lambda: apiserver.open_watches == before, 10, "the apiserver still serves the watch")
    assert took < 2.5, took
