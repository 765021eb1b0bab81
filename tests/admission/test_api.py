"""Definition CRUD, schema errors, and the dry-run review endpoint."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from werkzeug.test import Client

from bcs_middleware.admission.engine import AdmissionEngine
from bcs_middleware.admission.store import MemoryDefinitionStore
from bcs_middleware.apps.admission_api import AdmissionWebhookAPI
from bcs_middleware.core.environ import USER, User

from .conftest import (
    bcs_add_label,
    bcs_definition,
    bcs_webhook,
    client_for,
    k8s_add_label,
    k8s_configuration,
    k8s_webhook,
)

ADMIN = User(1, "admin", is_superuser=True)


def api(store: MemoryDefinitionStore, engine: AdmissionEngine | None = None) -> Client:
    return Client(AdmissionWebhookAPI(store, engine=engine))


def call(client: Client, method: str, path: str, body: Any = None, user: User | None = ADMIN) -> Any:
    environ = {USER: user} if user else {}
    data = body if isinstance(body, bytes) else (json.dumps(body) if body is not None else None)
    return client.open(path, method=method, data=data, content_type="application/json",
                       environ_overrides=environ)


def test_mesosdriver_routes_create_read_list_update_delete(ca):
    store = MemoryDefinitionStore()
    client = api(store)
    definition = bcs_definition("inject", [bcs_webhook("hook-a.webhooks", ca)])
    base = "/mesosdriver/v4/namespaces/bcs-system/admissionwebhook"
    assert call(client, "POST", base, definition).status_code == 201
    assert call(client, "POST", base, definition).status_code == 409
    got = call(client, "GET", f"{base}/inject").get_json()
    assert got["metadata"] == {"name": "inject", "namespace": "bcs-system"}
    assert call(client, "GET", "/mesosdriver/v4/namespaces/other/admissionwebhook/inject").status_code == 404
    definition["admissionWebhooks"][0]["failurePolicy"] = "Ignore"
    assert call(client, "PUT", base, definition).status_code == 200
    assert store.get_bcs("inject").webhooks[0].failure_policy == "Ignore"
    items = call(client, "GET", "/mesosdriver/v4/admissionwebhooks").get_json()["items"]
    assert [d["metadata"]["name"] for d in items] == ["inject"]
    assert call(client, "DELETE", f"{base}/inject").status_code == 200
    assert call(client, "GET", f"{base}/inject").status_code == 404


def test_duplicate_operation_and_kind_is_a_conflict(ca):
    client = api(MemoryDefinitionStore())
    webhooks = [bcs_webhook("hook-a.webhooks", ca)]
    assert call(client, "POST", "/rest/admissionwebhooks",
                bcs_definition("one", webhooks, kind="Application")).status_code == 201
    response = call(client, "POST", "/rest/admissionwebhooks",
                    bcs_definition("two", webhooks, kind="application"))
    assert response.status_code == 409 and "'one'" in response.get_json()["message"]
    assert call(client, "POST", "/rest/admissionwebhooks",
                bcs_definition("three", webhooks, operation="Update")).status_code == 201


def _without_ca(d: dict[str, Any]) -> None:
    del d["admissionWebhooks"][0]["clientConfig"]["caBundle"]


def _set(path: list[Any], value: Any) -> Any:
    def mutate(d: dict[str, Any]) -> None:
        target = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(_without_ca, "admissionWebhooks.0.clientConfig: missing required field 'caBundle'",
                     id="missing-ca"),
        pytest.param(_set(["admissionWebhooks", 0, "clientConfig", "caBundle"], "not base64!"),
                     "admissionWebhooks.0.clientConfig.caBundle: must be base64", id="bad-base64"),
        pytest.param(_set(["admissionWebhooks", 0, "clientConfig", "caBundle"],
                          base64.b64encode(b"hello").decode()),
                     "admissionWebhooks.0.clientConfig.caBundle: does not hold a PEM", id="not-pem"),
        pytest.param(_set(["resourcesRef", "kind"], "Service"), "resourcesRef.kind", id="bad-kind"),
        pytest.param(_set(["resourcesRef", "operation"], "Delete"), "resourcesRef.operation",
                     id="bad-operation"),
        pytest.param(_set(["admissionWebhooks", 0, "failurePolicy"], "Maybe"),
                     "admissionWebhooks.0.failurePolicy", id="bad-policy"),
        pytest.param(_set(["admissionWebhooks", 0, "clientConfig", "port"], 70000),
                     "admissionWebhooks.0.clientConfig.port", id="bad-port"),
        pytest.param(_set(["admissionWebhooks", 0, "namespaceSelector"],
                          {"operator": "Has", "values": []}),
                     "admissionWebhooks.0.namespaceSelector.operator", id="bad-selector"),
        pytest.param(_set(["apiVersion"], "v1"), "apiVersion", id="bad-api-version"),
        pytest.param(_set(["admissionWebhooks", 0, "clientConfig", "url"], "https://me:s3cret@hook.example/x"),
                     "admissionWebhooks.0.clientConfig.url: must not carry user information", id="url-userinfo"),
        pytest.param(_set(["admissionWebhooks", 0, "clientConfig", "url"], "https://token@hook.example/x"),
                     "admissionWebhooks.0.clientConfig.url: must not carry user information", id="url-user"),
        pytest.param(_set(["admissionWebhooks"], []), "admissionWebhooks", id="no-webhooks"),
    ],
)
def test_schema_errors_are_400_naming_the_field(ca, mutate, field):
    definition = bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)])
    mutate(definition)
    response = call(api(MemoryDefinitionStore()), "POST", "/rest/admissionwebhooks", definition)
    assert response.status_code == 400
    assert response.get_json()["message"].startswith(field)
    assert "not base64!" not in response.get_json()["message"]
    assert "s3cret" not in response.get_json()["message"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(_set(["webhooks", 0, "timeoutSeconds"], 31), "webhooks.0.timeoutSeconds",
                     id="timeout-above-30"),
        pytest.param(_set(["webhooks", 0, "clientConfig", "caBundle"], "@@"),
                     "webhooks.0.clientConfig.caBundle", id="bad-ca"),
        pytest.param(_set(["webhooks", 0, "admissionReviewVersions"], ["v2"]),
                     "webhooks.0.admissionReviewVersions", id="unknown-versions"),
        pytest.param(_set(["webhooks", 0, "namespaceSelector"],
                          {"matchExpressions": [{"key": "a", "operator": "In"}]}),
                     "webhooks.0.namespaceSelector.matchExpressions.0.values", id="in-without-values"),
        pytest.param(_set(["kind"], "Webhook"), "kind", id="bad-kind"),
        pytest.param(_set(["webhooks", 0, "clientConfig"], {"url": "https://me:s3cret@hook.example/x"}),
                     "webhooks.0.clientConfig.url: must not carry user information", id="url-userinfo"),
    ],
)
def test_kubernetes_configuration_errors_are_400_naming_the_field(ca, mutate, field):
    configuration = k8s_configuration("cfg", [k8s_webhook("a.example.com", "hook-a.webhooks", ca)])
    mutate(configuration)
    response = call(api(MemoryDefinitionStore()), "POST",
                    "/rest/clusters/c1/admissionwebhookconfigurations", configuration)
    assert response.status_code == 400
    assert response.get_json()["message"].startswith(field)


def test_kubernetes_configurations_are_per_cluster(ca):
    store = MemoryDefinitionStore()
    client = api(store)
    configuration = k8s_configuration("cfg", [k8s_webhook("a.example.com", "hook-a.webhooks", ca)])
    base = "/rest/clusters/c1/admissionwebhookconfigurations"
    assert call(client, "POST", base, configuration).status_code == 201
    assert call(client, "POST", base, configuration).status_code == 409
    assert [c.name for c in store.list_k8s("c1")] == ["cfg"] and store.list_k8s("c2") == []
    item = f"{base}/mutatingwebhookconfigurations/cfg"
    assert call(client, "GET", item).get_json()["metadata"]["name"] == "cfg"
    configuration["webhooks"][0]["failurePolicy"] = "Ignore"
    assert call(client, "PUT", item, configuration).status_code == 200
    assert store.get_k8s("c1", "MutatingWebhookConfiguration", "cfg").webhooks[0].failure_policy == "Ignore"
    assert call(client, "DELETE", item).status_code == 200
    assert call(client, "GET", item).status_code == 404


@pytest.mark.parametrize(("user", "status"), [pytest.param(None, 401, id="anonymous"),
                                              pytest.param(User(2, "bob"), 403, id="not-superuser")])
def test_only_superusers_manage_definitions(user, status):
    client = api(MemoryDefinitionStore())
    for method, path in (("GET", "/rest/admissionwebhooks"),
                         ("GET", "/mesosdriver/v4/admissionwebhooks"),
                         ("POST", "/rest/admission/review")):
        assert call(client, method, path, {}, user=user).status_code == status


def test_review_reports_each_webhook_and_the_final_object_without_forwarding(hooks, ca):
    first = hooks(bcs_add_label("one", "1"))
    failing = hooks(lambda obj: (500, b"no"))
    store = MemoryDefinitionStore()
    client = api(store, AdmissionEngine(store, client=client_for(("hook-a.webhooks", first),
                                                                 ("hook-b.webhooks", failing))))
    definition = bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca),
                                      bcs_webhook("hook-b.webhooks", ca, policy="Ignore")])
    assert call(client, "POST", "/rest/admissionwebhooks", definition).status_code == 201
    obj = {"kind": "Application", "metadata": {"name": "web", "namespace": "prod"}}
    result = call(client, "POST", "/rest/admission/review",
                  {"operation": "Create", "object": obj}).get_json()
    assert result["allowed"] is True
    assert result["final_object"]["metadata"]["labels"] == {"one": "1"}
    assert [(w["webhook"], w["outcome"]) for w in result["webhooks"]] == [
        ("d/hook-a-hook", "patched"), ("d/hook-b-hook", "skipped")]
    assert result["webhooks"][0]["patch"] == [
        {"op": "add", "path": "/metadata/labels", "value": {"one": "1"}}]
    assert result["webhooks"][1]["cause"] == "status"


def test_review_of_kubernetes_definitions(hooks, ca):
    hook = hooks(k8s_add_label("sidecar", "yes", warnings=["injected a sidecar"]))
    store = MemoryDefinitionStore()
    client = api(store, AdmissionEngine(store, client=client_for(("hook-a.webhooks", hook))))
    configuration = k8s_configuration("cfg", [k8s_webhook("a.example.com", "hook-a.webhooks", ca)])
    call(client, "POST", "/rest/clusters/c1/admissionwebhookconfigurations", configuration)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}}
    result = call(client, "POST", "/rest/admission/review",
                  {"operation": "CREATE", "cluster_id": "c1", "resource": "pods",
                   "object": pod}).get_json()
    assert result["allowed"] and result["warnings"] == ["injected a sidecar"]
    assert result["final_object"]["metadata"]["labels"] == {"sidecar": "yes"}
    assert result["webhooks"][0]["outcome"] == "patched"
    assert call(client, "POST", "/rest/admission/review",
                {"operation": "DELETE", "object": pod}).status_code == 400


def test_review_is_a_dry_run_and_never_calls_a_webhook_with_side_effects(hooks, ca):
    # The review forwards nothing, so every webhook it calls must be told so, and a
    # webhook that acts on what it is sent (sideEffects Some/Unknown) must not be called.
    safe = hooks(k8s_add_label("sidecar", "yes"))
    acting = hooks(k8s_add_label("acted", "yes"))
    store = MemoryDefinitionStore()
    client = api(store, AdmissionEngine(store, client=client_for(("hook-a.webhooks", safe),
                                                                 ("hook-b.webhooks", acting))))
    configuration = k8s_configuration("cfg", [k8s_webhook("a.example.com", "hook-a.webhooks", ca)])
    call(client, "POST", "/rest/clusters/c1/admissionwebhookconfigurations", configuration)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"}}
    document = {"operation": "CREATE", "cluster_id": "c1", "resource": "pods", "object": pod,
                "dryRun": False}
    result = call(client, "POST", "/rest/admission/review", document).get_json()
    assert result["allowed"] is True
    assert safe.bodies[0]["request"]["dryRun"] is True

    acting_cfg = k8s_configuration(
        "acting", [k8s_webhook("b.example.com", "hook-b.webhooks", ca, sideEffects="Some")])
    assert call(client, "POST", "/rest/clusters/c1/admissionwebhookconfigurations",
                acting_cfg).status_code == 201
    result = call(client, "POST", "/rest/admission/review", document).get_json()
    assert result["allowed"] is False
    assert "does not support dry run" in result["status"]["message"]
    assert acting.calls == 0


def test_a_refused_webhook_port_is_reported_as_refused_not_as_a_timeout(ca):
    import socket

    from bcs_middleware.admission.client import CircuitBreaker, WebhookClient

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = MemoryDefinitionStore()
    webhooks = WebhookClient(address_map={"hook-a.webhooks": f"127.0.0.1:{port}"},
                             breaker=CircuitBreaker(5, 30.0))
    client = api(store, AdmissionEngine(store, client=webhooks))
    definition = bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)])
    assert call(client, "POST", "/rest/admissionwebhooks", definition).status_code == 201
    obj = {"kind": "Application", "metadata": {"name": "web", "namespace": "prod"}}
    result = call(client, "POST", "/rest/admission/review",
                  {"operation": "Create", "object": obj}).get_json()
    assert result["allowed"] is False
    message = result["status"]["message"]
    assert "refused" in message and "timed out" not in message, message
