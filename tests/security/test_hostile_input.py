"""Hostile input costs nothing: attacks on a real ``bcs-middleware serve`` (gunicorn, HTTPS).

One gateway in front of a fake apiserver (a registered Kubernetes cluster with a Kubernetes
webhook on pods), a fake Mesos driver (``--static-driver``) and a bcs definition on Applications.
Each attack checks the answer (a 4xx naming the limit, never a 500 or a traceback) and that
nothing reached an upstream. Bootstrap-token, file-mode and terminal tests start their own.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import signal
import ssl
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families
from webhook_kit import https_server

from bcs_middleware.admission.definitions import parse_bcs_definition
from bcs_middleware.core.bodies import MAX_DEPTH
from bcs_middleware.store.definitions import SQLDefinitionStore
from bcs_middleware.store.sql import open_store
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.fake_scheduler import FakeScheduler
from tests.support.gateway import (
    CLI,
    CLUSTER,
    SA_TOKEN,
    Gateway,
    register_cluster,
    served_gateway,
    short_admission_refresh,
    wait_out_admission_refresh,
)
from tests.support.servers import ServerProcess, free_port, wait_for_port

MESOS = "BCS-MESOS-H01"
PODS = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods"
MESOS_APPS = "/bcsapi/v4/scheduler/mesos/namespaces/prod/applications"
JSON = {"Content-Type": "application/json"}
DEEP = 5000  # far past MAX_DEPTH, and past what Python's recursive parsers survive


def _deep_json(depth: int = DEEP) -> bytes:
    return b"[" * depth + b"]" * depth


def _review_answer(uid: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": True}}


def _webhook(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """Allows every pod, except that ``deep-answer`` gets an answer nested 5000 deep."""
    review = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
    request = review["request"]
    if request["object"]["metadata"]["name"] == "deep-answer":
        payload = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":'
                   + json.dumps(request["uid"]).encode() + b',"allowed":true,"x":' + _deep_json() + b"}}")
    else:
        payload = json.dumps(_review_answer(request["uid"])).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
    return [payload]


class Stack:
    def __init__(self, gw: Gateway, api: FakeAPIServer, driver: FakeScheduler) -> None:
        self.gw, self.api, self.driver = gw, api, driver


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("hostile")
    ca = trustme.CA()
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(tmp / "hook.pem"))
    hook = https_server(_webhook, str(tmp / "hook.pem"), str(tmp / "hook.pem"), port=0)
    threading.Thread(target=hook.serve_forever, args=(0.05,), daemon=True).start()
    driver = FakeScheduler("driver")
    try:
        with FakeAPIServer(token=SA_TOKEN) as api, served_gateway(
            tmp / "gateway", args=short_admission_refresh(tmp / "gateway", static_drivers=f"{MESOS} = {driver.url}"),
        ) as gw:
            register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
            bundle = base64.b64encode(ca.cert_pem.bytes()).decode()
            status, body = gw.call("POST", f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations", body={
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "pods"},
                "webhooks": [{"name": "pods.example.com",
                              "clientConfig": {"url": f"https://localhost:{hook.server_port}/", "caBundle": bundle},
                              "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                                         "apiVersions": ["v1"], "resources": ["pods"]}],
                              "failurePolicy": "Fail", "sideEffects": "None",
                              "admissionReviewVersions": ["v1"], "timeoutSeconds": 5}],
            })
            assert status == 201, body
            status, body = gw.call("POST", "/rest/admissionwebhooks", body={
                "apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": "apps"},
                "resourcesRef": {"operation": "Create", "kind": "Application"},
                "admissionWebhooks": [{"name": "h", "failurePolicy": "Ignore",
                                       "clientConfig": {"caBundle": bundle, "namespace": "ns", "name": "svc"}}],
            })
            assert status == 201, body
            wait_out_admission_refresh()  # every worker has both
            yield Stack(gw, api, driver)
    finally:
        driver.stop()
        hook.shutdown()
        hook.server_close()


def _error(body: bytes) -> tuple[str, str]:
    """``(code, message)`` of an API error, a Kubernetes Status or a bcs envelope (Mesos paths:
    its bk-bcs error number); fails on anything else (HTML)."""
    document = json.loads(body)
    if document.get("kind") == "Status":
        return document["details"]["causes"][0]["reason"], document["message"]
    if "result" in document:
        assert document["result"] is False and document["data"] is None
        return str(document["code"]), document["message"]
    return document["code_name"], document["message"]


YAML_TO_JSON_FAILED = "1405065"  # bk-bcs BcsErrApiMediaTypeError: "request yaml convert to json error"
BAD_PARAMETERS = "1405007"  # bk-bcs BcsErrCommHttpParametersFailed


# -- JSON nesting ------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "content_type", "body", "expected"), [
    pytest.param("POST", "/rest/users/", "application/json", _deep_json(), "BODY_TOO_DEEP",
                 id="management-api"),
    pytest.param("POST", "/rest/users/", "application/json", b'{"user_name":' + _deep_json() + b"}",
                 "BODY_TOO_DEEP", id="management-api-inside-object"),
    pytest.param("POST", "/rest/clusters/bcs", "application/json", b"{" + b'"a":{' * DEEP + b"}" * (DEEP + 1),
                 "BODY_TOO_DEEP", id="management-api-objects"),
    pytest.param("POST", "/rest/admissionwebhooks", "application/json", _deep_json(), "BODY_TOO_DEEP",
                 id="definitions-api"),
    pytest.param("POST", "/rest/admission/review", "application/json", _deep_json(), "BODY_TOO_DEEP",
                 id="dry-run-review-api"),
    pytest.param("POST", PODS, "application/json",
                 b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"deep"},"spec":' + _deep_json() + b"}",
                 "BODY_TOO_DEEP", id="tunnel-admission-create"),
    pytest.param("PUT", f"{PODS}/deep", "application/json",
                 b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"deep"},"x":' + _deep_json() + b"}",
                 "BODY_TOO_DEEP", id="tunnel-admission-update"),
    pytest.param("POST", MESOS_APPS, "application/x-yaml", b"[" * DEEP, YAML_TO_JSON_FAILED,
                 id="mesos-yaml-flow"),
    pytest.param("POST", MESOS_APPS, "application/x-yaml",
                 "".join(f"{' ' * i}a:\n" for i in range(300)).encode() + b" " * 300 + b"a: 1\n",
                 YAML_TO_JSON_FAILED, id="mesos-yaml-block"),
])
def test_deeply_nested_bodies_are_a_400_naming_the_limit(
    stack: Stack, method: str, path: str, content_type: str, body: bytes, expected: str
) -> None:
    before_api, before_driver = len(stack.api.requests), len(stack.driver.requests)
    status, answer = stack.gw.call(method, path, body=body,
                                   headers={"Content-Type": content_type, "BCS-ClusterID": MESOS})
    assert status == 400, answer[:300]
    code, message = _error(answer)
    assert code == expected and f"{MAX_DEPTH} levels" in message, message
    assert len(stack.driver.requests) == before_driver
    assert not [r for r in stack.api.requests.snapshot()[before_api:] if r.method != "GET"]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str, FakeScheduler]]:
    """``serve --role driver`` with a bcs definition on Applications, in front of a fake scheduler."""
    data = tmp_path_factory.mktemp("driver")
    bundle = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    store = open_store(data_dir=data)
    SQLDefinitionStore(store).put_bcs(parse_bcs_definition({
        "apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": "apps"},
        "resourcesRef": {"operation": "Create", "kind": "Application"},
        "admissionWebhooks": [{"name": "h", "failurePolicy": "Ignore",
                               "clientConfig": {"caBundle": bundle, "namespace": "ns", "name": "svc"}}],
    }))
    store.db.dispose()
    scheduler = FakeScheduler("scheduler")
    port = free_port()
    try:
        with ServerProcess([CLI, "serve", "--role", "driver", "--cluster-id", MESOS, "--scheduler", scheduler.url,
                            "--data-dir", str(data), "--bind", f"127.0.0.1:{port}", "--workers", "2",
                            "--threads", "4", "--graceful-timeout", "3"],
                           port=port, scheme="https", timeout=60) as server:
            yield server, str(data / "tls" / "ca.crt"), scheduler
    finally:
        scheduler.stop()


@pytest.mark.parametrize(("content_type", "body"), [
    pytest.param("application/json",
                 b'{"kind":"Application","metadata":{"name":"a"},"spec":' + _deep_json() + b"}", id="json"),
    pytest.param("application/x-yaml", b"kind: Application\nspec: " + b"[" * DEEP, id="yaml"),
])
def test_the_driver_refuses_deep_bodies_it_admits(
    driver: tuple[ServerProcess, str, FakeScheduler], content_type: str, body: bytes
) -> None:
    server, cafile, scheduler = driver
    request = urllib.request.Request(f"https://localhost:{server.port}/mesosdriver/v4/namespaces/prod/applications",
                                     data=body, method="POST",
                                     headers={"BCS-ClusterID": MESOS, "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=20, context=ssl.create_default_context(cafile=cafile)) as resp:
            status, answer = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, answer = err.code, err.read()
    assert status == 400, answer[:300]
    code, message = _error(answer)
    assert code == BAD_PARAMETERS and f"{MAX_DEPTH} levels" in message
    assert not scheduler.requests


def test_a_webhook_answer_nested_too_deep_is_a_webhook_failure_not_a_crash(stack: Stack) -> None:
    before = len(stack.api.requests)
    status, answer = stack.gw.call("POST", PODS, body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "deep-answer"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}, headers=JSON)
    assert status == 500, answer[:300]
    code, message = _error(answer)  # a Kubernetes Status, not gunicorn's HTML page
    assert code == "ADMISSION_WEBHOOK_FAILED"
    assert 'failed calling webhook "pods.example.com"' in message and f"{MAX_DEPTH} levels" in message
    assert not [r for r in stack.api.requests.snapshot()[before:] if r.method == "POST"]


def test_ordinary_nesting_still_passes(stack: Stack) -> None:
    nested: Any = "leaf"
    for _ in range(MAX_DEPTH - 10):
        nested = {"n": nested}
    status, answer = stack.gw.call("POST", PODS, body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nested-ok", "annotations": {}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}], "x": nested}}, headers=JSON)
    assert status == 201, answer[:300]


# -- YAML aliases ------------------------------------------------------------------------------


def _alias_bomb(levels: int = 6, width: int = 9) -> bytes:
    """A few hundred bytes that expand to ``width ** levels`` strings (6 x 9: 531441, ~3 MB of JSON)."""
    lines = ['a0: &a0 ["xxxx"' + ', "xxxx"' * (width - 1) + "]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("body", [
    pytest.param(_alias_bomb(), id="nested-aliases"),
    pytest.param(b"base: &b {kind: application}\napp:\n  <<: *b\n", id="merge-key"),
    pytest.param(b"- &x [1]\n- *x\n", id="single-alias"),
])
def test_yaml_aliases_are_refused_before_anything_reaches_the_driver(stack: Stack, body: bytes) -> None:
    assert len(body) < 400
    before = len(stack.driver.requests)
    status, answer = stack.gw.call("POST", MESOS_APPS, body=body,
                                   headers={"Content-Type": "application/x-yaml", "BCS-ClusterID": MESOS})
    assert status == 400, answer[:300]
    code, message = _error(answer)
    assert code == YAML_TO_JSON_FAILED and "alias" in message
    assert len(stack.driver.requests) == before


def test_plain_yaml_still_reaches_the_driver_as_json(stack: Stack) -> None:
    status, answer = stack.gw.call("POST", MESOS_APPS, body=b"kind: deployment\nspec: {replicas: 2}\n",
                                   headers={"Content-Type": "application/x-yaml", "BCS-ClusterID": MESOS})
    assert status == 200, answer[:300]
    assert stack.driver.requests[-1].json() == {"kind": "deployment", "spec": {"replicas": 2}}


# -- metric labels -----------------------------------------------------------------------------


def _request_series(gw: Gateway) -> set[tuple[tuple[str, str], ...]]:
    status, text = gw.call("GET", "/metrics")
    assert status == 200
    series = set()
    for family in text_string_to_metric_families(text.decode()):
        if family.name in ("bcs_api_request_count", "bcs_api_request_latency_seconds"):
            for sample in family.samples:
                series.add((("__name__", sample.name), *sorted(sample.labels.items())))
    return series


def test_invented_methods_paths_and_clusters_add_no_metric_series(stack: Stack) -> None:
    gw = stack.gw
    # Every route kind, known method and code an anonymous client can reach, counted once first.
    def anonymous_round(method_of: Callable[[int], str], i: int) -> None:
        gw.call(method_of(i), f"/rest/invented-{i}", token="")
        gw.call(method_of(i), f"/tunnels/clusters/NO-SUCH-{i}/api/v1/pods", token="")
        gw.call(method_of(i), f"/bcsapi/v4/scheduler/mesos/x{i}", token="", headers={"BCS-ClusterID": f"M-{i}"})
        gw.call(method_of(i), f"/totally/else/{i}", token="")

    for i in range(2):
        anonymous_round(lambda _: "GET", i)
        anonymous_round(lambda _: "FOO", i)
    deadline = time.monotonic() + 10
    baseline = _request_series(gw)
    while time.monotonic() < deadline:  # the other worker's batch may still be on its way
        time.sleep(0.5)
        again = _request_series(gw)
        if again == baseline:
            break
        baseline = again
    for i in range(40):
        anonymous_round(lambda n: f"X{n}INVENTED", i)
    time.sleep(1.0)  # > the batch period (0.25 s) of both workers
    after = _request_series(gw)
    for _ in range(4):  # /metrics flushes its own worker; the other one applies within 0.25 s
        time.sleep(0.5)
        after |= _request_series(gw)
    added = after - baseline
    assert not added, sorted(added)[:5]
    methods = {dict(s).get("method") for s in after} - {None}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "other"}
    clusters = {dict(s).get("cluster") for s in after} - {None}
    assert clusters <= {"", CLUSTER, MESOS}


# -- identity and forwarding headers ------------------------------------------------------------

_IDENTITY = {
    "X-Remote-User": "system:admin",
    "x-remote-group": "system:masters",
    "X-REMOTE-EXTRA-Scopes": "all",
    "X-Remote-Uid": "0",
    "X-Auth-Request-User": "root",
    "Remote-User": "root",
    "X-Forwarded-User": "root",
}


def test_front_proxy_identity_headers_never_reach_the_apiserver(stack: Stack) -> None:
    alice = stack.gw.user("alice-hostile")
    stack.gw.grant("alice-hostile")
    for token in (None, alice):  # the superuser (no impersonation) and an impersonated user
        stack.api.requests.clear()
        status, _ = stack.gw.call("GET", PODS, token=token, headers=_IDENTITY)
        assert status in (200, 403)
        seen = stack.api.requests.last("/api/v1/namespaces/default/pods")
        assert seen is not None
        for name in _IDENTITY:
            assert seen.headers.get(name) is None, name
        assert all(v not in ("system:admin", "system:masters", "root") for _, v in seen.headers.items())


@pytest.mark.parametrize("name", ["Impersonate-Uid", "impersonate-user", "IMPERSONATE-GROUP",
                                  "Impersonate-Extra-Scopes", "impersonate-extra-a%2Fb"])
def test_every_client_impersonation_header_is_refused(stack: Stack, name: str) -> None:
    stack.api.requests.clear()
    status, answer = stack.gw.call("GET", PODS, headers={name: "system:admin"})
    assert status == 403 and _error(answer)[0] == "IMPERSONATION_REFUSED"
    assert not stack.api.requests.matching("/api/v1/namespaces/default/pods")


def test_an_underscore_spelling_never_reaches_the_apiserver(stack: Stack) -> None:
    alice = stack.gw.user("alice-underscore")
    stack.gw.grant("alice-underscore")
    stack.api.requests.clear()
    status, _ = stack.gw.call("GET", PODS, token=alice,
                              headers={"Impersonate_User": "system:admin", "X_Remote_User": "system:admin"})
    assert status in (200, 403)  # gunicorn drops field names with "_" (WSGI would merge them)
    seen = stack.api.requests.last("/api/v1/namespaces/default/pods")
    assert seen is not None
    assert seen.headers.getlist("Impersonate-User") == ["alice-underscore"]
    assert seen.headers.get("X-Remote-User") is None


def test_forwarding_headers_from_a_client_are_not_believed(stack: Stack) -> None:
    spoof = {"X-Forwarded-Proto": "http", "X-Forwarded-Host": "evil.example", "X-Forwarded-For": "10.6.6.6",
             "X-Forwarded-Ssl": "off"}
    status, body = stack.gw.call("GET", f"/rest/clusters/{CLUSTER}/client_credentials", headers=spoof)
    assert status == 200, body
    assert json.loads(body)["server_address"].startswith(f"https://localhost:{stack.gw.server.port}/")
    stack.api.requests.clear()
    assert stack.gw.call("GET", PODS, headers=spoof)[0] == 200
    seen = stack.api.requests.last("/api/v1/namespaces/default/pods")
    assert seen is not None
    assert seen.headers.get("X-Forwarded-Proto") == "https"
    assert seen.headers.get("X-Forwarded-Host") == f"localhost:{stack.gw.server.port}"
    assert seen.headers.get("X-Forwarded-For") == "127.0.0.1"


def test_a_script_name_header_does_not_move_the_path(stack: Stack) -> None:
    # gunicorn takes SCRIPT_NAME from a header of a trusted forwarder (by default 127.0.0.1).
    status, body = stack.gw.call("GET", "/rest/users/admin", headers={"SCRIPT_NAME": "/rest"})
    assert status == 200 and json.loads(body)["is_super_user"] is True


# -- bootstrap tokens, the generated admin token and file modes ----------------------------------


def test_a_changed_bootstrap_token_is_refused_and_only_a_rotation_replaces_it(tmp_path: Path) -> None:
    """A start never replaces the bootstrap token (another instance's operator may hold it): a
    different one is refused; `rotate-admin-token` replaces it, and a start never brings it back."""
    old, new = "bootstrap-old-" + "o" * 32, "bootstrap-new-" + "n" * 32

    def start(token: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLI, "serve", "--data-dir", str(tmp_path), "--bind", f"127.0.0.1:{free_port()}",
                               "--workers", "1"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "BCS_ADMIN_TOKEN": token})

    with served_gateway(tmp_path, env={"BCS_ADMIN_TOKEN": old}) as gw:
        assert gw.call("GET", "/rest/users/admin", token=old)[0] == 200
    refused = start(new)
    assert refused.returncode == 2 and "bcs-middleware rotate-admin-token" in refused.stderr
    assert new not in refused.stderr + refused.stdout and old not in refused.stderr + refused.stdout
    rotated = subprocess.run([CLI, "rotate-admin-token", "--data-dir", str(tmp_path)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "BCS_ADMIN_TOKEN": new})
    assert rotated.returncode == 0, rotated.stderr
    with served_gateway(tmp_path, env={"BCS_ADMIN_TOKEN": new}) as gw:
        assert gw.call("GET", "/rest/users/admin", token=new)[0] == 200
        assert gw.call("GET", "/rest/users/admin", token=old)[0] == 401
    refused = start(old)  # and not back again by a restart
    assert refused.returncode == 2 and "was revoked" in refused.stderr


_PRIVATE = ("bcs.sqlite3", "bcs.sqlite3-wal", "bcs.sqlite3-shm", "secret.key", "admin.token")


def _modes(data: Path) -> dict[str, int]:
    modes = {name: stat.S_IMODE((data / name).stat().st_mode) for name in _PRIVATE if (data / name).exists()}
    modes["."] = stat.S_IMODE(data.stat().st_mode)
    return modes


def test_generated_admin_token_is_not_printed_without_a_terminal_and_files_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served_gateway(data, env={"BCS_ADMIN_TOKEN": ""}) as gw:
        token = (data / "admin.token").read_text().strip()
        assert gw.call("GET", "/rest/users/admin", token=token)[0] == 200
        fresh = _modes(data)
    output = gw.server.output()
    assert token not in output
    assert str(data / "admin.token") in output
    assert set(fresh) == {".", *_PRIVATE}, fresh
    assert fresh == {".": 0o700, **dict.fromkeys(_PRIVATE, 0o600)}
    # Left readable by others (an older version, a restored backup): tightened at the next start.
    for name in (".", "bcs.sqlite3", "secret.key", "admin.token", "bcs.sqlite3-wal", "bcs.sqlite3-shm"):
        if (data / name).exists():
            (data / name).chmod(0o755 if name == "." else 0o644)
    with served_gateway(data, env={"BCS_ADMIN_TOKEN": ""}) as gw:
        assert gw.call("GET", "/rest/users/admin", token=token)[0] == 200
        again = _modes(data)
    assert all(mode == (0o700 if name == "." else 0o600) for name, mode in again.items()), again
    assert token not in gw.server.output()


def test_generated_admin_token_is_shown_on_a_terminal_and_never_on_stdout(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    stdout = tmp_path / "stdout.log"
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "BCS_ADMIN_TOKEN"}
    with open(stdout, "wb") as out:
        proc = subprocess.Popen(
            [CLI, "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}", "--workers", "1",
             "--threads", "4", "--graceful-timeout", "3"],
            stdout=out, stderr=slave, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    os.close(slave)
    terminal = b""
    try:
        wait_for_port("127.0.0.1", port, 60, proc)
        token = (data / "admin.token").read_text().strip()
        deadline = time.monotonic() + 10
        while token.encode() not in terminal and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    terminal += os.read(master, 65536)
                except OSError:
                    break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
        os.close(master)
    assert token.encode() in terminal
    assert token not in stdout.read_text()
