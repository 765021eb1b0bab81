"""What operators and kubectl users see when something is not ready yet, through a real serve."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import CLI, Gateway, served_gateway
from tests.support.kube import kubectl, kubectl_path

CLUSTER = "BCS-K8S-NOTREADY"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with served_gateway(tmp_path_factory.mktemp("gw"), workers=1) as gateway:
        gateway.json("POST", "/rest/clusters/bcs",
                     body={"id": CLUSTER, "project_id": "p1", "cluster_type": "k8s"})
        yield gateway


@pytest.mark.skipif(kubectl_path() is None, reason="kubectl is not installed")
def test_kubectl_shows_why_a_cluster_without_an_agent_is_unreachable(gw: Gateway, tmp_path: Path) -> None:
    status, body = gw.call("GET", f"/rest/clusters/{CLUSTER}/kubeconfig")
    assert status == 200 and body.startswith(b"# WARNING: cluster BCS-K8S-NOTREADY has no credentials yet")
    kubeconfig = tmp_path / "config"
    kubeconfig.write_bytes(body)
    result = kubectl("get", "pods", kubeconfig=kubeconfig)
    # For a 503 kubectl prints only "the server is currently unable to handle the request".
    assert result.returncode != 0
    assert "has no credentials yet: its kube-agent has not reported" in result.stderr, result.stderr


def test_the_kubeconfig_of_a_cluster_without_an_agent_carries_a_warning(gw: Gateway) -> None:
    import ssl
    import urllib.request

    request = urllib.request.Request(f"{gw.url}/rest/clusters/{CLUSTER}/kubeconfig",
                                     headers={"Authorization": f"Bearer {gw.admin}"})
    context = ssl.create_default_context(cafile=gw.ca_file)
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        assert "no credentials yet" in response.headers["Warning"]
    status, body = gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/pods")
    assert status == 502 and b"kube-agent has not reported" in body


def test_a_second_gateway_on_a_busy_port_fails_before_its_banner(gw: Gateway, tmp_path: Path) -> None:
    result = subprocess.run(
        [CLI, "serve", "--data-dir", str(tmp_path / "second"), "--bind", f"127.0.0.1:{gw.server.port}"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "cannot listen on" in result.stderr and "already in use" in result.stderr
    assert "bcs-middleware" not in result.stdout and "certificate authority" not in result.stdout
    assert not (tmp_path / "second" / "tls").exists()
