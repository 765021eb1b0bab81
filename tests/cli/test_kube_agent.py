"""The kube-agent's discovery inside a cluster and its reporting rules."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from bcs_middleware.cli import kube_agent
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


@pytest.fixture
def stop_signals_given_back() -> Iterator[None]:
    """``kube_agent.run`` takes SIGINT and SIGTERM over, as the command it is does; in this process
    they must stop pytest again afterwards."""
    saved = {signum: signal.getsignal(signum) for signum in kube_agent.STOP_SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("stop_signals_given_back")
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


def _client_cert_kubeconfig(path: Path, api: FakeAPIServer, client: trustme.LeafCert) -> Path:
    """A kind/minikube-style kubeconfig: client-certificate-data and client-key-data, no token."""
    import base64

    import yaml

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kind",
        "clusters": [{"name": "kind", "cluster": {"server": api.url,
                                                  "certificate-authority-data": b64(api.ca_pem.encode())}}],
        "users": [{"name": "kind-admin", "user": {"client-certificate-data": b64(client.cert_chain_pems[0].bytes()),
                                                  "client-key-data": b64(client.private_key_pem.bytes())}}],
        "contexts": [{"name": "kind", "context": {"cluster": "kind", "user": "kind-admin"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def cert_cluster(tmp_path: Path) -> Iterator[tuple[FakeAPIServer, Path]]:
    client_ca = trustme.CA()
    with FakeAPIServer(token="sa-from-token-request", client_ca=client_ca) as api:
        kubeconfig = _client_cert_kubeconfig(tmp_path / "kind.kubeconfig", api,
                                             client_ca.issue_cert("kubernetes-admin"))
        kube_agent._TOKENS.clear()
        yield api, kubeconfig


def test_a_client_certificate_kubeconfig_gets_a_service_account_token(
    cert_cluster: tuple[FakeAPIServer, Path],
) -> None:
    api, kubeconfig = cert_cluster
    api.create("serviceaccounts", {"metadata": {"name": "bcs-kube-agent", "namespace": "kube-system"}},
               "kube-system")
    args = _args(kubeconfig=str(kubeconfig), external_proxy_addresses=api.url)
    access = kube_agent.gather(args)
    assert access.token == "sa-from-token-request" and access.ca_pem == api.ca_pem
    assert kube_agent.gather(args).token == access.token
    path = "/api/v1/namespaces/kube-system/serviceaccounts/bcs-kube-agent/token"
    requested = [r for r in api.requests.snapshot() if r.path == path]
    assert len(requested) == 1 and requested[0].method == "POST"  # renewed at half-life, not per report
    assert requested[0].headers.get("Authorization") is None  # the certificate authenticated


def test_a_missing_service_account_is_explained(cert_cluster: tuple[FakeAPIServer, Path]) -> None:
    _, kubeconfig = cert_cluster
    with pytest.raises(kube_agent.AgentError, match="kubectl -n kube-system create serviceaccount bcs-kube-agent"):
        kube_agent.gather(_args(kubeconfig=str(kubeconfig)))


def test_a_client_certificate_cluster_registers_and_serves_through_a_real_gateway(
    cert_cluster: tuple[FakeAPIServer, Path], tmp_path: Path,
) -> None:
    import subprocess

    from tests.support.gateway import CLI, served_gateway

    api, kubeconfig = cert_cluster
    api.create("namespaces", {"metadata": {"name": "ops"}})
    api.create("serviceaccounts", {"metadata": {"name": "agent", "namespace": "ops"}}, "ops")
    with served_gateway(tmp_path / "gw", workers=1) as gw:
        gw.json("POST", "/rest/clusters/bcs", body={"id": "BCS-K8S-KIND", "project_id": "p1", "cluster_type": "k8s"})
        register_token = str(gw.json("POST", "/rest/clusters/BCS-K8S-KIND/register_tokens")["token"])
        agent = subprocess.run(
            [CLI, "kube-agent", "--bke-address", gw.url, "--cluster-id", "BCS-K8S-KIND", "--kubeconfig",
             str(kubeconfig), "--service-account", "ops/agent", "--once"],
            env={**os.environ, "REGISTER_TOKEN": register_token, "SERVER_CERT": Path(gw.ca_file).read_text()},
            capture_output=True, text=True, timeout=60,
        )
        assert agent.returncode == 0, agent.stderr
        assert "sa-from-token-request" not in agent.stderr + agent.stdout
        status, body = gw.call("GET", "/tunnels/clusters/BCS-K8S-KIND/api/v1/namespaces/ops/serviceaccounts")
        assert status == 200 and b'"agent"' in body
