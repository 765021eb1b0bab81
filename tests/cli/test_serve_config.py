"""``serve --config FILE.ini`` and ``serve``'s own options: each does what it says, or is refused with
one clear message — never silently ignored, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import trustme

from tests.support.fake_scheduler import FakeScheduler
from tests.support.gateway import served_gateway
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port, http_get

CLI = str(BIN / "bcs-middleware")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ADMIN = "serve-config-admin-" + "c" * 24

GATEWAY_INI = """\
[DEFAULT]
data_dir = bcs-data

[app:main]
use = egg:bcs-middleware#gateway
get data_dir = data_dir
bootstrap_users =
    admin = env:BCS_ADMIN_TOKEN
"""


def _ini(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``bcs-middleware ARGV`` that must end by itself (a refusal); a server that starts is a failure."""
    result = subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=120, cwd=cwd,
                            env={**os.environ, "BCS_ADMIN_TOKEN": ADMIN, **(env or {})})
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a gunicorn master's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


# -- [server:main] -----------------------------------------------------------------------------------------


def test_server_main_sets_workers_worker_class_and_threads_and_a_flag_wins(tmp_path: Path) -> None:
    ini = _ini(tmp_path / "gw.ini", GATEWAY_INI + "\n[server:main]\nuse = egg:gunicorn#main\nworkers = 3\n"
                                                  "worker_class = gthread\nthreads = 4\n")
    data = tmp_path / "data"
    for flags, workers in (((), 3), (("--workers", "1"), 1)):
        port = free_port()
        argv = [CLI, "serve", "--config", str(ini), "--data-dir", str(data), "--bind", f"127.0.0.1:{port}",
                "--graceful-timeout", "3", *flags]
        with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=90) as server:
            assert http_get(f"https://localhost:{port}/healthz", cafile=str(data / "tls" / "ca.crt"))[0] == 200
            assert wait_until(lambda n=workers: len(_children(server.proc.pid)) == n, 60), _children(server.proc.pid)
            output = server.output()
        # gthread is served by its subclass that closes idle connections where they were served
        assert "Using worker: bcs_middleware.serving.gthread_worker.GatewayThreadWorker" in output, output


def test_a_server_main_setting_serve_does_not_take_is_refused(tmp_path: Path) -> None:
    for extra, message in (("max_requests = 10", "max_requests: serve does not take this setting"),
                           ("workers = many", "workers = 'many': not a number"),
                           ("worker_class = sync", "serve runs gevent or gthread"),
                           ("threads = 0", "threads = 0: must be positive")):
        ini = _ini(tmp_path / "gw.ini", GATEWAY_INI + f"\n[server:main]\n{extra}\n")
        result = _run("serve", "--config", str(ini), "--data-dir", str(tmp_path / "d"))
        assert result.returncode == 2 and message in result.stderr, (extra, result.stderr)


# -- flags that configure the ini's application --------------------------------------------------------


def test_the_driver_ini_takes_cluster_id_and_scheduler_from_the_command_line(tmp_path: Path) -> None:
    scheduler = FakeScheduler("scheduler")
    shutil.copy(EXAMPLES / "driver.ini", tmp_path / "driver.ini")
    data, port = tmp_path / "data", free_port()
    argv = [CLI, "serve", "--config", str(tmp_path / "driver.ini"), "--role", "driver",
            "--cluster-id", "BCS-MESOS-FLAG", "--scheduler", scheduler.url, "--data-dir", str(data),
            "--bind", f"127.0.0.1:{port}", "--workers", "1", "--graceful-timeout", "3"]
    try:
        with ServerProcess(argv, port=port, scheme="https", timeout=90) as server:
            cafile = str(data / "tls" / "ca.crt")
            url = f"https://localhost:{port}/mesosdriver/v4/namespaces/ns/apps"
            status, _, body = http_get(url, headers={"BCS-ClusterID": "BCS-MESOS-FLAG"}, cafile=cafile)
            assert status == 200 and json.loads(body)["served_by"] == "scheduler"
            # The ini's own cluster id is not this driver's any more.
            assert http_get(url, headers={"BCS-ClusterID": "BCS-MESOS-10001"}, cafile=cafile)[0] == 400
        assert "driver on https://" in server.output()
    finally:
        scheduler.stop()


