"""``classify``: one request, its facts — route, cluster, API path, RequestInfo, upgrade."""

from __future__ import annotations

from typing import Any

import pytest

from bcs_middleware.core import environ as env
from bcs_middleware.core import facts
from bcs_middleware.core.errors import BadRequest
from bcs_middleware.core.routes import Route


def _environ(path: str, method: str = "GET", query: str = "", **extra: Any) -> dict[str, Any]:
    return {"PATH_INFO": path, "REQUEST_METHOD": method, "QUERY_STRING": query, **extra}


def test_a_kubernetes_request_is_classified_on_its_api_path() -> None:
    got = facts.classify(_environ("/tunnels/clusters/BCS-K8S-1//api/v1/namespaces/dev/pods/web/exec", "POST",
                                  "command=sh", HTTP_CONNECTION="Upgrade", HTTP_UPGRADE="SPDY/3.1"))
    assert got.route == Route("kubernetes") and got.kubernetes and got.label == "tunnel"
    assert got.cluster_id == "BCS-K8S-1"
    assert got.api_path == "/api/v1/namespaces/dev/pods/web/exec"  # the doubled slash is one
    assert (got.info.namespace, got.info.resource, got.info.name, got.info.subresource) == ("dev", "pods", "web",
                                                                                             "exec")
    assert got.info.admission_operation == "CONNECT" and got.long_running
    assert got.upgrade == "SPDY/3.1" and got.refusal is None


def test_the_api_path_is_re_encoded_and_classified_decoded() -> None:
    got = facts.classify(_environ("/tunnels/clusters/c/api/v1/namespaces/a b/configmaps/x?y"))
    assert got.api_path == "/api/v1/namespaces/a%20b/configmaps/x%3Fy"
    assert (got.info.namespace, got.info.name) == ("a b", "x?y")


@pytest.mark.parametrize("path, raw_uri", [
    pytest.param("/tunnels/clusters/c/api/../../rest/users/", None, id="dot-dot"),
    pytest.param("/tunnels/clusters/c/./version", None, id="dot"),
    pytest.param("/tunnels/clusters/c/a\\b", None, id="backslash"),
    pytest.param("/tunnels/clusters/c/a\x00b", None, id="nul"),
    pytest.param("/tunnels/clusters/c/api/v1/namespaces/a/b", "/tunnels/clusters/c/api/v1/namespaces/a%2fb",
                 id="encoded-slash"),
    pytest.param("/tunnels/clusters/", None, id="no-cluster"),
    pytest.param("/tunnels/clusters/../x", None, id="dot-dot-cluster"),
])
def test_a_refused_kubernetes_path_is_classified_with_its_refusal(path: str, raw_uri: str | None) -> None:
    got = facts.classify(_environ(path, RAW_URI=raw_uri) if raw_uri else _environ(path))
    assert got.kubernetes and got.cluster_id is None and got.refusal
    assert not got.info.is_resource
    assert got.api_path.isprintable() and "\\" not in got.api_path
    with pytest.raises(BadRequest) as refused:
        got.refuse()
    assert refused.value.status == 400 and refused.value.code_name == "BAD_PATH"


def test_a_refused_path_is_named_percent_encoded() -> None:
    got = facts.classify(_environ("/tunnels/clusters/c/api/\n\x1b[2J/../x"))
    assert got.api_path == "/api/%0A%1B%5B2J/../x"
    assert got.info.path == got.api_path


def test_other_routes_keep_their_path() -> None:
    got = facts.classify(_environ("/bcsapi/v4/scheduler/mesos/namespaces/ns/applications", "POST"))
    assert got.route == Route("mesos") and got.label == "mesos" and not got.kubernetes
    assert got.cluster_id is None and got.api_path == "/bcsapi/v4/scheduler/mesos/namespaces/ns/applications"
    assert got.upgrade is None and got.refusal is None
    got.refuse()  # nothing to refuse


def test_a_path_without_route_is_classified_as_the_apiserver_would() -> None:
    got = facts.classify(_environ("/api/v1/namespaces/dev/pods", "POST"))
    assert got.route is None and got.kind is None and got.label == "other"
    assert got.info.admission_operation == "CREATE"


def test_of_classifies_once_and_keeps_the_facts() -> None:
    environ = _environ("/tunnels/clusters/c/api/v1/pods")
    first = facts.of(environ)
    assert environ[env.FACTS] is first
    environ["PATH_INFO"] = "/rest/"  # read once: a later change of PATH_INFO is not a new classification
    assert facts.of(environ) is first


def test_of_ignores_a_value_that_is_not_facts() -> None:
    environ = _environ("/tunnels/clusters/c/api/v1/pods", **{env.FACTS: "forged"})
    assert facts.of(environ).cluster_id == "c"


def test_reclassified_after_admission_rewrites_the_connect_target() -> None:
    environ = _environ("/tunnels/clusters/c/api/v1/namespaces/d/pods/p/exec", "POST", "command=sh")
    facts.of(environ)
    updated = facts.reclassified(environ, "/api/v1/namespaces/d/pods/p/attach", "stdin=true")
    assert facts.of(environ) is updated
    assert updated.cluster_id == "c" and updated.info.subresource == "attach"


def test_a_repeated_request_line_gets_the_same_facts_and_a_long_one_equal_facts() -> None:
    path = "/tunnels/clusters/c/api/v1/namespaces/default/pods"
    assert facts.classify(_environ(path)) is facts.classify(_environ(path))
    long_path = path + "/x" * 600
    first, second = facts.classify(_environ(long_path)), facts.classify(_environ(long_path))
    assert first == second and first is not second  # not remembered: too long
    refused = "/tunnels/clusters/c/api/../x"
    assert facts.classify(_environ(refused)).refusal == facts.classify(_environ(refused)).refusal is not None


def test_the_upgrade_decision_is_part_of_the_facts() -> None:
    path = "/tunnels/clusters/c/api/v1/namespaces/d/pods/p/exec"
    upgraded = facts.classify(_environ(path, "POST", HTTP_CONNECTION="Upgrade", HTTP_UPGRADE="websocket"))
    plain = facts.classify(_environ(path, "POST", HTTP_UPGRADE="websocket"))  # no Connection: upgrade
    h2c = facts.classify(_environ(path, "POST", HTTP_CONNECTION="Upgrade", HTTP_UPGRADE="h2c"))
    assert (upgraded.upgrade, plain.upgrade, h2c.upgrade) == ("websocket", None, None)
