"""The same request answers the same error through the agent tunnel as on the direct path.

Two fake apiservers alike: one on 127.0.0.1, which the gateway may not reach and serves only
through the real ``kube-agent --tunnel`` (``conftest.py``), and one on 127.0.0.2, registered
with its address and reached directly. Both decide impersonated requests by their own RBAC.
The gateway's upstream read timeout is 2 s here, so that a slow apiserver can be tested.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer, rbac_authorizer
from tests.support.gateway import gateway_ini, register_cluster, served_gateway
from tests.support.kube import kubectl
from tests.support.polling import wait_until

from .conftest import CLUSTER, DENY_LOOPBACK, SA_TOKEN, Agent, Gateway

DIRECT = "BCS-K8S-PARITY-DIRECT"
READ_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The suite's gateway (one worker, the fake's address denied), with a short read timeout."""
    folder = tmp_path_factory.mktemp("parity")
    data = folder / "data"
    # In the ini: with --config, the ini configures the application (serve refuses --upstream-deny
    # beside an ini that does not take it from [DEFAULT]; it used to ignore it silently).
    ini = gateway_ini(folder / "gateway.ini", data, read_timeout=f"{READ_TIMEOUT:g}s",
                      upstream_deny=DENY_LOOPBACK[1])
    with served_gateway(data, args=["--config", str(ini)], workers=1) as gw:
        yield gw
    assert SA_TOKEN not in gw.server.output()


@pytest.fixture(scope="module")
def direct_apiserver(gateway: Gateway) -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN, host="127.0.0.2", cert_hosts=("localhost", "127.0.0.2", "kubernetes")) as api:
        register_cluster(gateway, DIRECT, server_url=api.url, ca_pem=api.ca_pem)
        yield api


@pytest.fixture(scope="module")
def both(apiserver: FakeAPIServer, direct_apiserver: FakeAPIServer, agent: Agent) -> Iterator[None]:
    for api in (apiserver, direct_apiserver):
        api.authorize(rbac_authorizer(api))
    yield
    for api in (apiserver, direct_apiserver):
        api.authorize(None)


@pytest.fixture(scope="module")
def bob(gateway: Gateway, both: None) -> str:
    """May use both clusters at the gateway; neither cluster's RBAC grants him anything."""
    token = gateway.user("bob-parity")
    for cluster in (CLUSTER, DIRECT):
        gateway.grant("bob-parity", cluster=cluster)
    return token


def answers(gateway: Gateway, method: str, path: str, token: str | None = None) -> list[tuple[int, dict]]:
    """``(status, JSON body)`` of the tunnel path, then of the direct path; cluster ids and the
    apiservers' addresses (each path names its own) made alike."""
    out = []
    for cluster, host in ((CLUSTER, "127.0.0.1"), (DIRECT, "127.0.0.2")):
        status, body = gateway.call(method, f"/tunnels/clusters/{cluster}{path}", token=token, timeout=30)
        out.append((status, json.loads(body.decode().replace(cluster, "{cluster}").replace(host, "{host}"))))
    return out


def test_not_found(gateway: Gateway, both: None) -> None:
    tunnel, direct = answers(gateway, "GET", "/api/v1/namespaces/default/configmaps/nope")
    assert tunnel == direct
    assert tunnel[0] == 404 and tunnel[1]["reason"] == "NotFound"
    assert tunnel[1]["message"] == 'configmaps "nope" not found'


def test_forbidden_by_the_clusters_rbac(gateway: Gateway, bob: str, tmp_path: Path) -> None:
    tunnel, direct = answers(gateway, "GET", "/api/v1/namespaces/default/configmaps", token=bob)
    assert tunnel == direct
    assert tunnel[0] == 403 and tunnel[1]["kind"] == "Status" and tunnel[1]["reason"] == "Forbidden"
    assert 'User "bob-parity" cannot list resource "configmaps"' in tunnel[1]["message"]
    # kubectl shows the same sentence either way.
    shown = []
    for cluster in (CLUSTER, DIRECT):
        result = kubectl("get", "configmaps", kubeconfig=gateway.kubeconfig(bob, tmp_path / cluster, cluster=cluster))
        assert result.returncode != 0
        shown.append(result.stderr)
    assert shown[0] == shown[1] and "Forbidden" in shown[0], shown


def test_an_apiserver_slower_than_the_read_timeout(gateway: Gateway, both: None) -> None:
    started = time.monotonic()
    tunnel, direct = answers(gateway, "GET", f"/__slow?seconds={READ_TIMEOUT * 3:g}")
    took = time.monotonic() - started
    assert tunnel == direct
    assert tunnel[0] == 504 and tunnel[1]["kind"] == "Status" and tunnel[1]["code"] == 504
    assert took < 2 * (READ_TIMEOUT + 1.5), took  # each waited about the read timeout, not the apiserver


def test_agent_gone_is_a_503_status_naming_the_agent(gateway: Gateway, agent: Agent, both: None,
                                                     direct_apiserver: FakeAPIServer) -> None:
    """Runs last: it kills the module's agent."""
    agent.kill()
    answers: list[tuple[int, bytes]] = []

    def gone_away() -> bool:
        answers.append(gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces", timeout=10))
        return answers[-1][0] == 503

    wait_until(gone_away, 5, step=0.05)
    status, body = answers[-1]
    gone = json.loads(body)
    assert status == 503, gone
    assert gone["kind"] == "Status" and gone["apiVersion"] == "v1" and gone["code"] == 503
    assert gone["status"] == "Failure"
    assert "kube-agent" in gone["message"] and CLUSTER in gone["message"]
    # The direct path's "cannot reach the apiserver" has the same shape (its own code and words).
    direct_apiserver.stop()
    status, body = gateway.call("GET", f"/tunnels/clusters/{DIRECT}/api/v1/namespaces", timeout=30)
    unreachable = json.loads(body)
    assert status in (502, 503), unreachable
    assert set(unreachable) == set(gone), (unreachable, gone)
    assert unreachable["kind"] == "Status" and unreachable["status"] == "Failure"
