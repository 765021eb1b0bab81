"""Secret key rotation through real ``serve`` processes on PostgreSQL: OLD → ``NEW,OLD`` → NEW.

The operator's flow (README, "Instances sharing a database"): ``keygen`` a new key, restart with
``BCS_SECRET_KEY=NEW,OLD`` — the first instance started so re-encrypts every stored secret with NEW,
in one transaction — then with NEW alone. After each step the stored cluster credentials and
register tokens still work, and a tunnel request reaches the cluster.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cryptography.fernet import Fernet
from sqlalchemy import select

from bcs_middleware.store import models as m
from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.facts import SECRET_KEY_ID_FACT
from bcs_middleware.store.sql import SQLStore
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, register_cluster, served_gateway, write_kubeconfig
from tests.support.servers import BIN, free_port

CLI = str(BIN / "bcs-middleware")
CLUSTER = "BCS-K8S-ROTATE"
PODS = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods"


def _keygen() -> str:
    """What ``bcs-middleware keygen`` prints (cli/keygen.py), without a process start per key: the
    command itself is run by tests/test_examples.py's README rotation."""
    return Fernet.generate_key().decode()


def _stored_secrets(url: str) -> list[str]:
    """Every secret the database holds encrypted, as stored."""
    db = Database(url, secrets=SecretBox([]))
    try:
        with db.connection() as conn:
            tokens = conn.execute(select(m.register_tokens.c.token_encrypted)).scalars().all()
            credentials = conn.execute(select(m.cluster_credentials.c.secret_encrypted)).scalars().all()
    finally:
        db.dispose()
    return [*tokens, *credentials]


def _readable_by(url: str, key: str) -> bool:
    secrets = _stored_secrets(url)
    assert len(secrets) >= 2  # a register token and a credential at least
    return all(SecretBox([key]).can_decrypt(value) for value in secrets)


def _agent_reports(gw: Gateway, api: FakeAPIServer, register_token: str, tmp_path: Path) -> None:
    """The real kube-agent reports once with the cluster's register token (checked against the stored one)."""
    kubeconfig = tmp_path / "agent.kubeconfig"
    write_kubeconfig(kubeconfig, server=api.url, token=SA_TOKEN, ca_pem=api.ca_pem)
    agent = subprocess.run(
        [CLI, "kube-agent", "--bke-address", gw.url, "--cluster-id", CLUSTER, "--kubeconfig", str(kubeconfig),
         "--once"],
        env={**os.environ, "REGISTER_TOKEN": register_token, "SERVER_CERT": Path(gw.ca_file).read_text()},
        capture_output=True, text=True, timeout=60)
    assert agent.returncode == 0, agent.stderr


def _everything_works(gw: Gateway, api: FakeAPIServer, register_token: str, tmp_path: Path) -> None:
    assert gw.call("GET", PODS)[0] == 200  # the stored credential decrypts
    # The stored register token decrypts (the REST API hands it back) and opens the agent's door.
    assert gw.json("GET", f"/rest/clusters/{CLUSTER}/register_tokens")["token"] == register_token
    _agent_reports(gw, api, register_token, tmp_path)
    assert gw.call("GET", PODS)[0] == 200


def test_rotation_old_then_new_and_old_then_new_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    old, new = _keygen(), _keygen()
    data = tmp_path / "data"
    shared = ["--database-url", postgres_url]
    with FakeAPIServer(token=SA_TOKEN) as api:
        with served_gateway(data, args=shared, env={"BCS_SECRET_KEY": old}, workers=1) as gw:
            register_token = register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
            _everything_works(gw, api, register_token, tmp_path)
        assert _readable_by(postgres_url, old) and not _readable_by(postgres_url, new)

        with served_gateway(data, args=shared, env={"BCS_SECRET_KEY": f"{new},{old}"}, workers=1) as gw:
            # Re-encrypted at start, before any request: the old key reads nothing any more.
            assert _readable_by(postgres_url, new) and not _readable_by(postgres_url, old)
            _everything_works(gw, api, register_token, tmp_path)
        store = SQLStore(Database(postgres_url, secrets=SecretBox([])))
        assert store.get_fact(SECRET_KEY_ID_FACT) == SecretBox([new]).key_id()
        store.db.dispose()

        with served_gateway(data, args=shared, env={"BCS_SECRET_KEY": new}, workers=1) as gw:
            _everything_works(gw, api, register_token, tmp_path)
        assert _readable_by(postgres_url, new)

        # The old key alone is now refused at start, saying what to do, and showing no key.
        port = free_port()
        refused = subprocess.run(
            [CLI, "serve", "--data-dir", str(data), *shared, "--bind", f"127.0.0.1:{port}", "--workers", "1",
             "--graceful-timeout", "3"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "BCS_SECRET_KEY": old, "BCS_ADMIN_TOKEN": gw.admin})
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "cannot decrypt the secrets stored in the database" in refused.stderr
        assert "Traceback" not in refused.stderr and old not in refused.stderr and new not in refused.stderr
