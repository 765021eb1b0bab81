"""DELETE and CONNECT (exec/attach/port-forward) requests are never let through a Fail webhook unadmitted."""

from __future__ import annotations

from typing import Any

import pytest
from werkzeug.test import Client

from bcs_middleware.environ import CLUSTER, USER, Cluster, User
from bcs_middleware.middleware.admission import AdmissionMiddleware

from .apps import echo_app
from .conftest import client_for, k8s_allow, k8s_configuration, k8s_webhook
from .test_kubernetes_protocol import FakeCluster, store_of

POD = "/tunnels/clusters/c1/api/v1/namespaces/prod/pods/web"


def _layer(hooks, ca, operations: tuple[str, ...], resources: tuple[str, ...], policy: str):  # type: ignore[no-untyped-def]
    hook = hooks(k8s_allow)
    config = k8s_configuration("guard", [k8s_webhook("guard.example.com", "guard.sys", ca, policy=policy,
                                                      operations=operations, resources=resources)])
    layer = AdmissionMiddleware(echo_app, store=store_of(config), client=client_for(("guard.sys", hook)),
                                cluster_reader=FakeCluster())
    return Client(layer), hook


def _send(client: Client, method: str, path: str, **headers: str) -> Any:
    return client.open(path, method=method, headers=headers, environ_overrides={
        CLUSTER: Cluster("c1", "p1", "k8s"), USER: User(7, "alice")})


@pytest.mark.parametrize(
    ("method", "path", "headers", "operation"),
    [
        pytest.param("DELETE", POD, {}, "DELETE", id="delete"),
        pytest.param("POST", POD + "/exec?command=sh", {"Connection": "Upgrade", "Upgrade": "SPDY/3.1"},
                     "CONNECT", id="spdy-exec"),
        pytest.param("GET", POD + "/attach", {"Connection": "Upgrade", "Upgrade": "websocket"}, "CONNECT",
                     id="websocket-attach"),
        pytest.param("POST", POD + "/portforward", {}, "CONNECT", id="portforward"),
    ],
)
def test_a_fail_webhook_matching_the_operation_refuses_it_by_name(hooks, ca, method, path, headers, operation):  # type: ignore[no-untyped-def]
    client, _ = _layer(hooks, ca, (operation,), ("pods", "pods/*"), "Fail")
    response = _send(client, method, path, **headers)
    assert response.status_code == 501
    body = response.get_json()
    assert body["kind"] == "Status" and 'webhook "guard.example.com"' in body["message"]
    assert operation in body["message"]


def test_an_ignore_webhook_lets_it_through(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, _ = _layer(hooks, ca, ("DELETE",), ("pods",), "Ignore")
    response = _send(client, "DELETE", POD)
    assert response.status_code == 200 and response.get_json()["method"] == "DELETE"


def test_exec_is_not_mistaken_for_a_create(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    """kubectl exec over SPDY is an empty POST: a CREATE rule on pods/* must not see it."""
    client, _ = _layer(hooks, ca, ("CREATE",), ("pods", "pods/*"), "Fail")
    response = _send(client, "POST", POD + "/exec?command=sh", Connection="Upgrade", Upgrade="SPDY/3.1")
    assert response.status_code == 200 and response.get_json()["received"] == 0


def test_delete_without_a_matching_rule_passes(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    client, hook = _layer(hooks, ca, ("CREATE",), ("pods",), "Fail")
    assert _send(client, "DELETE", POD).status_code == 200
    assert hook.calls == 0


def test_a_kind_hidden_in_a_json_escape_is_still_admitted(hooks, ca) -> None:  # type: ignore[no-untyped-def]
    """The fast no-match check must not let "\\u0044eployment" slip past a Deployment definition."""
    from bcs_middleware.admission import MemoryDefinitionStore, parse_bcs_definition

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
