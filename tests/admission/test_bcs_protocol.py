"""bcs definitions in front of a foreign WSGI app: chains, failures, selectors, ordering."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from werkzeug.test import Client

from bcs_middleware.admission.client import PUBLIC_FAILURE
from bcs_middleware.admission.definitions import parse_bcs_definition
from bcs_middleware.admission.store import MemoryDefinitionStore
from bcs_middleware.core import gojson
from bcs_middleware.core.environ import ADMISSION, USER, AdmissionResult, User
from bcs_middleware.layers.admission import AdmissionMiddleware

from .apps import echo_app
from .conftest import (
    bcs_add_label,
    bcs_definition,
    bcs_webhook,
    client_for,
    k8s_add_label,
)

#: Only superusers read why a webhook call failed (anyone else: one message, see admission/client.py).
SUPERUSER = {USER: User(1, "root", is_superuser=True)}
APP = {"apiVersion": "v4", "kind": "application",
       "metadata": {"name": "web", "namespace": "prod"}, "spec": {"instance": 1}}


def layer(store: MemoryDefinitionStore, client: Any, **options: Any) -> Client:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        seen["admission"] = environ.get(ADMISSION)
        return echo_app(environ, start_response)

    client_ = Client(AdmissionMiddleware(app, store=store, client=client, **options))
    client_.seen = seen  # type: ignore[attr-defined]
    return client_


def post(client: Client, obj: Any = APP, method: str = "POST", **kw: Any) -> Any:
    return client.open("/mesosdriver/v4/scheduler/namespaces/prod/applications", method=method,
                       data=json.dumps(obj), content_type="application/json", **kw)


def store_of(*definitions: dict[str, Any]) -> MemoryDefinitionStore:
    return MemoryDefinitionStore([parse_bcs_definition(d) for d in definitions])


@pytest.mark.parametrize("count", [2, 3], ids=["two-webhooks", "three-webhooks"])
def test_chain_runs_in_listed_order_each_output_the_next_input(hooks, ca, count):
    services = ["hook-a.webhooks", "hook-b.webhooks", "hook-c.webhooks"][:count]
    started = [hooks(bcs_add_label(f"step{i}", str(i))) for i in range(count)]
    store = store_of(bcs_definition("chain", [bcs_webhook(s, ca) for s in services]))
    client = layer(store, client_for(*zip(services, started, strict=True)))
    response = post(client)
    assert response.status_code == 200
    echoed = response.get_json()
    labels = echoed["body"]["metadata"]["labels"]
    assert labels == {f"step{i}": str(i) for i in range(count)}
    # each webhook saw the previous one's output
    for i, hook in enumerate(started):
        assert hook.calls == 1
        assert set(hook.bodies[0].get("metadata", {}).get("labels", {})) == {f"step{j}" for j in range(i)}
    # the app gets the admitted object's compact re-encoding, and its length
    assert int(echoed["content_length"]) == echoed["received"] == len(gojson.dumps(echoed["body"]))
    result = client.seen["admission"]
    assert isinstance(result, AdmissionResult) and result.patched
    assert result.webhooks == tuple(f"chain/{s.split('.')[0]}-hook" for s in services)


def test_kind_matching_is_case_insensitive_and_update_is_put(hooks, ca):
    hook = hooks(bcs_add_label("x", "1"))
    store = store_of(bcs_definition("upd", [bcs_webhook("hook-a.webhooks", ca)],
                                    operation="Update", kind="Application"))
    client = layer(store, client_for(("hook-a.webhooks", hook)))
    assert "labels" not in post(client, {**APP, "kind": "Application"}).get_json()["body"]["metadata"]
    updated = post(client, {**APP, "kind": "APPLICATION"}, method="PUT").get_json()["body"]
    assert updated["metadata"]["labels"] == {"x": "1"}
    assert hook.calls == 1


def test_unmatched_requests_pass_untouched_and_unread(hooks, ca):
    hook = hooks(bcs_add_label("x", "1"))
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)], kind="Deployment"))
    client = layer(store, client_for(("hook-a.webhooks", hook)))
    raw = b'{"kind": "application",   "metadata": {"name": "web"}}'
    response = client.post("/x", data=raw, content_type="application/json")
    assert response.get_json()["body"] == json.loads(raw) and response.get_json()["received"] == len(raw)
    assert client.get("/x").status_code == 200
    assert hook.calls == 0


@pytest.mark.parametrize(
    ("operator", "values", "called"),
    [
        pytest.param("In", ["prod"], True, id="in-matches"),
        pytest.param("In", ["dev"], False, id="in-excludes"),
        pytest.param("NotIn", ["prod", "bcs-system"], False, id="notin-excludes"),
        pytest.param("NotIn", ["dev"], True, id="notin-matches"),
    ],
)
def test_namespace_selector(hooks, ca, operator, values, called):
    hook = hooks(bcs_add_label("x", "1"))
    webhook = bcs_webhook("hook-a.webhooks", ca,
                          namespaceSelector={"operator": operator, "values": values})
    client = layer(store_of(bcs_definition("d", [webhook])), client_for(("hook-a.webhooks", hook)))
    body = post(client).get_json()["body"]
    assert hook.calls == int(called)
    assert ("labels" in body["metadata"]) is called


def _slow(hook_delay: float) -> Any:
    def behaviour(obj: dict[str, Any]) -> Any:
        time.sleep(hook_delay)
        return obj
    return behaviour


FAILURES = [
    pytest.param("unreachable", id="unreachable"),
    pytest.param("timeout", id="slow-timeout"),
    pytest.param("wrong-ca", id="wrong-ca"),
    pytest.param("wrong-host", id="wrong-host-name"),
    pytest.param("status-500", id="non-200"),
    pytest.param("not-json", id="non-json"),
    pytest.param("array", id="not-an-object"),
]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound by this test and never listened on: a connection to it is refused.

    Not a stopped server's port: a freed ephemeral port can be handed to another socket of this
    process (even the connecting one's own source port, a loopback self-connect) before the
    test connects to it, and then something else answers there.
    """
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def _failing(kind: str, hooks: Any, ca: Any, other_ca: Any, policy: str,
             closed_port: int) -> tuple[dict[str, Any], Any]:
    service = "hook-a.webhooks"
    extra: dict[str, Any] = {}
    behaviours = {
        "status-500": lambda obj: (500, {"message": "boom"}),
        "not-json": lambda obj: b"<html>oops</html>",
        "other-name": lambda obj: {**obj, "metadata": {**obj["metadata"], "name": "evil"}},
        "array": lambda obj: [obj],
    }
    hook = None
    if kind == "unreachable":
        address = f"127.0.0.1:{closed_port}"
    else:
        hook = hooks(behaviours.get(kind, lambda obj: obj))
        address = hook.address
    if kind == "timeout":
        assert hook is not None
        hook.delay = 2.0
        extra["timeoutSeconds"] = 1
    webhook = bcs_webhook(service, other_ca if kind == "wrong-ca" else ca, policy=policy, **extra)
    if kind == "wrong-host":
        webhook["clientConfig"]["name"] = "elsewhere"
        service = "elsewhere.webhooks"
    client = client_for()
    client.address_map = {service: ("127.0.0.1", int(address.split(":")[1]))}
    return bcs_definition("d", [webhook]), client


