"""DELETE and CONNECT admitted as kube-apiserver admits them (the layer in process, real webhook servers).

CONNECT (``handlers/rest.go`` ``ConnectResource``): every method on exec, attach, port-forward and proxy;
the review's object is the connect options, ``oldObject`` and ``options`` null; what goes on is the
request rebuilt from the admitted options. DELETE (``handlers/delete.go``): ``oldObject`` is the object,
``options`` its DeleteOptions; the DELETE goes on with the admitted options as its body, guarded by the
object's uid and resourceVersion. A deletecollection the gateway cannot admit item by item is refused
under ``Fail`` and passed with a warning under ``Ignore``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

import pytest
from werkzeug.test import Client

from bcs_middleware.core.environ import CLUSTER, USER, Cluster, User
from bcs_middleware.layers.admission import AdmissionMiddleware

from .apps import echo_app
from .conftest import client_for, k8s_allow, k8s_configuration, k8s_webhook, review_answer
from .test_kubernetes_protocol import FakeCluster, store_of

POD = "/tunnels/clusters/c1/api/v1/namespaces/prod/pods/web"
POD_PATH = "/api/v1/namespaces/prod/pods/web"
CURRENT = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "namespace": "prod", "uid": "uid-1", "resourceVersion": "42",
                        "labels": {"app": "web"}}}


def _layer(hooks, ca, operations: tuple[str, ...], resources: tuple[str, ...], policy: str = "Fail",  # type: ignore[no-untyped-def]
           behaviour: Any = k8s_allow, **extra: Any):
    hook = hooks(behaviour)
    webhook = k8s_webhook("guard.example.com", "hook-a.webhooks", ca, policy=policy, operations=operations,
                          resources=resources, **extra)
    webhook["rules"][0]["apiGroups"] = [""]
    layer = AdmissionMiddleware(echo_app, store=store_of(k8s_configuration("guard", [webhook])),
                                client=client_for(("hook-a.webhooks", hook)),
                                cluster_reader=FakeCluster({POD_PATH: CURRENT}))
    return Client(layer), hook


def _send(client: Client, method: str, path: str, body: bytes | None = None, **headers: str) -> Any:
    return client.open(path, method=method, headers=headers, data=body, environ_overrides={
        CLUSTER: Cluster("c1", "p1", "k8s"), USER: User(7, "alice")})


# --------------------------------------------------------------------------- CONNECT

@pytest.mark.parametrize(("path", "kind", "options", "subresource"), [
    pytest.param(POD + "/exec?command=sh&command=-c&command=id&container=app&stdin=1&stdout=true&tty=false",
                 "PodExecOptions", {"stdin": True, "stdout": True, "container": "app", "command": ["sh", "-c", "id"]},
                 "exec", id="exec"),
    pytest.param(POD + "/exec", "PodExecOptions", {"command": None}, "exec", id="exec-without-a-query"),
    pytest.param(POD + "/attach?container=app&stdin=true&stderr=FALSE", "PodAttachOptions",
                 {"stdin": True, "container": "app"}, "attach", id="attach"),
    pytest.param(POD + "/portforward?ports=8080,9090&ports=22", "PodPortForwardOptions",
                 {"ports": [8080, 9090, 22]}, "portforward", id="portforward"),
    pytest.param(POD + "/proxy/metrics/a?x=1", "PodProxyOptions", {"path": "/metrics/a"}, "proxy", id="pod-proxy"),
    pytest.param(POD + "/proxy/", "PodProxyOptions", {"path": "/"}, "proxy", id="pod-proxy-trailing-slash"),
    pytest.param(POD + "/proxy", "PodProxyOptions", {}, "proxy", id="pod-proxy-no-tail"),
])
def test_connect_reviews_carry_the_options_as_the_apiserver_decodes_them(hooks, ca, path, kind, options,  # type: ignore[no-untyped-def]
                                                                          subresource) -> None:
    client, hook = _layer(hooks, ca, ("CONNECT",), ("pods/*",))
    response = _send(client, "POST", path)
    assert response.status_code == 200, response.get_data()
    request = hook.bodies[0]["request"]
    assert request["operation"] == "CONNECT" and request["subResource"] == subresource
    assert request["kind"] == {"group": "", "version": "v1", "kind": kind}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (request["name"], request["namespace"]) == ("web", "prod")
    assert request["object"] == {"kind": kind, "apiVersion": "v1", **options}
    assert request["oldObject"] is None and request["options"] is None and request["dryRun"] is False


def test_exec_goes_on_with_the_query_of_the_admitted_options_only(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, _ = _layer(hooks, ca, ("CONNECT",), ("pods/exec",))
    response = _send(client, "POST", POD + "/exec?command=ls;rm&command=id&container=app&stdout=1&junk=%zz&x=y")
    forwarded = response.get_json()
    # "command=ls;rm" is no parameter to the apiserver (Go drops a pair holding ';'): it is not forwarded either.
    assert forwarded["query"] == "stdout=true&container=app&command=id"
    assert forwarded["path"] == POD + "/exec"


def test_a_mutating_webhook_changes_what_is_executed(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    patch = [{"op": "replace", "path": "/command", "value": ["/bin/echo", "a b&c"]}]
    client, _ = _layer(hooks, ca, ("CONNECT",), ("pods/exec",),
                       behaviour=lambda body: review_answer(body, patch=patch))
    forwarded = _send(client, "POST", POD + "/exec?command=rm&command=-rf&command=/&stdin=true").get_json()
    assert dict(parse_qsl(forwarded["query"])) == {"stdin": "true", "command": "a b&c"}
    assert [v for k, v in parse_qsl(forwarded["query"]) if k == "command"] == ["/bin/echo", "a b&c"]


def test_a_mutating_webhook_changes_where_a_proxy_goes(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    patch = [{"op": "replace", "path": "/path", "value": "/healthz/a b?"}]
    client, _ = _layer(hooks, ca, ("CONNECT",), ("pods/proxy",),
                       behaviour=lambda body: review_answer(body, patch=patch))
    forwarded = _send(client, "GET", POD + "/proxy/admin/delete-everything?confirm=1").get_json()
    assert forwarded["path"] == POD + "/proxy/healthz/a b?"  # PATH_INFO is decoded; the upstream path re-encoded
    assert forwarded["query"] == "confirm=1"  # a proxy's query is the proxied server's, passed on as sent


@pytest.mark.parametrize(("subresource", "patch"), [
    pytest.param("proxy/x", [{"op": "replace", "path": "/path", "value": "/a/../../nodes"}], id="dot-dot-path"),
    pytest.param("proxy/x", [{"op": "replace", "path": "/path", "value": "no-leading-slash"}], id="relative-path"),
    pytest.param("exec?command=id", [{"op": "add", "path": "/privileged", "value": True}], id="unknown-field"),
    pytest.param("portforward?ports=80", [{"op": "replace", "path": "/ports", "value": [70000]}], id="port-range"),
    pytest.param("exec?command=id", [{"op": "replace", "path": "/command", "value": "id"}], id="command-type"),
])
def test_a_patch_the_apiserver_would_not_read_back_is_refused(hooks, ca, subresource, patch) -> None:  # type: ignore[no-untyped-def]
    client, _ = _layer(hooks, ca, ("CONNECT",), ("pods/*",), behaviour=lambda body: review_answer(body, patch=patch))
    response = _send(client, "GET", f"{POD}/{subresource}")
    assert response.status_code == 500 and response.get_json()["reason"] == "InternalError"
    assert "cannot be sent on" in response.get_json()["message"]


def test_a_patch_to_a_zero_value_is_the_field_left_out(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    """The apiserver decodes ``stdin: false`` as no stdin (omitempty): so does what goes on."""
    patch = [{"op": "replace", "path": "/stdin", "value": False}, {"op": "remove", "path": "/container"}]
    client, _ = _layer(hooks, ca, ("CONNECT",), ("pods/attach",),
                       behaviour=lambda body: review_answer(body, patch=patch))
    response = _send(client, "GET", POD + "/attach?stdin=true&stdout=true&container=app")
    assert response.status_code == 200 and response.get_json()["query"] == "stdout=true"


def test_a_denied_connect_is_the_webhooks_answer_and_nothing_goes_on(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    deny = {"code": 403, "message": "no shells in prod"}
    client, _ = _layer(hooks, ca, ("CONNECT",), ("pods/exec",),
                       behaviour=lambda body: review_answer(body, allowed=False, status=deny))
    response = _send(client, "GET", POD + "/exec?command=sh", Connection="Upgrade", Upgrade="websocket")
    assert response.status_code == 403
    assert response.get_json()["message"] == 'admission webhook "guard.example.com" denied the request: ' \
                                              "no shells in prod"
    assert "method" not in response.get_json()  # the echo app never ran


@pytest.mark.parametrize(("query", "message"), [
    pytest.param("command=sh&dryRun=All", "dryRun is not supported", id="dry-run"),
    pytest.param("ports=http", "cannot convert to []int32", id="port-not-a-number"),
    pytest.param("ports=70000", "cannot convert to []int32", id="port-out-of-range"),
])
def test_connect_options_the_apiserver_refuses_are_refused_before_any_webhook(hooks, ca, query, message) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("CONNECT",), ("pods/*",))
    subresource = "portforward" if "ports" in query else "exec"
    response = _send(client, "POST", f"{POD}/{subresource}?{query}")
    assert response.status_code == 400 and message in response.get_json()["message"]
    assert hook.calls == 0


def test_exec_is_not_mistaken_for_a_create(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    """kubectl exec over SPDY is an empty POST: a CREATE rule on pods/* must not see it."""
    client, hook = _layer(hooks, ca, ("CREATE",), ("pods", "pods/*"))
    response = _send(client, "POST", POD + "/exec?command=sh", Connection="Upgrade", Upgrade="SPDY/3.1")
    assert response.status_code == 200 and response.get_json()["query"] == "command=sh"
    assert hook.calls == 0


def test_an_object_selector_never_matches_connect_options(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    """The apiserver's object matcher: options have no metadata, so no selector matches them —
    not even one empty labels satisfy (``DoesNotExist``)."""
    selector = {"matchExpressions": [{"key": "exempt", "operator": "DoesNotExist"}]}
    client, hook = _layer(hooks, ca, ("CONNECT",), ("pods/exec",), objectSelector=selector)
    assert _send(client, "POST", POD + "/exec?command=sh").get_json()["query"] == "command=sh"
    assert hook.calls == 0


@pytest.mark.parametrize("operations", [("*",), ("CONNECT",), ("CREATE", "CONNECT")])
def test_connect_rules_and_wildcards_match_every_method(hooks, ca, operations) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, operations, ("pods/exec",))
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
        assert _send(client, method, POD + "/exec?command=id").status_code == 200
    assert [b["request"]["operation"] for b in hook.bodies] == ["CONNECT"] * 7


# --------------------------------------------------------------------------- DELETE

def test_a_delete_is_reviewed_with_the_object_and_its_options_and_goes_on_guarded(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("DELETE",), ("pods",))
    response = _send(client, "DELETE", POD + "?gracePeriodSeconds=0&propagationPolicy=Background&dryRun=All")
    assert response.status_code == 200
    request = hook.bodies[0]["request"]
    assert request["operation"] == "DELETE" and request["object"] is None
    assert request["oldObject"] == CURRENT
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["options"] == {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "gracePeriodSeconds": 0,
                                  "propagationPolicy": "Background", "dryRun": ["All"]}
    assert request["dryRun"] is True
    forwarded = response.get_json()
    assert forwarded["content_type"] == "application/json"
    assert forwarded["body"] == {**request["options"], "preconditions": {"uid": "uid-1", "resourceVersion": "42"}}


def test_delete_options_from_the_body_win_and_the_clients_preconditions_stay(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("*",), ("pods",))
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground",
            "preconditions": {"resourceVersion": "41"}, "unknownField": 1}
    response = _send(client, "DELETE", POD + "?propagationPolicy=Orphan", json.dumps(body).encode(),
                     **{"Content-Type": "application/json"})
    options = hook.bodies[0]["request"]["options"]
    assert options == {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "propagationPolicy": "Foreground",
                       "preconditions": {"resourceVersion": "41"}}
    # The client's resourceVersion precondition is the apiserver's to check (a 409 here): not replaced.
    assert response.get_json()["body"]["preconditions"] == {"uid": "uid-1", "resourceVersion": "41"}


def test_a_denied_delete_deletes_nothing(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, _ = _layer(hooks, ca, ("DELETE",), ("pods",),
                       behaviour=lambda body: review_answer(body, allowed=False, status={"message": "protected"}))
    response = _send(client, "DELETE", POD)
    assert response.status_code == 403 and "protected" in response.get_json()["message"]
    assert "method" not in response.get_json()


def test_deleting_an_object_that_is_not_there_is_a_404_without_a_review(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("DELETE",), ("pods",))
    response = _send(client, "DELETE", POD.replace("/web", "/gone"))
    assert response.status_code == 404 and response.get_json()["message"] == 'pods "gone" not found'
    assert hook.calls == 0


def test_a_mutating_webhook_may_not_patch_a_delete(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    patch = [{"op": "add", "path": "/metadata/labels/x", "value": "y"}]
    client, _ = _layer(hooks, ca, ("DELETE",), ("pods",), policy="Ignore",
                       behaviour=lambda body: review_answer(body, patch=patch))
    response = _send(client, "DELETE", POD)
    assert response.status_code == 500
    assert response.get_json()["message"] == ('admission webhook "guard.example.com" attempted to modify the object, '
                                              "which is not supported for this operation")


@pytest.mark.parametrize(("query", "body", "status"), [
    pytest.param("propagationPolicy=Sideways", None, 422, id="unknown-propagation"),
    pytest.param("orphanDependents=true&propagationPolicy=Orphan", None, 422, id="both-orphan-and-policy"),
    pytest.param("dryRun=Some", None, 422, id="dry-run-value"),
    pytest.param("gracePeriodSeconds=soon", None, 400, id="grace-not-a-number"),
    pytest.param("", b'{"kind": "Pod"}', 400, id="body-not-delete-options"),
    pytest.param("", b'{"gracePeriodSeconds": "1"}', 400, id="wrong-type"),
])
def test_delete_options_the_apiserver_refuses(hooks, ca, query, body, status) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("DELETE",), ("pods",))
    headers = {"Content-Type": "application/json"} if body else {}
    response = _send(client, "DELETE", f"{POD}?{query}", body, **headers)
    assert response.status_code == status and hook.calls == 0


def test_a_deletecollection_matched_by_a_fail_webhook_is_refused_by_name(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("DELETE",), ("pods",))
    response = _send(client, "DELETE", "/tunnels/clusters/c1/api/v1/namespaces/prod/pods?labelSelector=app%3Dweb")
    assert response.status_code == 501
    body = response.get_json()
    assert body["kind"] == "Status" and 'webhook "guard.example.com" (failurePolicy: Fail)' in body["message"]
    assert "method" not in body and hook.calls == 0


def test_a_deletecollection_matched_only_by_ignore_webhooks_goes_on_with_a_warning(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, _ = _layer(hooks, ca, ("DELETE",), ("pods",), policy="Ignore")
    response = _send(client, "DELETE", "/tunnels/clusters/c1/api/v1/namespaces/prod/pods")
    assert response.status_code == 200 and response.get_json()["method"] == "DELETE"
    assert response.headers.get_all("Warning") == [
        '299 - "deletecollection not sent to admission webhook \\"guard.example.com\\" (failurePolicy: Ignore)"']


def test_delete_without_a_matching_rule_passes_unread(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("CREATE",), ("pods",))
    forwarded = _send(client, "DELETE", POD + "?gracePeriodSeconds=3").get_json()
    assert forwarded["query"] == "gracePeriodSeconds=3" and forwarded["body"] is None
    assert hook.calls == 0


def test_a_kind_hidden_in_a_json_escape_is_still_admitted(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    """The fast no-match check must not let "\\u0044eployment" slip past a Deployment definition."""
    from bcs_middleware.admission.definitions import parse_bcs_definition
    from bcs_middleware.admission.store import MemoryDefinitionStore

    from .conftest import bcs_add_label, bcs_definition, bcs_webhook

    hook = hooks(bcs_add_label("seen", "yes"))
    store = MemoryDefinitionStore([parse_bcs_definition(
        bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)], kind="Deployment"))])
    client = Client(AdmissionMiddleware(echo_app, store=store, client=client_for(("hook-a.webhooks", hook))))
    raw = b'{"apiVersion": "v4", "kind": "\\u0044eployment", "metadata": {"name": "x", "namespace": "n"}}'
    response = client.post("/v4/deployments", data=raw, content_type="application/json")
    assert response.status_code == 200
    assert response.get_json()["body"]["metadata"]["labels"] == {"seen": "yes"}
    assert hook.calls == 1
    other = client.post("/v4/applications", data=b'{"kind": "Application", "metadata": {"name": "y"}}',
                        content_type="application/json")
    assert other.status_code == 200 and hook.calls == 1
