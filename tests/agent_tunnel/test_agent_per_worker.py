"""The agent holds a connection in every gateway worker, so no worker forwards to another.

A gateway of this project answers an agent that names itself (``BCS-Tunnel-Agent-Id``)
with ``BCS-Tunnel-Workers: N``; the agent then holds N connections, and a connection
that lands on a worker already holding one of them is refused with ``409
TUNNEL_DUPLICATE`` (nothing stored) and dialled again. The Go agent sends no id: one
connection, the newest of a worker winning, as before (``test_peer_link``, ``test_two_agents``).
"""

from __future__ import annotations

import json
import ssl
import urllib.error

import pytest

from bcs_middleware.agent_tunnel.handshake import CLOSE_REPLACED
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import Gateway, served_gateway
from tests.support.polling import wait_until
from tests.support.websocket import read_frame

from .conftest import Agent, create_cluster, handshake, kill_placement_holder, tunnel_headers, tunnel_params

FORWARDED = "forwarded to its holder"


def _opened(agent: Agent) -> int:
    return agent.output().count("tunnel to ")


def _attached(gw: Gateway, cluster: str) -> int:
    """How many connections of the cluster's agent the gateway's workers have taken so far."""
    return gw.server.output().count(f"kube-agent of cluster {cluster} connected")


def _all_answered_locally(gw: Gateway, cluster: str, count: int = 30) -> None:
    """``count`` requests on fresh connections (either worker, SO_REUSEPORT): all 200, none forwarded."""
    before = gw.server.output().count(FORWARDED)
    for _ in range(count):
        status, body = gw.call("GET", f"/tunnels/clusters/{cluster}/version")
        assert status == 200, body
    assert gw.server.output().count(FORWARDED) == before


def test_an_agent_holds_a_connection_in_every_worker_and_nothing_is_forwarded(
        tmp_path_factory: pytest.TempPathFactory, apiserver: FakeAPIServer) -> None:
    cluster = "BCS-K8S-PERWORKER"
    args = ["--upstream-deny", "127.0.0.0/8", "--log-level", "debug"]
    with served_gateway(tmp_path_factory.mktemp("perworker"), args=args, workers=2) as gw:
        agent = Agent(gw, apiserver, cluster, create_cluster(gw, cluster), tmp_path_factory.mktemp("agent")).start()
        try:
            agent.wait_connected()
            # The second connection is opened once the first 101 said "2 workers"; one that
            # lands on the worker holding the first is refused and dialled again.
            assert wait_until(lambda: "(connection 2)" in agent.output(), 20), agent.output()
            assert wait_until(lambda: _attached(gw, cluster) >= 2, 10)  # held by its worker now
            _all_answered_locally(gw, cluster)

            # A worker is killed: gunicorn starts another, the agent's connection that was in
            # the dead one comes back into the new one, and again nothing is forwarded.
            opened, attached = _opened(agent), _attached(gw, cluster)
            kill_placement_holder(gw, cluster)
            assert wait_until(lambda: _opened(agent) > opened and _attached(gw, cluster) > attached, 30), (
                agent.output())
            def answered_locally() -> bool:
                try:
                    _all_answered_locally(gw, cluster, 12)
                    return True
                except (AssertionError, urllib.error.URLError):
                    # The new worker forwards (or answers 503) until the agent's connection is in it.
                    return False

            wait_until(answered_locally, 30, step=0.5)
            _all_answered_locally(gw, cluster)
        finally:
            agent.stop()
        output = agent.output()
        assert "two agents serve one cluster" not in output  # its own connections are not "another agent"
        assert agent.register_token not in output


def _addresses(gw: Gateway, cluster: str) -> list[str]:
    return list(gw.json("GET", f"/rest/clusters/{cluster}/credentials")["server_addresses"])


def _close_code(sock: ssl.SSLSocket, timeout: float = 10.0) -> int | None:
    """The code of the gateway's close frame on a raw agent connection (``None``: it sent none)."""
    sock.settimeout(timeout)
    rfile = sock.makefile("rb")
    while True:
        try:
            opcode, payload = read_frame(rfile)
        except (OSError, ssl.SSLError):
            return None
        if opcode is None:
            return None
        if opcode == 0x8:
            return int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None


def test_a_connection_of_the_same_agent_to_a_worker_holding_one_is_refused_and_changes_nothing(
        gateway: Gateway, apiserver: FakeAPIServer) -> None:
    cluster = "BCS-K8S-DUPLICATE"
    token = create_cluster(gateway, cluster)
    first_params = tunnel_params(address="https://10.9.8.7:6443", ca_pem=apiserver.ca_pem)
    status, head, first = handshake(gateway, {**tunnel_headers(cluster, token, first_params),
                                              "BCS-Tunnel-Agent-Id": "a" * 32})
    try:
        assert status == 101
        assert b"bcs-tunnel-workers: 1" in head.lower()  # this fixture's gateway runs one worker
        # The worker holds it once the 101 is out (a connection racing in before then is let in,
        # and the older of the two closed as redundant: the registry tests show that).
        assert wait_until(lambda: gateway.json("GET", f"/rest/clusters/{cluster}")["agent"]["tunnel_connected"])
        # The same agent again, to the same (only) worker: refused, and nothing is stored.
        other_params = tunnel_params(address="https://10.1.1.1:6443", ca_pem=apiserver.ca_pem)
        status, body, again = handshake(gateway, {**tunnel_headers(cluster, token, other_params),
                                                  "BCS-Tunnel-Agent-Id": "a" * 32})
        again.close()
        assert status == 409, body
        assert json.loads(body.partition(b"\r\n\r\n")[2])["code_name"] == "TUNNEL_DUPLICATE"
        assert _addresses(gateway, cluster) == ["https://10.9.8.7:6443"]
        # Another agent (another id) replaces it, as before: the first is told it was replaced.
        status, _, second = handshake(gateway, {**tunnel_headers(cluster, token, first_params),
                                                "BCS-Tunnel-Agent-Id": "b" * 32})
        try:
            assert status == 101
            assert _close_code(first) == CLOSE_REPLACED
        finally:
            second.close()
    finally:
        first.close()


def test_the_go_agent_gets_no_worker_count(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    """Without an agent id (bk-bcs's agent) the 101 says nothing new: one connection, as before."""
    cluster = "BCS-K8S-GOAGENT"
    token = create_cluster(gateway, cluster)
    params = tunnel_params(address="https://10.9.8.5:6443", ca_pem=apiserver.ca_pem)
    status, head, sock = handshake(gateway, tunnel_headers(cluster, token, params))
    sock.close()
    assert status == 101
    assert b"bcs-tunnel-workers" not in head.lower()


@pytest.mark.parametrize("agent_id", [
    pytest.param("x" * 65, id="too-long"),
    pytest.param("has space", id="space"),
    pytest.param("a/b", id="slash"),
    pytest.param("a,b", id="comma"),
])
def test_a_malformed_agent_id_is_a_400_and_changes_nothing(gateway: Gateway, apiserver: FakeAPIServer,
                                                           agent_id: str) -> None:
    cluster = f"BCS-K8S-BADID-{abs(hash(agent_id)) % 10**6}"
    token = create_cluster(gateway, cluster)
    params = tunnel_params(address="https://10.9.8.6:6443", ca_pem=apiserver.ca_pem)
    status, body, sock = handshake(gateway, {**tunnel_headers(cluster, token, params),
                                             "BCS-Tunnel-Agent-Id": agent_id})
    sock.close()
    assert status == 400, body
    assert b"BCS-Tunnel-Agent-Id" in body
    assert _addresses(gateway, cluster) == []
