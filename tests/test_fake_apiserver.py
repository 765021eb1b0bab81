"""The fake apiserver is accepted by real kubectl (several versions) and the Python client.

Every tunnel test relies on this fake behaving like the real apiserver towards those clients,
so these tests talk to it directly, without the gateway.
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.fake_apiserver import (
    FakeAPIServer,
    RequestInfo,
    rbac_authorizer,
    strategic_merge,
)
from tests.support.kube import (
    kubectl,
    kubectl_path,
    kubectl_versions,
    kubectl_watch,
    write_kubeconfig,
)
from tests.support.polling import wait_until

TOKEN = "fake-sa-token-for-tests"

KUBECTLS = [
    pytest.param(None, id="kubectl-default"),
    pytest.param("1.27", id="kubectl-1.27"),
    pytest.param("1.33", id="kubectl-1.33"),
]

POD_YAML = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}}}
spec:
  containers:
  - name: main
    image: {image}
    ports: [{{containerPort: 80}}]
"""


def _pod(name: str, namespace: str = "default", **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "nginx"}]}}


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=TOKEN) as server:
        yield server


@pytest.fixture
def kubeconfig(api: FakeAPIServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", server=api.url, token=TOKEN,
                            ca_pem=api.ca_pem)


@pytest.fixture(params=KUBECTLS)
def version(request: pytest.FixtureRequest) -> str | None:
    if kubectl_path(request.param) is None:
        pytest.skip(f"kubectl {request.param} is not installed (have {kubectl_versions()})")
    return request.param


@pytest.fixture
def http(api: FakeAPIServer) -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False  # REQUESTS_CA_BUNDLE would override ``verify``
        session.verify = api.ca_file
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        yield session


def _ok(result) -> str:  # type: ignore[no-untyped-def]
    assert result.returncode == 0, result.stderr
    return result.stdout


# --------------------------------------------------------------------------- kubectl

def test_kubectl_version_shows_the_server_version(api, kubeconfig, version):
    out = _ok(kubectl("version", "-o", "json", kubeconfig=kubeconfig, version=version))
    assert json.loads(out)["serverVersion"]["gitVersion"] == "v1.32.0"


def test_kubectl_get_pods_prints_names_and_status(api, kubeconfig, version):
    api.create("pods", _pod("web-1"))
    api.create("pods", _pod("web-2"))
    out = _ok(kubectl("get", "pods", kubeconfig=kubeconfig, version=version))
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [row.split()[:3] for row in rows] == [["web-1", "1/1", "Running"],
                                                ["web-2", "1/1", "Running"]]


def test_kubectl_apply_get_delete_round_trip(api, kubeconfig, version):
    """Default validation (no --validate=false): the fake's OpenAPI documents satisfy kubectl."""
    out = _ok(kubectl("apply", "-f", "-", kubeconfig=kubeconfig, version=version,
                      input=POD_YAML.format(name="x", image="nginx:1")))
    assert out.strip() == "pod/x created"
    out = _ok(kubectl("apply", "-f", "-", kubeconfig=kubeconfig, version=version,
                      input=POD_YAML.format(name="x", image="nginx:2")))
    assert out.strip() == "pod/x configured"
    patch = api.requests.last("/api/v1/namespaces/default/pods/x", method="PATCH")
    assert patch is not None
    assert patch.headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert patch.params["fieldValidation"] == "Strict"

    pod = json.loads(_ok(kubectl("get", "pod", "x", "-o", "json", kubeconfig=kubeconfig,
                                 version=version)))
    assert pod["spec"]["containers"] == [
        {"name": "main", "image": "nginx:2", "ports": [{"containerPort": 80}]}]
    assert "kubectl.kubernetes.io/last-applied-configuration" in pod["metadata"]["annotations"]

    out = _ok(kubectl("delete", "pod", "x", kubeconfig=kubeconfig, version=version))
    assert out.strip() == 'pod "x" deleted'
    assert api.store.list("pods", "default")[0] == []


def test_kubectl_create_generators_round_trip(api, kubeconfig, version):
    """kubectl 1.32+ sends these as protobuf; the fake decodes the kinds generators create."""
    _ok(kubectl("create", "namespace", "team", kubeconfig=kubeconfig, version=version))
    _ok(kubectl("create", "configmap", "cm", "-n", "team", "--from-literal=a=b",
                kubeconfig=kubeconfig, version=version))
    _ok(kubectl("create", "secret", "generic", "s", "-n", "team", "--from-literal=k=v",
                kubeconfig=kubeconfig, version=version))
    namespace = api.store.get("namespaces", None, "team")
    assert namespace["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team"}
    assert api.store.get("configmaps", "team", "cm")["data"] == {"a": "b"}
    assert api.store.get("secrets", "team", "s")["data"] == {"k": "dg=="}


