"""Gateway instances (real ``serve`` processes) side by side: on one PostgreSQL, in one data directory.

What they share (records, the secret key, the admin token, the CA) works on every instance; what is
each server's own (its metrics) stays its own; and an instance that would break the others — another
secret key, another admin token, a CA of its own — refuses to start, saying how to fix it.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import stat
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.fernet import Fernet
from prometheus_client.parser import text_string_to_metric_families

from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.sql import SQLStore
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, copy_ca, register_cluster, served_gateway
from tests.support.polling import wait_for, wait_until
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


@pytest.fixture(scope="module")
def instances(postgres_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Instance, Instance]]:
    """Two instances on one PostgreSQL database, shared by the tests of this module (each works
    on records of its own names)."""
    postgres_url = postgres_server.create_database()
    tmp_path = tmp_path_factory.mktemp("instances")
    key = _keygen()
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
        wait_for(lambda i=instance: i.call("GET", "/rest/clusters/shared-c", token=token)[0] == 401, 8.0)


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
    wait_for(lambda: any(d["metadata"]["name"] == "shared-hook"
                            for d in b.call("GET", "/rest/admissionwebhooks")[1]["items"]), 5.0)
    assert b.call("DELETE", "/rest/admissionwebhooks/shared-hook")[0] == 200
    wait_for(lambda: not a.call("GET", "/rest/admissionwebhooks")[1]["items"], 5.0)


# -- helpers -----------------------------------------------------------------------------------------


def _keygen() -> str:
    """What ``bcs-middleware keygen`` prints (cli/keygen.py), without a process start per key: the
    command itself is run by tests/test_examples.py's README rotation."""
    return Fernet.generate_key().decode()


def _serve(data: Path, *extra: str, env: dict[str, str]) -> ServerProcess:
    port = free_port()
    argv = [CLI, "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}", "--workers", "2",
            "--threads", "8", "--graceful-timeout", "3", *extra]
    return ServerProcess(argv, port=port, env=env, scheme="https", timeout=90)


def _refused(data: Path, *extra: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A ``serve`` that must stop at start: its exit and output (it is killed if it serves instead)."""
    argv = [CLI, "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{free_port()}", "--workers", "1",
            "--graceful-timeout", "3", *extra]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result


def _get(port: int, cafile: Path, path: str, token: str) -> tuple[int, bytes]:
    req = urllib.request.Request(f"https://localhost:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=str(cafile))) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _rest_gets(server: ServerProcess, cafile: Path) -> float:
    """The server's own count of answered ``GET /rest/…`` 200s, from its /metrics (as a superuser)."""
    status, body = _get(server.port, cafile, "/metrics", ADMIN)
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "bcs_api_request_count":
            return sum(s.value for s in family.samples if s.name == "bcs_api_request_count_total"
                       and (s.labels["kind"], s.labels["method"], s.labels["code"]) == ("rest", "GET", "200"))
    return 0.0


# -- per-server state in a shared data directory -------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_servers_in_one_data_directory_keep_their_own_metrics_across_a_restart(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest,
) -> None:
    extra = [] if backend == "sqlite" else ["--database-url", request.getfixturevalue("postgres_url")]
    env = {"BCS_ADMIN_TOKEN": ADMIN, "BCS_SECRET_KEY": _keygen()}
    data = tmp_path / "data"
    cafile = data / "tls" / "ca.crt"
    first = _serve(data, *extra, env=env)
    second = _serve(data, *extra, env=env)  # started later in the same directory: it must not clear the first's
    try:
        for server, count in ((first, 3), (second, 5)):
            for _ in range(count):
                assert _get(server.port, cafile, "/rest/users/admin", ADMIN)[0] == 200
        assert wait_until(lambda: (_rest_gets(first, cafile), _rest_gets(second, cafile)) == (3, 5), 20), \
            (_rest_gets(first, cafile), _rest_gets(second, cafile))
        second_dir = data / "prometheus" / str(second.proc.pid)
        assert second_dir.is_dir() and (data / "prometheus" / str(first.proc.pid)).is_dir()
        second.stop()
        second = _serve(data, *extra, env=env)
        for _ in range(2):
            assert _get(second.port, cafile, "/rest/users/admin", ADMIN)[0] == 200
        assert wait_until(lambda: (_rest_gets(first, cafile), _rest_gets(second, cafile)) == (3, 2), 20), \
            (_rest_gets(first, cafile), _rest_gets(second, cafile))
        assert not second_dir.exists()  # the stopped server's directory went at the next start
        assert stat.S_IMODE((data / "prometheus").stat().st_mode) == 0o700
    finally:
        first.stop()
        second.stop()
    assert "Traceback" not in first.output() + second.output()


