"""The kube-agent's discovery inside a cluster and its reporting rules."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from bcs_middleware import kube_agent
from tests.support.fake_apiserver import FakeAPIServer


@pytest.fixture
def in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    with FakeAPIServer(token="sa-in-cluster") as api:
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text("sa-in-cluster\n")
        (sa / "ca.crt").write_text(api.ca_pem)
        monkeypatch.setattr(kube_agent, "SA_DIR", sa)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        yield api


def _args(**overrides: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kube_agent.configure_parser(parser)
    args = parser.parse_args(["--bke-address", "https://gw.example:8443", "--cluster-id", "c1"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_in_cluster_reads_the_mount_and_the_kubernetes_endpoints(in_cluster: FakeAPIServer) -> None:
    access = kube_agent.gather(_args())
    assert access.token == "sa-in-cluster"
    assert access.ca_pem == in_cluster.ca_pem
    assert access.addresses == (f"https://127.0.0.1:{in_cluster.port}",)
    seen = in_cluster.requests.last("/api/v1/namespaces/default/endpoints/kubernetes")
    assert seen is not None and seen.headers["authorization"] == "Bearer sa-in-cluster"


def test_external_proxy_addresses_win(in_cluster: FakeAPIServer) -> None:
    access = kube_agent.gather(_args(external_proxy_addresses="https://lb-1:6443;https://lb-2:6443"))
    assert access.addresses == ("https://lb-1:6443", "https://lb-2:6443")


def test_outside_a_cluster_without_kubeconfig_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(kube_agent.AgentError, match="--kubeconfig"):
        kube_agent.gather(_args())


def test_refuses_plain_http_gateway_and_missing_register_token(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("REGISTER_TOKEN", raising=False)
    assert kube_agent.run(_args(once=True)) == 2
    monkeypatch.setenv("REGISTER_TOKEN", "rt-secret-value")
    caplog.set_level(logging.INFO)
    assert kube_agent.run(_args(bke_address="http://gw.example:8080", once=True)) == 2
    assert "must be https://" in caplog.text
    assert "rt-secret-value" not in caplog.text


def test_unreachable_gateway_fails_once_without_leaking(
    in_cluster: FakeAPIServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.servers import free_port

    monkeypatch.setenv("REGISTER_TOKEN", "rt-secret-value")
    monkeypatch.setenv("SERVER_CERT", in_cluster.ca_pem)
    caplog.set_level(logging.INFO)
    code = kube_agent.run(_args(bke_address=f"https://127.0.0.1:{free_port()}", once=True))
    assert code == 1
    assert "cannot reach the gateway" in caplog.text
    assert "rt-secret-value" not in caplog.text and "sa-in-cluster" not in caplog.text
