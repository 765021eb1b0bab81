"""A hostile *gateway* cannot grow the agent without bound either.

The agent is the real ``bcs-middleware kube-agent`` (a process of its own, RSS read from
``/proc``) or its reporter in this process; the gateway is a stand-in on 127.0.0.1 that
floods pings without reading, or answers a report with an endless body.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request

from bcs_middleware.agent_tunnel.wsframes import OP_PING, Frames
from bcs_middleware.cli.kube_agent import AgentError, ClusterAccess, Reporter
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLI, SA_TOKEN
from tests.support.kube import write_kubeconfig
from tests.support.polling import wait_until

from .hostile import vm_bytes
from .wsfixtures import TLS, WSServer

MiB = 1024 * 1024
REGISTER_TOKEN = "register-token-" + "r" * 28


class PingingGateway:
    """Accepts the agent's WebSocket, then sends it pings as fast as it can and never reads."""

    def __init__(self, tls: TLS) -> None:
        self.connections = 0
        self.sent = 0
        self.cut = threading.Event()
        self._stop = threading.Event()
        self.server = WSServer(tls, self._handle)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    def _handle(self, sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        self.connections += 1
        ws = WSConnection(ConnectionType.SERVER)
        ws.receive_data(head)
        assert any(isinstance(event, Request) for event in ws.events())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(ws.send(AcceptConnection()))
        if self.connections > 1:  # the agent came back: hold it, quietly
            self._stop.wait(60)
            return
        pings = Frames(client=False, max_message=1024).frame(OP_PING, b"g" * 125) * 256
        sock.settimeout(2)
        deadline = time.monotonic() + 30
        try:
            while not self._stop.is_set() and time.monotonic() < deadline and self.sent < 2048 * MiB:
                sock.sendall(pings)
                self.sent += len(pings)
        except (OSError, ssl.SSLError):
            self.cut.set()  # the agent ended the connection

    def close(self) -> None:
        self._stop.set()
        self.server.close()


@contextlib.contextmanager
def agent_process(tmp_path: Path, gateway_url: str, api: FakeAPIServer, server_cert: str) -> Iterator[
        subprocess.Popen[str]]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=api.url, token=SA_TOKEN, ca_pem=api.ca_pem)
    env = dict(os.environ, REGISTER_TOKEN=REGISTER_TOKEN, SERVER_CERT=server_cert)
    with (tmp_path / "agent.log").open("w") as log_file:
        process = subprocess.Popen(
            [CLI, "kube-agent", "--tunnel", "--bke-address", gateway_url, "--cluster-id", "BCS-K8S-40002",
             "--kubeconfig", str(kubeconfig), "--tunnel-connections", "1"],
            env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(10)


def test_a_gateway_that_pings_and_never_reads_is_cut_by_the_agent_with_bounded_memory(tmp_path: Path) -> None:
    tls = TLS()
    gateway = PingingGateway(tls)
    try:
        with FakeAPIServer(token=SA_TOKEN) as api, agent_process(tmp_path, gateway.url, api, tls.ca_pem) as process:
            assert wait_until(lambda: gateway.connections >= 1 or process.poll() is not None, 60)
            before = vm_bytes(process.pid, "VmRSS")
            Path(f"/proc/{process.pid}/clear_refs").write_text("5")
            assert gateway.cut.wait(40), f"the agent took {gateway.sent // MiB} MiB of pings without a cut"
            grew = vm_bytes(process.pid, "VmHWM") - before
            log = tmp_path / "agent.log"
            print(f"\nagent: {gateway.sent / MiB:.1f} MiB of pings never read; its RSS grew by {grew / MiB:.1f} MiB")
            assert grew < 32 * MiB
            assert wait_until(lambda: "WebSocket close 1008" in log.read_text(), 20), log.read_text()
            assert "pings without reading the pongs" in log.read_text()
            # It reconnects, as after any failure.
            assert wait_until(lambda: gateway.connections >= 2, 30)
    finally:
        gateway.close()


class EndlessRefusal:
    """A stand-in gateway answering every request 400 with a body of ``size`` bytes (written
    until the client goes away)."""

    def __init__(self, tls: TLS, size: int) -> None:
        self.size = size
        self.written = 0
        self.server = WSServer(tls, self._handle)

    def _handle(self, sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        sock.settimeout(10)
        try:
            sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n{\"code_name\": \"BAD\", \"message\": \"" % self.size)
            chunk = b"x" * 65536
            while self.written < self.size:
                sock.sendall(chunk)
                self.written += len(chunk)
        except (OSError, ssl.SSLError):
            pass
        finally:
            sock.close()


def test_a_report_answered_with_an_endless_refusal_reads_only_its_start(tmp_path: Path) -> None:
    tls = TLS()
    gateway = EndlessRefusal(tls, 512 * MiB)
    try:
        reporter = Reporter(f"https://127.0.0.1:{gateway.server.port}", "BCS-K8S-40003", REGISTER_TOKEN,
                            server_cert=tls.ca_pem, insecure=False)
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(AgentError) as refused:
                reporter.report(ClusterAccess(("https://10.0.0.1:6443",), "ca", SA_TOKEN))
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert "HTTP 400" in str(refused.value) and len(str(refused.value)) < 400
        assert peak < 4 * MiB, f"the agent held {peak // MiB} MiB of the answer"
        assert time.monotonic() - started < 15
        assert gateway.written < 64 * MiB
    finally:
        gateway.server.close()