# -- the secret key ---------------------------------------------------------------------------------------

PODS = "/tunnels/clusters/{}/api/v1/namespaces/default/pods"


def test_an_instance_with_another_secret_key_stops_at_start_and_tunnel_errors_stay_a_status(
    postgres_url: str, tmp_path: Path,
) -> None:
    first_key, other_key = _keygen(), _keygen()
    shared = ["--database-url", postgres_url]
    with FakeAPIServer(token=SA_TOKEN) as api, \
            served_gateway(tmp_path / "a", args=shared, env={"BCS_SECRET_KEY": first_key}, workers=1) as gw:
        register_cluster(gw, "BCS-K8S-KEY", server_url=api.url, ca_pem=api.ca_pem)
        assert gw.call("GET", PODS.format("BCS-K8S-KEY"))[0] == 200
        second = tmp_path / "b"
        copy_ca(tmp_path / "a", second)  # the CA is right; only the key is not
        for env, origin in (({"BCS_SECRET_KEY": other_key}, "env BCS_SECRET_KEY"),
                            ({"BCS_SECRET_KEY": ""}, f"{second / 'secret.key'}, generated by this start")):
            result = _refused(second, *shared, env={"BCS_ADMIN_TOKEN": gw.admin, **env})
            assert result.returncode == 2, result.stdout + result.stderr
            assert "cannot decrypt the secrets stored in the database" in result.stderr
            assert f"({origin})" in result.stderr and "BCS_SECRET_KEY=NEW,OLD" in result.stderr
            output = result.stdout + result.stderr
            assert first_key not in output and other_key not in output and "bcs-middleware " not in result.stdout
        # A stored secret that no configured key decrypts (written behind the gateway's back): a tunnel
        # request to that cluster is a Kubernetes Status kubectl can print, never the server's HTML page.
        gw.json("POST", "/rest/clusters/bcs", body={"id": "BCS-K8S-ROGUE", "project_id": "p", "cluster_type": "k8s"})
        rogue = SQLStore(Database(postgres_url, secrets=SecretBox([other_key])))
        rogue.report_credentials("BCS-K8S-ROGUE", server_addresses=[api.url], cacert_pem=api.ca_pem, user_token="x")
        rogue.db.dispose()
        status, body = gw.call("GET", PODS.format("BCS-K8S-ROGUE"))
        assert status == 500, body
        answer = json.loads(body)
        assert answer["kind"] == "Status" and answer["code"] == 500 and "see the server log" in answer["message"]
        assert gw.call("GET", PODS.format("BCS-K8S-KEY"))[0] == 200  # the other clusters are unaffected
    assert "Traceback" in gw.server.output()  # the operator gets the detail in the log


# -- the bootstrap admin token --------------------------------------------------------------------------


