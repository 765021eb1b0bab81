"""One gateway (real ``bcs-middleware serve``: gunicorn, HTTPS) in front of a fake apiserver.

The cluster is registered end to end the way an operator does it: REST calls
create the cluster and its register token, and the real ``kube-agent`` reports
the fake apiserver's credentials (from a kubeconfig) to the gateway.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.kube import write_kubeconfig
from tests.support.servers import BIN, ServerProcess, free_port

CLI = str(BIN / "bcs-middleware")
ADMIN = "tunnel-admin-token-" + "a" * 24
SA_TOKEN = "cluster-service-account-token-0123456789"
CLUSTER = "BCS-K8S-T01"


@dataclass
class Gateway:
    server: ServerProcess
    data: Path
    ca_file: str

    @property
    def url(self) -> str:
        return f"https://localhost:{self.server.port}"

    def call(self, method: str, path: str, *, token: str = ADMIN, body: dict | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        ctx = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def json(self, method: str, path: str, **kw) -> dict:  # type: ignore[no-untyped-def]
        status, body = self.call(method, path, **kw)
        assert status < 300, (status, body)
        return json.loads(body)

    def user(self, name: str) -> str:
        user = self.json("POST", "/rest/users/", body={"user_name": name})
        return str(self.json("POST", f"/rest/users/{user['id']}/tokens")["user_token"])

    def kubeconfig(self, token: str, path: Path, cluster: str = CLUSTER) -> Path:
        status, body = self.call("GET", f"/rest/clusters/{cluster}/kubeconfig", token=token)
        assert status == 200, body
        path.write_bytes(body)
        return path


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("gateway")
    port = free_port()
    argv = [CLI, "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}", "--workers", "2",
            "--threads", "16", "--graceful-timeout", "3"]
    env = {"BCS_ADMIN_TOKEN": ADMIN}
    with ServerProcess(argv, port=port, env=env, scheme="https", timeout=60) as server:
        gw = Gateway(server, data, str(data / "tls" / "ca.crt"))
        gw.json("POST", "/rest/clusters/bcs", body={"id": CLUSTER, "project_id": "p1", "cluster_type": "k8s"})
        register_token = gw.json("POST", f"/rest/clusters/{CLUSTER}/register_tokens")["token"]
        # The kube-agent, outside the cluster, reads the fake apiserver from a kubeconfig.
        agent_kubeconfig = data / "agent.kubeconfig"
        write_kubeconfig(agent_kubeconfig, server=apiserver.url, token=SA_TOKEN, ca_pem=apiserver.ca_pem)
        agent = subprocess.run(
            [CLI, "kube-agent", "--bke-address", gw.url, "--cluster-id", CLUSTER, "--kubeconfig",
             str(agent_kubeconfig), "--once"],
            env={**os.environ, "REGISTER_TOKEN": register_token, "SERVER_CERT": (data / "tls" / "ca.crt").read_text()},
            capture_output=True, text=True, timeout=60,
        )
        assert agent.returncode == 0, agent.stderr
        assert register_token not in agent.stderr + agent.stdout and SA_TOKEN not in agent.stderr
        yield gw
    # Read after the server stopped: each worker writes its queued access lines at exit.
    output = server.output()
    assert SA_TOKEN not in output and register_token not in output
