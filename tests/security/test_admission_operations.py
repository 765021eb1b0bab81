"""CONNECT and DELETE through a real ``bcs-middleware serve``: admitted as kube-apiserver admits them, or refused.

kube-apiserver admits **every method** on the ``exec``, ``attach``, ``portforward`` and ``proxy``
subresources of pods, nodes and services as CONNECT (``handlers/rest.go`` ``ConnectResource``,
routed for each method ``installer.go`` registers), and a DELETE with the object it deletes
(``handlers/delete.go``). The attacks: every such subresource (with and without a tail, the
``name:port`` and ``scheme:name:port`` forms, the ``/proxy/`` verb prefix) with every method, against

* a real HTTPS webhook registered for CONNECT with ``failurePolicy: Fail`` that records each review
  and denies names holding ``deny``: an allowed request reaches the fake apiserver exactly as the
  options the webhook admitted, a denied one never reaches it;
* the same registration pointing at a webhook that is down: every request is refused, none reaches it;

and DELETEs of objects (and collections) a Fail webhook guards: admitted with ``oldObject`` and
``options``, or refused — including when the object is swapped under its name while the webhook
looks at it.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trustme
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tests.security.test_admission_bypass import send as send_as
from tests.support.fake_apiserver import ApiError, FakeAPIServer
from tests.support.gateway import ADMIN, CLUSTER, SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import wait_until
from tests.support.servers import free_port

DOWN = "BCS-K8S-T02"  # the same cluster behind a second registration, whose webhook is down
CONNECT_RESOURCES = ["pods/exec", "pods/attach", "pods/portforward", "pods/proxy", "nodes/proxy", "services/proxy"]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@dataclass
class Reviews:
    """A real HTTPS admission webhook: records every AdmissionReview request, denies names holding "deny".

    A DELETE of an object whose name starts with ``swap`` is answered only after the object was
    deleted and created again under that name (a new uid): what the gateway then deletes must not be
    the object nobody reviewed.
    """

    api: FakeAPIServer
    port: int = 0
    ca_bundle: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.seen if r["name"] == name]

    def app(self, environ: dict[str, Any], start_response: Any) -> Any:
        req = json.loads(Request(environ).get_data())["request"]
        with self.lock:
            self.seen.append(req)
        answer: dict[str, Any] = {"uid": req["uid"], "allowed": "deny" not in req["name"]}
        if not answer["allowed"]:
            answer["status"] = {"code": 403, "message": f"{req['operation']} of {req['name']} is not allowed"}
        if req["operation"] == "DELETE" and req["name"].startswith("swap"):
            old = req["oldObject"]
            self.api.store.delete("pods", old["metadata"]["namespace"], old["metadata"]["name"])
            self.api.store.create("pods", _pod(old["metadata"]["name"], swapped="yes"), "default")
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        return Response(json.dumps(body), content_type="application/json")(environ, start_response)


def _pod(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]}}


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def reviews(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reviews]:
    ca = trustme.CA()
    pem = tmp_path_factory.mktemp("webhook") / "hook.pem"
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(pem))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pem))
    hook = Reviews(apiserver, ca_bundle=base64.b64encode(ca.cert_pem.bytes()).decode())
    server = make_server("127.0.0.1", 0, hook.app, threaded=True, ssl_context=context)
    hook.port = server.server_port
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()


def _configuration(name: str, url: str, ca_bundle: str, operations: list[str], resources: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.example.com",
            "clientConfig": {"url": url, "caBundle": ca_bundle},
            "rules": [{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": resources}],
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }],
    }


@pytest.fixture(scope="module")
def gateway(apiserver: FakeAPIServer, reviews: Reviews, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # One worker: definitions are refreshed per process; polling one worker is then polling all.
    with served_gateway(tmp_path_factory.mktemp("gateway"), workers=1) as gw:
        closed = f"https://localhost:{free_port()}/review"
        for cluster, url in ((CLUSTER, f"https://localhost:{reviews.port}/review"), (DOWN, closed)):
            register_cluster(gw, cluster, server_url=apiserver.url, ca_pem=apiserver.ca_pem)
            for config in (_configuration("connect-guard", url, reviews.ca_bundle, ["CONNECT"], CONNECT_RESOURCES),
                           _configuration("delete-guard", url, reviews.ca_bundle, ["DELETE"], ["pods", "configmaps"])):
                status, body = gw.call("POST", f"/rest/clusters/{cluster}/admissionwebhookconfigurations",
                                       body=config)
                assert status == 201, body
        probe = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods/deny-probe/exec?command=id"
        # Until the definitions are read, the probe reaches the cluster (no such pod: 404); then the guard answers.
        assert wait_until(lambda: send(gw, "POST", probe)[0] != 404, timeout=30), "definitions never applied"
        yield gw


def send(gw: Gateway, method: str, path: str, body: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One request with exactly these headers, as the admin."""
    return send_as(gw, method, path, ADMIN, body, headers)