def test_kubectl_get_pods_watch_receives_a_later_pod(api, kubeconfig, version):
    api.create("pods", _pod("before"))
    with kubectl_watch("get", "pods", "--watch", kubeconfig=kubeconfig, version=version) as watch:
        watch.wait_for("before")
        wait_until(lambda: api.open_watches > 0, 10)
        assert api.open_watches == 1
        api.create("pods", _pod("after"))
        assert watch.wait_for("after").split()[:3] == ["after", "1/1", "Running"]
    assert wait_until(lambda: api.open_watches == 0, 5)  # kubectl gone → the watch connection is freed


def test_kubectl_get_namespaces_shows_labels(api, kubeconfig, version):
    api.create("namespaces", {"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    out = _ok(kubectl("get", "namespaces", "--show-labels", kubeconfig=kubeconfig,
                      version=version))
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:]}
    assert rows["default"] == "kubernetes.io/metadata.name=default"
    assert rows["team-a"] == "kubernetes.io/metadata.name=team-a,team=a"


def test_kubectl_bad_token_prints_unauthorized(api, tmp_path, version):
    config = write_kubeconfig(tmp_path / "bad", server=api.url, token="wrong", ca_pem=api.ca_pem)
    result = kubectl("get", "pods", kubeconfig=config, version=version)
    assert result.returncode != 0
    assert "You must be logged in to the server" in result.stderr
    assert "wrong" not in result.stderr


def test_kubectl_verifies_the_kubernetes_name_with_tls_server_name(api, tmp_path):
    config = write_kubeconfig(tmp_path / "kc", server=api.url, token=TOKEN, ca_pem=api.ca_pem,
                              tls_server_name="kubernetes")
    assert "Server Version" in _ok(kubectl("version", kubeconfig=config))
    config = write_kubeconfig(tmp_path / "kc2", server=api.url, token=TOKEN, ca_pem=api.ca_pem,
                              tls_server_name="elsewhere")
    result = kubectl("get", "pods", kubeconfig=config)
    assert result.returncode != 0
    assert "certificate" in result.stderr


# --------------------------------------------------------------------------- Python client

def test_python_client_lists_creates_and_watches(api):
    from kubernetes import client, watch

    config = client.Configuration()
    config.host = api.url
    config.api_key = {"authorization": TOKEN}
    config.api_key_prefix = {"authorization": "Bearer"}
    config.ssl_ca_cert = api.ca_file
    with client.ApiClient(config) as api_client:
        core = client.CoreV1Api(api_client)
        assert core.list_namespaced_pod("default", _request_timeout=10).items == []
        created = core.create_namespaced_pod("default", client.V1Pod(
            metadata=client.V1ObjectMeta(name="py"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
        ), _request_timeout=10)
        assert created.metadata.uid
        assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["py"]

        threading.Timer(0.5, api.create, args=("pods", _pod("py-later"))).start()
        seen = []
        watcher = watch.Watch()
        for event in watcher.stream(core.list_namespaced_pod, "default", timeout_seconds=5,
                                    _request_timeout=10):
            seen.append((event["type"], event["object"].metadata.name))
            if event["object"].metadata.name == "py-later":
                watcher.stop()
        assert seen == [("ADDED", "py"), ("ADDED", "py-later")]


# --------------------------------------------------------------------------- protocol details

@pytest.mark.parametrize(("method", "path", "body", "code", "reason"), [
    pytest.param("GET", "/api/v1/namespaces/default/pods/nope", None, 404, "NotFound",
                 id="missing-pod"),
    pytest.param("POST", "/api/v1/namespaces/default/configmaps",
                 {"metadata": {"name": "kube-root"}}, 201, None, id="create"),
    pytest.param("POST", "/api/v1/namespaces/ghost/configmaps",
                 {"metadata": {"name": "a"}}, 404, "NotFound", id="missing-namespace"),
    pytest.param("GET", "/apis/apps/v1/namespaces/default/widgets", None, 404, "NotFound",
                 id="unknown-resource"),
    pytest.param("POST", "/api/v1/namespaces/default/pods", {"metadata": {}}, 422, "Invalid",
                 id="no-name"),
])
def test_api_answers_with_status_objects(api, http, method, path, body, code, reason):
    response = http.request(method, api.url + path, json=body, timeout=10)
    assert response.status_code == code
    if reason:
        status = response.json()
        assert (status["kind"], status["apiVersion"], status["status"]) == ("Status", "v1",
                                                                            "Failure")
        assert (status["code"], status["reason"]) == (code, reason)


def test_missing_or_wrong_token_is_401_status(api):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}):
        response = requests.get(api.url + "/api/v1/namespaces", headers=headers,
                                verify=api.ca_file, timeout=10)
        assert response.status_code == 401
        assert response.json()["reason"] == "Unauthorized"


