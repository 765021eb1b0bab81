"""``bcs-middleware serve`` as an operator runs it: a real gunicorn on a real socket."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from bcs_middleware.pki import certificates
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port, http_get

CLI = str(BIN / "bcs-middleware")


def serve(data_dir: Path, *extra: str, env: dict[str, str] | None = None, scheme: str = "https") -> ServerProcess:
    port = free_port()
    argv = [CLI, "serve", "--data-dir", str(data_dir), "--bind", f"127.0.0.1:{port}", "--workers", "2",
            "--threads", "8", "--graceful-timeout", "3", *extra]
    return ServerProcess(argv, port=port, env=env, scheme=scheme, timeout=60)


def call(url: str, method: str = "GET", *, token: str | None = None, body: dict | None = None,
         cafile: str | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = ssl.create_default_context(cafile=cafile) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("curl")
    if exe is None:
        pytest.skip("curl is not installed")
    return subprocess.run([exe, "-sS", "--max-time", "10", *args], capture_output=True, text=True, timeout=30)


def test_first_start_serves_https_with_its_own_ca_and_a_new_admin_token(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "BCS_ADMIN_TOKEN"}
    with serve(data, env=env) as server:
        ca = data / "tls" / "ca.crt"
        token_file = data / "admin.token"
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE((data / "tls" / "server.key").stat().st_mode) == 0o600
        assert stat.S_IMODE((data / "secret.key").stat().st_mode) == 0o600
        ok = curl("--cacert", str(ca), f"{server.url}/healthz")
        assert ok.returncode == 0 and json.loads(ok.stdout) == {"status": "ok"}
        refused = curl(f"{server.url}/healthz")
        assert refused.returncode != 0  # the system trust store does not know our CA
        by_name = curl("--cacert", str(ca), "-H", f"Authorization: Bearer {token}",
                       f"https://localhost:{server.port}/rest/users/admin")
        assert json.loads(by_name.stdout)["is_super_user"] is True
    output = server.output()
    assert f"curl --cacert {ca}" in output
    # Not a terminal (captured): only the file is named (tests/security/test_hostile_input.py has the tty case).
    assert token not in output and str(token_file) in output


def _served_certificate(port: int, cafile: Path) -> x509.Certificate:
    """The certificate a new connection gets, verified against ``cafile``."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls_sock:
        der = tls_sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


@pytest.mark.parametrize("worker_class", ["gthread", "gevent"])
def test_a_running_gateway_renews_its_certificate_without_a_restart(tmp_path: Path, worker_class: str) -> None:
    data = tmp_path / "data"
    with serve(data, "--tls-check-interval", "0.5", "--worker-class", worker_class) as server:
        ca_file, tls_dir = data / "tls" / "ca.crt", data / "tls"
        master = server.proc.pid
        key_before = (tls_dir / "server.key").read_bytes()
        first = _served_certificate(server.port, ca_file).serial_number
        # The certificate now expires tomorrow (same key, same CA): due for renewal. The renewer
        # checks every 0.5 s, so the short certificate may never be served at all: the proof of
        # renewal is a long-lived certificate that is neither the first one nor the short one.
        ca = certificates.load_keypair(ca_file, tls_dir / "ca.key")
        short = certificates.issue_server_cert(ca, ["localhost", "127.0.0.1"], days=1, key_pem=key_before)
        (tls_dir / "server.crt").write_bytes(short.cert_pem)
        replaced = (first, x509.load_pem_x509_certificate(short.cert_pem).serial_number)

        def renewed() -> bool:
            served = _served_certificate(server.port, ca_file)
            return (served.serial_number not in replaced
                    and served.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300))

        assert wait_until(renewed, 20), "the running gateway still serves the expiring certificate"
        assert server.proc.pid == master and server.proc.poll() is None  # no restart
        assert (tls_dir / "server.key").read_bytes() == key_before  # only the certificate changed
        assert call(f"{server.url}/healthz", cafile=str(ca_file)) == (200, {"status": "ok"})
        output = server.output()
    assert "renewed the gateway certificate" in output