@pytest.mark.parametrize("kind", FAILURES)
def test_failure_with_fail_policy_rejects_and_names_the_webhook(hooks, ca, other_ca, kind, closed_port):
    definition, webhook_client = _failing(kind, hooks, ca, other_ca, "Fail", closed_port)
    reached: list[Any] = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        reached.append(environ)
        return echo_app(environ, start_response)

    client = Client(AdmissionMiddleware(app, store=store_of(definition), client=webhook_client))
    response = post(client)
    assert response.status_code == 500
    body = response.get_json()
    assert body["code_name"] == "ADMISSION_WEBHOOK_FAILED"
    assert body["message"].startswith('failed calling webhook "d/hook-a-hook": ')
    assert not reached


@pytest.mark.parametrize("kind", FAILURES)
def test_failure_with_ignore_policy_skips_the_webhook(hooks, ca, other_ca, kind, closed_port):
    definition, webhook_client = _failing(kind, hooks, ca, other_ca, "Ignore", closed_port)
    second = hooks(bcs_add_label("after", "yes"))
    definition["admissionWebhooks"].append(bcs_webhook("hook-b.webhooks", ca))
    webhook_client.address_map["hook-b.webhooks"] = ("127.0.0.1", second.port)
    client = layer(store_of(definition), webhook_client)
    response = post(client)
    assert response.status_code == 200
    assert response.get_json()["body"]["metadata"]["labels"] == {"after": "yes"}
    assert response.get_json()["body"]["metadata"]["name"] == "web"


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize(
    "change",
    [pytest.param(lambda obj: {**obj, "metadata": {**obj["metadata"], "name": "evil"}}, id="name"),
     pytest.param(lambda obj: {**obj, "metadata": {**obj["metadata"], "namespace": "kube-system"}},
                  id="namespace"),
     pytest.param(lambda obj: {**obj, "kind": "Deployment"}, id="kind")],
)
def test_a_webhook_answer_that_moves_the_object_is_refused_naming_it(hooks, ca, policy, change):
    hook = hooks(change)
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca, policy=policy)]))
    reached: list[Any] = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        reached.append(environ)
        return echo_app(environ, start_response)

    client = Client(AdmissionMiddleware(app, store=store, client=client_for(("hook-a.webhooks", hook),
                                                                             threshold=1)))
    response = post(client)
    assert response.status_code == 400
    assert response.get_json()["message"].startswith('admission webhook "d/hook-a-hook" may not change')
    assert not reached
    # The object was the caller's: the webhook's breaker did not count it.
    hook.behaviour = bcs_add_label("x", "1")
    assert post(client).status_code == 200 and hook.calls == 2


