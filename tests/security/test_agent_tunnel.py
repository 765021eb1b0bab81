"""Attacks on the agent tunnel endpoint (``/bcsapi/v1/websocket/connect``), through a real gateway.

Only a cluster's *current* register token opens a tunnel for it; anything refused
changes nothing (no credentials stored, nothing dialled); a connected agent cannot
be used to reach another cluster or the gateway itself; rotating the token drops
the tunnel; the client's ``Impersonate-*`` is still refused on a tunnelled cluster.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_tunnel.conftest import (
    CONNECT,
    DENY_LOOPBACK,
    Agent,
    create_cluster,
    handshake,
    tunnel_headers,
    tunnel_params,
)
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, served_gateway
from tests.support.polling import seconds_until, wait_until
from tests.support.servers import TrapListener

VICTIM = "BCS-K8S-VICTIM"
OTHER = "BCS-K8S-OTHER"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with served_gateway(tmp_path_factory.mktemp("gateway"), args=DENY_LOOPBACK, workers=1) as gw:
        yield gw
    assert SA_TOKEN not in gw.server.output()


@pytest.fixture(scope="module")
def tokens(gateway: Gateway) -> dict[str, str]:
    return {VICTIM: create_cluster(gateway, VICTIM), OTHER: create_cluster(gateway, OTHER)}


def _reported(gw: Gateway, cluster_id: str) -> bool:
    return bool(gw.json("GET", f"/rest/clusters/{cluster_id}/credentials")["reported"])


def _params(apiserver: FakeAPIServer) -> str:
    return tunnel_params(address=apiserver.url, ca_pem=apiserver.ca_pem)


# ----------------------------------------------------------------------------- who may connect


def test_wrong_token_is_refused_and_changes_nothing(gateway: Gateway, apiserver: FakeAPIServer,
                                                     tokens: dict[str, str]) -> None:
    status, body, sock = handshake(gateway, tunnel_headers(VICTIM, "not-the-token-" + "x" * 30, _params(apiserver)))
    sock.close()
    assert status == 401, body
    assert b"failed authentication" in body
    assert not _reported(gateway, VICTIM)


def test_another_clusters_token_is_refused(gateway: Gateway, apiserver: FakeAPIServer,
                                           tokens: dict[str, str]) -> None:
    status, body, sock = handshake(gateway, tunnel_headers(VICTIM, tokens[OTHER], _params(apiserver)))
    sock.close()
    assert status == 401, body
    assert not _reported(gateway, VICTIM) and not _reported(gateway, OTHER)


def test_unknown_cluster_and_wrong_token_answer_alike(gateway: Gateway, apiserver: FakeAPIServer,
                                                      tokens: dict[str, str]) -> None:
    answers = []
    for cluster in (VICTIM, "BCS-K8S-NOSUCH"):
        status, body, sock = handshake(gateway, tunnel_headers(cluster, "x" * 43, _params(apiserver)))
        sock.close()
        answers.append((status, json.loads(body.partition(b"\r\n\r\n")[2])))
    assert answers[0] == answers[1]
    assert answers[0][0] == 401


def test_an_old_register_token_is_refused(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    cluster = "BCS-K8S-ROTATED"
    old = create_cluster(gateway, cluster)
    gateway.json("DELETE", f"/rest/clusters/{cluster}/register_tokens")
    status, body, sock = handshake(gateway, tunnel_headers(cluster, old, _params(apiserver)))
    sock.close()
    assert status == 401, body
    gateway.json("POST", f"/rest/clusters/{cluster}/register_tokens")
    status, body, sock = handshake(gateway, tunnel_headers(cluster, old, _params(apiserver)))
    sock.close()
    assert status == 401, body
    assert not _reported(gateway, cluster)


@pytest.mark.parametrize("module", ["mesosdriver", "", "kube-agent-x"])
def test_only_kube_agents_open_tunnels(gateway: Gateway, apiserver: FakeAPIServer, tokens: dict[str, str],
                                       module: str) -> None:
    status, body, sock = handshake(gateway, tunnel_headers(VICTIM, tokens[VICTIM], _params(apiserver),
                                                           module=module))
    sock.close()
    assert status == 400, body
    assert not _reported(gateway, VICTIM)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


@pytest.mark.parametrize("params", [
    pytest.param("", id="missing"),
    pytest.param("%%%not-base64%%%", id="not-base64"),
    pytest.param(_b64(b"[1, 2]"), id="not-an-object"),
    pytest.param(_b64(b"{" * 5000), id="deep-json"),
    pytest.param("A" * (70 * 1024), id="oversized"),
    pytest.param({"address": "http://10.0.0.1:6443"}, id="plain-http"),
    pytest.param({"address": "https://user:pw@10.0.0.1:6443"}, id="userinfo"),
    pytest.param({"address": "https://10.0.0.1:6443/?x=1"}, id="query"),
    pytest.param({"address": "https://10.0.0.1:99999"}, id="bad-port"),
    pytest.param({"address": ""}, id="no-address"),
    pytest.param({"userToken": ""}, id="no-user-token"),
    pytest.param({"caCert": _b64(b"not a certificate")}, id="ca-not-pem"),
    pytest.param({"caCert": ""}, id="no-ca"),
])
def test_bad_params_get_400_and_change_nothing(gateway: Gateway, apiserver: FakeAPIServer,
                                               tokens: dict[str, str], params: str | dict) -> None:
    if isinstance(params, dict):
        raw = {"address": apiserver.url, "userToken": SA_TOKEN, "caCert": _b64(apiserver.ca_pem.encode()), **params}
        params = tunnel_params(raw=raw)
    status, body, sock = handshake(gateway, tunnel_headers(VICTIM, tokens[VICTIM], params))
    sock.close()
    if len(params) > 8190:  # beyond gunicorn's header field limit: refused before the app
        assert status == 431, body
    else:
        assert status == 400, body
        assert b"BCS-API-Tunnel-Params" in body
    assert not _reported(gateway, VICTIM)


def test_the_right_token_without_an_upgrade_changes_nothing(gateway: Gateway, apiserver: FakeAPIServer,
                                                            tokens: dict[str, str]) -> None:
    status, body, sock = handshake(gateway, tunnel_headers(VICTIM, tokens[VICTIM], _params(apiserver)), upgrade=False)
    sock.close()
    assert status == 400, body
    status, body, sock = handshake(gateway, tunnel_headers(VICTIM, tokens[VICTIM], _params(apiserver)), method="POST")
    sock.close()
    assert status == 400, body
    assert not _reported(gateway, VICTIM)


def test_the_direct_path_to_the_fake_is_closed(gateway: Gateway, apiserver: FakeAPIServer,
                                               tokens: dict[str, str]) -> None:
    """The premise of every tunnel test: the gateway itself may not connect to the fake apiserver."""
    status, body = gateway.call("PUT", f"/rest/clusters/{OTHER}/credentials", token=tokens[OTHER],
                                body={"server_addresses": apiserver.url, "cacert_data": apiserver.ca_pem,
                                      "user_token": SA_TOKEN})
    assert status == 400 and b"does not connect" in body, body


# ----------------------------------------------------------------------------- a connected agent


@pytest.fixture(scope="module")
def victim_agent(gateway: Gateway, apiserver: FakeAPIServer, tokens: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    running = Agent(gateway, apiserver, VICTIM, tokens[VICTIM], tmp_path_factory.mktemp("agent")).start()
    try:
        running.wait_connected()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def mallory(gateway: Gateway, tokens: dict[str, str]) -> str:
    token = gateway.user("mallory-nat")
    gateway.grant("mallory-nat", cluster=VICTIM)
    return token


@pytest.mark.parametrize("header", ["Impersonate-User", "impersonate-group", "Impersonate-Extra-Scopes"])
def test_client_impersonation_is_still_refused_on_a_tunnelled_cluster(
    gateway: Gateway, apiserver: FakeAPIServer, victim_agent: Agent, mallory: str, header: str,
) -> None:
    apiserver.requests.clear()
    status, body = gateway.call("GET", f"/tunnels/clusters/{VICTIM}/api/v1/namespaces", token=mallory,
                                headers={header: "system:admin"})
    assert status == 403, body
    assert not apiserver.requests.matching("/api/v1/namespaces")
    status, body = gateway.call("GET", f"/tunnels/clusters/{VICTIM}/api/v1/namespaces", token=mallory)
    assert status == 200, body
    seen = apiserver.requests.last("/api/v1/namespaces")
    assert seen is not None and seen.headers.get("Impersonate-User") == "mallory-nat"
    assert seen.headers.get("Authorization") == f"Bearer {SA_TOKEN}"


def test_another_cluster_is_never_reached_through_this_agent(
    gateway: Gateway, apiserver: FakeAPIServer, victim_agent: Agent, tokens: dict[str, str],
) -> None:
    """OTHER reports credentials directly (an address the policy allows, where nothing listens):
    its requests fail on their own path and never ride VICTIM's tunnel to the apiserver it reaches."""
    status, body = gateway.call("PUT", f"/rest/clusters/{OTHER}/credentials", token=tokens[OTHER],
                                body={"server_addresses": "https://192.0.2.1:6443", "cacert_data": apiserver.ca_pem,
                                      "user_token": SA_TOKEN})
    assert status == 200, body
    apiserver.requests.clear()
    answers: list[tuple[int, bytes]] = []

    def reported() -> bool:  # the gateway's cluster cache picks the report up within a few seconds
        answers.append(gateway.call("GET", f"/tunnels/clusters/{OTHER}/api/v1/namespaces", timeout=15))
        return answers[-1][0] != 502 or b"credentials" not in answers[-1][1]

    wait_until(reported, 10, step=0.2)
    status, body = answers[-1]
    assert status in (502, 504), body
    assert not apiserver.requests.matching("/api/v1/namespaces")


