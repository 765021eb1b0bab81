"""The route table: every path the gateway and the driver answer, and the kind that owns it.

The table replaced five hand-written copies of the same decisions (the dispatcher's
``if``s, the access log's ``kind``, token auth's agent-report regex, admission's
definition-route regex, the agent tunnel's path). The expected answers below are those
copies' answers, written out; a random sweep compares the table against them as they
were, so no path changed owner in the move.
"""

from __future__ import annotations

import random
import re

import pytest

from bcs_middleware.agent_tunnel.handshake import CONNECT_PATH
from bcs_middleware.core import routes
from bcs_middleware.core.routes import Route, match


@pytest.mark.parametrize("method, path, kind, definitions", [
    # The Kubernetes route: anything below the prefix, checked later (an empty id is a 400 there).
    pytest.param("GET", "/tunnels/clusters/BCS-K8S-1/api/v1/pods", "kubernetes", False, id="tunnel"),
    pytest.param("GET", "/tunnels/clusters/BCS-K8S-1", "kubernetes", False, id="tunnel-cluster-only"),
    pytest.param("GET", "/tunnels/clusters/BCS-K8S-1/", "kubernetes", False, id="tunnel-trailing-slash"),
    pytest.param("GET", "/tunnels/clusters/BCS-K8S-1//version", "kubernetes", False, id="tunnel-doubled-slash"),
    pytest.param("GET", "/tunnels/clusters/", "kubernetes", False, id="tunnel-no-cluster-id"),
    pytest.param("GET", "/tunnels/clusters//version", "kubernetes", False, id="tunnel-empty-cluster-id"),
    pytest.param("GET", "/tunnels/clusters/c/api/v1/namespaces/a%2Fb", "kubernetes", False, id="tunnel-percent"),
    pytest.param("GET", "/tunnels/clusters/c/api\n\x1b[31m", "kubernetes", False, id="tunnel-control-chars"),
    pytest.param("GET", "/tunnels/clusters/c/../../rest/users/", "kubernetes", False, id="tunnel-dot-dot"),
    pytest.param("GET", "/tunnels/clusters", None, False, id="tunnel-prefix-without-slash"),
    pytest.param("GET", "/tunnels/", None, False, id="tunnels-only"),
    pytest.param("GET", "//tunnels/clusters/c/version", None, False, id="leading-doubled-slash"),
    # The agent's report, anonymous through token auth: PUT only, with or without "/rest".
    pytest.param("PUT", "/rest/clusters/BCS-K8S-1/credentials", "agent_report", False, id="report"),
    pytest.param("PUT", "/rest/clusters/BCS-K8S-1/credentials/", "agent_report", False, id="report-slash"),
    pytest.param("PUT", "/clusters/BCS-K8S-1/credentials", "agent_report", False, id="report-legacy"),
    pytest.param("PUT", "/clusters/BCS-K8S-1/credentials/", "agent_report", False, id="report-legacy-slash"),
    pytest.param("GET", "/rest/clusters/BCS-K8S-1/credentials", "management", False, id="report-get-is-management"),
    pytest.param("POST", "/clusters/BCS-K8S-1/credentials", "management", False, id="report-post-is-management"),
    pytest.param("PUT", "/rest/clusters//credentials", "management", False, id="report-empty-id"),
    pytest.param("PUT", "/rest/clusters/a/b/credentials", "management", False, id="report-id-with-slash"),
    pytest.param("PUT", "/rest/clusters/a/credentials//", "management", False, id="report-two-slashes"),
    # Management.
    pytest.param("GET", "/rest/", "management", False, id="rest"),
    pytest.param("GET", "/rest", None, False, id="rest-without-slash"),
    pytest.param("GET", "/clusters/", "management", False, id="clusters"),
    pytest.param("GET", "/rest/rbac/status", "rbac_status", False, id="rbac-status"),
    pytest.param("GET", "/rest/rbac/status/", "management", False, id="rbac-status-slash"),
    # Definitions, exempt from admission.
    pytest.param("POST", "/rest/admissionwebhooks", "management", True, id="defs-rest"),
    pytest.param("PUT", "/rest/admissionwebhooks/w/", "management", True, id="defs-rest-name-slash"),
    pytest.param("PUT", "/rest/admissionwebhooks/w/x", "management", False, id="defs-rest-too-deep"),
    pytest.param("POST", "/rest/clusters/c/admissionwebhookconfigurations", "management", True, id="defs-k8s"),
    pytest.param("PUT", "/rest/clusters/c/admissionwebhookconfigurations/validating/w", "management", True,
                 id="defs-k8s-name"),
    pytest.param("PUT", "/rest/clusters/c/admissionwebhookconfigurations/validating", "management", False,
                 id="defs-k8s-half"),
    pytest.param("POST", "/rest/admission/review", "management", True, id="defs-review"),
    pytest.param("POST", "/mesosdriver/v4/namespaces/ns/admissionwebhook", "driver", True, id="defs-driver"),
    pytest.param("PUT", "/mesosdriver/v4/namespaces/ns/admissionwebhook/w/", "driver", True, id="defs-driver-name"),
    pytest.param("POST", "/mesosdriver/v4/admissionwebhooks", "driver", True, id="defs-driver-list"),
    pytest.param("POST", "/bcsapi/v4/scheduler/mesos/admissionwebhooks/", "mesos", True, id="defs-mesos"),
    pytest.param("POST", "/bcsapi/v4/scheduler/mesos/namespaces/ns/admissionwebhook", "mesos", True,
                 id="defs-mesos-ns"),
    pytest.param("POST", "/tunnels/clusters/c/rest/admissionwebhooks", "kubernetes", False,
                 id="defs-name-under-tunnel"),
    # Mesos, web console, the agent tunnel, the driver.
    pytest.param("POST", "/bcsapi/v4/scheduler/mesos/namespaces/ns/applications", "mesos", False, id="mesos"),
    pytest.param("GET", "/bcsapi/v4/scheduler/mesos", "bcsapi", False, id="mesos-without-slash"),
    pytest.param("GET", "/bcsapi/v1/webconsole/start_exec", "webconsole", False, id="webconsole"),
    pytest.param("GET", "/bcsapi/v1/websocket/connect", "agent_connect", False, id="agent-connect"),
    pytest.param("GET", "/bcsapi/v1/websocket/connect/", "bcsapi", False, id="agent-connect-slash"),
    pytest.param("GET", "/bcsapi/v1/other", "bcsapi", False, id="other-bcsapi"),
    pytest.param("GET", "/mesosdriver/v4/namespaces/ns/applications", "driver", False, id="driver"),
    # Status and nothing.
    pytest.param("GET", "/healthz", "health", False, id="healthz"),
    pytest.param("GET", "/healthz/", None, False, id="healthz-slash"),
    pytest.param("GET", "/readyz", "readiness", False, id="readyz"),
    pytest.param("GET", "/metrics", "metrics", False, id="metrics"),
    pytest.param("GET", "/metrics/x", None, False, id="metrics-below"),
    pytest.param("GET", "/", None, False, id="root"),
    pytest.param("GET", "", None, False, id="empty"),
    pytest.param("GET", "api/v1/pods", None, False, id="relative"),
])
def test_route_table(method: str, path: str, kind: str | None, definitions: bool) -> None:
    route = match(path, method)
    if kind is None:
        assert route is None
    else:
        assert route == Route(kind, definitions=definitions)  # type: ignore[arg-type]