# --------------------------------------------------------------------------- CONNECT, every subresource and method

@dataclass(frozen=True)
class Connect:
    """One CONNECT request: ``{n}`` is a name unique to the case; what the webhook and the cluster must see."""

    path: str
    query: str
    kind: str
    options: dict[str, Any]
    resource: str
    name: str
    namespace: str = "default"
    forwarded_query: str | None = None  # None: the query as sent


CASES = {
    "exec": Connect("/api/v1/namespaces/default/pods/{n}/exec",
                    "command=id&command=-u&container=app&stdout=true&stdin=0&tty=true",
                    "PodExecOptions", {"stdout": True, "tty": True, "container": "app", "command": ["id", "-u"]},
                    "pods", "{n}", forwarded_query="stdout=true&tty=true&container=app&command=id&command=-u"),
    "exec-escaped": Connect("/api/v1/namespaces/default/pods/{n}/exec", "command=ls%20-la&command=a;b&command=%2Fetc",
                            "PodExecOptions", {"command": ["ls -la", "/etc"]}, "pods", "{n}",
                            forwarded_query="command=ls%20-la&command=%2Fetc"),
    "attach": Connect("/api/v1/namespaces/default/pods/{n}/attach", "container=app&stdin=true&stdout=1",
                      "PodAttachOptions", {"stdin": True, "stdout": True, "container": "app"}, "pods", "{n}",
                      forwarded_query="stdin=true&stdout=true&container=app"),
    "portforward": Connect("/api/v1/namespaces/default/pods/{n}/portforward", "ports=8080,9090",
                           "PodPortForwardOptions", {"ports": [8080, 9090]}, "pods", "{n}",
                           forwarded_query="ports=8080&ports=9090"),
    "pod-proxy": Connect("/api/v1/namespaces/default/pods/{n}/proxy", "", "PodProxyOptions", {}, "pods", "{n}"),
    "pod-proxy-tail": Connect("/api/v1/namespaces/default/pods/{n}/proxy/metrics/a", "x=1&y=%0a",
                              "PodProxyOptions", {"path": "/metrics/a"}, "pods", "{n}"),
    "pod-proxy-port": Connect("/api/v1/namespaces/default/pods/https:{n}:8443/proxy/a/", "",
                              "PodProxyOptions", {"path": "/a/"}, "pods", "https:{n}:8443"),
    "node-proxy": Connect("/api/v1/nodes/{n}/proxy", "", "NodeProxyOptions", {}, "nodes", "{n}", namespace=""),
    "node-proxy-port": Connect("/api/v1/nodes/{n}:10250/proxy/stats/summary", "", "NodeProxyOptions",
                               {"path": "/stats/summary"}, "nodes", "{n}:10250", namespace=""),
    "service-proxy": Connect("/api/v1/namespaces/default/services/{n}/proxy", "", "ServiceProxyOptions", {},
                             "services", "{n}"),
    "service-proxy-port": Connect("/api/v1/namespaces/default/services/https:{n}:443/proxy/healthz", "",
                                  "ServiceProxyOptions", {"path": "/healthz"}, "services", "https:{n}:443"),
    "proxy-verb-pod": Connect("/api/v1/proxy/namespaces/default/pods/{n}/x", "", "PodProxyOptions", {"path": "/x"},
                              "pods", "{n}"),
    "proxy-verb-node": Connect("/api/v1/proxy/nodes/{n}/stats", "", "NodeProxyOptions", {"path": "/stats"}, "nodes",
                               "{n}", namespace=""),
}
MATRIX = [pytest.param(case, method, id=f"{case}-{method}") for case in CASES for method in METHODS]


