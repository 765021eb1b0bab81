"""The gateway runs the RBAC sync itself when its configuration names a permission source."""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import gateway_ini
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port

ADMIN = "rbac-wiring-admin-token-" + "r" * 20


def _call(base: str, method: str, path: str, cafile: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(base + path, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=cafile)) as resp:
        return json.loads(resp.read())


def test_serve_with_a_permission_file_reconciles_and_reports(tmp_path: Path) -> None:
    grants = tmp_path / "grants.json"
    grants.write_text(json.dumps({"version": 1, "grants": [
        {"user": "alice", "cluster": "rbac-c1", "namespace": "default", "role": "view"}]}))
    data = tmp_path / "data"
    ini = tmp_path / "gateway.ini"
    gateway_ini(ini, data, rbac="true", rbac_source_file=str(grants), rbac_interval="2s")
    with FakeAPIServer(token="sa-rbac") as api:
        port = free_port()
        argv = [str(BIN / "bcs-middleware"), "serve", "--config", str(ini), "--data-dir", str(data),
                "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4"]
        with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60) as server:
            base, cafile = f"https://localhost:{port}", str(data / "tls" / "ca.crt")
            cluster = {"id": "rbac-c1", "project_id": "p", "cluster_type": "k8s"}
            _call(base, "POST", "/rest/clusters/bcs", cafile, cluster)
            _call(base, "PUT", "/rest/clusters/rbac-c1/credentials", cafile,
                  {"server_addresses": api.url, "cacert_data": api.ca_pem, "user_token": "sa-rbac"})
            assert wait_until(lambda: any(b["metadata"]["name"] == "bcs:alice:view" for b in api.bindings), 30), \
                "the gateway never created the binding"
            binding = next(b for b in api.bindings if b["metadata"]["name"] == "bcs:alice:view")
            assert binding["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "bcs-middleware"
            assert binding["subjects"][0]["name"] == "alice"

            # Revoking the grant removes the binding at the next pass.
            grants.write_text(json.dumps({"version": 1, "grants": []}))
            assert wait_until(lambda: not any(b["metadata"]["name"] == "bcs:alice:view" for b in api.bindings), 30), \
                "the revoked grant's binding stayed"

            status = _call(base, "GET", "/rest/rbac/status", cafile)
            assert status["enabled"] is True and status["leader"]
            assert [c for c in status["clusters"] if "rbac-c1" in json.dumps(c)]
    output = server.output()
    assert "sa-rbac" not in output and ADMIN not in output