def test_the_agent_tunnel_connects_on_the_tables_path() -> None:
    assert CONNECT_PATH == routes.AGENT_CONNECT_PATH
    assert match(CONNECT_PATH) == Route("agent_connect")


# The decisions as five places made them before the table (the reference of the sweep).
_OLD_DEFINITIONS = re.compile(
    r"(?:/mesosdriver/v4|/bcsapi/v4/scheduler/mesos)"
    r"/(?:namespaces/[^/]+/admissionwebhook(?:/[^/]+)?|admissionwebhooks)/?"
    r"|/rest/(?:admissionwebhooks(?:/[^/]+)?"
    r"|clusters/[^/]+/admissionwebhookconfigurations(?:/[^/]+/[^/]+)?|admission/review)/?"
)
_OLD_REPORT = re.compile(r"/(?:rest/)?clusters/[^/]+/credentials/?")


def _old_label(path: str) -> str:
    if path.startswith("/tunnels/clusters/"):
        return "tunnel"
    if path.startswith(("/rest/", "/clusters/")):
        return "rest"
    if path.startswith(("/bcsapi/", "/mesosdriver/")):
        return "agent" if path == "/bcsapi/v1/websocket/connect" else "mesos"
    return "other"


def _old_dispatch(path: str) -> str | None:
    if path.startswith("/tunnels/clusters/"):
        return "kubernetes"
    if path in ("/healthz", "/readyz", "/metrics", "/rest/rbac/status"):
        return {"/healthz": "health", "/readyz": "readiness", "/metrics": "metrics",
                "/rest/rbac/status": "rbac_status"}[path]
    if path.startswith("/bcsapi/v4/scheduler/mesos/"):
        return "mesos"
    if path.startswith("/bcsapi/v1/webconsole/"):
        return "webconsole"
    if path.startswith(("/rest/", "/clusters/")):
        return "management"
    return None


_PIECES = ["", "/", "//", "rest", "clusters", "tunnels", "c", "credentials", "bcsapi", "v4", "scheduler",
           "mesos", "v1", "webconsole", "websocket", "connect", "mesosdriver", "namespaces", "admissionwebhook",
           "admissionwebhooks", "admissionwebhookconfigurations", "admission", "review", "rbac", "status",
           "healthz", "readyz", "metrics", "x", "%2F", "\n", "..", "é"]


def test_the_table_agrees_with_the_rules_it_replaced() -> None:
    rng = random.Random(26)  # noqa: S311 - reproducible test data
    for _ in range(20000):
        path = "/" + "/".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 7)))
        if rng.random() < 0.5:  # bias towards the routes' own prefixes
            path = rng.choice(["/tunnels/clusters/", "/rest/", "/clusters/", "/bcsapi/v4/scheduler/mesos/",
                               "/mesosdriver/v4/", "/bcsapi/v1/"]) + path.lstrip("/")
        method = rng.choice(["GET", "PUT", "POST", "DELETE"])
        route = match(path, method)
        label = route.label if route is not None else "other"
        assert label == _old_label(path), path
        dispatched = route.kind if route is not None else None
        if dispatched == "agent_report":
            dispatched = "management"  # the management API answers it, as before
        if dispatched in ("driver", "bcsapi", "agent_connect"):
            dispatched = None  # no part of the gateway's dispatcher
        assert dispatched == _old_dispatch(path), path
        assert (route is not None and route.definitions) == bool(_OLD_DEFINITIONS.fullmatch(path)), path
        is_report = route is not None and route.kind == "agent_report"
        assert is_report == (method == "PUT" and bool(_OLD_REPORT.fullmatch(path))), path


def test_long_paths_are_matched_alike_but_not_remembered() -> None:
    long_path = "/tunnels/clusters/c/" + "a/" * 400
    assert match(long_path) == Route("kubernetes")
    assert (long_path, "GET") not in routes._matches
    assert match("/tunnels/clusters/c/api") == Route("kubernetes")
    assert ("/tunnels/clusters/c/api", "GET") in routes._matches