def test_kubernetes_protocol_webhook_serves_bcs_traffic(hooks, ca):
    hook = hooks(k8s_add_label("injected", "true"))
    webhook = bcs_webhook("hook-a.webhooks", ca, admissionReviewVersions=["v1"])
    client = layer(store_of(bcs_definition("d", [webhook])), client_for(("hook-a.webhooks", hook)))
    response = post(client)
    assert response.get_json()["body"]["metadata"]["labels"] == {"injected": "true"}
    request = hook.bodies[0]["request"]
    assert request["operation"] == "CREATE" and request["object"]["metadata"]["name"] == "web"
    assert request["namespace"] == "prod"


def test_total_budget_applies_the_policy_of_the_webhook_that_would_run(hooks, ca):
    slow = hooks(_slow(0.6))
    fast = hooks(bcs_add_label("late", "1"))
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca, policy="Ignore"),
                                          bcs_webhook("hook-b.webhooks", ca, policy="Fail")]))
    client = layer(store, client_for(("hook-a.webhooks", slow), ("hook-b.webhooks", fast)),
                   total_budget=0.5)
    response = post(client, environ_overrides=SUPERUSER)
    assert response.status_code == 500
    assert "hook-b-hook" in response.get_json()["message"]
    assert "budget" in response.get_json()["message"]
    assert fast.calls == 0


