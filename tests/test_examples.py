"""Every example in examples/ loads and serves under a real gunicorn, as its comments say."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.fernet import Fernet
from paste.deploy import loadapp
from prometheus_client.parser import text_string_to_metric_families

from bcs_middleware.store.crypto import token_digest
from bcs_middleware.store.sql import open_store
from tests.support.fake_upstream import FakeUpstream
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port, gunicorn, http_get

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ADMIN = "examples-admin-token-" + "e" * 22


def test_every_entry_point_loads() -> None:
    loaded = {}
    for group in ("paste.app_factory", "paste.filter_factory", "console_scripts"):
        for ep in importlib.metadata.entry_points(group=group):
            if ep.dist is not None and ep.dist.name == "bcs-middleware":
                loaded[(group, ep.name)] = ep.load()
    assert ("paste.filter_factory", "token_auth") in loaded
    assert ("paste.filter_factory", "cluster_routing") in loaded
    assert ("paste.filter_factory", "admission") in loaded
    assert ("paste.app_factory", "gateway") in loaded
    assert ("paste.app_factory", "upstream_proxy") in loaded
    assert ("paste.app_factory", "management_api") in loaded
    assert ("paste.app_factory", "driver") in loaded
    assert ("paste.filter_factory", "mesos_routing") in loaded
    assert ("paste.filter_factory", "audit") in loaded
    assert ("paste.filter_factory", "request_context") in loaded
    assert all(callable(obj) for obj in loaded.values())


def test_the_readme_names_every_paste_entry_point() -> None:
    readme = (EXAMPLES.parent / "README.md").read_text()
    names = [ep.name for group in ("paste.app_factory", "paste.filter_factory")
             for ep in importlib.metadata.entry_points(group=group)
             if ep.dist is not None and ep.dist.name == "bcs-middleware"]
    assert len(names) >= 10
    assert [name for name in names if f"`{name}`" not in readme] == []


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


def test_every_example_ini_loads(data_dir: Path, tmp_path: Path) -> None:
    definitions = _definitions_copy(tmp_path, trustme.CA())
    overrides = {
        "gateway.ini": {"data_dir": str(data_dir)},
        "token_auth_app.ini": {"data_dir": str(data_dir)},
        "admission_app.ini": {"definitions_file": str(definitions)},
        "reverse_proxy.ini": {},
        "driver.ini": {"data_dir": str(data_dir)},
        "audited_gateway.ini": {"data_dir": str(data_dir)},
    }
    env = {"BCS_ADMIN_TOKEN": ADMIN, "BCS_SECRET_KEY": Fernet.generate_key().decode()}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import sys

    sys.path.insert(0, str(EXAMPLES))
    try:
        inis = sorted(p.name for p in EXAMPLES.glob("*.ini"))
        assert set(overrides) <= set(inis)
        for name in inis:
            app = loadapp(f"config:{EXAMPLES / name}", global_conf=overrides.get(name, {}))
            assert callable(app), name
            if hasattr(app, "sink"):
                app.sink.close()  # the audit filter's file
    finally:
        sys.path.remove(str(EXAMPLES))
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _definitions_copy(tmp_path: Path, ca: trustme.CA) -> Path:
    text = (EXAMPLES / "admission-definitions.yaml").read_text()
    bundle = base64.b64encode(ca.cert_pem.bytes()).decode()
    copy = tmp_path / "definitions.yaml"
    copy.write_text(text.replace("PASTE_THE_caBundle_PRINTED_BY_bcs-middleware_certs", bundle))
    return copy


def test_gateway_ini_with_the_gunicorn_config_file(data_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The server must not inherit a PROMETHEUS_MULTIPROC_DIR (it would read another server's samples
    # from there): serve run in-process sets it, and tests/conftest.py fails a test that leaves it.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    port = free_port()
    env = {
        "BCS_ADMIN_TOKEN": ADMIN, "BCS_BIND": f"127.0.0.1:{port}", "BCS_WORKERS": "2", "BCS_THREADS": "8",
        "BCS_CERTFILE": str(tmp_path / "server.pem"), "BCS_KEYFILE": str(tmp_path / "server.pem"),
        "BCS_DATA_DIR": str(data_dir),
    }
    argv = [str(BIN / "gunicorn"), "--paste", str(EXAMPLES / "gateway.ini"), "-c", str(EXAMPLES / "gunicorn.conf.py"),
            "--paste-global", f"data_dir={data_dir}", "--paste-global", f"database_url=sqlite:///{data_dir}/bcs.sqlite3"]
    clean_env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with ServerProcess(argv, port=port, env={**clean_env, **env}, scheme="https", timeout=60) as server:
        cafile = str(tmp_path / "ca.pem")
        auth = {"Authorization": f"Bearer {ADMIN}", "X-Request-Id": "req-examples-1"}
        for _ in range(3):
            status, headers, body = http_get(f"https://localhost:{port}/rest/users/admin", headers=auth, cafile=cafile)
            assert status == 200 and json.loads(body)["is_super_user"] is True
            assert headers["X-Request-Id"] == "req-examples-1"
        assert http_get(f"https://localhost:{port}/rest/users/nobody", headers=auth, cafile=cafile)[0] == 404
        # Several workers, one answer: the multiprocess collector sums them. Each worker
        # applies its request metrics in batches (metrics.BATCH), within 0.25 s; /metrics
        # flushes only the worker that serves it, so when that is the one that served
        # none of the requests above, the family is not there yet: ask again.
        def scrape() -> tuple[dict[str, Any], dict[tuple[str, str, str], float]]:
            """The metric families, and the request counts by (kind, method, code)."""
            scraper = {"Authorization": auth["Authorization"]}  # /metrics is for superusers (and the metrics token)
            status, _, metrics = http_get(f"https://localhost:{port}/metrics", headers=scraper, cafile=cafile)
            assert status == 200
            families = {f.name: f for f in text_string_to_metric_families(metrics.decode())}
            family = families.get("bcs_api_request_count")
            return families, {
                (s.labels["kind"], s.labels["method"], s.labels["code"]): s.value
                for s in (family.samples if family else [])
                if s.name == "bcs_api_request_count_total"
            }

        def all_counted() -> bool:
            counted = scrape()[1]
            return (counted.get(("rest", "GET", "200")), counted.get(("rest", "GET", "404"))) == (3, 1)

        wait_until(all_counted, 5, step=0.05)
        families, counted = scrape()
        assert counted[("rest", "GET", "200")] == 3, counted
        assert counted[("rest", "GET", "404")] == 1
        assert "bcs_api_request_latency_seconds" in families
    output = server.output()
    access = [json.loads(line) for line in output.splitlines() if line.startswith('{"time"')]
    mine = [line for line in access if line["request_id"] == "req-examples-1"]
    assert sorted(line["status"] for line in mine) == [200, 200, 200, 404]
    assert all(line["user"] == "admin" and line["bytes"] > 0 and line["kind"] == "rest" for line in mine)
    assert ADMIN not in output


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A directory laid out like a fresh clone (examples/ only): commands run in it as written."""
    root = tmp_path / "clone"
    shutil.copytree(EXAMPLES, root / "examples", ignore=shutil.ignore_patterns("bcs-data", "__pycache__"))
    return root


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROMETHEUS_MULTIPROC_DIR", "BCS_ADMIN_TOKEN", "BCS_SECRET_KEY", "BCS_DATA_DIR")}
    return {**env, **extra}