def test_create_twice_is_409_already_exists(api, http):
    url = api.url + "/api/v1/namespaces/default/configmaps"
    assert http.post(url, json={"metadata": {"name": "c"}}, timeout=10).status_code == 201
    response = http.post(url, json={"metadata": {"name": "c"}}, timeout=10)
    assert (response.status_code, response.json()["reason"]) == (409, "AlreadyExists")


def test_put_with_stale_resource_version_is_409_conflict(api, http):
    created = api.create("configmaps", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    url = api.url + "/api/v1/namespaces/default/configmaps/c"
    updated = http.put(url, json={**created, "data": {"a": "2"}}, timeout=10)
    assert updated.status_code == 200
    assert int(updated.json()["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"])
    stale = http.put(url, json={**created, "data": {"a": "3"}}, timeout=10)
    assert (stale.status_code, stale.json()["reason"]) == (409, "Conflict")
    assert api.store.get("configmaps", "default", "c")["data"] == {"a": "2"}


@pytest.mark.parametrize(("content_type", "patch", "expected"), [
    pytest.param("application/merge-patch+json", {"data": {"b": "2", "a": None}}, {"b": "2"},
                 id="merge"),
    pytest.param("application/json-patch+json", [{"op": "add", "path": "/data/b", "value": "2"}],
                 {"a": "1", "b": "2"}, id="json-patch"),
    pytest.param("application/strategic-merge-patch+json", {"data": {"b": "2"}},
                 {"a": "1", "b": "2"}, id="strategic"),
    pytest.param("application/apply-patch+yaml",
                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                  "data": {"a": "9"}}, {"a": "9"}, id="apply"),
])
def test_patch_content_types(api, http, content_type, patch, expected):
    api.create("configmaps", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    response = http.patch(api.url + "/api/v1/namespaces/default/configmaps/c",
                          data=json.dumps(patch), headers={"Content-Type": content_type},
                          timeout=10)
    assert response.status_code == 200, response.text
    assert response.json()["data"] == expected


@pytest.mark.parametrize(("original", "patch", "expected"), [
    pytest.param(
        {"containers": [{"name": "a", "image": "1", "ports": [{"containerPort": 80}]},
                        {"name": "b", "image": "1"}]},
        {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
         "containers": [{"name": "a", "image": "2"}]},
        {"containers": [{"name": "a", "image": "2", "ports": [{"containerPort": 80}]},
                        {"name": "b", "image": "1"}]},
        id="merge-by-name"),
    pytest.param({"containers": [{"name": "a"}, {"name": "b"}]},
                 {"containers": [{"name": "a", "$patch": "delete"}]},
                 {"containers": [{"name": "b"}]}, id="delete-element"),
    pytest.param({"finalizers": ["x", "y"]}, {"$deleteFromPrimitiveList/finalizers": ["x"]},
                 {"finalizers": ["y"]}, id="delete-primitive"),
    pytest.param({"a": {"b": 1, "c": 2}}, {"a": {"$patch": "replace", "d": 3}}, {"a": {"d": 3}},
                 id="replace"),
    pytest.param({"a": 1, "b": 2}, {"b": None}, {"a": 1}, id="null-deletes"),
])
def test_strategic_merge(original, patch, expected):
    assert strategic_merge(original, patch) == expected


def test_selectors_filter_lists(api, http):
    api.create("pods", _pod("a", app="web", tier="front"))
    api.create("pods", _pod("b", app="web"))
    api.create("pods", _pod("c", app="db"))
    url = api.url + "/api/v1/namespaces/default/pods"

    def names(**params: str) -> list[str]:
        response = http.get(url, params=params, timeout=10)
        assert response.status_code == 200
        return [item["metadata"]["name"] for item in response.json()["items"]]

    assert names(labelSelector="app=web") == ["a", "b"]
    assert names(labelSelector="app=web,tier") == ["a"]
    assert names(labelSelector="app in (db, cache)") == ["c"]
    assert names(labelSelector="app!=web") == ["c"]
    assert names(fieldSelector="metadata.name=b") == ["b"]


def _watch_lines(http: requests.Session, url: str, count: int, **params: str) -> list[dict]:
    events = []
    with http.get(url, params={"watch": "true", **params}, stream=True, timeout=10) as response:
        assert response.headers["Content-Type"] == "application/json"
        for line in response.iter_lines():
            if line:
                events.append(json.loads(line))
            if len(events) == count:
                break
    return events


def test_watch_replays_from_resource_version_and_streams_live(api, http):
    first = api.create("pods", _pod("one"))
    api.create("pods", _pod("two"))
    url = api.url + "/api/v1/namespaces/default/pods"
    threading.Timer(0.3, api.store.delete, args=("pods", "default", "one")).start()
    events = _watch_lines(http, url, 2, resourceVersion=first["metadata"]["resourceVersion"])
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "two"), ("DELETED", "one")]


