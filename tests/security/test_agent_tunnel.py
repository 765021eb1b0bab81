"""Attacks on the agent tunnel endpoint (``/bcsapi/v1/websocket/connect``), through a real gateway.

Only a cluster's *current* register token opens a tunnel for it; anything refused
changes nothing (no credentials stored, nothing dialled); a connected agent cannot
be used to reach another cluster or the gateway itself; rotating the token drops
the tunnel; the client's ``Impersonate-*`` is still refused on a tunnelled cluster.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, served_gateway
from tests.tunnel_agent.conftest import (
    DENY_LOOPBACK,
    Agent,
    create_cluster,
    handshake,
    tunnel_headers,
    tunnel_params,
)

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
