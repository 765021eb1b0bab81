"""A cluster id deleted and registered again by another user inherits nothing of the old cluster.

Alice runs a cluster through a real ``kube-agent --tunnel`` (its placement and credentials in the
store), gives Bob ``view``, defines a Kubernetes admission configuration for it, and defines a bcs
admission definition for a Mesos cluster she manages. Both clusters are deleted; Mallory then
registers the Kubernetes id, and a superuser registers the Mesos id again for her. Mallory must
find no credentials, no register token, no agent (the old one cannot come back), no permission of
anyone else, no admission configuration or definition — and her requests must not reach Alice's
apiserver.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.agent_tunnel.conftest import Agent, create_cluster
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import ADMIN, SA_TOKEN, Gateway, served_gateway
from tests.support.polling import wait_until

K8S, MESOS = "reused-k8s", "BCS-MESOS-REUSED"
BUNDLE = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
DEFINITIONS = "/bcsapi/v4/scheduler/mesos/admissionwebhooks"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with served_gateway(tmp_path_factory.mktemp("reuse"), workers=2) as gw:
        yield gw


def _configuration() -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "alices-injector"},
            "webhooks": [{"name": "inject.alice.example.com",
                          "clientConfig": {"url": "https://inject.alice.example.com/", "caBundle": BUNDLE},
                          "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                     "resources": ["pods"]}],
                          "failurePolicy": "Ignore", "sideEffects": "None", "admissionReviewVersions": ["v1"]}]}


def _bcs_definition() -> dict[str, Any]:
    return {"apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": "alices-hook", "namespace": "prod"},
            "resourcesRef": {"operation": "Create", "kind": "Application"},
            "admissionWebhooks": [{"name": "alices-hook", "failurePolicy": "Ignore",
                                   "clientConfig": {"caBundle": BUNDLE, "namespace": "hooks", "name": "alice"}}]}


def _agent_connected(gw: Gateway, token: str) -> bool:
    status, body = gw.call("GET", f"/rest/clusters/{K8S}", token=token)
    return status == 200 and bool(json.loads(body)["agent"]["tunnel_connected"])


def test_a_reused_id_inherits_nothing(gateway: Gateway, apiserver: FakeAPIServer, tmp_path: Path) -> None:
    gw = gateway
    alice, bob, mallory = gw.user("alice"), gw.user("bob"), gw.user("mallory")
    register_token = create_cluster(gw, K8S, token=alice)
    agent = Agent(gw, apiserver, K8S, register_token, tmp_path).start()
    try:
        agent.wait_connected()
        gw.grant("bob", "view", cluster=K8S)
        assert gw.call("POST", f"/rest/clusters/{K8S}/admissionwebhookconfigurations", token=alice,
                       body=_configuration())[0] == 201
        gw.json("POST", "/rest/clusters/bcs", body={"id": MESOS, "project_id": "p", "cluster_type": "mesos"})
        gw.grant("alice", "edit", cluster=MESOS)
        status, raw = gw.call("POST", "/bcsapi/v4/scheduler/mesos/namespaces/prod/admissionwebhook", token=alice,
                              body=_bcs_definition(), headers={"BCS-ClusterID": MESOS})
        assert status == 201, raw
        assert gw.call("GET", f"/tunnels/clusters/{K8S}/version", token=bob)[0] == 200

        deleted = gw.json("DELETE", f"/rest/clusters/{K8S}", token=alice)["deleted"]
        assert deleted["register_token"] and deleted["credentials"]
        assert deleted["admission_configurations"] == ["MutatingWebhookConfiguration/alices-injector"]
        assert gw.json("DELETE", f"/rest/clusters/{MESOS}")["deleted"]["admission_configurations"] == [
            "admissionwebhook/alices-hook"]

        # Mallory takes the Kubernetes id; a superuser registers the Mesos id again, for her.
        assert gw.call("POST", "/rest/clusters/bcs", token=mallory,
                       body={"id": K8S, "project_id": "p", "cluster_type": "k8s"})[0] == 201
        gw.json("POST", "/rest/clusters/bcs", body={"id": MESOS, "project_id": "p", "cluster_type": "mesos"})
        gw.grant("mallory", "edit", cluster=MESOS)
        before = len(apiserver.requests)

        # Alice's agent is dropped (its register token is gone) and cannot come back: for a few
        # of its reconnection attempts, the new cluster shows no agent.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert not _agent_connected(gw, mallory)
            time.sleep(0.5)
        assert gw.json("GET", f"/rest/clusters/{K8S}/credentials", token=mallory)["reported"] is False
        assert gw.call("GET", f"/rest/clusters/{K8S}/register_tokens", token=mallory)[0] == 404
        permissions = gw.json("GET", f"/rest/clusters/{K8S}/permissions", token=mallory)
        assert [(p["user_name"], p["permission"]) for p in permissions] == [("mallory", "edit")]
        assert gw.json("GET", f"/rest/clusters/{K8S}/admissionwebhookconfigurations", token=mallory)["items"] == []
        # The tunnel cache (5 s) may still know the old record: wait for the new one's answer.
        assert wait_until(lambda: gw.call("GET", f"/tunnels/clusters/{K8S}/version", token=mallory)[0] == 502, 15)
        for token in (alice, bob):
            assert gw.call("GET", f"/rest/clusters/{K8S}", token=token)[0] == 404
            assert wait_until(lambda t=token: gw.call("GET", f"/tunnels/clusters/{K8S}/version", token=t)[0] == 404,
                              15)
        # Nothing of anyone's reached the old cluster's apiserver through the gateway since.
        reached = [r for r in apiserver.requests.snapshot()[before:] if r.headers.get("Impersonate-User")]
        assert not reached, [(r.method, r.path, r.headers.get("Impersonate-User")) for r in reached]

        status, raw = gw.call("GET", DEFINITIONS, token=mallory, headers={"BCS-ClusterID": MESOS})
        assert status == 200 and json.loads(raw)["items"] == [], raw
    finally:
        agent.stop()
    assert ADMIN not in gw.server.output()