def test_watch_ends_after_timeout_seconds(api, http):
    with http.get(api.url + "/api/v1/namespaces/default/pods",
                  params={"watch": "1", "timeoutSeconds": "1"}, stream=True,
                  timeout=10) as response:
        assert response.content == b""  # no pods, clean end of the chunked stream
    assert api.open_watches == 0


def test_client_disconnect_frees_the_watch(api):
    context = ssl.create_default_context(cafile=api.ca_file)
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET /api/v1/pods?watch=true HTTP/1.1\r\nHost: x\r\n"
                    b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
        assert tls.recv(4096).startswith(b"HTTP/1.1 200")
        assert api.open_watches == 1
    assert wait_until(lambda: api.open_watches == 0, 5)


def test_pod_log_follow_streams_lines(api, http):
    api.create("pods", _pod("logger"))
    api.pod_logs[("default", "logger")] = ["first"]
    api.log_interval = 0.05
    url = api.url + "/api/v1/namespaces/default/pods/logger/log"
    assert http.get(url, timeout=10).text == "first\n"
    lines = []
    with http.get(url, params={"follow": "true"}, stream=True, timeout=10) as response:
        for line in response.iter_lines():
            lines.append(line.decode())
            if len(lines) == 3:
                break
    assert lines == ["first", "logger line 1", "logger line 2"]


def test_test_endpoints_stream_bodies_without_credentials(api):
    payload = b"abc" * 100_000

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 65536):
            yield payload[start:start + 65536]

    for body in (payload, chunks()):
        response = requests.post(api.url + "/__digest", data=body, verify=api.ca_file,
                                 timeout=10)
        assert response.json() == {"bytes": len(payload),
                                    "sha256": hashlib.sha256(payload).hexdigest()}
    assert api.requests.last("/__digest").body_length == len(payload)
    response = requests.get(api.url + "/__bytes", params={"n": "100000"}, verify=api.ca_file,
                            timeout=10)
    assert len(response.content) == 100_000


def test_authorize_hook_denies_impersonated_users_with_403(api, http):
    def only_alice_reads(info: RequestInfo) -> bool:
        return info.user == "alice" and info.verb in ("get", "list")

    api.authorize(only_alice_reads)
    url = api.url + "/api/v1/namespaces/default/pods"
    assert http.get(url, headers={"Impersonate-User": "alice"}, timeout=10).status_code == 200
    denied = http.get(url, headers={"Impersonate-User": "bob"}, timeout=10)
    assert denied.status_code == 403
    assert denied.json()["message"] == (
        'pods is forbidden: User "bob" cannot list resource "pods" in API group "" '
        'in the namespace "default"')
    recorded = api.requests.last("/api/v1/namespaces/default/pods")
    assert recorded.headers["impersonate-user"] == "bob"


def test_rbac_authorizer_follows_stored_bindings(api, http):
    api.authorize(rbac_authorizer(api))
    url = api.url + "/api/v1/namespaces/default/pods"
    headers = {"Impersonate-User": "carol", "Impersonate-Group": "system:authenticated"}
    assert http.get(url, headers=headers, timeout=10).status_code == 403
    api.create("rolebindings", {
        "metadata": {"name": "carol-view", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "view"},
        "subjects": [{"kind": "User", "name": "carol"}]})
    assert http.get(url, headers=headers, timeout=10).status_code == 200
    assert http.post(url, json=_pod("p"), headers=headers, timeout=10).status_code == 403
    assert [b["metadata"]["name"] for b in api.bindings] == ["carol-view"]


def test_stop_ends_open_watches_promptly():
    api = FakeAPIServer(token=TOKEN).start()
    session = requests.Session()
    response = session.get(api.url + "/api/v1/pods", params={"watch": "true"}, stream=True,
                           verify=api.ca_file, headers={"Authorization": f"Bearer {TOKEN}"},
                           timeout=10)
    assert api.open_watches == 1
    api.stop()
    assert api.open_watches == 0
    response.close()
    session.close()


def test_kubectl_as_user_meets_the_rbac_authorizer(api, kubeconfig, version):
    api.authorize(rbac_authorizer(api))
    api.create("rolebindings", {
        "metadata": {"name": "alice-view", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "view"},
        "subjects": [{"kind": "User", "name": "alice"}]})
    can = kubectl("auth", "can-i", "list", "pods", "--as", "alice", kubeconfig=kubeconfig,
                  version=version)
    assert (can.returncode, can.stdout.strip()) == (0, "yes")
    denied = kubectl("get", "pods", "--as", "bob", kubeconfig=kubeconfig, version=version)
    assert denied.returncode != 0
    assert 'Error from server (Forbidden): pods is forbidden: User "bob"' in denied.stderr