def test_a_second_instance_with_another_admin_token_refuses_to_start(postgres_url: str, tmp_path: Path) -> None:
    first_token, other_token = "first-admin-" + "f" * 32, "other-admin-" + "o" * 32
    shared = ["--database-url", postgres_url]
    key = _keygen()
    with served_gateway(tmp_path / "a", args=shared, env={"BCS_SECRET_KEY": key, "BCS_ADMIN_TOKEN": first_token},
                        workers=1) as first:
        first.admin = first_token
        copy_ca(tmp_path / "a", tmp_path / "b")
        result = _refused(tmp_path / "b", *shared, env={"BCS_SECRET_KEY": key, "BCS_ADMIN_TOKEN": other_token})
        assert result.returncode == 2
        assert "already has another bootstrap token for this user" in result.stderr
        assert "bcs-middleware rotate-admin-token" in result.stderr and "env BCS_ADMIN_TOKEN" in result.stderr
        assert first_token not in result.stderr + result.stdout and other_token not in result.stderr + result.stdout
        assert first.call("GET", "/rest/users/admin")[0] == 200  # not locked out
        assert first.call("GET", "/rest/users/admin", token=other_token)[0] == 401
        # The same token: both instances agree.
        with served_gateway(tmp_path / "b", args=shared, workers=1,
                            env={"BCS_SECRET_KEY": key, "BCS_ADMIN_TOKEN": first_token}) as second:
            second.admin = first_token
            assert second.call("GET", "/rest/users/admin")[0] == 200
        assert first.call("GET", "/rest/users/admin")[0] == 200


def test_an_instance_without_a_token_joins_and_rotation_replaces_it_everywhere(
    postgres_url: str, tmp_path: Path,
) -> None:
    shared = ["--database-url", postgres_url]
    env = {"BCS_SECRET_KEY": _keygen(), "BCS_ADMIN_TOKEN": ""}
    with served_gateway(tmp_path / "a", args=shared, env=env, workers=1) as first:
        first.admin = (tmp_path / "a" / "admin.token").read_text().strip()
        copy_ca(tmp_path / "a", tmp_path / "b")
        with served_gateway(tmp_path / "b", args=shared, env=env, workers=1) as second:
            second.admin = first.admin
            assert not (tmp_path / "b" / "admin.token").exists()  # no token of its own
            for gateway in (first, second):
                assert gateway.call("GET", "/rest/users/admin")[0] == 200
            # The deliberate way to change it, for every instance at once.
            old = first.admin
            rotated = subprocess.run([CLI, "rotate-admin-token", "--data-dir", str(tmp_path / "a"), *shared],
                                     capture_output=True, text=True, timeout=120, env={**os.environ, **env})
            assert rotated.returncode == 0, rotated.stderr
            new = (tmp_path / "a" / "admin.token").read_text().strip()
            assert new != old and new not in rotated.stdout + rotated.stderr
            assert stat.S_IMODE((tmp_path / "a" / "admin.token").stat().st_mode) == 0o600
            for gateway in (first, second):
                assert wait_until(lambda g=gateway: g.call("GET", "/rest/users/admin", token=old)[0] == 401, 15)
                assert gateway.call("GET", "/rest/users/admin", token=new)[0] == 200
        second_output = second.server.output()
    assert "no token is configured on this instance" in second_output and old not in second_output
    # An instance restarted with the rotated-away token refuses, rather than bring it back.
    result = _refused(tmp_path / "b", *shared, env={**env, "BCS_ADMIN_TOKEN": old})
    assert result.returncode == 2 and "was revoked" in result.stderr


# -- the CA -------------------------------------------------------------------------------------------------


def _client_credentials_ca(gateway: Gateway, cluster: str) -> str:
    return str(gateway.json("GET", f"/rest/clusters/{cluster}/client_credentials")["cacert_data"])