def _connect(gw: Gateway, cluster: str, case: str, method: str, name: str) -> tuple[int, Any, Connect, str]:
    spec = CASES[case]
    path = spec.path.format(n=name)
    url = f"/tunnels/clusters/{cluster}{path}" + (f"?{spec.query}" if spec.query else "")
    status, body = send(gw, method, url)
    return status, body, spec, path


@pytest.mark.parametrize(("case", "method"), MATRIX)
def test_every_connect_is_admitted_with_its_options_and_goes_on_as_admitted(
        gateway: Gateway, apiserver: FakeAPIServer, reviews: Reviews, case: str, method: str) -> None:
    name = f"ok-{case}-{method.lower()}"
    status, body, spec, path = _connect(gateway, CLUSTER, case, method, name)
    assert status != 500, body
    (review,) = reviews.of(spec.name.format(n=name))
    assert review["operation"] == "CONNECT"
    assert review["kind"] == {"group": "", "version": "v1", "kind": spec.kind}
    assert review["resource"] == {"group": "", "version": "v1", "resource": spec.resource}
    assert review["subResource"] == ("proxy" if "proxy" in case else case.split("-")[0])
    assert review["namespace"] == spec.namespace
    assert review["object"] == {"kind": spec.kind, "apiVersion": "v1", **spec.options}
    assert review["oldObject"] is None and review["options"] is None and review["dryRun"] is False
    reached = [r for r in apiserver.requests.snapshot() if r.path == path]
    assert [(r.method, r.query) for r in reached] == [
        (method, spec.query if spec.forwarded_query is None else spec.forwarded_query)]


@pytest.mark.parametrize(("case", "method"), MATRIX)
def test_a_connect_the_webhook_denies_never_reaches_the_cluster(
        gateway: Gateway, apiserver: FakeAPIServer, reviews: Reviews, case: str, method: str) -> None:
    name = f"deny-{case}-{method.lower()}"
    status, body, spec, path = _connect(gateway, CLUSTER, case, method, name)
    assert status == 403
    if method != "HEAD":
        assert body["kind"] == "Status" and "is not allowed" in body["message"]
    assert len(reviews.of(spec.name.format(n=name))) == 1
    assert not [r for r in apiserver.requests.snapshot() if r.path == path]


@pytest.mark.parametrize(("case", "method"), MATRIX)
def test_a_connect_whose_webhook_is_down_is_refused(
        gateway: Gateway, apiserver: FakeAPIServer, case: str, method: str) -> None:
    name = f"down-{case}-{method.lower()}"
    status, body, _, path = _connect(gateway, DOWN, case, method, name)
    assert status == 500
    if method != "HEAD":
        assert 'failed calling webhook "connect-guard.example.com"' in body["message"]
    assert not [r for r in apiserver.requests.snapshot() if r.path == path]


@pytest.mark.parametrize("upgrade", ["SPDY/3.1", "websocket"])
def test_an_upgraded_exec_is_admitted_like_any_connect(gateway: Gateway, apiserver: FakeAPIServer,
                                                       reviews: Reviews, upgrade: str) -> None:
    headers = {"Connection": "Upgrade", "Upgrade": upgrade, "X-Stream-Protocol-Version": "v4.channel.k8s.io"}
    for name, denied in ((f"deny-upgrade-{upgrade[:4]}", True), (f"up-{upgrade[:4]}", False)):
        path = f"/api/v1/namespaces/default/pods/{name}/exec"
        status, _ = send(gateway, "GET", f"/tunnels/clusters/{CLUSTER}{path}?command=sh&stdin=true", headers=headers)
        assert len(reviews.of(name)) == 1
        reached = [r for r in apiserver.requests.snapshot() if r.path == path]
        if denied:
            assert status == 403 and not reached
        else:  # the fake answers 404 for a pod it does not have: the request reached it, admitted
            assert [r.query for r in reached] == ["stdin=true&command=sh"]


