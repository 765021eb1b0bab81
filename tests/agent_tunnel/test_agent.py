"""The agent side of the tunnel: what it sends, what it dials, how it stays connected.

A small stand-in gateway (a TLS WebSocket endpoint running the gateway's end of the
session) replaces the real endpoint; the apiserver behind the agent is the fake
apiserver over TLS. ``test_the_cli_agent_*`` start the real ``bcs-middleware
kube-agent --tunnel`` process.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bcs_middleware.agent_tunnel.agent import MAX_CONNECTIONS, TunnelAgent, apiserver_dialer
from bcs_middleware.agent_tunnel.handshake import (
    CLOSE_DUPLICATE,
    CLOSE_REPLACED,
    CONNECT_PATH,
    TunnelParams,
    dial_address,
)
from bcs_middleware.agent_tunnel.session import Session
from bcs_middleware.agent_tunnel.wschannel import WebSocketChannel
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLI
from tests.support.kube import write_kubeconfig
from tests.support.polling import wait_until

from .wsfixtures import TLS, TargetServer, WSServer

REGISTER_TOKEN = "register-" + "r" * 40
SA_TOKEN = "sa-token-" + "s" * 40


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines if line)}


class StandInGateway:
    """Accepts agent tunnels with the right register token; answers 401 otherwise (as bcs-api did)."""

    def __init__(self, tls: TLS, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.sessions: list[Session] = []
        self.attempts: list[float] = []
        self.arrived = threading.Condition()
        self.server = WSServer(tls, self._handle)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    def _handle(self, sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        self.attempts.append(time.monotonic())
        headers = _headers(head)
        if self.refuse or headers.get("bcs-api-tunnel-token") != REGISTER_TOKEN:
            body = b"failed authentication"
            sock.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            sock.close()
            return
        session = Session(WebSocketChannel.accept(sock, head, leftover=leftover), name="stand-in")
        with self.arrived:
            self.sessions.append(session)
            self.arrived.notify_all()
        session.serve()

    def wait_session(self, count: int = 1, timeout: float = 10) -> Session:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.sessions) >= count and not self.sessions[-1].closed,
                                         timeout), f"no tunnel #{count} within {timeout}s"
            return self.sessions[count - 1]

    def close(self) -> None:
        for session in self.sessions:
            session.close("stand-in gateway stopping")
        self.server.close()


@pytest.fixture(scope="module")
def tls() -> TLS:
    return TLS()


@pytest.fixture(scope="module")
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as server:
        yield server


@pytest.fixture
def gateway(tls: TLS) -> Iterator[StandInGateway]:
    gw = StandInGateway(tls)
    yield gw
    gw.close()


def params_for(api: FakeAPIServer) -> TunnelParams:
    return TunnelParams(address=api.url, user_token=SA_TOKEN, ca_pem=api.ca_pem)


@contextlib.contextmanager
def running_agent(gateway_url: str, context: ssl.SSLContext, gather, **options) -> Iterator[TunnelAgent]:  # type: ignore[no-untyped-def]
    agent = TunnelAgent(gateway_url=gateway_url, cluster_id="BCS-K8S-40001", register_token=REGISTER_TOKEN,
                        gather=gather, context=context, **options)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(10)
        assert not thread.is_alive()


def get_through(session: Session, params: TunnelParams, path: str = "/version") -> tuple[int, bytes]:
    """What the gateway does: TLS to the apiserver through the tunnel, with the reported CA and token."""
    raw = session.open("tcp", dial_address(params.address), 5)
    raw.settimeout(10)
    context = ssl.create_default_context(cadata=params.ca_pem)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: kubernetes\r\nAuthorization: Bearer {params.user_token}\r\n"
                     f"Connection: close\r\n\r\n".encode())
        data = bytearray()
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_the_agent_opens_the_tunnel_with_the_bk_bcs_headers(tls: TLS, api: FakeAPIServer,
                                                            gateway: StandInGateway) -> None:
    with running_agent(gateway.url, tls.client_context(), lambda: params_for(api)):
        gateway.wait_session()
    head = gateway.server.heads[0]
    assert head.startswith(f"GET {CONNECT_PATH} HTTP/1.1\r\n".encode())
    headers = _headers(head)
    assert headers["host"] == f"127.0.0.1:{gateway.server.port}"
    assert headers["upgrade"].lower() == "websocket"
    assert headers["bcs-api-tunnel-module"] == "kube-agent"
    assert headers["bcs-api-tunnel-token"] == REGISTER_TOKEN
    assert headers["bcs-api-tunnel-clusterid"] == "BCS-K8S-40001"
    # base64 (standard alphabet, padded) of a JSON object with exactly the Go agent's keys
    params = json.loads(base64.b64decode(headers["bcs-api-tunnel-params"], validate=True))
    assert set(params) == {"address", "userToken", "caCert"}
    assert params["address"] == api.url
    assert params["userToken"] == SA_TOKEN
    assert base64.b64decode(params["caCert"], validate=True).decode() == api.ca_pem
    assert TunnelParams.decode(headers["bcs-api-tunnel-params"]) == params_for(api)


def test_the_gateway_reaches_the_agents_apiserver_through_the_tunnel(tls: TLS, api: FakeAPIServer,
                                                                     gateway: StandInGateway) -> None:
    with running_agent(gateway.url, tls.client_context(), lambda: params_for(api)):
        session = gateway.wait_session()
        status, body = get_through(session, params_for(api))
        assert status == 200
        assert json.loads(body)["major"] == "1"
        assert api.requests.last("/version") is not None


def test_the_agent_dials_only_its_own_apiserver(tls: TLS, api: FakeAPIServer, gateway: StandInGateway,
                                                caplog: pytest.LogCaptureFixture) -> None:
    foreign = TargetServer("echo")  # on the same host as the apiserver, another port
    caplog.set_level(logging.INFO)
    try:
        with running_agent(gateway.url, tls.client_context(), lambda: params_for(api)):
            session = gateway.wait_session()
            for proto, address in [("tcp", foreign.address), ("tcp", "10.0.0.1:6443"),
                                   ("tcp", f"localhost:{api.port}"), ("tcp", f"127.0.0.1:{api.port + 1}"),
                                   ("unix", "/var/run/docker.sock"), ("udp", f"127.0.0.1:{api.port}")]:
                with session.open(proto, address, 5) as sock:
                    sock.settimeout(5)
                    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    assert sock.recv(100) == b"", address
            # the tunnel still serves the apiserver itself
            assert get_through(session, params_for(api))[0] == 200
    finally:
        foreign.close()
    assert foreign.connections == 0
    assert "connect not allowed" in caplog.text
    assert SA_TOKEN not in caplog.text and REGISTER_TOKEN not in caplog.text


def test_the_agents_sockets_send_without_nagle_delay(tls: TLS, api: FakeAPIServer,
                                                    gateway: StandInGateway) -> None:
    """It relays TLS records as they come, as the Go agent (Go's TCP sockets set TCP_NODELAY)."""
    import socket

    with apiserver_dialer(params_for(api))("tcp", dial_address(api.url), 5) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    with running_agent(gateway.url, tls.client_context(), lambda: params_for(api)) as agent:
        gateway.wait_session()
        assert wait_until(lambda: agent.session is not None)
        raw = agent.session.channel._sock  # type: ignore[union-attr]
        assert raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_the_gateway_certificate_is_verified(api: FakeAPIServer, gateway: StandInGateway,
                                             caplog: pytest.LogCaptureFixture) -> None:
    other_ca = TLS()  # the agent trusts another CA than the one that signed the gateway's certificate
    caplog.set_level(logging.INFO)
    with running_agent(gateway.url, other_ca.client_context(), lambda: params_for(api),
                       backoff_base=0.1, backoff_max=0.2) as agent:
        # Tried and refused more than once (the backoff is 0.1-0.2 s), and never connected.
        assert wait_until(lambda: caplog.text.count("did not verify") >= 3, 10), caplog.text
        assert agent.connections == 0
    assert gateway.sessions == [] and gateway.server.heads == []
    assert "did not verify" in caplog.text


def test_the_agent_reconnects_after_the_gateway_drops_it(tls: TLS, api: FakeAPIServer,
                                                         gateway: StandInGateway) -> None:
    with running_agent(gateway.url, tls.client_context(), lambda: params_for(api),
                       backoff_base=0.2, backoff_max=1.0) as agent:
        first = gateway.wait_session(1)
        first.close("gateway restarting")
        second = gateway.wait_session(2, timeout=10)
        assert wait_until(lambda: agent.connections == 2, 5), agent.connections
        assert get_through(second, params_for(api))[0] == 200


def test_an_agent_replaced_by_another_waits_long_and_says_why(tls: TLS, api: FakeAPIServer,
                                                              gateway: StandInGateway,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with running_agent(gateway.url, tls.client_context(), lambda: params_for(api),
                       backoff_base=0.1, backoff_max=0.2, replaced_backoff=3.0) as agent:
        gateway.wait_session(1).close("replaced by a newer connection", code=CLOSE_REPLACED)
        closed = time.monotonic()
        second = gateway.wait_session(2, timeout=10)
        # Not the ordinary 0.05-0.1 s: the upper half of --replaced-backoff.
        assert time.monotonic() - closed >= 1.5
        assert agent.replaced == 1
        second.close("gateway restarting")  # an ordinary close: back soon
        closed = time.monotonic()
        gateway.wait_session(3, timeout=10)
        assert time.monotonic() - closed < 1.5
    assert "two agents serve one cluster" in caplog.text


class _Opening:
    closed = False


class WorkersGateway(StandInGateway):
    """A stand-in gateway of ``workers`` workers: connection n lands on worker ``landing[n]``; a
    worker holding a live connection of the same agent id answers 409, as the real endpoint does."""

    def __init__(self, tls: TLS, *, workers: int, landing: list[int]) -> None:
        super().__init__(tls)
        self.workers = workers
        self.landing = landing
        self.held: dict[int, tuple[str, Session]] = {}
        self.refused = 0
        self.lock = threading.Lock()

    def _handle(self, sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        headers = _headers(head)
        agent_id = headers.get("bcs-tunnel-agent-id", "")
        with self.lock:  # connections arrive in threads of their own
            number = len(self.attempts)
            self.attempts.append(time.monotonic())
            worker = self.landing[number] if number < len(self.landing) else number % self.workers
            held = self.held.get(worker)
            duplicate = bool(agent_id) and held is not None and held[0] == agent_id and not held[1].closed
            if duplicate:
                self.refused += 1
            else:  # reserved at once: a connection arriving meanwhile is a duplicate
                self.held[worker] = (agent_id, _Opening())  # type: ignore[assignment]
        if duplicate:
            body = b'{"code_name": "TUNNEL_DUPLICATE"}'
            sock.sendall(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            sock.close()
            return
        channel = WebSocketChannel.accept(sock, head, leftover=leftover,
                                          extra_headers=[("BCS-Tunnel-Workers", str(self.workers))])
        session = Session(channel, name=f"stand-in-{worker}")
        with self.lock:
            self.held[worker] = (agent_id, session)
        with self.arrived:
            self.sessions.append(session)
            self.arrived.notify_all()
        session.serve()

    def live_workers(self) -> set[int]:
        return {worker for worker, (_, session) in self.held.items()
                if isinstance(session, Session) and not session.closed}


def test_the_agent_holds_a_connection_in_every_worker_the_gateway_names(tls: TLS, api: FakeAPIServer) -> None:
    # The 2nd and 3rd connections land on worker 0, which holds the first: refused, dialled again.
    gateway = WorkersGateway(tls, workers=3, landing=[0, 0, 0, 1, 1, 2])
    try:
        with running_agent(gateway.url, tls.client_context(), lambda: params_for(api)) as agent:
            assert wait_until(lambda: gateway.live_workers() == {0, 1, 2}), gateway.held
            assert gateway.refused == 3
            assert wait_until(lambda: len(agent.sessions) == 3)
            assert agent.wanted == 3 and agent.replaced == 0
            # A worker lost (its connection ends): that connection comes back, soon.
            gateway.held[1][1].close("worker restarting")
            assert wait_until(lambda: gateway.live_workers() == {0, 1, 2}), gateway.held
            # Every connection carries requests to the apiserver.
            for _, session in gateway.held.values():
                assert get_through(session, params_for(api))[0] == 200
    finally:
        gateway.close()


def test_a_redundant_connection_closed_by_the_gateway_is_dialled_again_soon(tls: TLS, api: FakeAPIServer,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    gateway = WorkersGateway(tls, workers=1, landing=[])
    caplog.set_level(logging.INFO)
    try:
        with running_agent(gateway.url, tls.client_context(), lambda: params_for(api),
                           replaced_backoff=30.0) as agent:
            gateway.wait_session(1).close("the same kube-agent connected again", code=CLOSE_DUPLICATE)
            closed = time.monotonic()
            gateway.wait_session(2, timeout=10)
            assert time.monotonic() - closed < 1.0  # not the replaced backoff
            assert agent.replaced == 0
    finally:
        gateway.close()
    assert "two agents serve one cluster" not in caplog.text


@pytest.mark.parametrize("workers", [pytest.param("0", id="zero"), pytest.param("many", id="not-a-number"),
                                     pytest.param("1000", id="beyond-the-cap")])
def test_the_workers_header_is_bounded(tls: TLS, api: FakeAPIServer, workers: str) -> None:
    class Saying(WorkersGateway):
        def __init__(self) -> None:
            super().__init__(tls, workers=1, landing=[])
            self.say = workers

        def _handle(self, sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
            self.attempts.append(time.monotonic())
            channel = WebSocketChannel.accept(sock, head, leftover=leftover,
                                              extra_headers=[("BCS-Tunnel-Workers", self.say)])
            session = Session(channel, name="stand-in")
            with self.arrived:
                self.sessions.append(session)
                self.arrived.notify_all()
            session.serve()

    gateway = Saying()
    try:
        with running_agent(gateway.url, tls.client_context(), lambda: params_for(api)) as agent:
            gateway.wait_session(1)
            time.sleep(0.5)  # the sleep is the test: a window in which the agent would open more
            expected = {"0": 1, "many": 1, "1000": MAX_CONNECTIONS}[workers]
            assert wait_until(lambda: len(agent.sessions) == expected)
            assert agent.wanted == expected
    finally:
        gateway.close()


def test_a_fixed_connection_count_ignores_the_gateway(tls: TLS, api: FakeAPIServer) -> None:
    gateway = WorkersGateway(tls, workers=4, landing=[0, 1, 2, 3])
    try:
        with running_agent(gateway.url, tls.client_context(), lambda: params_for(api), connections=1) as agent:
            gateway.wait_session(1)
            time.sleep(0.5)  # the sleep is the test: a window in which the agent would open more
            assert len(gateway.attempts) == 1 and agent.wanted == 1
    finally:
        gateway.close()


def test_a_refused_tunnel_is_retried_with_growing_backoff(tls: TLS, api: FakeAPIServer,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    refusing = StandInGateway(tls, refuse=True)
    caplog.set_level(logging.INFO)
    try:
        with running_agent(refusing.url, tls.client_context(), lambda: params_for(api),
                           backoff_base=0.1, backoff_max=0.8):
            wait_until(lambda: len(refusing.attempts) >= 5, 10)
    finally:
        refusing.close()
    gaps = [b - a for a, b in zip(refusing.attempts, refusing.attempts[1:], strict=False)]
    assert len(gaps) >= 4
    # 0.05-0.1, 0.1-0.2, 0.2-0.4, 0.4-0.8 s (jitter in the upper half), plus a little overhead
    for gap, floor in zip(gaps, [0.05, 0.1, 0.2, 0.4], strict=False):
        assert gap >= floor * 0.9, gaps
    assert max(gaps) < 0.8 + 0.5
    assert "refused the tunnel (HTTP 401): failed authentication" in caplog.text
    assert REGISTER_TOKEN not in caplog.text and SA_TOKEN not in caplog.text


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    agent = TunnelAgent(gateway_url="https://gw.example", cluster_id="c", register_token="t",
                        gather=lambda: TunnelParams("https://a:1", "t", "pem"),
                        context=ssl.create_default_context(), backoff_base=1.0, backoff_max=60.0)
    assert agent.backoff(0) == 0.0
    for failures, ceiling in [(1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (100, 60)]:
        delays = [agent.backoff(failures) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered, not in step


def test_a_changed_token_is_reported_by_reconnecting(tls: TLS, api: FakeAPIServer,
                                                     gateway: StandInGateway) -> None:
    current = [params_for(api)]
    with running_agent(gateway.url, tls.client_context(), lambda: current[0], refresh=0.2):
        gateway.wait_session(1)
        current[0] = TunnelParams(api.url, "rotated-token", api.ca_pem)
        gateway.wait_session(2, timeout=10)
    params = json.loads(base64.b64decode(_headers(gateway.server.heads[1])["bcs-api-tunnel-params"]))
    assert params["userToken"] == "rotated-token"


@contextlib.contextmanager
def cli_agent(tmp_path: Path, gateway_url: str, kubeconfig: Path, server_cert: str) -> Iterator[subprocess.Popen[str]]:
    env = dict(os.environ, REGISTER_TOKEN=REGISTER_TOKEN, SERVER_CERT=server_cert)
    log_file = (tmp_path / "agent.log").open("w")
    process = subprocess.Popen(
        [CLI, "kube-agent", "--tunnel", "--bke-address", gateway_url, "--cluster-id", "BCS-K8S-40001",
         "--kubeconfig", str(kubeconfig)],
        env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        log_file.close()


def test_the_cli_agent_serves_its_apiserver_and_refuses_the_rest(tmp_path: Path, tls: TLS, api: FakeAPIServer,
                                                                 gateway: StandInGateway) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=api.url, token=SA_TOKEN, ca_pem=api.ca_pem)
    foreign = TargetServer("echo")
    try:
        with cli_agent(tmp_path, gateway.url, kubeconfig, tls.ca_pem) as process:
            session = gateway.wait_session(timeout=20)
            assert get_through(session, params_for(api))[0] == 200
            with session.open("tcp", foreign.address, 5) as sock:
                sock.settimeout(5)
                assert sock.recv(10) == b""
            # SIGTERM closes the tunnel cleanly: the gateway's end sees it at once
            process.send_signal(signal.SIGTERM)
            assert process.wait(10) == 0
            assert wait_until(lambda: session.closed, 5)
    finally:
        foreign.close()
    assert foreign.connections == 0
    log_text = (tmp_path / "agent.log").read_text()
    assert "tunnel to 127.0.0.1" in log_text
    assert REGISTER_TOKEN not in log_text and SA_TOKEN not in log_text


def test_the_cli_agent_refuses_an_unverified_gateway(tmp_path: Path, api: FakeAPIServer,
                                                     gateway: StandInGateway) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=api.url, token=SA_TOKEN, ca_pem=api.ca_pem)
    log = tmp_path / "agent.log"
    with cli_agent(tmp_path, gateway.url, kubeconfig, TLS().ca_pem) as process:
        # Polled: the agent's start takes more than a second on a busy host; twice: it keeps trying.
        assert wait_until(lambda: log.exists() and log.read_text().count("did not verify") >= 2, 30), \
            log.read_text() if log.exists() else "no log"
        assert process.poll() is None  # it keeps trying, with backoff
    assert gateway.server.heads == []  # the register token never left the agent


def test_the_cli_agent_needs_https(tmp_path: Path, api: FakeAPIServer) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=api.url, token=SA_TOKEN, ca_pem=api.ca_pem)
    result = subprocess.run(
        [CLI, "kube-agent", "--tunnel", "--insecure-skip-verify", "--bke-address", "http://127.0.0.1:1",
         "--cluster-id", "c", "--kubeconfig", str(kubeconfig)],
        env=dict(os.environ, REGISTER_TOKEN=REGISTER_TOKEN), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "https://" in result.stderr




def test_the_example_manifests_tunnel_line_is_a_valid_agent_option() -> None:
    import argparse

    import yaml

    from bcs_middleware.cli import kube_agent

    text = (Path(__file__).resolve().parents[2] / "examples" / "kube-agent.yaml").read_text()
    assert "# - --tunnel\n" in text
    documents = list(yaml.safe_load_all(text.replace("# - --tunnel\n", "- --tunnel\n")))
    container = documents[-1]["spec"]["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    kube_agent.configure_parser(parser)
    args = parser.parse_args(container["args"])
    assert args.tunnel and args.bke_address.startswith("https://")


@pytest.mark.parametrize(("url", "expected"), [
    pytest.param("https://10.96.0.1:443", "10.96.0.1:443", id="ipv4"),
    pytest.param("https://Kubernetes.Default.svc", "kubernetes.default.svc:443", id="name-default-port"),
    pytest.param("https://[fd00::1]:6443", "[fd00::1]:6443", id="ipv6"),
    pytest.param("https://fd00::1:6443", "[fd00::1]:6443", id="ipv6-unbracketed-as-the-go-agent-writes-it"),
])
def test_the_dial_address_of_a_reported_apiserver(url: str, expected: str) -> None:
    assert dial_address(url) == expected


def _params_header(body: object) -> str:
    return base64.b64encode(json.dumps(body).encode()).decode()


PEM_B64 = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


@pytest.mark.parametrize("header", [
    pytest.param("not base64!", id="not-base64"),
    pytest.param(base64.b64encode(b"not json").decode(), id="not-json"),
    pytest.param(_params_header(["address"]), id="not-an-object"),
    pytest.param(_params_header({"address": "https://a:1", "userToken": "t"}), id="no-ca"),
    pytest.param(_params_header({"address": "https://a:1", "userToken": "", "caCert": PEM_B64}), id="empty-token"),
    pytest.param(_params_header({"address": "http://a:1", "userToken": "t", "caCert": PEM_B64}), id="not-https"),
    pytest.param(_params_header({"address": "https://a:x", "userToken": "t", "caCert": PEM_B64}), id="bad-port"),
    pytest.param(_params_header({"address": "https://a:1", "userToken": "t", "caCert": "%%%"}), id="ca-not-base64"),
    pytest.param(_params_header({"address": "https://a:1", "userToken": "t",
                                 "caCert": base64.b64encode(b"hello").decode()}), id="ca-not-pem"),
    pytest.param("A" * 70000, id="too-long"),
])
def test_a_malformed_params_header_is_a_typed_error_that_never_quotes_it(header: str) -> None:
    from bcs_middleware.agent_tunnel.handshake import TunnelParamsError

    with pytest.raises(TunnelParamsError) as info:
        TunnelParams.decode(header)
    assert header[:20] not in str(info.value) or len(header) < 8