def test_a_second_instance_never_mints_a_ca_of_its_own(postgres_url: str, tmp_path: Path) -> None:
    shared = ["--database-url", postgres_url]
    env = {"BCS_SECRET_KEY": _keygen()}
    with served_gateway(tmp_path / "a", args=shared, env=env, workers=1) as first:
        first.json("POST", "/rest/clusters/bcs", body={"id": "BCS-K8S-CA", "project_id": "p", "cluster_type": "k8s"})
        result = _refused(tmp_path / "b", *shared, env={**env, "BCS_ADMIN_TOKEN": first.admin})
        assert result.returncode == 2
        assert "records the CA the gateways hand to clients" in result.stderr and "Copy ca.crt" in result.stderr
        assert not (tmp_path / "b" / "tls" / "ca.crt").exists()
        # Given the shared CA, it serves its own certificate signed by it and hands out the same CA.
        copy_ca(tmp_path / "a", tmp_path / "b")
        with served_gateway(tmp_path / "b", args=shared, env=env, workers=1) as second:
            assert second.call("GET", "/healthz")[0] == 200  # verified with the shared CA
            assert _client_credentials_ca(second, "BCS-K8S-CA") == _client_credentials_ca(first, "BCS-K8S-CA")
        # Another CA (an operator's certificate) is refused, naming both ...
        other = tmp_path / "other-pki"
        made = subprocess.run([CLI, "certs", "--gateway", "--host", "localhost,127.0.0.1", "--out", str(other)],
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        tls_args = ["--certfile", str(other / "server.crt"), "--keyfile", str(other / "server.key"),
                    "--ca-file", str(other / "ca.crt")]
        result = _refused(tmp_path / "c", *shared, *tls_args, env={**env, "BCS_ADMIN_TOKEN": first.admin})
        assert result.returncode == 2 and "is not the CA the gateways sharing the database" in result.stderr
        assert str(other / "ca.crt") in result.stderr
        # ... until an operator records it as the shared one on purpose.
        recorded = subprocess.run([CLI, "set-shared-ca", "--ca-file", str(other / "ca.crt"), *shared],
                                  capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert recorded.returncode == 0, recorded.stderr
        with served_gateway(tmp_path / "c", args=[*shared, *tls_args], env=env, workers=1) as third:
            third.ca_file = str(other / "ca.crt")
            assert _client_credentials_ca(third, "BCS-K8S-CA") == (other / "ca.crt").read_text()


# -- the README's section, as written ----------------------------------------------------------------------


def test_the_readme_several_instances_section_runs_as_written(postgres_url: str, tmp_path: Path) -> None:
    """README "Several instances": its commands by bash (the database URL and the ports substituted)."""
    import re
    import signal

    from tests.support.servers import wait_for_port

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Several instances", 1)[1].split("\n## ", 1)[0]
    start, check = re.findall(r"```sh\n(.*?)```", section, re.S)[:2]
    ports = free_port(), free_port()

    def as_here(text: str) -> str:
        text = text.replace("postgresql://bcs@db.internal/bcs", postgres_url)
        for port, readme_port in zip(ports, (8443, 8444), strict=True):
            text = text.replace(f"0.0.0.0:{readme_port}", f"127.0.0.1:{port}")
            text = text.replace(f"localhost:{readme_port}", f"localhost:{port}")
        return text

    env = {k: v for k, v in os.environ.items() if not k.startswith(("BCS_", "PROMETHEUS_"))}
    env["PATH"] = f"{BIN}:{env['PATH']}"
    log = tmp_path / "servers.log"
    with open(log, "wb") as out:
        servers = subprocess.Popen(["bash", "-ec", as_here(start) + "\nwait"], cwd=tmp_path, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for port in ports:
            wait_for_port("127.0.0.1", port, 120, servers)
        exports = next(line for line in start.splitlines() if line.startswith("export "))
        checked = subprocess.run(["bash", "-ec", exports + "\n" + as_here(check)], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120)
    finally:
        os.killpg(servers.pid, signal.SIGTERM)
        servers.wait(30)
    assert checked.returncode == 0, checked.stderr + log.read_text()
    answers, text, decoder = [], checked.stdout.strip(), json.JSONDecoder()
    while text:  # curl prints one JSON answer after the other, no line between
        answer, end = decoder.raw_decode(text)
        answers.append(answer)
        text = text[end:].strip()
    assert [a["name"] for a in answers] == ["admin", "admin"] and all(a["is_super_user"] for a in answers)
    output = log.read_text()
    assert "Traceback" not in output and (tmp_path / "shared" / "admin.token").read_text().strip() not in output
    assert not (tmp_path / "gw2" / "admin.token").exists() and not (tmp_path / "gw1" / "admin.token").exists()
