"""A cluster's ``edit`` holder must not make the gateway POST where the address policy forbids.

``edit`` on a cluster lets a non-superuser register admission webhook configurations for it
(url or service). Webhooks are called by the gateway itself, so without the upstream address
policy any edit holder could make it POST AdmissionReviews to the metadata service, the
gateway's own port, or an address the operator denied. The attacker (``mallory``, edit on the
cluster, no superuser) tries both ways:

* a ``clientConfig.url`` at a literal refused IP address — refused when defined (like a
  reported apiserver address);
* a host *name* that resolves to a denied address — accepted when defined (names are judged
  when connecting), then refused at connect when a write through the tunnel calls it.

A trap listener on the denied address counts the connections it accepts: none. One real
``bcs-middleware serve`` with ``--upstream-deny 127.0.0.1/32`` (the fake apiserver runs on
127.0.0.3; ``localhost`` resolves to 127.0.0.1).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import trustme

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import (
    CLUSTER,
    SA_TOKEN,
    Gateway,
    register_cluster,
    served_gateway,
    short_admission_refresh,
    wait_out_admission_refresh,
)
from tests.support.servers import TrapListener

CONFIGS = f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations"
PODS = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods"


@pytest.fixture(scope="module")
def trap() -> Iterator[TrapListener]:
    made = TrapListener("127.0.0.1")
    yield made
    made.close()


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN, host="127.0.0.3", cert_hosts=("127.0.0.3", "kubernetes")) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("webhook-policy")
    with served_gateway(data, workers=1, args=short_admission_refresh(data, upstream_deny="127.0.0.1/32")) as gw:
        register_cluster(gw, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gw


@pytest.fixture(scope="module")
def mallory(gateway: Gateway) -> str:
    token = gateway.user("mallory-wh")
    gateway.grant("mallory-wh", "edit")
    return token


def _configuration(name: str, url: str) -> dict[str, Any]:
    bundle = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.example.com",
            "clientConfig": {"url": url, "caBundle": bundle},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 3,
        }],
    }


def _literals(gateway: Gateway, trap: TrapListener) -> list[str]:
    return [
        f"https://127.0.0.1:{trap.port}/",  # denied by the operator
        f"https://[::ffff:127.0.0.1]:{trap.port}/",  # the same, IPv6-mapped
        "https://169.254.169.254/latest/meta-data",  # the metadata service (always refused)
        f"https://127.0.0.1:{gateway.server.port}/",  # the gateway's own port
    ]


def test_an_edit_holder_cannot_define_a_webhook_at_a_refused_address(
    gateway: Gateway, mallory: str, trap: TrapListener
) -> None:
    for number, url in enumerate(_literals(gateway, trap)):
        status, body = gateway.call("POST", CONFIGS, token=mallory, body=_configuration(f"literal-{number}", url))
        assert status == 400, (url, status, body)
        assert "does not connect to" in json.loads(body)["message"], body
    status, body = gateway.call("GET", CONFIGS, token=mallory)
    assert status == 200 and json.loads(body)["items"] == [], body
    assert trap.accepted == 0


def test_a_webhook_host_name_at_a_denied_address_is_refused_at_connect(
    gateway: Gateway, mallory: str, trap: TrapListener, apiserver: FakeAPIServer
) -> None:
    status, body = gateway.call("POST", CONFIGS, token=mallory,
                                body=_configuration("by-name", f"https://localhost:{trap.port}/review"))
    assert status == 201, body  # a name: judged when the gateway connects
    wait_out_admission_refresh()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": "default"},
           "spec": {"containers": [{"name": "app", "image": "nginx"}]}}
    for _ in range(3):
        status, body = gateway.call("POST", PODS, token=mallory, body=pod,
                                    headers={"Content-Type": "application/json"})
        assert status >= 500, (status, body)  # failurePolicy Fail: the call failed
        assert "by-name.example.com" in json.loads(body)["message"], body
    assert trap.accepted == 0
    assert not [r for r in apiserver.requests if r.method == "POST" and r.path.endswith("/pods")]