@pytest.mark.parametrize(
    ("ini_text", "flags", "message"),
    [
        pytest.param(GATEWAY_INI, ["--role", "driver"], "--role driver: the application of", id="role-gateway-ini"),
        pytest.param((EXAMPLES / "driver.ini").read_text(), ["--role", "gateway"],
                     "is a driver", id="role-driver-ini"),
        pytest.param(GATEWAY_INI, ["--cluster-id", "BCS-MESOS-1"],
                     "--cluster-id with --config", id="cluster-id-for-a-gateway"),
        pytest.param(GATEWAY_INI, ["--upstream-deny", "127.0.0.0/8"],
                     "the ini's application does not take upstream_deny from [DEFAULT]", id="upstream-deny"),
        pytest.param(GATEWAY_INI, ["--audit-log", "audit.jsonl"], "--audit-log with --config", id="audit-log"),
        pytest.param("[app:main]\nuse = egg:bcs-middleware#driver\ncluster_id = BCS-MESOS-OWN\n"
                     "static_schedulers = http://127.0.0.1:1\ndata_dir = bcs-data\n",
                     ["--cluster-id", "BCS-MESOS-OTHER"], "Set cluster_id in the ini", id="own-cluster-id"),
    ],
)
def test_a_flag_the_ini_would_ignore_is_refused(tmp_path: Path, ini_text: str, flags: list[str],
                                                message: str) -> None:
    ini = _ini(tmp_path / "app.ini", ini_text)
    result = _run("serve", "--config", str(ini), "--data-dir", str(tmp_path / "d"), *flags)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "bcs-middleware 0" not in result.stdout  # refused before anything served


def test_a_flag_the_ini_takes_from_default_is_honoured(tmp_path: Path) -> None:
    """examples/gateway.ini takes peer_address from [DEFAULT]: --peer-address off reaches the app."""
    shutil.copy(EXAMPLES / "gateway.ini", tmp_path / "gateway.ini")
    with served_gateway(tmp_path / "data", args=["--config", str(tmp_path / "gateway.ini"), "--peer-address", "off"],
                        workers=1) as gw:
        assert gw.call("GET", "/healthz")[0] == 200
        output = gw.server.output()
    assert "peer listener on" not in output  # "off": no peer listener in the worker


# -- the audit log's folder ----------------------------------------------------------------------------------


def test_an_audit_log_in_a_missing_folder_gets_the_folder(tmp_path: Path) -> None:
    log = tmp_path / "var" / "log" / "bcs" / "audit.jsonl"
    with served_gateway(tmp_path / "data", args=["--audit-log", str(log)], workers=1) as gw:
        assert gw.call("GET", "/tunnels/clusters/BCS-K8S-NONE/api/v1/pods")[0] == 404
        assert wait_until(lambda: log.exists() and log.read_text().count("\n") >= 2, 15)
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = _run("serve", "--data-dir", str(tmp_path / "other"), "--audit-log", str(blocker / "audit.jsonl"))
    assert result.returncode == 2 and f"audit log {blocker / 'audit.jsonl'}" in result.stderr


# -- every configuration mistake: one message, no traceback ---------------------------------------------