def test_a_nonpositive_certificate_check_interval_is_refused(tmp_path: Path) -> None:
    result = subprocess.run([CLI, "serve", "--data-dir", str(tmp_path / "d"), "--tls-check-interval", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--tls-check-interval must be positive" in result.stderr


def test_restart_keeps_ca_tokens_and_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "BCS_ADMIN_TOKEN"}
    with serve(data, env=env) as server:
        token = (data / "admin.token").read_text().strip()
        ca_before = (data / "tls" / "ca.crt").read_bytes()
        cafile = str(data / "tls" / "ca.crt")
        status, user = call(f"{server.url}/rest/users/", "POST", token=token, body={"user_name": "alice"},
                            cafile=cafile)
        assert status == 201
        status, issued = call(f"{server.url}/rest/users/{user['id']}/tokens", "POST", token=token, cafile=cafile)
        alice_token = issued["user_token"]
        first_output = server.output()
    with serve(data, env=env) as server:
        assert (data / "tls" / "ca.crt").read_bytes() == ca_before
        assert call(f"{server.url}/rest/users/alice", token=token, cafile=cafile)[0] == 200
        assert call(f"{server.url}/rest/clusters/none", token=alice_token, cafile=cafile)[0] == 404
        second_output = server.output()
    assert token not in second_output
    assert alice_token not in first_output + second_output


def test_admin_token_from_environment(tmp_path: Path) -> None:
    data = tmp_path / "data"
    token = "env-admin-token-" + "x" * 32
    with serve(data, env={"BCS_ADMIN_TOKEN": token}) as server:
        cafile = str(data / "tls" / "ca.crt")
        assert call(f"{server.url}/rest/users/admin", token=token, cafile=cafile)[0] == 200
        assert not (data / "admin.token").exists()
        assert token not in server.output()


def test_operator_certificates_are_served_and_handed_to_clients(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    made = subprocess.run([CLI, "certs", "--gateway", "--host", "localhost,127.0.0.1", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert f"--certfile {out / 'server.crt'}" in made.stdout
    data = tmp_path / "data"
    with serve(data, "--certfile", str(out / "server.crt"), "--keyfile", str(out / "server.key"),
               "--ca-file", str(out / "ca.crt"), env={"BCS_ADMIN_TOKEN": "t" * 43}) as server:
        cafile = str(out / "ca.crt")
        assert not (data / "tls").exists()
        status, _ = call(f"{server.url}/rest/clusters/bcs", "POST", token="t" * 43, cafile=cafile,
                         body={"id": "c1", "project_id": "p", "cluster_type": "k8s"})
        assert status == 201
        status, creds = call(f"https://localhost:{server.port}/rest/clusters/c1/client_credentials",
                             token="t" * 43, cafile=cafile)
        assert status == 200
        assert creds["cacert_data"] == (out / "ca.crt").read_text()
        assert creds["server_address"] == f"https://localhost:{server.port}/tunnels/clusters/c1/"
        # The address verifies against the CA it came with.
        ctx = ssl.create_default_context(cadata=creds["cacert_data"])
        with urllib.request.urlopen(creds["server_address"].replace("/tunnels/clusters/c1/", "/healthz"),
                                    context=ctx, timeout=10) as resp:
            assert resp.status == 200


def test_insecure_http_serves_plain_http_with_a_warning(tmp_path: Path) -> None:
    with serve(tmp_path / "data", "--insecure-http", env={"BCS_ADMIN_TOKEN": "t" * 43}, scheme="http") as server:
        status, _, _ = http_get(f"{server.url}/healthz")
        assert status == 200
        output = server.output()
    assert "kubectl will not send bearer tokens" in output
    assert not (tmp_path / "data" / "tls").exists()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_creation_yields_one_201_and_409s(tmp_path: Path, backend: str, request) -> None:  # type: ignore[no-untyped-def]
    extra: list[str] = []
    if backend == "postgresql":
        extra = ["--database-url", request.getfixturevalue("postgres_url")]
    token = "c" * 43
    env = {"BCS_ADMIN_TOKEN": token, "BCS_SECRET_KEY": subprocess.run(
        [CLI, "keygen"], capture_output=True, text=True, check=True).stdout.strip()}
    data = tmp_path / "data"
    port = free_port()
    argv = [CLI, "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}", "--workers", "4",
            "--threads", "8", *extra]
    with ServerProcess(argv, port=port, env=env, scheme="https", timeout=60) as server:
        cafile = str(data / "tls" / "ca.crt")

        def create(kind: str) -> int:
            if kind == "user":
                return call(f"{server.url}/rest/users/", "POST", token=token, body={"user_name": "racer"},
                            cafile=cafile)[0]
            return call(f"{server.url}/rest/clusters/bcs", "POST", token=token, cafile=cafile,
                        body={"id": "race-1", "project_id": "p", "cluster_type": "k8s"})[0]

        for kind in ("user", "cluster"):
            with concurrent.futures.ThreadPoolExecutor(12) as pool:
                codes = sorted(pool.map(create, [kind] * 24))
            assert codes.count(201) == 1, codes
            assert codes.count(409) == 23, codes
        output = server.output()
    assert "Traceback" not in output


def test_serve_rejects_half_a_certificate(tmp_path: Path) -> None:
    result = subprocess.run([CLI, "serve", "--data-dir", str(tmp_path), "--certfile", "x.crt"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--keyfile" in result.stderr


def test_cli_entry_point_runs(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "bcs_middleware.cli.main", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "bcs-middleware" in result.stdout


def test_many_keep_alive_clients_keep_their_tls_connections(tmp_path: Path) -> None:
    """More idle keep-alive clients than threads: none is told to reconnect (a new TLS handshake)."""
    data = tmp_path / "data"
    with serve(data) as server:  # 2 workers x 8 threads
        ctx = ssl.create_default_context(cafile=str(data / "tls" / "ca.crt"))
        conns = [http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=20)
                 for _ in range(40)]
        try:
            closing = 0
            for _ in range(2):
                for conn in conns:  # every connection stays open between its requests
                    conn.request("GET", "/healthz")
                    resp = conn.getresponse()
                    resp.read()
                    assert resp.status == 200
                    closing += resp.getheader("Connection", "").lower() == "close"
            assert closing == 0, f"{closing} of 80 answers closed a keep-alive connection"
        finally:
            for conn in conns:
                conn.close()


def test_new_connections_resume_their_tls_session(tmp_path: Path) -> None:
    """The server context is reused across connections (not rebuilt per connection): a client's
    TLS session from one connection is resumed on the next, which skips the key exchange."""
    data = tmp_path / "data"
    with serve(data, "--workers", "1") as server:
        ctx = ssl.create_default_context(cafile=str(data / "tls" / "ca.crt"))
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # the session is known after the handshake
        session = None
        reused = []
        for _ in range(6):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                    ctx.wrap_socket(raw, server_hostname="localhost", session=session) as tls_sock:
                tls_sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                while tls_sock.recv(4096):
                    pass
                reused.append(tls_sock.session_reused)
                session = tls_sock.session
        # A context per connection never resumes a session (0 of 5 before); a shared one does.
        assert sum(reused[1:]) >= 3, reused


def test_postgresql_without_its_driver_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from bcs_middleware.cli import main as cli

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the postgresql extra were not installed
    # serve sets PROMETHEUS_MULTIPROC_DIR in the process that runs it, this one: setting it first
    # makes monkeypatch restore the pytest process's own value at the end (delenv of an unset
    # variable records nothing, and every later server started from this process inherited it).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", os.environ.get("PROMETHEUS_MULTIPROC_DIR", ""))
    monkeypatch.setenv("BCS_ADMIN_TOKEN", "t" * 43)
    # gthread: serve on gevent would monkey-patch this test process (it patches before anything else).
    code = cli.main(["serve", "--data-dir", str(tmp_path / "data"), "--bind", f"127.0.0.1:{free_port()}",
                     "--worker-class", "gthread", "--database-url", "postgresql://bcs@127.0.0.1:1/bcs"])
    assert code == 2
    err = capsys.readouterr().err
    assert "pip install 'bcs-middleware[postgresql]'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "gevent"),
    [
        pytest.param(["serve"], True, id="default"),
        pytest.param(["serve", "--worker-class", "gthread"], False, id="gthread"),
        pytest.param(["serve", "--zookeeper", "zk:2181"], True, id="registers"),
        pytest.param(["serve", "--zookeeper=zk:2181", "--worker-class=gthread"], False, id="registers-gthread"),
        pytest.param(["kube-agent"], False, id="reporting-agent"),
        pytest.param(["kube-agent", "--tunnel"], True, id="tunnelling-agent"),
        pytest.param(["kube-agent", "--tunnel", "--io", "threads"], False, id="tunnelling-agent-threads"),
        pytest.param(["kube-agent", "--io=threads", "--tunnel"], False, id="tunnelling-agent-threads-eq"),
        pytest.param(["certs", "--tunnel"], False, id="other-command"),
    ],
)
def test_serve_and_the_tunnelling_agent_run_gevent_unless_told_otherwise(argv: list[str], gevent: bool) -> None:
    from bcs_middleware.cli import main as cli

    assert cli.runs_on_gevent(argv) is gevent
