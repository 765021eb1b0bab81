"""The driver role, YAML conversion on the gateway route, and gateway → driver → scheduler end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme
from kazoo.client import KazooClient
from werkzeug.test import Client

from bcs_middleware.compose.driver import app_factory, build_driver
from bcs_middleware.core import environ as env
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.discovery.registration import driver_path
from bcs_middleware.discovery.static import StaticDiscovery
from bcs_middleware.discovery.zookeeper import ZookeeperDiscovery
from bcs_middleware.layers.mesos_route import MesosRoutingMiddleware, filter_factory
from tests.admission.conftest import SERVICE_NAMES, Hook, bcs_add_label, bcs_definition, bcs_webhook
from tests.support.polling import wait_until
from tests.support.servers import free_port, gunicorn

from .conftest import SCHEDULERS, SESSION_TIMEOUT, UserLayer

ROOT = Path(__file__).resolve().parents[2]
APPLICATION = {"apiVersion": "v4", "kind": "Application",
               "metadata": {"name": "web", "namespace": "prod"}, "spec": {"instance": 1}}


def _capture(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    upstream = env.get_upstream(environ)
    payload = json.dumps({
        "content_type": environ.get("CONTENT_TYPE"),
        "body": environ["wsgi.input"].read(length).decode() if length else "",
        "base_urls": list(upstream.base_urls) if upstream else None,
        "path": upstream.path if upstream else None,
        "cluster": env.get_cluster(environ).cluster_type if env.get_cluster(environ) else None,
    }).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [payload]


def _route(**options: Any) -> Client:
    discovery = StaticDiscovery({"c1": ["http://127.0.0.1:9001", "https://127.0.0.1:9002"]})
    return Client(UserLayer(MesosRoutingMiddleware(_capture, discovery=discovery, max_yaml=256, **options)))


@pytest.mark.parametrize(
    ("content_type", "body", "status", "expected", "uri"),
    [
        pytest.param("application/x-yaml", "kind: Application\nmetadata:\n  name: web\n", 200,
                     {"kind": "Application", "metadata": {"name": "web"}}, "namespaces/ns/applications",
                     id="yaml-to-json"),
        pytest.param("text/yaml; charset=utf-8", "- a\n- b\n", 200, ["a", "b"], "namespaces/ns/other",
                     id="yaml-list"),
        # the driver's Go types read a list here as no ReplicaController: refused as it would refuse it
        pytest.param("text/yaml; charset=utf-8", "- a\n- b\n", 400, 1405010, "namespaces/ns/applications",
                     id="yaml-list-for-an-application"),
        pytest.param("application/x-yaml", "just a string", 400, 1405065, "namespaces/ns/applications",
                     id="not-a-mapping"),
        pytest.param("application/x-yaml", "a: [1, 2", 400, 1405065, "namespaces/ns/applications",
                     id="does-not-parse"),
        pytest.param("application/x-yaml", "!!python/object:os.system {}", 400, 1405065,
                     "namespaces/ns/applications", id="unsafe-tag"),
        pytest.param("application/x-yaml", "k: " + "x" * 300, 413, 1405008, "namespaces/ns/applications",
                     id="oversized"),
        pytest.param("application/json", '{"kind": "Application"}', 200, {"kind": "Application"},
                     "namespaces/ns/applications", id="json-kept"),
    ],
)
def test_yaml_bodies_become_json(content_type, body, status, expected, uri):
    response = _route().post(f"/bcsapi/v4/scheduler/mesos/{uri}", data=body,
                             headers={"BCS-ClusterID": "c1", "Content-Type": content_type})
    assert response.status_code == status, response.text
    if status != 200:
        assert response.json == {"result": False, "code": expected, "message": response.json["message"],
                                 "data": None}
        return
    assert json.loads(response.json["body"]) == expected
    assert response.json["content_type"] == "application/json" or content_type == "application/json"
    assert response.json["path"] == f"/mesosdriver/v4/{uri}"
    assert response.json["cluster"] == "mesos"


def test_route_rotates_drivers_prefers_external_and_refuses_escapes():
    client = _route()
    firsts = {client.get("/bcsapi/v4/scheduler/mesos/x", headers={"BCS-ClusterID": "c1"}).json["base_urls"][0]
              for _ in range(4)}
    assert firsts == {"http://127.0.0.1:9001", "https://127.0.0.1:9002"}
    escaped = client.get("/bcsapi/v4/scheduler/mesos/a/../../b", headers={"BCS-ClusterID": "c1"})
    assert escaped.status_code in (400, 404) or escaped.json["path"].startswith("/mesosdriver/v4/")
    encoded = client.get("/bcsapi/v4/scheduler/mesos/a%2F..%2Fb", headers={"BCS-ClusterID": "c1"},
                         environ_overrides={"REQUEST_URI": "/bcsapi/v4/scheduler/mesos/a%2F..%2Fb"})
    assert encoded.status_code == 400
    assert client.get("/other", headers={"BCS-ClusterID": "c1"}).json["path"] is None  # passes through


def test_filter_factory_builds_static_routing_and_rejects_bad_options():
    layer = filter_factory({}, static_drivers="c1 = http://127.0.0.1:1 https://127.0.0.1:2",
                           max_yaml="1MiB")(_capture)
    assert [e.base_url() for e in layer.discovery.drivers("c1")] == ["http://127.0.0.1:1", "https://127.0.0.1:2"]
    with pytest.raises(ConfigError, match="unknown key 'zk'"):
        filter_factory({}, zk="x")
    with pytest.raises(ConfigError, match="not both"):
        filter_factory({}, zookeeper_hosts="127.0.0.1:1", static_drivers="c1 = http://127.0.0.1:1")


def _driver(**kwargs: Any) -> Client:
    return Client(build_driver(cluster_id="c1", discovery=StaticDiscovery(schedulers=["http://127.0.0.1:9"]),
                               **kwargs))


@pytest.mark.parametrize(
    ("headers", "code_name"),
    [
        pytest.param({}, "CLUSTER_ID_REQUIRED", id="missing"),
        pytest.param({"BCS-ClusterID": "c2"}, "WRONG_CLUSTER", id="other-cluster"),
    ],
)
def test_driver_refuses_requests_for_another_cluster(headers, code_name):
    # bk-bcs's HeaderValidFilter: HTTP 400, BcsErrMesosDriverHttpFilterFailed, for a missing or wrong header
    response = _driver().get("/mesosdriver/v4/namespaces/ns/applications", headers=headers)
    assert response.status_code == 400
    assert (response.json["result"], response.json["code"], response.json["data"]) == (False, 1405234, None)
    assert "BCS-ClusterID" in response.json["message"]


def test_driver_health_definitions_api_and_factory(tmp_path):
    client = _driver()
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json["scheduler"] == "http://127.0.0.1:9"
    # Definition CRUD goes to the admission API (superusers only), never to the scheduler.
    assert client.get("/mesosdriver/v4/admissionwebhooks").status_code == 401
    assert client.post("/mesosdriver/v4/namespaces/ns/admissionwebhook", json={}).status_code == 401
    unreachable = ZookeeperDiscovery(f"127.0.0.1:{free_port()}", timeout=1, initial_wait=0)
    try:
        stale = Client(build_driver(cluster_id="c1", discovery=unreachable))
        assert stale.get("/readyz").status_code == 503
        assert stale.get("/readyz").json["discovery"] == "stale"
    finally:
        unreachable.close()
    assert app_factory({}, cluster_id="c1", static_schedulers="http://127.0.0.1:9").cluster_id == "c1"
    with pytest.raises(ConfigError, match="cluster_id is required"):
        app_factory({}, static_schedulers="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="zookeeper_hosts or static_schedulers"):
        app_factory({}, cluster_id="c1")


def test_gateway_to_gunicorn_driver_to_scheduler_with_admission(private_zookeeper, fakes, registrars,
                                                                gateway_route, tmp_path):
    zk = private_zookeeper
    ca = trustme.CA()
    hook = Hook(ca.issue_cert(*SERVICE_NAMES, "127.0.0.1"), bcs_add_label("injected", "yes"))
    scheduler = fakes("scheduler")
    registrars(zk.hosts, SCHEDULERS, scheduler)
    definitions = tmp_path / "admission.json"
    definitions.write_text(json.dumps({"admissionwebhooks": [
        bcs_definition("inject", [bcs_webhook("hook-a.webhooks", ca)])]}))
    port = free_port()
    environment = {"ZK_HOSTS": zk.hosts, "DRIVER_CLUSTER": "BCS-MESOS-E2E", "DRIVER_PORT": str(port),
                   "ADMISSION_DEFINITIONS": str(definitions),
                   "ADMISSION_ADDRESS_MAP": json.dumps({"hook-a.webhooks": hook.address})}
    discovery = ZookeeperDiscovery(zk.hosts, timeout=SESSION_TIMEOUT, initial_wait=5)
    raw = KazooClient(hosts=zk.hosts)
    raw.start(10)
    try:
        # The suite's worker class: under gevent the master's ZooKeeper hooks import kazoo before the
        # worker patches, which once made every scheduler call a 500 (kazoo's retry sleep).
        with gunicorn("tests.mesos.driver_app:app", port=port, workers=2, env=environment,
                      extra=["--chdir", str(ROOT), "-c", str(ROOT / "tests/mesos/gunicorn_driver_conf.py")]):
            assert discovery.wait_for(lambda s: "BCS-MESOS-E2E" in s.drivers, 15)
            # one registration per server, not per worker
            assert len(raw.get_children(driver_path("BCS-MESOS-E2E"))) == 1
            server, _ = gateway_route(discovery)
            yaml_body = ("apiVersion: v4\nkind: application\nmetadata:\n  name: web\n"
                         "  namespace: prod\nspec:\n  instance: 1\n  template:\n    spec:\n"
                         "      containers:\n      - image: nginx\n")
            response = requests.post(f"{server.url}/bcsapi/v4/scheduler/mesos/namespaces/prod/applications?v=1",
                                     data=yaml_body, headers={"BCS-ClusterID": "BCS-MESOS-E2E",
                                                              "Content-Type": "application/x-yaml"}, timeout=20)
            assert response.status_code == 200, response.text
            assert response.json()["result"] is True  # the scheduler's own envelope, relayed
            received = scheduler.requests[-1]
            # admission ran on the v4 document, then the driver converted it for the scheduler
            assert (received.method, received.path, received.query) == ("POST", "/v1/apps", "")
            version = received.json()
            assert version["ObjectMeta"]["labels"] == {"injected": "yes"} == version["Labels"]
            assert version["raw_json"]["metadata"]["labels"] == {"injected": "yes"}
            assert (version["ID"], version["RunAs"], version["Kind"]) == ("web", "prod", "application")
            assert hook.calls == 1
            # Admission parses JSON (and YAML) bodies only: a body sent as another media type is never
            # converted into a scheduler call that no webhook saw.
            before = scheduler.count()
            for content_type in ("text/plain", "application/octet-stream"):
                sneaky = requests.post(f"http://127.0.0.1:{port}/mesosdriver/v4/namespaces/prod/applications",
                                       data=json.dumps({"apiVersion": "v4", "kind": "application",
                                                        "metadata": {"name": "sneaky", "namespace": "prod"},
                                                        "spec": {"instance": 1, "template": {"spec": {
                                                            "containers": [{"image": "nginx"}]}}}}),
                                       headers={"BCS-ClusterID": "BCS-MESOS-E2E", "Content-Type": content_type},
                                       timeout=10)
                assert sneaky.status_code == 415, (content_type, sneaky.text)
            assert scheduler.count() == before and hook.calls == 1
            wrong = requests.get(f"http://127.0.0.1:{port}/mesosdriver/v4/x",
                                 headers={"BCS-ClusterID": "BCS-MESOS-OTHER"}, timeout=10)
            assert wrong.status_code == 400
        # clean shutdown removed the node
        assert wait_until(lambda: not raw.get_children(driver_path("BCS-MESOS-E2E")), 10)
    finally:
        raw.stop()
        raw.close()
        discovery.close()
        hook.stop()