def _pki(tmp_path: Path) -> dict[str, str]:
    ca, other = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("localhost")
    files = {"cert": tmp_path / "server.crt", "key": tmp_path / "server.key", "other_key": tmp_path / "other.key",
             "ca": tmp_path / "ca.crt", "policy": tmp_path / "policy.yaml", "syntax": tmp_path / "syntax.ini",
             "no_app": tmp_path / "no-app.ini"}
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    other.issue_cert("localhost").private_key_pem.write_to_path(str(files["other_key"]))
    ca.cert_pem.write_to_path(str(files["ca"]))
    files["policy"].write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [\n")
    files["syntax"].write_text("[app:main\nuse = egg:bcs-middleware#gateway\n")
    files["no_app"].write_text("[server:main]\nworkers = 1\n")
    return {name: str(path) for name, path in files.items()}


MISTAKES = [
    (["--config", "{tmp}/missing.ini"], "missing.ini: No such file"),
    (["--config", "{syntax}"], "--config {syntax}"),
    (["--config", "{no_app}"], "No section 'main'"),
    (["--audit-log", "-", "--audit-policy", "{tmp}/missing.yaml"], "audit policy {tmp}/missing.yaml"),
    (["--audit-log", "-", "--audit-policy", "{policy}"], "audit policy {policy}"),
    (["--certfile", "{tmp}/missing.crt", "--keyfile", "{key}"], "--certfile {tmp}/missing.crt"),
    (["--certfile", "{cert}", "--keyfile", "{other_key}", "--ca-file", "{ca}"], "--certfile {cert}"),
    (["--certfile", "{cert}", "--keyfile", "{key}", "--ca-file", "{tmp}/missing-ca.crt"], "--ca-file"),
    (["--client-ca-file", "{tmp}/missing-ca.crt"], "--client-ca-file"),
    (["--database-url", "::not a url::"], "the database URL is not a valid URL"),
    (["--database-url", "postgresql://bcs:pw-s3cr3t@127.0.0.1:1/bcs"], "cannot open the database"),
    (["--tls-host", "not a host!"], "--tls-host"),
    (["--static-driver", "BCS-MESOS-1"], "expected CLUSTER=URL"),
    (["--data-dir", "/dev/null/data"], "--data-dir /dev/null/data"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--bind", "127.0.0.1:99999"], "no such port 99999"),
    (["--upstream-deny", "300.0.0.0/8"], "upstream_deny"),
    (["--public-url", "ftp://gw"], "public_url"),
    (["--role", "driver"], "needs --cluster-id"),
    (["--role", "driver", "--cluster-id", "BCS-MESOS-1", "--scheduler", "not-a-url"], "not-a-url"),
]


@pytest.mark.parametrize(("flags", "message"), [pytest.param(f, m, id=m.split()[0].strip("-")[:20] + str(i))
                                                for i, (f, m) in enumerate(MISTAKES)])
def test_a_configuration_mistake_is_one_clear_message(tmp_path: Path, flags: list[str], message: str) -> None:
    names = {"tmp": str(tmp_path), **_pki(tmp_path)}
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--bind", f"127.0.0.1:{free_port()}", "--workers", "1"]
    argv += [flag.format(**names) for flag in flags]
    if "--data-dir" in flags:
        argv = argv[:1] + argv[3:]
    result = _run(*argv)
    assert result.returncode in (1, 2), result.stdout
    assert message.format(**names) in result.stderr, result.stderr
    assert "s3cr3t" not in result.stderr  # a password in a database URL is never shown


def test_a_secret_key_that_is_not_a_key_and_a_ca_without_its_key_are_one_clear_message(tmp_path: Path) -> None:
    result = _run("serve", "--data-dir", str(tmp_path / "a"), env={"BCS_SECRET_KEY": "not-a-fernet-key"})
    assert result.returncode == 2 and "not a valid Fernet key" in result.stderr
    assert "not-a-fernet-key" not in result.stderr
    (tmp_path / "b" / "tls").mkdir(parents=True)
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "b" / "tls" / "ca.crt"))
    result = _run("serve", "--data-dir", str(tmp_path / "b"))
    assert result.returncode == 2 and "the CA cannot be used" in result.stderr


def test_the_ini_s_worker_class_decides_the_gevent_patch_unless_a_flag_does(tmp_path: Path) -> None:
    """gevent patches the standard library before anything is imported: it must follow the ini's
    [server:main] worker_class (a gthread server patched for gevent would run its threads as greenlets)."""
    from bcs_middleware.cli.main import runs_on_gevent

    ini = str(_ini(tmp_path / "gw.ini", GATEWAY_INI + "\n[server:main]\nworker_class = gthread\n"))
    assert runs_on_gevent(["serve", "--config", ini]) is False
    assert runs_on_gevent(["serve", f"--config={ini}", "--worker-class", "gevent"]) is True
    assert runs_on_gevent(["serve", "--config", str(tmp_path / "missing.ini")]) is True  # serve reports it


def test_gunicorn_with_the_example_config_file_stops_on_a_mistake_with_one_message(tmp_path: Path) -> None:
    """examples/gunicorn.conf.py builds the application once in the master (on_starting): a mistake in the
    ini stops gunicorn with one line, instead of every worker failing to boot with a traceback."""
    ini = _ini(tmp_path / "gw.ini", GATEWAY_INI + "no_such_option = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BCS_", "PROMETHEUS_"))}
    env.update(BCS_DATA_DIR=str(tmp_path / "data"), BCS_BIND=f"127.0.0.1:{free_port()}", BCS_WORKERS="1",
               BCS_ADMIN_TOKEN=ADMIN)
    result = subprocess.run([str(BIN / "gunicorn"), "--paste", str(ini), "-c", str(EXAMPLES / "gunicorn.conf.py"),
                             "--no-control-socket"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2, result.stderr
    assert "error: configuration:" in result.stderr and "no_such_option" in result.stderr
    assert "Traceback" not in result.stderr and "Booting worker" not in result.stderr