def _gateway_user_token(clone: Path) -> str:
    """A user and token in the gateway's database in clone/bcs-data (as the REST API makes them)."""
    store = open_store(data_dir=clone / "bcs-data")
    user = store.create_user("webuser")
    _, token = store.create_token(user.id)
    store.db.dispose()
    return token


def test_token_auth_in_front_of_an_existing_app(clone: Path) -> None:
    token = _gateway_user_token(clone)
    port = free_port()
    argv = [str(BIN / "gunicorn"), "--paste", "examples/token_auth_app.ini", "--pythonpath", "examples",
            "--bind", f"127.0.0.1:{port}", "--no-control-socket"]
    with ServerProcess(argv, port=port, cwd=clone, env=_clean_env()) as server:
        status, _, body = http_get(f"{server.url}/anything", headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and json.loads(body)["hello"] == "webuser"
        assert http_get(f"{server.url}/anything")[0] == 401
        assert http_get(f"{server.url}/healthz")[0] == 200


def test_token_auth_without_a_gateway_database_refuses_to_start(clone: Path) -> None:
    port = free_port()
    argv = [str(BIN / "gunicorn"), "--paste", "examples/token_auth_app.ini", "--pythonpath", "examples",
            "--bind", f"127.0.0.1:{port}", "--no-control-socket"]
    result = subprocess.run(argv, cwd=clone, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "no gateway database in" in result.stdout + result.stderr


def test_gunicorn_path_as_the_readme_shows(clone: Path) -> None:
    """gunicorn --paste examples/gateway.ini -c examples/gunicorn.conf.py: HTTPS, one data dir, admin."""
    port = free_port()
    argv = [str(BIN / "gunicorn"), "--paste", "examples/gateway.ini", "-c", "examples/gunicorn.conf.py",
            "--no-control-socket"]
    with ServerProcess(argv, port=port, cwd=clone, scheme="https", timeout=60,
                       env=_clean_env(BCS_BIND=f"127.0.0.1:{port}", BCS_WORKERS="1", BCS_THREADS="8")) as server:
        data = clone / "bcs-data"
        cafile = str(data / "tls" / "ca.crt")
        admin = (data / "admin.token").read_text().strip()
        assert (data / "admin.token").stat().st_mode & 0o077 == 0
        auth = {"Authorization": f"Bearer {admin}"}
        status, _, body = http_get(f"https://localhost:{port}/rest/users/admin", headers=auth, cafile=cafile)
        assert status == 200 and json.loads(body)["is_super_user"] is True
        _create_cluster(port, auth, cafile)
        status, _, body = http_get(f"https://localhost:{port}/rest/clusters/BCS-K8S-EX/client_credentials",
                                   headers=auth, cafile=cafile)
        creds = json.loads(body)
        assert creds["server_address"].startswith("https://")
        assert creds["cacert_data"] == (data / "tls" / "ca.crt").read_text()
    output = server.output()
    assert admin not in output
    assert "HTTPS certificate authority" in output
    assert not (clone / "examples" / "bcs-data").exists()
    assert {"admin.token", "bcs.sqlite3", "secret.key", "tls"} <= {p.name for p in data.iterdir()}


def _create_cluster(port: int, auth: dict[str, str], cafile: str) -> None:
    import ssl
    import urllib.request

    body = json.dumps({"id": "BCS-K8S-EX", "project_id": "p1", "cluster_type": "k8s"}).encode()
    request = urllib.request.Request(f"https://localhost:{port}/rest/clusters/bcs", data=body, method="POST",
                                     headers={**auth, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=cafile),
                                timeout=10) as response:
        assert response.status == 201


def test_serve_with_the_example_config_as_the_readme_shows(clone: Path) -> None:
    """bcs-middleware serve --config examples/gateway.ini: one data directory, the banner's."""
    port = free_port()
    argv = [str(BIN / "bcs-middleware"), "serve", "--config", "examples/gateway.ini",
            "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with ServerProcess(argv, port=port, cwd=clone, env=_clean_env(), scheme="https", timeout=60) as server:
        data = clone / "bcs-data"
        cafile = str(data / "tls" / "ca.crt")
        auth = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
        status, _, body = http_get(f"https://localhost:{port}/rest/users/admin", headers=auth, cafile=cafile)
        assert status == 200, body
        _create_cluster(port, auth, cafile)
        status, _, body = http_get(f"https://localhost:{port}/rest/clusters/BCS-K8S-EX/client_credentials",
                                   headers=auth, cafile=cafile)
        assert json.loads(body)["cacert_data"] == (data / "tls" / "ca.crt").read_text()
    assert f"(data: {data})" in server.output()
    assert (data / "bcs.sqlite3").exists() and not (clone / "examples" / "bcs-data").exists()


@pytest.fixture
def sidecar_injector_service(tmp_path: Path) -> Iterator[tuple[int, trustme.CA]]:
    import sidecar_injector
    from webhook_kit import https_server

    ca = trustme.CA()
    # The certificate names the service, as `bcs-middleware certs --service` makes it.
    cert = ca.issue_cert("sidecar-injector.bcs-system", "sidecar-injector.bcs-system.svc")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "hook.pem"))
    server = https_server(sidecar_injector.app, str(tmp_path / "hook.pem"), str(tmp_path / "hook.pem"), port=0)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server.server_port, ca
    server.shutdown()
    server.server_close()


def test_admission_in_front_of_an_existing_app(
    tmp_path: Path, sidecar_injector_service: tuple[int, trustme.CA]
) -> None:
    port, ca = sidecar_injector_service
    definitions = _definitions_copy(tmp_path, ca)
    ini = tmp_path / "admission_app.ini"
    ini.write_text((EXAMPLES / "admission_app.ini").read_text().replace("127.0.0.1:9443", f"127.0.0.1:{port}"))
    with gunicorn(str(ini), workers=1, extra=["--pythonpath", str(EXAMPLES),
                                              "--paste-global", f"definitions_file={definitions}"]) as server:
        import requests

        deployment = {"apiVersion": "v4", "kind": "Deployment", "metadata": {"name": "web", "namespace": "prod"},
                      "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}}}
        answer = requests.post(f"{server.url}/v4/deployments", json=deployment, timeout=30).json()
        containers = answer["body"]["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["app", "sidecar"]
        # A namespace the selector excludes passes untouched.
        deployment["metadata"]["namespace"] = "bcs-system"
        answer = requests.post(f"{server.url}/v4/deployments", json=deployment, timeout=30).json()
        assert [c["name"] for c in answer["body"]["spec"]["template"]["spec"]["containers"]] == ["app"]


def test_reverse_proxy_ini() -> None:
    with FakeUpstream() as upstream, gunicorn(
        str(EXAMPLES / "reverse_proxy.ini"), workers=1, extra=["--paste-global", f"upstream={upstream.url}"]
    ) as server:
        status, _, body = http_get(f"{server.url}/echo/hi?x=1", headers={"Authorization": "Bearer secret"})
        assert status == 200
        echoed = json.loads(body)
        assert echoed["path"] == "/echo/hi" and echoed["query"] == "x=1"
        assert "authorization" not in {k.lower() for k, _ in echoed["headers"]}


def test_wrap_app_stacks(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"robot {token_digest('w' * 43)} superuser\n")
    with gunicorn("wrap_app:protected", workers=1, extra=["--pythonpath", str(EXAMPLES)],
                  env={"BCS_TOKENS_FILE": str(tokens)}) as server:
        status, _, body = http_get(f"{server.url}/x", headers={"Authorization": "Bearer " + "w" * 43})
        assert status == 200 and json.loads(body)["hello"] == "robot"
        assert http_get(f"{server.url}/x")[0] == 401


def test_wrap_app_as_written_uses_the_gateway_tokens(clone: Path) -> None:
    token = _gateway_user_token(clone)
    port = free_port()
    argv = [str(BIN / "gunicorn"), "wrap_app:protected", "--pythonpath", "examples",
            "--bind", f"127.0.0.1:{port}", "--no-control-socket"]
    with ServerProcess(argv, port=port, cwd=clone, env=_clean_env()) as server:
        status, _, body = http_get(f"{server.url}/x", headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and json.loads(body)["hello"] == "webuser"
        assert http_get(f"{server.url}/x")[0] == 401


def test_driver_ini_serves_with_a_static_scheduler_and_the_gateway_data_dir(clone: Path) -> None:
    """gunicorn --paste examples/driver.ini, as its comments show: state in ./bcs-data, none in examples/."""
    from tests.support.fake_scheduler import FakeScheduler

    scheduler = FakeScheduler("scheduler")
    port = free_port()
    argv = [str(BIN / "gunicorn"), "--paste", "examples/driver.ini", "--bind", f"127.0.0.1:{port}",
            "--workers", "1", "--no-control-socket",
            "--paste-global", f"scheduler={scheduler.url}", "--paste-global", "cluster_id=BCS-MESOS-EX"]
    try:
        with ServerProcess(argv, port=port, cwd=clone, env=_clean_env()) as server:
            status, _, body = http_get(f"{server.url}/mesosdriver/v4/namespaces/ns/apps?x=1",
                                       headers={"BCS-ClusterID": "BCS-MESOS-EX"})
            answer = json.loads(body)
            assert status == 200 and answer["served_by"] == "scheduler"
            assert answer["path"] == "/v4/namespaces/ns/apps" and answer["query"] == "x=1"
            assert http_get(f"{server.url}/mesosdriver/v4/apps", headers={"BCS-ClusterID": "other"})[0] == 400
            assert http_get(f"{server.url}/healthz")[0] == 200
    finally:
        scheduler.stop()
    data = clone / "bcs-data"
    assert (data / "bcs.sqlite3").exists() and (data / "secret.key").exists()
    assert data.stat().st_mode & 0o077 == 0
    assert not (clone / "examples" / "bcs-data").exists()


def test_driver_ini_with_serve_config_keeps_its_state_in_the_banner_data_dir(clone: Path) -> None:
    """bcs-middleware serve --config examples/driver.ini --role driver: one data directory, the banner's."""
    port = free_port()
    argv = [str(BIN / "bcs-middleware"), "serve", "--config", "examples/driver.ini", "--role", "driver",
            "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with ServerProcess(argv, port=port, cwd=clone, env=_clean_env(), scheme="https", timeout=60) as server:
        data = clone / "bcs-data"
        assert http_get(f"https://localhost:{port}/healthz", cafile=str(data / "tls" / "ca.crt"))[0] == 200
    assert f"driver on https://127.0.0.1:{port}/  (data: {data})" in server.output()
    assert {"bcs.sqlite3", "secret.key", "tls"} <= {p.name for p in data.iterdir()}
    assert not (clone / "examples" / "bcs-data").exists()


def test_audited_gateway_ini_audits_refused_tunnel_requests(clone: Path) -> None:
    """gunicorn --paste examples/audited_gateway.ini -c examples/gunicorn.conf.py: events in bcs-data."""
    port = free_port()
    argv = [str(BIN / "gunicorn"), "--paste", "examples/audited_gateway.ini", "-c", "examples/gunicorn.conf.py",
            "--no-control-socket"]
    with ServerProcess(argv, port=port, cwd=clone, scheme="https", timeout=60,
                       env=_clean_env(BCS_BIND=f"127.0.0.1:{port}", BCS_WORKERS="1", BCS_THREADS="8")):
        data = clone / "bcs-data"
        cafile = str(data / "tls" / "ca.crt")
        admin = (data / "admin.token").read_text().strip()
        url = f"https://localhost:{port}/tunnels/clusters/BCS-K8S-NONE/api/v1/pods"
        assert http_get(url, headers={"X-Request-Id": "ex-audit-401"}, cafile=cafile)[0] == 401
        assert http_get(url, headers={"X-Request-Id": "ex-audit-404", "Authorization": f"Bearer {admin}"},
                        cafile=cafile)[0] == 404
        log = data / "audit.jsonl"

        def logged() -> list[dict]:
            return [json.loads(line) for line in (log.read_text() if log.exists() else "").split("\n")[:-1]]

        wait_until(lambda: len(logged()) >= 4, 10, step=0.1)
        events = logged()
    seen = [(e["auditID"], e["stage"], e["user"]["username"], e.get("responseStatus", {}).get("code"))
            for e in events]
    assert seen == [
        ("ex-audit-401", "RequestReceived", "system:anonymous", None),
        ("ex-audit-401", "ResponseComplete", "system:anonymous", 401),
        ("ex-audit-404", "RequestReceived", "admin", None),
        ("ex-audit-404", "ResponseComplete", "admin", 404),
    ]
    assert all(e["apiVersion"] == "audit.k8s.io/v1" and e["kind"] == "Event" for e in events)
    assert admin not in log.read_text() and log.stat().st_mode & 0o077 == 0
    assert not (clone / "examples" / "bcs-data").exists()


def test_kube_agent_manifest_is_valid_yaml() -> None:
    import yaml

    documents = list(yaml.safe_load_all((EXAMPLES / "kube-agent.yaml").read_text()))
    kinds = [d["kind"] for d in documents]
    assert kinds == ["Secret", "ServiceAccount", "ClusterRoleBinding", "Secret", "Deployment"]
    container = documents[-1]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["bcs-middleware", "kube-agent"]
    assert {e["name"] for e in container["env"]} == {"REGISTER_TOKEN", "SERVER_CERT"}



def test_the_readme_tour_runs_as_written(clone: Path, tmp_path: Path) -> None:
    """The README's REST tour, run by bash against `serve` in a fresh directory (port substituted)."""
    import re

    readme = (EXAMPLES.parent / "README.md").read_text()
    tour = readme.split("## A tour of the REST API", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    port = free_port()
    script = tour.replace("localhost:8443", f"localhost:{port}")
    home = tmp_path / "home"
    home.mkdir()
    argv = [str(BIN / "bcs-middleware"), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with ServerProcess(argv, port=port, cwd=clone, env=_clean_env(), scheme="https", timeout=60):
        result = subprocess.run(["bash", "-c", script], cwd=clone, env=_clean_env(HOME=str(home)),
                                capture_output=True, text=True, timeout=120)
    kubeconfig = home / ".kube" / "bcs-BCS-K8S-001.config"
    assert kubeconfig.exists(), result.stderr
    assert kubeconfig.stat().st_mode & 0o077 == 0  # it holds alice's token
    text = kubeconfig.read_text()
    assert text.startswith("# WARNING: cluster BCS-K8S-001 has no credentials yet")  # no agent in the tour
    assert re.search(r"token: \S{40,}", text)
    assert not (clone / "kubeconfig").exists()
    assert '"permission": "view"' in result.stdout and '"code_name"' not in result.stdout, result.stdout
    # The last line is kubectl, which says why the cluster cannot be reached yet.
    assert "has no credentials yet" in result.stderr


def test_the_readme_command_line_client_section_runs_as_written(clone: Path, tmp_path: Path) -> None:
    """README "Command-line client": every line by bash against `serve` in a fresh directory.

    Substituted: the port, ``<alice's token>`` (a token of alice's, made by the same CLI), and the
    user's own ``inject.yaml``/``sidecar.yaml`` are written first.
    """
    import yaml

    from tests.admission.conftest import bcs_definition, bcs_webhook, k8s_configuration, k8s_webhook

    readme = (EXAMPLES.parent / "README.md").read_text()
    block = readme.split("## Command-line client", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    port = free_port()
    block = block.replace("localhost:8443", f"localhost:{port}")
    made_token = ("$(bcs-middleware tokens create alice -o json | "
                  "python3 -c 'import json, sys; print(json.load(sys.stdin)[\"user_token\"])')")
    assert "<alice's token>" in block
    block = block.replace("<alice's token>", made_token)
    lines = block.strip().splitlines()
    assert lines[-1].startswith("kubectl --context bcs-BCS-K8S-001")
    hook_ca = trustme.CA()
    (clone / "inject.yaml").write_text(yaml.safe_dump(bcs_definition("inject", [bcs_webhook("inject.bcs", hook_ca)])))
    (clone / "sidecar.yaml").write_text(yaml.safe_dump(
        k8s_configuration("sidecar", [k8s_webhook("sidecar.example.com", "sidecar.bcs-system", hook_ca)])))
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(HOME=str(home), PATH=f"{BIN}:{os.environ['PATH']}")
    for key in [k for k in env if k.startswith(("BCS_", "KUBECONFIG", "XDG_"))]:
        env.pop(key)
    argv = [str(BIN / "bcs-middleware"), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with ServerProcess(argv, port=port, cwd=clone, env=_clean_env(), scheme="https", timeout=60):
        setup = subprocess.run(["bash", "-ec", "\n".join(lines[:-1])], cwd=clone, env=env,
                               capture_output=True, text=True, timeout=180)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        last = subprocess.run(["bash", "-c", "\n".join([*lines[:2], lines[-1]])], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=60)
    assert "BCS-K8S-001" in setup.stdout and "alice" in setup.stdout
    kubeconfig = yaml.safe_load((home / ".kube" / "config").read_text())
    assert [c["name"] for c in kubeconfig["contexts"]] == ["bcs-BCS-K8S-001"]
    assert (home / ".kube" / "config").stat().st_mode & 0o077 == 0
    assert (home / ".config" / "bcs-middleware" / "config.json").stat().st_mode & 0o077 == 0
    # No kube-agent in this run: kubectl reaches the gateway, which says why the cluster cannot serve yet.
    assert last.returncode != 0 and "has no credentials yet" in last.stderr, last.stderr


def test_the_readme_certs_line_prints_a_serve_line_that_serves(clone: Path) -> None:
    """README: `certs --gateway --host … --out …` prints the `serve --certfile … --keyfile … --ca-file …` line."""
    made = subprocess.run([str(BIN / "bcs-middleware"), "certs", "--gateway", "--host", "localhost,127.0.0.1",
                           "--out", "tls"], cwd=clone, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    line = next(x.strip() for x in made.stdout.splitlines() if x.strip().startswith("bcs-middleware serve "))
    words = line.split()
    assert words[2:] == ["--certfile", f"{clone}/tls/server.crt", "--keyfile", f"{clone}/tls/server.key",
                         "--ca-file", f"{clone}/tls/ca.crt"], line
    port = free_port()
    argv = [str(BIN / "bcs-middleware"), *words[1:], "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with ServerProcess(argv, port=port, cwd=clone, env=_clean_env(BCS_ADMIN_TOKEN=ADMIN), scheme="https",
                       timeout=60):
        cafile = str(clone / "tls" / "ca.crt")
        auth = {"Authorization": f"Bearer {ADMIN}"}
        assert http_get(f"https://localhost:{port}/healthz", cafile=cafile)[0] == 200
        _create_cluster(port, auth, cafile)
        status, _, body = http_get(f"https://localhost:{port}/rest/clusters/BCS-K8S-EX/client_credentials",
                                   headers=auth, cafile=cafile)
        assert status == 200 and json.loads(body)["cacert_data"] == (clone / "tls" / "ca.crt").read_text()
    assert not (clone / "bcs-data" / "tls").exists()  # the named certificate, not a generated one


def test_the_readme_key_rotation_keygen_then_new_and_old_keys(tmp_path: Path) -> None:
    """README: BCS_SECRET_KEY from `keygen`; "NEW,OLD" rotates: the first encrypts, all decrypt."""
    from tests.support.fake_apiserver import FakeAPIServer
    from tests.support.gateway import SA_TOKEN, register_cluster, served_gateway, write_kubeconfig

    def keygen() -> str:
        return subprocess.run([str(BIN / "bcs-middleware"), "keygen"], capture_output=True, text=True,
                              check=True, timeout=60).stdout.strip()

    old, new = keygen(), keygen()
    assert old != new and Fernet(old.encode()) and Fernet(new.encode())
    data = tmp_path / "data"
    path = "/tunnels/clusters/BCS-K8S-ROT/api/v1/namespaces/default/pods"
    with FakeAPIServer(token=SA_TOKEN) as api:
        with served_gateway(data, env={"BCS_SECRET_KEY": old}, workers=1) as gw:
            register_token = register_cluster(gw, "BCS-K8S-ROT", server_url=api.url, ca_pem=api.ca_pem)
            assert gw.call("GET", path)[0] == 200
        with served_gateway(data, env={"BCS_SECRET_KEY": f"{new},{old}"}, workers=1) as gw:
            assert gw.call("GET", path)[0] == 200  # the old key still decrypts
            # The agent reports again: the credential is now encrypted with the new key.
            kubeconfig = tmp_path / "agent.kubeconfig"
            write_kubeconfig(kubeconfig, server=api.url, token=SA_TOKEN, ca_pem=api.ca_pem)
            agent = subprocess.run(
                [str(BIN / "bcs-middleware"), "kube-agent", "--bke-address", gw.url, "--cluster-id", "BCS-K8S-ROT",
                 "--kubeconfig", str(kubeconfig), "--once"],
                env={**os.environ, "REGISTER_TOKEN": register_token, "SERVER_CERT": Path(gw.ca_file).read_text()},
                capture_output=True, text=True, timeout=60)
            assert agent.returncode == 0, agent.stderr
        with served_gateway(data, env={"BCS_SECRET_KEY": new}, workers=1) as gw:
            assert gw.call("GET", path)[0] == 200  # the old key is gone: everything reads with the new one
