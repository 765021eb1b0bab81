"""Client-certificate authentication for machine callers, configured explicitly on `serve`."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bcs_middleware.store.sql import open_store
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.kube import write_kubeconfig
from tests.support.servers import BIN, ServerProcess, free_port

CLI = str(BIN / "bcs-middleware")
ADMIN = "client-cert-admin-token-" + "k" * 20


def _certs(*args: str) -> None:
    result = subprocess.run([CLI, "certs", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _get(url: str, cafile: str, *, cert: Path | None = None, token: str | None = None) -> int:
    ctx = ssl.create_default_context(cafile=cafile)
    if cert is not None:
        ctx.load_cert_chain(str(cert / "client.crt"), str(cert / "client.key"))
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture
def gateway(tmp_path: Path):  # type: ignore[no-untyped-def]
    pki = tmp_path / "pki"
    _certs("--gateway", "--host", "localhost,127.0.0.1", "--out", str(pki))
    _certs("--client", "kube-agent-cc1", "--ca-dir", str(pki), "--out", str(tmp_path / "agent"))
    _certs("--client", "deploy-bot", "--ca-dir", str(pki), "--out", str(tmp_path / "bot"))
    _certs("--client", "stranger", "--ca-dir", str(pki), "--out", str(tmp_path / "stranger"))
    other = tmp_path / "other-pki"
    _certs("--gateway", "--host", "localhost", "--out", str(other))
    _certs("--client", "kube-agent-cc1", "--ca-dir", str(other), "--out", str(tmp_path / "forged"))
    data = tmp_path / "data"
    port = free_port()
    argv = [CLI, "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}", "--workers", "1",
            "--certfile", str(pki / "server.crt"), "--keyfile", str(pki / "server.key"),
            "--ca-file", str(pki / "ca.crt"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--client-cert-map", "CN=kube-agent-cc1 -> cluster:cc1",
            "--client-cert-map", "CN=deploy-bot -> user:deploy-bot"]
    with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60) as server:
        yield server, tmp_path, str(pki / "ca.crt"), data


def test_mapped_certificates_authenticate_and_others_do_not(gateway) -> None:  # type: ignore[no-untyped-def]
    server, tmp, cafile, _ = gateway
    base = f"https://localhost:{server.port}"
    req = urllib.request.Request(f"{base}/rest/users/", data=json.dumps({"user_name": "deploy-bot"}).encode(),
                                 method="POST", headers={"Authorization": f"Bearer {ADMIN}"})
    urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=cafile)).close()
    # A user by certificate; tokens still work beside certificates.
    assert _get(f"{base}/rest/clusters/none", cafile, cert=tmp / "bot") == 404
    assert _get(f"{base}/rest/clusters/none", cafile, token=ADMIN) == 404
    # A certificate from the right CA whose subject is not mapped is nobody.
    assert _get(f"{base}/rest/clusters/none", cafile, cert=tmp / "stranger") == 401
    # A cluster agent's certificate is not a user.
    assert _get(f"{base}/rest/clusters/none", cafile, cert=tmp / "agent") == 403
    # A certificate from another CA never gets past TLS.
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):  # TLS 1.3 reports it at the first read
        _get(f"{base}/healthz", cafile, cert=tmp / "forged")


def test_kube_agent_reports_with_its_certificate(gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, tmp, cafile, data = gateway
    base = f"https://localhost:{server.port}"
    req = urllib.request.Request(f"{base}/rest/clusters/bcs", method="POST",
                                 headers={"Authorization": f"Bearer {ADMIN}"},
                                 data=json.dumps({"id": "cc1", "project_id": "p", "cluster_type": "k8s"}).encode())
    urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=cafile)).close()
    with FakeAPIServer(token="sa-cc1") as api:
        kubeconfig = tmp_path / "agent.kubeconfig"
        write_kubeconfig(kubeconfig, server=api.url, token="sa-cc1", ca_pem=api.ca_pem)
        env = {k: v for k, v in os.environ.items() if k != "REGISTER_TOKEN"}
        env["SERVER_CERT"] = Path(cafile).read_text()
        agent = subprocess.run(
            [CLI, "kube-agent", "--bke-address", base, "--cluster-id", "cc1", "--kubeconfig", str(kubeconfig),
             "--client-cert", str(tmp / "agent" / "client.crt"), "--client-key", str(tmp / "agent" / "client.key"),
             "--once"], env=env, capture_output=True, text=True, timeout=60)
        assert agent.returncode == 0, agent.stderr
        # Another cluster's credentials are refused to this certificate.
        req = urllib.request.Request(f"{base}/rest/clusters/bcs", method="POST",
                                     headers={"Authorization": f"Bearer {ADMIN}"},
                                     data=json.dumps({"id": "cc2", "project_id": "p", "cluster_type": "k8s"}).encode())
        urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=cafile)).close()
        other = subprocess.run(
            [CLI, "kube-agent", "--bke-address", base, "--cluster-id", "cc2", "--kubeconfig", str(kubeconfig),
             "--client-cert", str(tmp / "agent" / "client.crt"), "--client-key", str(tmp / "agent" / "client.key"),
             "--once"], env=env, capture_output=True, text=True, timeout=60)
        assert other.returncode == 1 and "HTTP 403" in other.stderr
    store = open_store(data_dir=data)
    creds = store.get_credentials("cc1")
    assert creds is not None and creds.user_token == "sa-cc1"
    assert store.get_credentials("cc2") is None
    store.db.dispose()