def test_a_timeout_cut_short_by_the_spent_budget_does_not_count_towards_the_breaker(hooks, ca):
    # The first webhook's slowness (which a caller's object may cause) leaves the second less than
    # its own timeout: its timeout then is not its fault, and must not open its breaker.
    first = hooks(bcs_add_label("a", "1"))
    first.delay = 0.3
    second = hooks(bcs_add_label("b", "1"))
    second.delay = 3.0
    # A budget with room for the first webhook even on a loaded machine, and less than the
    # second's own timeout (5 s) for the second.
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca),
                                          bcs_webhook("hook-b.webhooks", ca, timeoutSeconds=5)]))
    client = layer(store, client_for(("hook-a.webhooks", first), ("hook-b.webhooks", second), threshold=1),
                   total_budget=1.5)
    for _ in range(2):
        response = post(client, environ_overrides=SUPERUSER)
        assert response.status_code == 500 and "timed out" in response.get_json()["message"]
    assert second.calls == 2  # called again: its breaker stayed closed
    first.delay = second.delay = 0.0
    assert post(client).status_code == 200 and second.calls == 3


def test_circuit_breaker_stops_calling_a_failing_webhook_during_cool_down(hooks, ca):
    hook = hooks(lambda obj: (503, {"message": "down"}))
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca, policy="Ignore")]))
    client = layer(store, client_for(("hook-a.webhooks", hook), threshold=3, cooldown=0.5))
    for _ in range(6):
        assert post(client).status_code == 200
    assert hook.calls == 3
    time.sleep(0.6)  # the sleep is the rule under test: past the 0.5 s cool-down, the hook is called again
    hook.behaviour = lambda obj: obj
    assert post(client).status_code == 200
    assert hook.calls == 4
    for _ in range(3):
        post(client)
    assert hook.calls == 7  # closed again after a successful trial call


def test_circuit_open_under_fail_policy_fails_fast_naming_the_cause(hooks, ca):
    hook = hooks(lambda obj: (500, b"x"))
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)]))
    client = layer(store, client_for(("hook-a.webhooks", hook), threshold=1, cooldown=30))
    assert post(client).status_code == 500
    response = post(client, environ_overrides=SUPERUSER)
    assert response.status_code == 500 and "circuit open" in response.get_json()["message"]
    # Why it failed is for superusers: anyone else reads one message whatever the webhook did.
    response = post(client)
    assert response.status_code == 500 and response.get_json()["message"].endswith(PUBLIC_FAILURE)
    assert hook.calls == 1


def test_concurrent_requests_are_admitted_independently(hooks, ca):
    def behaviour(obj: dict[str, Any]) -> Any:
        obj["metadata"].setdefault("labels", {})["copy"] = obj["spec"]["tag"]
        return obj

    hook = hooks(behaviour)
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)]))
    app = AdmissionMiddleware(echo_app, store=store, client=client_for(("hook-a.webhooks", hook)))

    def one(i: int) -> str:
        body = {**APP, "spec": {"tag": f"t{i}"}}
        response = post(Client(app), body)
        return response.get_json()["body"]["metadata"]["labels"]["copy"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(40), timeout=60))
    assert results == [f"t{i}" for i in range(40)]
    assert hook.calls == 40


def test_body_larger_than_max_body_is_413(hooks, ca):
    hook = hooks(bcs_add_label("x", "1"))
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)]))
    client = layer(store, client_for(("hook-a.webhooks", hook)), max_body=100)
    big = {**APP, "spec": {"blob": "x" * 200}}
    assert post(client, big).status_code == 413
    assert hook.calls == 0


def test_definition_requests_are_never_intercepted(hooks, ca):
    hook = hooks(bcs_add_label("x", "1"))
    store = store_of(bcs_definition("d", [bcs_webhook("hook-a.webhooks", ca)]))
    client = layer(store, client_for(("hook-a.webhooks", hook)))
    for path in ("/mesosdriver/v4/namespaces/prod/admissionwebhook",
                 "/bcsapi/v4/scheduler/mesos/namespaces/prod/admissionwebhook",
                 "/rest/admissionwebhooks"):
        response = client.post(path, data=json.dumps(APP), content_type="application/json")
        assert "labels" not in response.get_json()["body"]["metadata"]
    assert hook.calls == 0
