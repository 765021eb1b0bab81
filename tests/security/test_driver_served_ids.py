"""A user must never gain a Mesos cluster that someone else's drivers serve.

Drivers announce the cluster id they serve (ZooKeeper ``/bcs/services/endpoints/mesosdriver/<id>``,
or the gateway's static list), and the gateway routes ``BCS-ClusterID: <id>`` to them for whoever
holds ``view`` on the id's record. The attacker (``mallory``, a plain user) tries to own such an
id: registering it as ``mesos`` and as ``k8s`` (refused: superusers only), and registering a
``k8s`` id *before* any driver serves it, then waiting for drivers to appear (the record is hers,
but a ``k8s`` record never routes to drivers). A superuser can register a served id and grant it.

Real ZooKeeper (Debian's), real ``bcs-middleware serve`` gateways; the drivers are recording
HTTP servers (what reaches them is what the gateway routed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from bcs_middleware.discovery.base import Endpoint
from bcs_middleware.discovery.registration import Registrar, driver_path
from tests.support import zookeeper
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import ADMIN, Gateway, served_gateway
from tests.support.polling import wait_until

ROUTE = "/bcsapi/v4/scheduler/mesos/namespaces/prod/applications"
#: Served by drivers from the start (in ZooKeeper and statically).
SERVED, SERVED_FOR_ADMIN = "BCS-MESOS-20001", "BCS-MESOS-20002"
#: Registered by mallory as k8s before any driver serves it; drivers come later.
LATE, PROBE = "BCS-MESOS-20003", "BCS-MESOS-20004"


@dataclass
class World:
    gw: Gateway
    driver: FakeUpstream
    mallory: str


def _endpoint(fake: FakeUpstream, cluster: str) -> Endpoint:
    return Endpoint(ip="127.0.0.1", port=int(urlsplit(fake.url).port or 0), scheme="http", cluster=cluster)


@pytest.fixture(scope="module")
def zk() -> Iterator[zookeeper.ZookeeperServer]:
    if not zookeeper.available():
        pytest.skip("ZooKeeper (Debian's zookeeper package and java) is not installed")
    server = zookeeper.ZookeeperServer()
    server.start()
    yield server
    server.remove()


@pytest.fixture(scope="module")
def registered(zk: zookeeper.ZookeeperServer) -> Iterator[list[Registrar]]:
    made: list[Registrar] = []
    yield made
    for registrar in made:
        registrar.deregister()


def _register(zk: zookeeper.ZookeeperServer, registered: list[Registrar], fake: FakeUpstream, cluster: str) -> None:
    registrar = Registrar(zk.hosts, driver_path(cluster), _endpoint(fake, cluster), timeout=5.0)
    assert registrar.register(wait=15), f"could not register a driver of {cluster}"
    registered.append(registrar)


@pytest.fixture(scope="module")
def in_zookeeper(zk: zookeeper.ZookeeperServer, registered: list[Registrar],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    driver = FakeUpstream()
    for cluster in (SERVED, SERVED_FOR_ADMIN):
        _register(zk, registered, driver, cluster)
    # One worker: what its discovery has seen is what every request sees.
    with served_gateway(tmp_path_factory.mktemp("zk-gateway"), workers=1, args=["--zookeeper", zk.hosts]) as gw:
        # The gateway has the drivers once a superuser's request reaches one (an id without a
        # record is routed for superusers, as before records existed).
        assert wait_until(lambda: _route(gw, ADMIN, SERVED)[0] == 404 and driver.requests, 30)
        yield World(gw, driver, gw.user("mallory"))
    driver.stop()


@pytest.fixture(scope="module")
def static(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    driver = FakeUpstream()
    args = [arg for cluster in (SERVED, SERVED_FOR_ADMIN) for arg in ("--static-driver", f"{cluster}={driver.url}")]
    with served_gateway(tmp_path_factory.mktemp("static-gateway"), workers=2, args=args) as gw:
        yield World(gw, driver, gw.user("mallory"))
    driver.stop()


@pytest.fixture(params=["zookeeper", "static"])
def world(request: pytest.FixtureRequest) -> World:
    return request.getfixturevalue("in_zookeeper" if request.param == "zookeeper" else "static")  # type: ignore[no-any-return]


def _route(gw: Gateway, token: str, cluster: str, method: str = "GET") -> tuple[int, bytes]:
    body = {"apiVersion": "v4", "kind": "application", "metadata": {"name": "x", "namespace": "prod"}}
    return gw.call(method, ROUTE, token=token, headers={"BCS-ClusterID": cluster},
                   body=body if method == "POST" else None)


def _register_cluster(gw: Gateway, token: str, cluster: str, cluster_type: str) -> tuple[int, dict]:
    status, raw = gw.call("POST", "/rest/clusters/bcs", token=token,
                          body={"id": cluster, "project_id": "p", "cluster_type": cluster_type})
    return status, json.loads(raw)


@pytest.mark.parametrize("cluster_type", ["mesos", "k8s"])
def test_a_plain_user_cannot_register_an_id_drivers_serve(world: World, cluster_type: str) -> None:
    before = len(world.driver.requests)
    status, body = _register_cluster(world.gw, world.mallory, SERVED, cluster_type)
    assert (status, body["code_name"]) == (403, "CLUSTER_ID_RESERVED"), body
    assert world.gw.call("GET", f"/rest/clusters/{SERVED}")[0] == 404  # nothing was recorded
    for method in ("GET", "POST"):
        status, _ = _route(world.gw, world.mallory, SERVED, method)
        assert status == 404
    assert len(world.driver.requests) == before, "mallory's request reached the drivers"


def test_a_plain_user_cannot_register_a_mesos_cluster_at_all(world: World) -> None:
    status, body = _register_cluster(world.gw, world.mallory, "BCS-MESOS-UNSERVED", "mesos")
    assert (status, body["code_name"]) == (403, "CLUSTER_ID_RESERVED"), body
    assert _register_cluster(world.gw, world.mallory, "mallorys-k8s", "k8s")[0] == 201


def test_a_superuser_registers_a_served_id_and_grants_it(world: World) -> None:
    assert _register_cluster(world.gw, ADMIN, SERVED_FOR_ADMIN, "mesos")[0] == 201
    world.gw.grant("mallory", "view", cluster=SERVED_FOR_ADMIN)
    before = len(world.driver.requests)
    # The tunnel's permission cache may hold the old answer for its ttl (5 s).
    assert wait_until(lambda: _route(world.gw, world.mallory, SERVED_FOR_ADMIN)[0] == 404
                      and len(world.driver.requests) > before, 15)
    assert world.driver.requests[-1].path == "/mesosdriver/v4/namespaces/prod/applications"
    assert "authorization" not in {k.lower() for k, _ in world.driver.requests[-1].headers}


def test_a_k8s_record_never_reaches_drivers_that_appear_later(
        in_zookeeper: World, zk: zookeeper.ZookeeperServer, registered: list[Registrar]) -> None:
    gw, mallory = in_zookeeper.gw, in_zookeeper.mallory
    assert _register_cluster(gw, mallory, LATE, "k8s")[0] == 201  # nobody serves it yet
    late = FakeUpstream()
    try:
        _register(zk, registered, late, LATE)
        _register(zk, registered, late, PROBE)
        # The gateway has seen the new drivers once it refuses the probe id to her.
        assert wait_until(lambda: _register_cluster(gw, mallory, PROBE, "k8s")[0] == 403, 30)
        for method in ("GET", "POST"):
            status, raw = _route(gw, mallory, LATE, method)
            assert status == 404 and json.loads(raw)["code"] == 1405051, raw
        # Not even a superuser's request: the record says k8s, and the superuser is told so.
        status, raw = _route(gw, ADMIN, LATE)
        assert status == 404 and b"registered as a k8s cluster" in raw, raw
        assert not late.requests, "a k8s record's id was routed to drivers"
        # The drivers were reachable all along: without the record, the superuser's request goes.
        gw.json("DELETE", f"/rest/clusters/{LATE}")
        assert wait_until(lambda: _route(gw, ADMIN, LATE)[0] == 404 and late.requests, 15)
        assert {r.header("BCS-ClusterID") for r in late.requests} == {LATE}
    finally:
        late.stop()
