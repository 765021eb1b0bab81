"""The Mesos route and the driver decide by the one route table (core/routes.py): which paths
they own, and which are webhook-definition routes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from werkzeug.test import Client

from bcs_middleware.compose.driver import build_driver
from bcs_middleware.core import environ as env
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.core.routes import match
from bcs_middleware.discovery.base import Endpoint
from bcs_middleware.discovery.static import StaticDiscovery
from bcs_middleware.layers.mesos_route import MesosRoutingMiddleware, filter_factory


def _named(name: str) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"app": name, "path": environ.get("PATH_INFO")}).encode()]
    return app


def test_the_mesos_route_owns_only_a_prefix_of_the_table() -> None:
    discovery = StaticDiscovery({})
    with pytest.raises(ValueError, match="route table"):
        MesosRoutingMiddleware(_named("next"), discovery=discovery, prefix="/bcsapi/v4/scheduler/other/")
    with pytest.raises(ConfigError, match=r"\[filter:mesos_routing\] prefix must be"):
        filter_factory({}, static_drivers="c1 = http://127.0.0.1:9001", prefix="/elsewhere/")(_named("next"))


class Superuser:
    """Stands in for token auth: every request is a superuser's."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        environ[env.USER] = env.User(1, "root", is_superuser=True)
        return self.app(environ, start_response)


@pytest.mark.parametrize(("path", "served_by"), [
    pytest.param("/bcsapi/v4/scheduler/mesos/namespaces/ns/admissionwebhook", "definitions", id="definition"),
    pytest.param("/bcsapi/v4/scheduler/mesos/admissionwebhooks/", "definitions", id="definition-list"),
    pytest.param("/bcsapi/v4/scheduler/mesos/namespaces/ns/admissionwebhook/a/b", "driver", id="too-deep"),
    pytest.param("/bcsapi/v4/scheduler/mesos/namespaces/ns/applications", "driver", id="resource"),
    pytest.param("/bcsapi/v1/webconsole/x", "next", id="another-route"),
])
def test_the_mesos_route_serves_the_tables_definition_routes(path: str, served_by: str) -> None:
    layer = MesosRoutingMiddleware(_named("next"), discovery=StaticDiscovery({"c1": ["http://127.0.0.1:9001"]}),
                                   definitions=_named("definitions"))
    response = Client(Superuser(layer)).post(path, json={}, headers={"BCS-ClusterID": "c1"})
    assert response.status_code == 200, response.data
    if served_by == "driver":  # forwarded: bcs.upstream set to the driver, passed to the next app
        assert response.json == {"app": "next", "path": path}
    else:
        assert response.json["app"] == served_by  # type: ignore[index]
    route = match(path, "POST")
    assert route is not None and route.definitions == (served_by == "definitions")


@pytest.mark.parametrize(("path", "served_by"), [
    pytest.param("/mesosdriver/v4/namespaces/ns/admissionwebhook/w/", "definitions", id="definition"),
    pytest.param("/mesosdriver/v4/admissionwebhooks", "definitions", id="definition-list"),
    pytest.param("/mesosdriver/v4/namespaces/ns/admissionwebhook//", "admission", id="empty-name"),
    pytest.param("/mesosdriver/v4/namespaces/ns/deployment", "admission", id="resource"),
    pytest.param("/mesosdriver/v3/namespaces/ns/deployment", None, id="another-version"),
    pytest.param("/bcsapi/v4/scheduler/mesos/admissionwebhooks", None, id="the-gateways-route"),
])
def test_the_driver_dispatches_by_the_route_table(path: str, served_by: str | None) -> None:
    driver = build_driver(cluster_id="BCS-MESOS-1",
                          discovery=StaticDiscovery(schedulers=[Endpoint.from_url("http://127.0.0.1:9")]))
    driver.admission, driver.definitions_api = _named("admission"), _named("definitions")
    response = Client(driver).post(path, json={}, headers={"BCS-ClusterID": "BCS-MESOS-1"})
    if served_by is None:
        assert response.status_code == 404
        return
    assert response.json["app"] == served_by  # type: ignore[index]
    route = match(path, "POST")
    assert route is not None and route.definitions == (served_by == "definitions")