def test_a_connect_asking_for_a_dry_run_is_refused_as_the_apiserver_refuses_it(
        gateway: Gateway, apiserver: FakeAPIServer) -> None:
    path = "/api/v1/namespaces/default/pods/dry/exec"
    status, body = send(gateway, "POST", f"/tunnels/clusters/{CLUSTER}{path}?command=sh&dryRun=All")
    assert status == 400 and body["message"] == "dryRun is not supported"
    assert not [r for r in apiserver.requests.snapshot() if r.path == path]


# --------------------------------------------------------------------------- DELETE

def _exists(api: FakeAPIServer, name: str) -> dict[str, Any] | None:
    try:
        return api.store.get("pods", "default", name)
    except ApiError:
        return None


def test_a_delete_is_admitted_with_the_object_and_its_options(gateway: Gateway, apiserver: FakeAPIServer,
                                                              reviews: Reviews) -> None:
    created = apiserver.store.create("pods", _pod("del-ok", tier="web"), "default")
    path = "/api/v1/namespaces/default/pods/del-ok"
    status, _ = send(gateway, "DELETE", f"/tunnels/clusters/{CLUSTER}{path}?gracePeriodSeconds=0")
    assert status == 200 and _exists(apiserver, "del-ok") is None
    (review,) = reviews.of("del-ok")
    assert review["operation"] == "DELETE" and review["object"] is None
    assert review["oldObject"]["metadata"]["uid"] == created["metadata"]["uid"]
    assert review["oldObject"]["metadata"]["labels"] == {"tier": "web"}
    assert review["options"] == {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "gracePeriodSeconds": 0}
    (reached,) = [r for r in apiserver.requests.snapshot() if r.path == path and r.method == "DELETE"]
    assert reached.body_length > 0  # the admitted options, as a body


def test_kubectl_delete_options_in_the_body_are_what_the_webhook_sees(gateway: Gateway, apiserver: FakeAPIServer,
                                                                     reviews: Reviews) -> None:
    apiserver.store.create("pods", _pod("del-body"), "default")
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    status, _ = send(gateway, "DELETE", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods/del-body", body)
    assert status == 200
    assert reviews.of("del-body")[0]["options"]["propagationPolicy"] == "Background"


@pytest.mark.parametrize(("cluster", "name", "status"), [
    pytest.param(CLUSTER, "deny-del", 403, id="denied"),
    pytest.param(DOWN, "down-del", 500, id="webhook-down"),
])
def test_a_delete_the_webhook_does_not_allow_deletes_nothing(gateway: Gateway, apiserver: FakeAPIServer,
                                                            cluster: str, name: str, status: int) -> None:
    apiserver.store.create("pods", _pod(name), "default")
    path = f"/api/v1/namespaces/default/pods/{name}"
    answer, _ = send(gateway, "DELETE", f"/tunnels/clusters/{cluster}{path}")
    assert answer == status and _exists(apiserver, name) is not None
    assert not [r for r in apiserver.requests.snapshot() if r.path == path and r.method == "DELETE"]


def test_an_object_swapped_while_it_is_reviewed_is_not_deleted(gateway: Gateway, apiserver: FakeAPIServer,
                                                               reviews: Reviews) -> None:
    """The webhook reviewed one object; another took its name meanwhile: the DELETE's preconditions refuse it."""
    original = apiserver.store.create("pods", _pod("swap-me"), "default")
    status, body = send(gateway, "DELETE", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods/swap-me")
    assert status == 409 and "Precondition failed" in body["message"]
    survivor = _exists(apiserver, "swap-me")
    assert survivor is not None and survivor["metadata"]["labels"] == {"swapped": "yes"}
    assert reviews.of("swap-me")[0]["oldObject"]["metadata"]["uid"] == original["metadata"]["uid"]


def test_a_guarded_deletecollection_is_refused_naming_the_webhook(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    apiserver.store.create("pods", _pod("in-collection", group="c"), "default")
    path = "/api/v1/namespaces/default/pods"
    status, body = send(gateway, "DELETE", f"/tunnels/clusters/{CLUSTER}{path}?labelSelector=group%3Dc")
    assert status == 501 and 'webhook "delete-guard.example.com" (failurePolicy: Fail)' in body["message"]
    assert _exists(apiserver, "in-collection") is not None
    assert not [r for r in apiserver.requests.snapshot() if r.path == path and r.method == "DELETE"]