def test_the_agent_cannot_open_connections_on_the_gateway_side(
    gateway: Gateway, apiserver: FakeAPIServer,
) -> None:
    """A hostile agent sends Connect itself, towards a listener beside the gateway: refused with an
    Error and cut (1008, as remotedialer's server ends a session on a Connect), nothing dialled."""
    from bcs_middleware.agent_tunnel.frames import Message, MessageType, decode, encode
    from bcs_middleware.agent_tunnel.wschannel import WebSocketChannel

    cluster = "BCS-K8S-HOSTILE"
    token = create_cluster(gateway, cluster)
    trap = TrapListener(answer=b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    raw = socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10)
    sock = ssl.create_default_context(cafile=gateway.ca_file).wrap_socket(raw, server_hostname="localhost")
    headers = tunnel_headers(cluster, token, _params(apiserver))
    channel = WebSocketChannel.connect(sock, host=f"localhost:{gateway.server.port}", path=CONNECT,
                                       headers=list(headers.items()), timeout=10)
    try:
        for target in (trap.port, gateway.server.port):
            channel.send(encode(Message.connect(7, "tcp", f"127.0.0.1:{target}")))
            channel.send(encode(Message.data(7, b"GET /version HTTP/1.1\r\nHost: localhost\r\n\r\n")))
        answers = []
        channel.set_idle_timeout(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            frame = channel.receive()
            if frame is None:
                break
            message = decode(frame)
            if message.conn_id == 7:
                answers.append(message)
        # The first Connect is answered with an Error, then the connection is cut; nothing ever
        # reaches the listener.
        assert [m.type for m in answers] == [MessageType.ERROR], answers
        assert channel.peer_close_code == 1008, channel.close_reason
        # The wait is the test: a window in which a dial would have reached the listener.
        assert not wait_until(lambda: trap.accepted > 0, 2)
    finally:
        channel.close()
        sock.close()
        trap.close()


def test_rotating_the_register_token_drops_the_tunnel(
    gateway: Gateway, apiserver: FakeAPIServer, tmp_path: Path,
) -> None:
    cluster = "BCS-K8S-ROTATE-LIVE"
    token = create_cluster(gateway, cluster)
    running = Agent(gateway, apiserver, cluster, token, tmp_path).start()
    try:
        running.wait_connected()
        gateway.json("DELETE", f"/rest/clusters/{cluster}/register_tokens")
        refusals = running.output().count("the gateway refused the tunnel")
        answers: list[tuple[int, bytes]] = []

        def dropped() -> bool:
            answers.append(gateway.call("GET", f"/tunnels/clusters/{cluster}/version", timeout=5))
            return answers[-1][0] == 503

        assert seconds_until(dropped, 10, f"the tunnel stayed: {answers[-1:]}", step=0.1) < 5
        # The agent keeps trying with its old token and is refused every time.
        assert wait_until(lambda: running.output().count("the gateway refused the tunnel") >= refusals + 2, 30), \
            running.output()
        assert gateway.call("GET", f"/tunnels/clusters/{cluster}/version")[0] == 503
        assert gateway.json("GET", f"/rest/clusters/{cluster}")["agent"]["tunnel_connected"] is False
    finally:
        running.stop()
