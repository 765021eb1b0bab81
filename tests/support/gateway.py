"""A real ``bcs-middleware serve`` (gunicorn, HTTPS) for tests, and the calls a client makes to it.

``served_gateway()`` starts one on loopback in a data directory; ``register_cluster()`` registers a
cluster end to end the way an operator does it: REST calls create the cluster and its register
token, and the real ``kube-agent`` reports a (fake) apiserver's credentials from a kubeconfig.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.kube import write_kubeconfig
from tests.support.servers import BIN, ServerProcess, free_port, worker_class_under_test

CLI = str(BIN / "bcs-middleware")
ADMIN = "tunnel-admin-token-" + "a" * 24
SA_TOKEN = "cluster-service-account-token-0123456789"
#: The cluster the tunnel suites register.
CLUSTER = "BCS-K8S-T01"


@dataclass
class Gateway:
    server: ServerProcess
    data: Path
    ca_file: str
    admin: str = ADMIN

    @property
    def url(self) -> str:
        return f"https://localhost:{self.server.port}"

    def call(self, method: str, path: str, *, token: str | None = None, body: dict | bytes | None = None,
             headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, bytes]:
        """One request; ``token=None`` means the admin's, ``token=""`` none at all."""
        token = self.admin if token is None else token
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        ctx = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def json(self, method: str, path: str, **kw) -> dict:  # type: ignore[no-untyped-def]
        status, body = self.call(method, path, **kw)
        assert status < 300, (status, body)
        return json.loads(body)

    def user(self, name: str) -> str:
        """Create a user; return a fresh token of theirs."""
        user = self.json("POST", "/rest/users/", body={"user_name": name})
        return str(self.json("POST", f"/rest/users/{user['id']}/tokens")["user_token"])

    def grant(self, user_name: str, permission: str = "view", cluster: str = CLUSTER) -> None:
        """Give ``user_name`` ``permission`` (``view``: use, ``edit``: manage) on ``cluster``, as the admin."""
        self.json("PUT", f"/rest/clusters/{cluster}/permissions/{user_name}", body={"permission": permission})

    def kubeconfig(self, token: str, path: Path, cluster: str = CLUSTER) -> Path:
        status, body = self.call("GET", f"/rest/clusters/{cluster}/kubeconfig", token=token)
        assert status == 200, body
        path.write_bytes(body)
        return path


@contextmanager
def served_gateway(data: Path, *, args: Sequence[str] = (), env: dict[str, str] | None = None,
                   workers: int = 2, threads: int = 16) -> Iterator[Gateway]:
    """``bcs-middleware serve`` in ``data`` on a free loopback port, admin token :data:`ADMIN`."""
    port = free_port()
    argv = [CLI, "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
            "--threads", str(threads), "--graceful-timeout", "3", *args]
    if not any(arg.startswith("--worker-class") for arg in args):
        argv += ["--worker-class", worker_class_under_test()]
    with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN, **(env or {})}, scheme="https",
                       timeout=60) as server:
        yield Gateway(server, data, str(data / "tls" / "ca.crt"))


def copy_ca(source: Path, target: Path) -> None:
    """Give the data directory ``target`` the CA of ``source``'s, as an operator does for a second
    instance on the same database (it then makes its own server certificate from that CA)."""
    (target / "tls").mkdir(parents=True, mode=0o700, exist_ok=True)
    for name in ("ca.crt", "ca.key"):
        shutil.copy2(source / "tls" / name, target / "tls" / name)


def register_cluster(gw: Gateway, cluster_id: str, *, server_url: str, ca_pem: str, sa_token: str = SA_TOKEN,
                     token: str | None = None) -> str:
    """Create ``cluster_id`` (as ``token``'s user) and have the real kube-agent report it once.

    Returns the register token.
    """
    gw.json("POST", "/rest/clusters/bcs", token=token,
            body={"id": cluster_id, "project_id": "p1", "cluster_type": "k8s"})
    register_token = str(gw.json("POST", f"/rest/clusters/{cluster_id}/register_tokens", token=token)["token"])
    agent_kubeconfig = gw.data / f"agent-{cluster_id}.kubeconfig"
    write_kubeconfig(agent_kubeconfig, server=server_url, token=sa_token, ca_pem=ca_pem)
    agent = subprocess.run(
        [CLI, "kube-agent", "--bke-address", gw.url, "--cluster-id", cluster_id, "--kubeconfig",
         str(agent_kubeconfig), "--once"],
        env={**os.environ, "REGISTER_TOKEN": register_token, "SERVER_CERT": Path(gw.ca_file).read_text()},
        capture_output=True, text=True, timeout=60,
    )
    assert agent.returncode == 0, agent.stderr
    assert register_token not in agent.stderr + agent.stdout and sa_token not in agent.stderr
    return register_token


#: How often the workers of a gateway started with :func:`short_admission_refresh` re-read the
#: admission definitions (the default, 2 s, is a production bound no test should wait out).
ADMISSION_REFRESH = 0.25


def short_admission_refresh(data: Path, **options: str) -> list[str]:
    """``serve`` arguments for a gateway in ``data`` whose workers re-read the admission
    definitions every :data:`ADMISSION_REFRESH` seconds (``options``: more ini options)."""
    ini = gateway_ini(data.with_name(f"{data.name}.ini"), data, admission_refresh=f"{ADMISSION_REFRESH}s", **options)
    return ["--config", str(ini)]


def wait_out_admission_refresh() -> None:
    """Sleep past :data:`ADMISSION_REFRESH`: the store re-reads the definitions' revision on the
    first request after that bound, so from then on every worker admits with the new ones."""
    # The bound is the rule (store/definitions.py); nothing outside a worker shows its cache.
    time.sleep(2 * ADMISSION_REFRESH)


def gateway_ini(path: Path, data: Path, **options: str) -> Path:
    """An ini for ``serve --config``: the gateway app in ``data``, the bootstrap admin, ``options``.

    A multi-line value is given with its line breaks and indentation (``"\\n    a = b"``).
    """
    lines = ["[app:main]", "use = egg:bcs-middleware#gateway", f"data_dir = {data}",
             "bootstrap_users =", "    admin = env:BCS_ADMIN_TOKEN"]
    lines += [f"{key} = {value}" for key, value in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
