"""Kubernetes audit events (audit.k8s.io/v1 Event) for tunnel requests, through a real serve.

Every event is checked against the Event schema's fields and types; a watch shows its
stages, an exec session its start and end with duration and bytes, and no event ever
carries a token.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import ADMIN, CLUSTER, SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import wait_for

from .test_upgrade import BANNER, Handlers, upgrade

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
STAGES = {"RequestReceived", "ResponseStarted", "ResponseComplete", "Panic"}
LEVELS = {"Metadata", "Request", "RequestResponse"}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
POLICY = """
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: None
    nonResourceURLs: ["/version"]
  - level: RequestResponse
    resources: [{group: "", resources: ["configmaps", "secrets"]}]
    verbs: [create]
  - level: Metadata
    omitStages: []
"""


def validate(event: dict[str, Any]) -> None:
    """The audit.k8s.io/v1 Event: required fields, and the types of those present."""
    assert event["kind"] == "Event" and event["apiVersion"] == "audit.k8s.io/v1"
    for key in ("level", "auditID", "stage", "requestURI", "verb", "user", "requestReceivedTimestamp",
                "stageTimestamp"):
        assert key in event, key
    assert event["level"] in LEVELS and event["stage"] in STAGES
    assert isinstance(event["auditID"], str) and event["auditID"]
    assert isinstance(event["requestURI"], str) and isinstance(event["verb"], str)
    assert isinstance(event["user"]["username"], str)
    assert all(isinstance(g, str) for g in event["user"].get("groups", []))
    assert TIMESTAMP.match(event["requestReceivedTimestamp"]) and TIMESTAMP.match(event["stageTimestamp"])
    assert all(isinstance(ip, str) for ip in event.get("sourceIPs", []))
    if "impersonatedUser" in event:
        assert isinstance(event["impersonatedUser"]["username"], str)
    if "objectRef" in event:
        allowed = {"resource", "namespace", "name", "apiGroup", "apiVersion", "subresource", "uid",
                   "resourceVersion"}
        assert set(event["objectRef"]) <= allowed
        assert all(isinstance(v, str) for v in event["objectRef"].values())
    if "responseStatus" in event:
        assert isinstance(event["responseStatus"]["code"], int)
    if "annotations" in event:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in event["annotations"].items())
    assert set(event) <= {"kind", "apiVersion", "level", "auditID", "stage", "requestURI", "verb", "user",
                          "impersonatedUser", "sourceIPs", "userAgent", "objectRef", "responseStatus",
                          "requestObject", "responseObject", "requestReceivedTimestamp", "stageTimestamp",
                          "annotations"}


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gw(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("audit-gw")
    policy = data / "policy.yaml"
    policy.write_text(POLICY)
    with served_gateway(data, args=["--audit-log", str(data / "audit.jsonl"), "--audit-policy", str(policy)],
                        workers=1) as gateway:
        register_cluster(gateway, CLUSTER, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
        yield gateway


@pytest.fixture(scope="module")
def handlers(apiserver: FakeAPIServer) -> Iterator[Handlers]:
    apiserver.create("pods", {"metadata": {"name": "p", "namespace": "default"},
                              "spec": {"containers": [{"name": "app", "image": "busybox"}]}}, "default")
    h = Handlers(apiserver)
    apiserver.on_upgrade(h)
    yield h
    apiserver.on_upgrade(None)


@pytest.fixture(scope="module")
def bob(gw: Gateway) -> str:
    token = gw.user("bob-audit")
    gw.grant("bob-audit")
    return token


def events(gw: Gateway, audit_id: str, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    """The events of one request (by X-Request-Id), once ``count`` are written."""
    path = gw.data / "audit.jsonl"
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        complete_lines = text.split("\n")[:-1]  # the writer may be mid-line
        found = [json.loads(line) for line in complete_lines if audit_id in line]
        found = [e for e in found if e["auditID"] == audit_id]
        if len(found) >= count or time.monotonic() > deadline:
            for event in found:
                validate(event)
            assert SA_TOKEN not in text and ADMIN not in text
            return found


def test_a_list_is_two_metadata_events_with_user_impersonation_and_object(gw: Gateway, bob: str) -> None:
    status, _ = gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods?limit=5",
                        token=bob, headers={"X-Request-Id": "audit-list-1", "User-Agent": "kubectl/v1.32"})
    assert status == 200
    received, complete = events(gw, "audit-list-1", 2)
    assert (received["stage"], complete["stage"]) == ("RequestReceived", "ResponseComplete")
    assert complete["level"] == "Metadata" and complete["verb"] == "list"
    assert complete["requestURI"] == "/api/v1/namespaces/default/pods?limit=5"
    assert complete["user"]["username"] == "bob-audit"
    assert complete["impersonatedUser"]["username"] == "bob-audit"
    assert complete["objectRef"] == {"resource": "pods", "namespace": "default", "apiVersion": "v1"}
    assert complete["responseStatus"]["code"] == 200 and "responseStatus" not in received
    assert complete["userAgent"] == "kubectl/v1.32" and complete["sourceIPs"] == ["127.0.0.1"]
    assert complete["annotations"]["bcs-middleware/cluster"] == CLUSTER
    assert "requestObject" not in complete and "responseObject" not in complete


def test_policy_levels_bodies_and_none(gw: Gateway, bob: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "audited", "namespace": "default"},
          "data": {"k": "v"}}
    status, _ = gw.call("POST", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/configmaps",
                        body=cm, headers={"X-Request-Id": "audit-create-1", "Content-Type": "application/json"})
    assert status == 201
    complete = events(gw, "audit-create-1", 2)[-1]
    assert complete["level"] == "RequestResponse" and complete["verb"] == "create"
    assert complete["requestObject"]["data"] == {"k": "v"}
    assert complete["responseObject"]["metadata"]["name"] == "audited"
    assert "impersonatedUser" not in complete  # the admin is not impersonated
    # A non-resource URL the policy sets to None: no event.
    gw.call("GET", f"/tunnels/clusters/{CLUSTER}/version", headers={"X-Request-Id": "audit-version-1"})
    gw.call("DELETE", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/configmaps",
            headers={"X-Request-Id": "audit-delcol-1"})
    assert events(gw, "audit-delcol-1", 2)[-1]["verb"] == "deletecollection"
    assert events(gw, "audit-version-1", 1, timeout=1) == []


def test_a_watch_has_received_started_and_complete_stages(gw: Gateway, bob: str, apiserver: FakeAPIServer) -> None:
    raw = socket.create_connection(("127.0.0.1", gw.server.port), timeout=10)
    sock = ssl.create_default_context(cafile=gw.ca_file).wrap_socket(raw, server_hostname="localhost")
    sock.sendall(
        f"GET /tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1 HTTP/1.1\r\n"
        f"Host: localhost\r\nAuthorization: Bearer {bob}\r\nX-Request-Id: audit-watch-1\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    started = events(gw, "audit-watch-1", 2)
    assert [e["stage"] for e in started] == ["RequestReceived", "ResponseStarted"]
    assert started[1]["verb"] == "watch" and started[1]["responseStatus"]["code"] == 200
    deadline = time.monotonic() + 10
    while sock.recv(65536) and time.monotonic() < deadline:
        pass  # until the watch's timeoutSeconds ends it
    sock.close()
    stages = [e["stage"] for e in events(gw, "audit-watch-1", 3)]
    assert stages == ["RequestReceived", "ResponseStarted", "ResponseComplete"]


def test_an_exec_session_has_a_start_and_an_end_with_duration_and_bytes(
    gw: Gateway, bob: str, handlers: Handlers,
) -> None:
    handlers.mode = "echo"
    conn = upgrade(gw, bob, extra={"X-Request-Id": "audit-exec-1"})
    try:
        assert conn.status == 101
        assert conn.read_exactly(len(BANNER)) == BANNER
        start = events(gw, "audit-exec-1", 2)[-1]
        assert start["stage"] == "ResponseStarted" and start["responseStatus"]["code"] == 101
        assert start["objectRef"]["subresource"] == "exec" and start["verb"] == "create"
        conn.sock.sendall(b"x" * 1000)
        assert conn.read_exactly(1000) == b"x" * 1000
        time.sleep(0.3)  # the sleep is the test: the session lasts at least this long, and says so
    finally:
        conn.sock.close()
    end = events(gw, "audit-exec-1", 3)[-1]
    assert end["stage"] == "ResponseComplete"
    notes = end["annotations"]
    assert float(notes["bcs-middleware/session-seconds"]) >= 0.3
    assert int(notes["bcs-middleware/bytes-to-upstream"]) >= 1000
    assert int(notes["bcs-middleware/bytes-to-client"]) >= 1000 + len(BANNER)


def test_no_token_in_the_request_uri(gw: Gateway, bob: str) -> None:
    gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods?access_token=SECRET123&limit=1",
            token=bob, headers={"X-Request-Id": "audit-token-1"})
    complete = events(gw, "audit-token-1", 2)[-1]
    assert "SECRET123" not in json.dumps(complete) and complete["requestURI"].endswith("?limit=1")


def test_a_secret_is_never_written_whatever_the_policy(gw: Gateway) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1", "namespace": "default"},
              "stringData": {"password": "hunter2-in-a-body"}}
    status, _ = gw.call("POST", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/secrets",
                        body=secret, headers={"X-Request-Id": "audit-secret-1", "Content-Type": "application/json"})
    assert status == 201
    complete = events(gw, "audit-secret-1", 2)[-1]
    assert complete["level"] == "Metadata" and complete["objectRef"]["resource"] == "secrets"
    assert "hunter2" not in (gw.data / "audit.jsonl").read_text()


def test_policy_errors_are_clear(tmp_path: Path) -> None:
    from bcs_middleware.audit.policy import parse_policy
    from bcs_middleware.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"rules\[0\].level"):
        parse_policy({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Everything"}]})
    with pytest.raises(ConfigError, match="unknown stage"):
        parse_policy({"rules": [{"level": "Metadata", "omitStages": ["Later"]}]})


def _in_process(app: Any, policy: Any = None) -> tuple[Any, Any]:
    import io

    from werkzeug.test import Client

    from bcs_middleware.audit.policy import DEFAULT_POLICY
    from bcs_middleware.layers.audit import AuditMiddleware, AuditSink

    stream = io.StringIO()
    sink = AuditSink(stream)
    return Client(AuditMiddleware(app, sink=sink, policy=policy or DEFAULT_POLICY)), (sink, stream)


def _written(out: tuple[Any, Any]) -> list[dict[str, Any]]:
    sink, stream = out
    sink.drain()
    found = [json.loads(line) for line in stream.getvalue().splitlines()]
    for event in found:
        validate(event)
    return found


def test_admission_audit_annotations_reach_the_event() -> None:
    from bcs_middleware.core import environ as env

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        environ[env.USER] = env.User(7, "carol", groups=("dev",))
        environ[env.ADMISSION] = env.AdmissionResult(
            webhooks=("inject",), audit_annotations=(("inject.example.com/sidecar", "added"),))
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b"{}"]

    client, out = _in_process(app)
    client.post("/tunnels/clusters/C/apis/apps/v1/namespaces/n/deployments", data=b"{}",
                headers={"Content-Type": "application/json"}).close()
    complete = _written(out)[-1]
    assert complete["annotations"]["inject.example.com/sidecar"] == "added"
    assert complete["verb"] == "create"
    assert complete["objectRef"] == {"resource": "deployments", "namespace": "n", "apiGroup": "apps",
                                     "apiVersion": "v1"}


def test_an_unexpected_failure_is_a_panic_event() -> None:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        raise RuntimeError("bug")

    client, out = _in_process(app)
    with pytest.raises(RuntimeError):
        client.get("/tunnels/clusters/C/api/v1/pods")
    stages = [(e["stage"], e.get("responseStatus", {}).get("code")) for e in _written(out)]
    assert stages == [("RequestReceived", None), ("Panic", 500)]


@pytest.mark.parametrize("method, path, query, verb", [
    ("GET", "/api/v1/namespaces/n/pods/p", "", "get"),
    ("GET", "/api/v1/namespaces/n/pods", "", "list"),
    ("GET", "/api/v1/namespaces/n/pods", "watch=1", "watch"),
    ("GET", "/api/v1/watch/namespaces/n/pods", "", "watch"),
    ("PUT", "/apis/apps/v1/namespaces/n/deployments/d/scale", "", "update"),
    ("PATCH", "/api/v1/nodes/x", "", "patch"),
    ("DELETE", "/api/v1/namespaces/n/pods", "", "deletecollection"),
    ("DELETE", "/api/v1/namespaces/n", "", "delete"),
    ("GET", "/version", "", "get"),
    ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "", "create"),
])
def test_verbs_as_the_apiserver_derives_them(method: str, path: str, query: str, verb: str) -> None:
    """The events' verbs are the classifier's (tests/core/test_requestinfo.py has kube-apiserver's table)."""
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return []

    client, out = _in_process(app)
    client.open("/tunnels/clusters/C" + path, method=method, query_string=query).close()
    assert {e["verb"] for e in _written(out)} == {verb}


@pytest.mark.parametrize("token, headers, code", [
    pytest.param(None, {}, 401, id="no-token"),
    pytest.param("not-a-real-token-" + "x" * 30, {}, 401, id="unknown-token"),
    pytest.param("BOB", {"Impersonate-User": "admin"}, 403, id="client-impersonation"),
    pytest.param("BOB", {}, 404, id="cluster-not-visible"),
])
def test_a_request_refused_before_the_tunnel_is_audited_without_its_token(
    gw: Gateway, bob: str, token: str | None, headers: dict[str, str], code: int,
) -> None:
    """kube-apiserver audits failed authentication and refusals; so does the gateway, and never a token."""
    cluster = "BCS-K8S-NOT-VISIBLE" if code == 404 else CLUSTER
    request_id = f"audit-refused-{code}-{len(headers)}-{token is None}"
    sent = {"X-Request-Id": request_id, **headers}
    if token is not None:
        sent["Authorization"] = f"Bearer {bob if token == 'BOB' else token}"
    status, _ = gw.call("GET", f"/tunnels/clusters/{cluster}/api/v1/namespaces/default/secrets?limit=1",
                        token="", headers=sent)
    assert status == code
    found = events(gw, request_id, 2)
    assert [(e["stage"], e.get("responseStatus", {}).get("code")) for e in found] == [
        ("RequestReceived", None), ("ResponseComplete", code)]
    complete = found[-1]
    assert complete["verb"] == "list" and complete["objectRef"]["resource"] == "secrets"
    expected_user = "system:anonymous" if code == 401 else "bob-audit"
    assert complete["user"]["username"] == expected_user
    assert "impersonatedUser" not in complete
    text = (gw.data / "audit.jsonl").read_text()
    assert bob not in text and (token is None or token == "BOB" or token not in text)


def test_the_audit_filter_from_an_ini_audits_refused_and_served_requests(tmp_path: Path) -> None:
    """[filter:audit] in a PasteDeploy pipeline in front of token_auth, loaded from a real .ini."""
    from paste.deploy import loadapp
    from werkzeug.test import Client

    from bcs_middleware.layers.audit import AuditMiddleware
    from bcs_middleware.layers.auth import TokenAuthMiddleware
    from bcs_middleware.layers.request_context import RequestContextMiddleware
    from bcs_middleware.store.crypto import token_digest

    token = "audit-ini-token-" + "t" * 30
    (tmp_path / "tokens.txt").write_text(f"carol {token_digest(token)}\n")
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "hello.py").write_text(
        "def app_factory(global_conf, **local):\n"
        "    def app(environ, start_response):\n"
        "        start_response('200 OK', [('Content-Type', 'application/json')])\n"
        "        return [b'{}']\n"
        "    return app\n")
    ini = tmp_path / "audited.ini"
    ini.write_text(
        "[pipeline:main]\npipeline = request_context audit token_auth hello\n\n"
        "[filter:request_context]\nuse = egg:bcs-middleware#request_context\naccess_log = false\n\n"
        "[filter:audit]\nuse = egg:bcs-middleware#audit\nlog = %(here)s/audit.jsonl\n"
        "policy_file = %(here)s/policy.yaml\n\n"
        "[filter:token_auth]\nuse = egg:bcs-middleware#token_auth\ntokens_file = %(here)s/tokens.txt\n\n"
        "[app:hello]\npaste.app_factory = hello:app_factory\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        app = loadapp(f"config:{ini}")
    finally:
        sys.path.remove(str(tmp_path))
    assert isinstance(app, RequestContextMiddleware) and app.access_log is False
    audit = app.app
    assert isinstance(audit, AuditMiddleware) and isinstance(audit.app, TokenAuthMiddleware)
    assert audit.policy.rules[0].level == "None"  # the policy file's
    client = Client(app)
    client.get("/tunnels/clusters/C/api/v1/pods", headers={"Authorization": f"Bearer {token}"}).close()
    refused = client.get("/tunnels/clusters/C/api/v1/pods", headers={"Authorization": "Bearer wrong"})
    refused.close()
    client.get("/rest/users").close()  # not a tunnel path: not audited
    audit.sink.drain()
    found = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    for event in found:
        validate(event)
    assert [(e["stage"], e["user"]["username"], e.get("responseStatus", {}).get("code")) for e in found] == [
        ("RequestReceived", "carol", None), ("ResponseComplete", "carol", 200),
        ("RequestReceived", "system:anonymous", None), ("ResponseComplete", "system:anonymous", 401)]
    assert found[-1]["auditID"] == refused.headers["X-Request-Id"]  # the access log's request id
    audit.sink.close()
    assert token not in (tmp_path / "audit.jsonl").read_text()
    assert (tmp_path / "audit.jsonl").stat().st_mode & 0o077 == 0


def test_the_audit_filter_rejects_unknown_keys_and_needs_a_log() -> None:
    from bcs_middleware.core.errors import ConfigError
    from bcs_middleware.layers.audit import filter_factory

    with pytest.raises(ConfigError, match=r"\[filter:audit\] unknown key 'path'"):
        filter_factory({}, path="x")
    with pytest.raises(ConfigError, match="needs log"):
        filter_factory({})


def test_audit_log_dash_writes_events_to_stdout_beside_the_access_log(tmp_path: Path) -> None:
    """README: `serve --audit-log -` — the events share stdout with the access log, told apart by kind."""
    with served_gateway(tmp_path / "data", args=["--audit-log", "-"], workers=1) as gateway:
        status, _ = gateway.call("GET", "/tunnels/clusters/BCS-K8S-NONE/api/v1/pods", token="",
                                 headers={"X-Request-Id": "audit-stdout-1"})
        assert status == 401

        def both_events() -> list[dict[str, Any]]:
            lines = [line for line in gateway.server.output().splitlines() if '"kind":"Event"' in line]
            found = [e for e in map(json.loads, lines) if e["auditID"] == "audit-stdout-1"]
            return found if len(found) >= 2 else []

        found = wait_for(both_events, 10, "the request's two audit events never appeared on stdout")
    for event in found:
        validate(event)
    assert [(e["stage"], e.get("responseStatus", {}).get("code")) for e in found] == [
        ("RequestReceived", None), ("ResponseComplete", 401)]
