"""Two gateway instances (two real gunicorn servers) sharing one PostgreSQL."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support.servers import BIN, ServerProcess, free_port

CLI = str(BIN / "bcs-middleware")
ADMIN = "shared-admin-token-" + "s" * 24


class Instance:
    def __init__(self, server: ServerProcess, cafile: str) -> None:
        self.server = server
        self.cafile = cafile

    def call(self, method: str, path: str, token: str = ADMIN, body: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(f"https://localhost:{self.server.port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=self.cafile)) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")


@pytest.fixture
def instances(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Instance, Instance]]:
    key = subprocess.run([CLI, "keygen"], capture_output=True, text=True, check=True).stdout.strip()
    env = {"BCS_ADMIN_TOKEN": ADMIN, "BCS_SECRET_KEY": key}
    # One certificate for the service name both instances answer to, as behind a load balancer.
    pki = tmp_path / "pki"
    made = subprocess.run([CLI, "certs", "--gateway", "--host", "localhost,127.0.0.1", "--out", str(pki)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    servers = []
    for name in ("a", "b"):
        port = free_port()
        argv = [CLI, "serve", "--data-dir", str(tmp_path / name), "--database-url", postgres_url,
                "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "8",
                "--certfile", str(pki / "server.crt"), "--keyfile", str(pki / "server.key"),
                "--ca-file", str(pki / "ca.crt")]
        servers.append(ServerProcess(argv, port=port, env=env, scheme="https", timeout=60))
    try:
        yield Instance(servers[0], str(pki / "ca.crt")), Instance(servers[1], str(pki / "ca.crt"))
    finally:
        for server in servers:
            server.stop()
    # Read after the servers stopped: each worker writes its queued access lines at exit.
    outputs = servers[0].output() + servers[1].output()
    assert ADMIN not in outputs and "Traceback" not in outputs


def _eventually(check, bound: float) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < bound, "not visible within the bound"
        time.sleep(0.1)
    return time.monotonic() - started


def test_records_made_on_one_instance_work_on_the_other(instances: tuple[Instance, Instance]) -> None:
    a, b = instances
    status, user = a.call("POST", "/rest/users/", body={"user_name": "shared-user"})
    assert status == 201
    status, issued = a.call("POST", f"/rest/users/{user['id']}/tokens")
    token = issued["user_token"]
    # At once on the other instance: nothing it caches has seen this token yet.
    assert b.call("GET", "/rest/clusters/none", token=token)[0] == 404
    assert b.call("POST", "/rest/clusters/bcs", token=token,
                  body={"id": "shared-c", "project_id": "p", "cluster_type": "k8s"})[0] == 201
    status, register = a.call("POST", "/rest/clusters/shared-c/register_tokens", token=token)
    assert status == 201
    ca = trustme.CA().cert_pem.bytes().decode()
    status, _ = b.call("PUT", "/rest/clusters/shared-c/credentials", token=register["token"],
                       body={"server_addresses": "https://10.1.1.1:6443", "cacert_data": ca, "user_token": "sa"})
    assert status == 200
    assert a.call("GET", "/rest/clusters/shared-c/register_tokens", token=token)[1]["token"] == register["token"]
    # Revocation on one reaches both within the token cache bound (5 s by default).
    token_id = a.call("GET", f"/rest/users/{user['id']}/tokens")[1][0]["id"]
    assert b.call("DELETE", f"/rest/users/{user['id']}/tokens/{token_id}")[0] == 200
    for instance in (a, b):
        _eventually(lambda i=instance: i.call("GET", "/rest/clusters/shared-c", token=token)[0] == 401, 8.0)


def test_webhook_definitions_reach_both_instances(instances: tuple[Instance, Instance]) -> None:
    a, b = instances
    bundle = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    definition = {
        "apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": "shared-hook"},
        "resourcesRef": {"operation": "Create", "kind": "Application"},
        "admissionWebhooks": [{"name": "h", "failurePolicy": "Ignore",
                               "clientConfig": {"caBundle": bundle, "namespace": "ns", "name": "svc"}}],
    }
    status, _ = a.call("POST", "/rest/admissionwebhooks", body=definition)
    assert status == 201
    _eventually(lambda: any(d["metadata"]["name"] == "shared-hook"
                            for d in b.call("GET", "/rest/admissionwebhooks")[1]["items"]), 5.0)
    assert b.call("DELETE", "/rest/admissionwebhooks/shared-hook")[0] == 200
    _eventually(lambda: not a.call("GET", "/rest/admissionwebhooks")[1]["items"], 5.0)
