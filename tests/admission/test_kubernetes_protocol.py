"""Kubernetes webhook configurations on tunnel traffic: AdmissionReview in and out."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest
from werkzeug.test import Client

from bcs_middleware.admission.definitions import parse_k8s_configuration
from bcs_middleware.admission.store import MemoryDefinitionStore
from bcs_middleware.core.environ import ADMISSION, CLUSTER, USER, Cluster, User
from bcs_middleware.layers.admission import AdmissionMiddleware

from .apps import echo_app
from .conftest import client_for, k8s_add_label, k8s_allow, k8s_configuration, k8s_webhook, review_answer

PODS = "/tunnels/clusters/c1/api/v1/namespaces/prod/pods"
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "prod"},
       "spec": {"containers": [{"name": "app", "image": "nginx"}]}}


class FakeCluster:
    """In-memory ClusterReader: objects by API path, labels by namespace."""

    def __init__(self, objects: dict[str, Any] | None = None,
                 namespaces: dict[str, dict[str, str]] | None = None) -> None:
        self.objects = objects or {}
        self.namespaces = namespaces or {}
        self.label_reads = 0

    def get_object(self, cluster_id: str, api_path: str) -> dict[str, Any] | None:
        assert cluster_id == "c1"
        found = self.objects.get(api_path)
        return json.loads(json.dumps(found)) if found is not None else None

    def namespace_labels(self, cluster_id: str, namespace: str) -> dict[str, str]:
        self.label_reads += 1
        return dict(self.namespaces.get(namespace, {}))


def store_of(*configurations: dict[str, Any]) -> MemoryDefinitionStore:
    return MemoryDefinitionStore(k8s={"c1": [parse_k8s_configuration(c) for c in configurations]})


ALICE = User(7, "alice", groups=("dev",))
#: Only superusers read why a webhook call failed (anyone else: one message, see admission/client.py).
ROOT = User(1, "root", is_superuser=True)


class Tunnel:
    def __init__(self, store: MemoryDefinitionStore, webhook_client: Any,
                 reader: FakeCluster | None = None, **options: Any) -> None:
        self.environs: list[dict[str, Any]] = []

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            self.environs.append(environ)
            return echo_app(environ, start_response)

        self.layer = AdmissionMiddleware(app, store=store, client=webhook_client,
                                         cluster_reader=reader or FakeCluster(), **options)
        self.client = Client(self.layer)

    def send(self, method: str, path: str, body: Any, content_type: str = "application/json",
             query: str = "", user: User = ALICE) -> Any:
        return self.client.open(path, method=method, data=json.dumps(body), query_string=query,
                                content_type=content_type, environ_overrides={
                                    CLUSTER: Cluster("c1", "p1", "k8s"), USER: user})


def test_mutating_configurations_run_by_name_then_listed_and_validating_sees_final(hooks, ca):
    order: list[str] = []

    def tagging(tag: str) -> Any:
        def behaviour(body: dict[str, Any]) -> Any:
            order.append(tag)
            return k8s_add_label(tag, "1")(body)
        return behaviour

    seen_by_validator: list[Any] = []

    def validator(body: dict[str, Any]) -> Any:
        order.append("validate")
        seen_by_validator.append(body["request"]["object"]["metadata"]["labels"])
        return review_answer(body, warnings=["looks fine"], auditAnnotations={"checked": "yes"})

    a, b, c, v = (hooks(tagging("a")), hooks(tagging("b")), hooks(tagging("c")), hooks(validator))
    store = store_of(
        k8s_configuration("zz-second", [k8s_webhook("c.example.com", "hook-c.webhooks", ca)]),
        k8s_configuration("aa-first", [k8s_webhook("a.example.com", "hook-a.webhooks", ca),
                                       k8s_webhook("b.example.com", "hook-b.webhooks", ca)]),
        k8s_configuration("check", [k8s_webhook("v.example.com", "hook-d.webhooks", ca)],
                          mutating=False),
    )
    tunnel = Tunnel(store, client_for(("hook-a.webhooks", a), ("hook-b.webhooks", b),
                                      ("hook-c.webhooks", c), ("hook-d.webhooks", v)))
    response = tunnel.send("POST", PODS, POD)
    assert response.status_code == 200
    assert order == ["a", "b", "c", "validate"]
    assert seen_by_validator == [{"a": "1", "b": "1", "c": "1"}]
    assert response.get_json()["body"]["metadata"]["labels"] == {"a": "1", "b": "1", "c": "1"}
    assert response.headers.get_all("Warning") == ['299 - "looks fine"']
    result = tunnel.environs[0][ADMISSION]
    assert result.audit_annotations == (("v.example.com/checked", "yes"),)
    request = a.bodies[0]["request"]
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["operation"] == "CREATE" and request["namespace"] == "prod"
    assert request["name"] == "web" and request["oldObject"] is None and request["dryRun"] is False
    assert request["userInfo"] == {"username": "alice", "uid": "7",
                                   "groups": ["dev", "system:authenticated"]}
    assert a.bodies[0]["apiVersion"] == "admission.k8s.io/v1"


@pytest.mark.parametrize(
    ("status", "expected_code"),
    [pytest.param({}, 403, id="default-403"),
     pytest.param({"code": 422, "message": "image not allowed"}, 422, id="webhook-code"),
     pytest.param({"code": 200, "message": "x"}, 400, id="below-400-raised")],
)
def test_denial_returns_the_webhooks_status_as_kubernetes_status(hooks, ca, status, expected_code):
    hook = hooks(lambda body: review_answer(body, allowed=False, status=status))
    store = store_of(k8s_configuration("deny", [k8s_webhook("deny.example.com", "hook-a.webhooks",
                                                            ca)], mutating=False))
    tunnel = Tunnel(store, client_for(("hook-a.webhooks", hook)))
    response = tunnel.send("POST", PODS, POD)
    assert response.status_code == expected_code
    body = response.get_json()
    assert body["kind"] == "Status" and body["code"] == expected_code
    assert body["message"].startswith('admission webhook "deny.example.com" denied the request')
    assert not tunnel.environs


def _encoded(ops: Any) -> str:
    return base64.b64encode(json.dumps(ops).encode()).decode()


BAD_ANSWERS = [
    pytest.param(lambda b: {**review_answer(b), "response": {"uid": "other", "allowed": True}},
                 True, "expected response.uid", id="wrong-uid"),
    pytest.param(lambda b: {**review_answer(b), "apiVersion": "admission.k8s.io/v1beta1"},
                 True, "expected webhook response of admission.k8s.io/v1", id="wrong-envelope"),
    pytest.param(lambda b: {**review_answer(b), "response": {
        "uid": b["request"]["uid"], "allowed": True, "patch": _encoded([])}},
                 True, "but not response.patchType", id="patch-without-type"),
    pytest.param(lambda b: {**review_answer(b), "response": {
        "uid": b["request"]["uid"], "allowed": True, "patchType": "MergePatch",
        "patch": _encoded({})}}, True, "invalid response.patchType", id="not-jsonpatch"),
    pytest.param(lambda b: {**review_answer(b), "response": {
        "uid": b["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
        "patch": "%%%"}}, True, "not base64", id="patch-not-base64"),
    pytest.param(lambda b: review_answer(b, patch=[{"op": "add", "path": "/x", "value": 1}]),
                 False, "validating webhook may not return response.patch",
                 id="patch-from-validating"),
    pytest.param(lambda b: (500, b"{}"), True, "HTTP 500", id="non-200"),
    pytest.param(lambda b: b"not json", True, "not JSON", id="non-json"),
]


@pytest.mark.parametrize(("answer", "mutating", "message"), BAD_ANSWERS)
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_responses_are_checked_like_the_apiserver(hooks, ca, answer, mutating, message, policy):
    hook = hooks(answer)
    store = store_of(k8s_configuration("cfg", [k8s_webhook("bad.example.com", "hook-a.webhooks",
                                                           ca, policy=policy)], mutating=mutating))
    tunnel = Tunnel(store, client_for(("hook-a.webhooks", hook)))
    response = tunnel.send("POST", PODS, POD, user=ROOT)
    if policy == "Ignore":
        assert response.status_code == 200
        assert response.get_json()["body"] == POD
        return
    assert response.status_code == 500
    status = response.get_json()
    assert status["reason"] == "InternalError"
    assert status["message"].startswith('failed calling webhook "bad.example.com": ')
    assert message in status["message"]
    assert not tunnel.environs


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize(
    ("patch", "status", "message"),
    [pytest.param([{"op": "remove", "path": "/nope/deeper"}], 500, "does not apply", id="not-applying"),
     pytest.param([{"op": "replace", "path": "/metadata/name", "value": "evil"}], 400,
                  "may not change metadata.name", id="name"),
     pytest.param([{"op": "replace", "path": "/metadata/namespace", "value": "kube-system"}], 400,
                  "may not change metadata.namespace", id="namespace"),
     pytest.param([{"op": "replace", "path": "/kind", "value": "Secret"}], 400,
                  "may not change kind", id="kind"),
     pytest.param([{"op": "replace", "path": "/apiVersion", "value": "v2"}], 400,
                  "may not change apiVersion", id="apiVersion")],
)
def test_a_patch_that_does_not_apply_or_moves_the_object_fails_this_request_only(
        hooks, ca, policy, patch, status, message):
    hook = hooks(lambda b: review_answer(b, patch=patch))
    store = store_of(k8s_configuration("cfg", [k8s_webhook("bad.example.com", "hook-a.webhooks",
                                                           ca, policy=policy)]))
    tunnel = Tunnel(store, client_for(("hook-a.webhooks", hook), threshold=1))
    for _ in range(3):  # more than the breaker's threshold
        response = tunnel.send("POST", PODS, POD)
        assert response.status_code == status
        assert response.get_json()["message"].startswith('admission webhook "bad.example.com" ')
        assert message in response.get_json()["message"]
    assert not tunnel.environs and hook.calls == 3
    hook.behaviour = k8s_add_label("ok", "1")
    assert tunnel.send("POST", PODS, POD).status_code == 200 and hook.calls == 4


@pytest.mark.parametrize(
    ("answer", "counted"),
    [pytest.param(lambda b: (400, b'{"message": "cannot parse your object"}'), False, id="4xx"),
     pytest.param(lambda b: (422, b"{}"), False, id="422"),
     pytest.param(lambda b: review_answer(b, allowed=False), False, id="denied"),
     pytest.param(lambda b: (503, b"{}"), True, id="5xx"),
     pytest.param(lambda b: b"garbage", True, id="malformed")],
)
def test_only_faults_of_the_webhook_count_towards_its_breaker(hooks, ca, answer, counted):
    hook = hooks(answer)
    # A failed call made for an ordinary user lasts its webhook's whole timeout (uniform timing,
    # admission/client.py), so the webhook's timeout is short here rather than the default 10 s.
    webhook = k8s_webhook("w.example.com", "hook-a.webhooks", ca, timeoutSeconds=3)
    store = store_of(k8s_configuration("cfg", [webhook]))
    tunnel = Tunnel(store, client_for(("hook-a.webhooks", hook), threshold=2))
    for _ in range(4):
        assert tunnel.send("POST", PODS, POD).status_code >= 400
    assert hook.calls == (2 if counted else 4)


DEPLOYMENT = {"kind": "Deployment", "metadata": {"name": "web", "namespace": "prod"},
              "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}}}


@pytest.mark.parametrize("group_version", ["apps/v1beta1", "apps/v1beta2", "extensions/v1beta1"])
@pytest.mark.parametrize("policy", ["Equivalent", None])
def test_match_policy_equivalent_sends_other_versions_converted_to_the_rules(hooks, ca, group_version,
                                                                             policy):
    hook = hooks(k8s_add_label("injected", "true"))
    extra = {"matchPolicy": policy} if policy else {}  # Equivalent is the default, as in the apiserver
    webhook = k8s_webhook("d.example.com", "hook-a.webhooks", ca, resources=("deployments",), **extra)
    webhook["rules"][0]["apiGroups"] = ["apps"]
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])), client_for(("hook-a.webhooks", hook)))
    response = tunnel.send("POST", f"/tunnels/clusters/c1/apis/{group_version}/namespaces/prod/deployments",
                           {**DEPLOYMENT, "apiVersion": group_version})
    assert response.status_code == 200
    request = hook.bodies[0]["request"]
    assert request["kind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert request["resource"] == {"group": "apps", "version": "v1", "resource": "deployments"}
    group, version = group_version.split("/")
    assert request["requestKind"] == {"group": group, "version": version, "kind": "Deployment"}
    assert request["requestResource"] == {"group": group, "version": version, "resource": "deployments"}
    assert request["object"]["apiVersion"] == "apps/v1"
    sent = response.get_json()["body"]
    assert sent["apiVersion"] == group_version and sent["metadata"]["labels"] == {"injected": "true"}


def test_match_policy_exact_matches_the_rules_versions_only(hooks, ca):
    hook = hooks(k8s_add_label("injected", "true"))
    webhook = k8s_webhook("d.example.com", "hook-a.webhooks", ca, resources=("deployments",),
                          matchPolicy="Exact")
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])), client_for(("hook-a.webhooks", hook)))
    response = tunnel.send("POST", "/tunnels/clusters/c1/apis/apps/v1beta2/namespaces/prod/deployments",
                           {**DEPLOYMENT, "apiVersion": "apps/v1beta2"})
    assert response.status_code == 200 and hook.calls == 0


def test_match_policy_equivalent_sends_another_version_of_a_custom_resource_as_made(hooks, ca):
    hook = hooks(k8s_allow)
    webhook = k8s_webhook("w.example.com", "hook-a.webhooks", ca, resources=("widgets",))
    webhook["rules"][0]["apiGroups"] = ["example.com"]
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])), client_for(("hook-a.webhooks", hook)))
    widget = {"apiVersion": "example.com/v2", "kind": "Widget", "metadata": {"name": "w", "namespace": "prod"}}
    response = tunnel.send("POST", "/tunnels/clusters/c1/apis/example.com/v2/namespaces/prod/widgets", widget)
    assert response.status_code == 200 and hook.calls == 1
    assert hook.bodies[0]["request"]["kind"]["version"] == "v2"


@pytest.mark.parametrize(
    ("method", "path", "resources", "operations", "scope", "called"),
    [
        pytest.param("PUT", f"{PODS}/web/status", ("pods/status",), ("UPDATE",), "*", True,
                     id="subresource-rule"),
        pytest.param("PUT", f"{PODS}/web/status", ("pods",), ("UPDATE",), "*", False,
                     id="resource-rule-skips-subresource"),
        pytest.param("PUT", f"{PODS}/web/status", ("*/status",), ("*",), "*", True,
                     id="any-status"),
        pytest.param("PUT", f"{PODS}/web/status", ("*",), ("*",), "*", False,
                     id="star-is-no-subresource"),
        pytest.param("PUT", f"{PODS}/web/status", ("*/*",), ("*",), "*", True, id="star-star"),
        pytest.param("POST", PODS, ("pods",), ("UPDATE",), "*", False, id="operation-mismatch"),
        pytest.param("POST", PODS, ("pods",), ("CREATE",), "Cluster", False, id="scope-cluster"),
        pytest.param("POST", PODS, ("pods",), ("CREATE",), "Namespaced", True, id="scope-ns"),
        pytest.param("POST", "/tunnels/clusters/c1/api/v1/nodes", ("nodes",), ("CREATE",),
                     "Cluster", True, id="cluster-scoped"),
        pytest.param("POST", "/tunnels/clusters/c1/apis/apps/v1/namespaces/prod/deployments",
                     ("deployments",), ("CREATE",), "*", True, id="apps-group"),
    ],
)
def test_rules_match_operations_resources_subresources_and_scope(
        hooks, ca, method, path, resources, operations, scope, called):
    hook = hooks(k8s_allow)
    webhook = k8s_webhook("r.example.com", "hook-a.webhooks", ca, resources=resources,
                          operations=operations)
    webhook["rules"][0]["scope"] = scope
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])),
                    client_for(("hook-a.webhooks", hook)),
                    FakeCluster(objects={"/api/v1/namespaces/prod/pods/web": POD}))
    assert tunnel.send(method, path, POD).status_code == 200
    assert hook.calls == int(called)
    if called and path.endswith("/status"):
        request = hook.bodies[0]["request"]
        assert request["subResource"] == "status" and request["oldObject"] == POD


@pytest.mark.parametrize(
    ("selector", "called"),
    [
        pytest.param({"matchLabels": {"team": "web"}}, True, id="match-labels"),
        pytest.param({"matchLabels": {"team": "db"}}, False, id="match-labels-miss"),
        pytest.param({"matchExpressions": [{"key": "env", "operator": "In",
                                            "values": ["prod", "stage"]}]}, True, id="in"),
        pytest.param({"matchExpressions": [{"key": "env", "operator": "NotIn",
                                            "values": ["prod"]}]}, False, id="notin"),
        pytest.param({"matchExpressions": [{"key": "inject", "operator": "Exists"}]}, False,
                     id="exists-miss"),
        pytest.param({"matchExpressions": [{"key": "inject", "operator": "DoesNotExist"}]}, True,
                     id="does-not-exist"),
        pytest.param({"matchLabels": {"kubernetes.io/metadata.name": "prod"}}, True,
                     id="metadata-name-label"),
    ],
)
def test_namespace_selector_reads_labels_from_the_cluster(hooks, ca, selector, called):
    hook = hooks(k8s_allow)
    reader = FakeCluster(namespaces={"prod": {"team": "web", "env": "prod"}})
    webhook = k8s_webhook("ns.example.com", "hook-a.webhooks", ca, namespaceSelector=selector)
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])),
                    client_for(("hook-a.webhooks", hook)), reader)
    for _ in range(3):
        assert tunnel.send("POST", PODS, POD).status_code == 200
    assert hook.calls == 3 * int(called)
    assert reader.label_reads == 1  # cached


def test_object_selector_matches_the_object_or_the_old_object(hooks, ca):
    hook = hooks(k8s_allow)
    old = {**POD, "metadata": {**POD["metadata"], "labels": {"inject": "yes"},
                               "resourceVersion": "5"}}
    webhook = k8s_webhook("obj.example.com", "hook-a.webhooks", ca, operations=("*",),
                          objectSelector={"matchLabels": {"inject": "yes"}})
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])),
                    client_for(("hook-a.webhooks", hook)),
                    FakeCluster(objects={"/api/v1/namespaces/prod/pods/web": old}))
    tunnel.send("POST", PODS, POD)
    assert hook.calls == 0
    tunnel.send("PUT", f"{PODS}/web", POD)  # new object lost the label; the old one has it
    assert hook.calls == 1
    assert hook.bodies[0]["request"]["oldObject"]["metadata"]["resourceVersion"] == "5"


@pytest.mark.parametrize(
    ("side_effects", "status", "calls"),
    [pytest.param("None", 200, 1, id="none"),
     pytest.param("NoneOnDryRun", 200, 1, id="none-on-dry-run"),
     pytest.param("Unknown", 400, 0, id="unknown-rejected"),
     pytest.param("Some", 400, 0, id="some-rejected")],
)
def test_dry_run_skips_nothing_silently(hooks, ca, side_effects, status, calls):
    hook = hooks(k8s_allow)
    webhook = k8s_webhook("dry.example.com", "hook-a.webhooks", ca, sideEffects=side_effects)
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])),
                    client_for(("hook-a.webhooks", hook)))
    response = tunnel.send("POST", PODS, POD, query="dryRun=All")
    assert response.status_code == status and hook.calls == calls
    if calls:
        assert hook.bodies[0]["request"]["dryRun"] is True
        assert hook.bodies[0]["request"]["options"]["dryRun"] == ["All"]
    else:
        assert "does not support dry run" in response.get_json()["message"]


CURRENT = {**POD, "metadata": {**POD["metadata"], "resourceVersion": "42",
                               "labels": {"keep": "me"}}}


@pytest.mark.parametrize(
    ("content_type", "patch"),
    [pytest.param("application/json-patch+json",
                  [{"op": "replace", "path": "/spec/containers/0/image", "value": "nginx:2"}],
                  id="json-patch"),
     pytest.param("application/merge-patch+json",
                  {"spec": {"containers": [{"name": "app", "image": "nginx:2"}]}},
                  id="merge-patch")],
)
def test_patch_is_resolved_admitted_as_update_and_sent_as_a_guarded_json_patch(hooks, ca, content_type,
                                                                               patch):
    hook = hooks(k8s_add_label("injected", "true"))
    webhook = k8s_webhook("p.example.com", "hook-a.webhooks", ca, operations=("UPDATE",))
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])),
                    client_for(("hook-a.webhooks", hook)),
                    FakeCluster(objects={"/api/v1/namespaces/prod/pods/web": CURRENT}))
    response = tunnel.send("PATCH", f"{PODS}/web", patch, content_type=content_type,
                           query="fieldManager=kubectl")
    echoed = response.get_json()
    # Still a PATCH (the cluster's RBAC checks "patch"), now the change from the object read
    # to the admitted one, applying only to the resourceVersion that was admitted.
    assert echoed["method"] == "PATCH" and echoed["content_type"] == "application/json-patch+json"
    assert echoed["query"] == "fieldManager=kubectl"
    sent = echoed["body"]
    assert sent[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    result = jsonpatch.apply_patch(CURRENT, sent)
    assert result["spec"]["containers"][0]["image"] == "nginx:2"
    assert result["metadata"]["labels"] == {"keep": "me", "injected": "true"}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch({**CURRENT, "metadata": {**CURRENT["metadata"], "resourceVersion": "43"}}, sent)
    request = hook.bodies[0]["request"]
    assert request["operation"] == "UPDATE" and request["oldObject"] == CURRENT


@pytest.mark.parametrize(
    ("content_type", "objects", "status"),
    [pytest.param("application/strategic-merge-patch+json", {}, 415, id="strategic-merge"),
     pytest.param("application/apply-patch+yaml", {}, 415, id="apply"),
     pytest.param("application/json-patch+json", {}, 404, id="object-missing")],
)
def test_patches_that_cannot_be_resolved_are_refused(hooks, ca, content_type, objects, status):
    hook = hooks(k8s_allow)
    webhook = k8s_webhook("p.example.com", "hook-a.webhooks", ca, operations=("UPDATE",))
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])),
                    client_for(("hook-a.webhooks", hook)), FakeCluster(objects=objects))
    response = tunnel.send("PATCH", f"{PODS}/web", [], content_type=content_type)
    assert response.status_code == status
    if status == 415:
        assert '"p.example.com"' in response.get_json()["message"]
    assert not tunnel.environs and hook.calls == 0


def test_webhook_configuration_requests_are_never_intercepted(hooks, ca):
    hook = hooks(k8s_allow)
    webhook = k8s_webhook("all.example.com", "hook-a.webhooks", ca, resources=("*",),
                          operations=("*",))
    webhook["rules"][0]["apiGroups"] = ["*"]
    webhook["rules"][0]["apiVersions"] = ["*"]
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [webhook])),
                    client_for(("hook-a.webhooks", hook)))
    path = "/tunnels/clusters/c1/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    assert tunnel.send("POST", path, {"kind": "MutatingWebhookConfiguration"}).status_code == 200
    assert hook.calls == 0
    assert tunnel.send("POST", PODS, POD).status_code == 200
    assert hook.calls == 1


def test_a_protobuf_body_on_a_matched_request_is_refused(hooks, ca):
    hook = hooks(k8s_allow)
    tunnel = Tunnel(store_of(k8s_configuration("cfg", [k8s_webhook("a.example.com",
                                                                   "hook-a.webhooks", ca)])),
                    client_for(("hook-a.webhooks", hook)))
    response = tunnel.send("POST", PODS, POD, content_type="application/vnd.kubernetes.protobuf")
    assert response.status_code == 415 and not tunnel.environs
