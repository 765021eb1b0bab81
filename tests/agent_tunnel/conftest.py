"""A gateway that cannot reach the fake apiserver, and a real ``kube-agent --tunnel`` that can.

The fake apiserver listens on 127.0.0.1; the gateway runs with ``--upstream-deny
127.0.0.1/32``, so the direct path is refused by its address policy and the only way
to the apiserver is the agent's tunnel. The cluster and its register token are made
through the REST API the way an operator makes them; the agent is the real command
(``bcs-middleware kube-agent --tunnel``) in its own process.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bcs_middleware.store.sql import open_store
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import ADMIN, CLI, SA_TOKEN, Gateway, served_gateway, short_admission_refresh
from tests.support.kube import write_kubeconfig
from tests.support.polling import wait_until

__all__ = ["ADMIN", "CLUSTER", "SA_TOKEN", "Agent", "Gateway", "handshake", "tunnel_headers"]

#: The cluster behind "NAT": registered, but only reachable through its agent.
CLUSTER = "BCS-K8S-NAT01"
CONNECT = "/bcsapi/v1/websocket/connect"
#: The gateway's address policy refuses the fake's address: the direct path to it is closed (other
#: loopback addresses, 127.0.0.2 for a webhook, stay allowed).
DENY_LOOPBACK = ["--upstream-deny", "127.0.0.1/32"]


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


# One worker: the agent's connection lands in it, and so does every request (reaching an
# agent held by another worker or instance is the peer forwarding's job, tested there).
@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("gateway")
    args = short_admission_refresh(data, upstream_deny="127.0.0.1/32", audit_log=str(data / "audit.jsonl"))
    with served_gateway(data, args=args, workers=1) as gw:
        yield gw
    assert SA_TOKEN not in gw.server.output()


def create_cluster(gw: Gateway, cluster_id: str, *, token: str | None = None) -> str:
    """Create a Kubernetes cluster and its register token through the REST API; returns the token."""
    gw.json("POST", "/rest/clusters/bcs", token=token,
            body={"id": cluster_id, "project_id": "p1", "cluster_type": "k8s"})
    return str(gw.json("POST", f"/rest/clusters/{cluster_id}/register_tokens", token=token)["token"])


@pytest.fixture(scope="module")
def register_token(gateway: Gateway) -> str:
    return create_cluster(gateway, CLUSTER)


class Agent:
    """A real ``bcs-middleware kube-agent --tunnel`` process for one cluster."""

    def __init__(self, gw: Gateway, apiserver: FakeAPIServer, cluster_id: str, register_token: str,
                 workdir: Path, *, args: Sequence[str] = ()) -> None:
        self.gw = gw
        self.args = list(args)
        self.cluster_id = cluster_id
        self.register_token = register_token
        self.kubeconfig = workdir / f"agent-{cluster_id}.kubeconfig"
        write_kubeconfig(self.kubeconfig, server=apiserver.url, token=SA_TOKEN, ca_pem=apiserver.ca_pem)
        self.log = workdir / f"agent-{cluster_id}-{secrets.token_hex(4)}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Agent:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [CLI, "kube-agent", "--tunnel", "--bke-address", self.gw.url, "--cluster-id", self.cluster_id,
                 "--kubeconfig", str(self.kubeconfig), *self.args],
                env={**os.environ, "REGISTER_TOKEN": self.register_token,
                     "SERVER_CERT": Path(self.gw.ca_file).read_text(), "PYTHONUNBUFFERED": "1"},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_connected(self, timeout: float = 30.0) -> dict:
        """Until the gateway says the agent is connected and a request goes through it."""
        last: list[object] = [None]
        found: list[dict] = []

        def connected() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the agent exited ({self.proc.returncode}):\n{self.output()}")
            status, body = self.gw.call("GET", f"/rest/clusters/{self.cluster_id}")
            agent = json.loads(body).get("agent", {}) if status == 200 else {}
            if agent.get("tunnel_connected"):
                status, body = self.gw.call("GET", f"/tunnels/clusters/{self.cluster_id}/version")
                if status == 200:
                    found.append(agent)
                    return True
            last[0] = (status, body[:300])
            return False

        if not wait_until(connected, timeout, step=0.1):
            raise AssertionError(f"the agent did not connect: {last[0]}\n{self.output()}")
        return found[-1]


def kill_placement_holder(gw: Gateway, cluster_id: str) -> int:
    """SIGKILL the gateway worker the cluster's placement names (it clears nothing); its pid."""
    store = open_store(data_dir=gw.data)
    try:
        record = store.get_placement(cluster_id)
    finally:
        store.db.dispose()
    assert record is not None, f"no placement for {cluster_id}"
    pid = int(record.holder_id.rpartition("/")[2])
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.fixture(scope="module")
def agent(gateway: Gateway, apiserver: FakeAPIServer, register_token: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    # Tests replace this agent with a second one on purpose, and need it back soon after.
    running = Agent(gateway, apiserver, CLUSTER, register_token, tmp_path_factory.mktemp("agent"),
                    args=["--replaced-backoff", "2"]).start()
    try:
        running.wait_connected()
        yield running
    finally:
        running.stop()
    output = running.output()
    assert register_token not in output and SA_TOKEN not in output


def tunnel_params(*, address: str = "https://10.0.0.1:443", user_token: str = SA_TOKEN,
                  ca_pem: str | None = None, raw: dict | None = None) -> str:
    """``BCS-API-Tunnel-Params`` as bcs-kube-agent builds it: base64(JSON), the CA itself base64 of the PEM."""
    if raw is None:
        raw = {"address": address, "userToken": user_token,
               "caCert": base64.b64encode((ca_pem or "").encode()).decode()}
    return base64.b64encode(json.dumps(raw).encode()).decode()


def tunnel_headers(cluster_id: str, token: str, params: str, *, module: str = "kubeagent") -> dict[str, str]:
    """The headers of bcs-kube-agent's websocket mode (``bcs-kube-agent/app/websocket.go``)."""
    return {"BCS-API-Tunnel-Module": module, "BCS-API-Tunnel-ClusterId": cluster_id,
            "BCS-API-Tunnel-Token": token, "BCS-API-Tunnel-Params": params}


def handshake(gw: Gateway, headers: dict[str, str], *, upgrade: bool = True,
              method: str = "GET") -> tuple[int, bytes, ssl.SSLSocket]:
    """Open the tunnel endpoint by hand: (status, what followed the status line, the socket)."""
    raw = socket.create_connection(("127.0.0.1", gw.server.port), timeout=10)
    sock = ssl.create_default_context(cafile=gw.ca_file).wrap_socket(raw, server_hostname="localhost")
    lines = [f"{method} {CONNECT} HTTP/1.1", f"Host: localhost:{gw.server.port}"]
    if upgrade:
        lines += ["Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
                  "Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)).decode()]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    status_line, _, rest = data.partition(b"\r\n")
    status = int(status_line.split()[1]) if status_line.startswith(b"HTTP/1.1 ") else 0
    if status != 101:
        # A refusal: the whole answer, then the gateway closes the connection.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
            except (OSError, ssl.SSLError):
                break
            if not piece:
                break
            rest += piece
    return status, rest, sock
