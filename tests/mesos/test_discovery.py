"""ZooKeeper discovery and the gateway's Mesos route, against a real ZooKeeper."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from kazoo.client import KazooClient

from bcs_middleware.discovery.base import Endpoint, node_sequence
from bcs_middleware.discovery.registration import apiserver_path, driver_path
from bcs_middleware.discovery.static import StaticDiscovery
from bcs_middleware.discovery.zookeeper import ZookeeperDiscovery
from tests.support.polling import wait_until

from .conftest import SCHEDULERS, SESSION_TIMEOUT, mesos_get, served_by

LAYOUT_FIELDS = {"ip", "port", "metric_port", "hostname", "scheme", "version", "cluster", "pid",
                 "external_ip", "external_port"}


@pytest.fixture
def discovery(zookeeper):
    found = ZookeeperDiscovery(zookeeper.hosts, timeout=SESSION_TIMEOUT, initial_wait=5)
    yield found
    found.close()


def test_driver_and_gateway_nodes_are_written_in_the_source_layout(zookeeper, registrars):
    endpoint = Endpoint(ip="10.1.2.3", port=8443, metric_port=9090, scheme="https", version="v1.2",
                        cluster="BCS-MESOS-LAYOUT", external_ip="1.2.3.4", external_port=443)
    driver = registrars(zookeeper.hosts, driver_path("BCS-MESOS-LAYOUT"), endpoint)
    gateway = registrars(zookeeper.hosts, apiserver_path(), Endpoint(ip="10.1.2.4", port=8080))
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(10)
    try:
        for registrar, parent in ((driver, "/bcs/services/endpoints/mesosdriver/BCS-MESOS-LAYOUT"),
                                  (gateway, "/bcs/services/endpoints/apiserver")):
            children = raw.get_children(parent)
            assert [f"{parent}/{name}" for name in children] == [registrar.node]
            assert node_sequence(children[0]) is not None and len(children[0]) == 10
            data, stat = raw.get(registrar.node)
            assert stat.ephemeralOwner != 0  # ephemeral: gone with the session
            document = json.loads(data)
            assert set(document) == LAYOUT_FIELDS
            assert document["pid"] > 0 and document["hostname"]
        assert json.loads(raw.get(driver.node)[0]) | {"pid": 0, "hostname": ""} == {
            "ip": "10.1.2.3", "port": 8443, "metric_port": 9090, "hostname": "", "scheme": "https",
            "version": "v1.2", "cluster": "BCS-MESOS-LAYOUT", "pid": 0, "external_ip": "1.2.3.4",
            "external_port": 443}
        node = driver.node
        driver.deregister()
        assert raw.exists(node) is None
    finally:
        raw.stop()
        raw.close()


def test_a_registrar_whose_session_expired_registers_again(zookeeper, registrars):
    registrar = registrars(zookeeper.hosts, driver_path("BCS-MESOS-EXPIRY"), Endpoint(ip="10.9.9.9", port=31000))
    first = registrar.node
    # A second client that takes over the session and closes it ends that session on the
    # server, exactly as an expiry does: the registrar's client hears SESSION_EXPIRED (LOST).
    thief = KazooClient(hosts=zookeeper.hosts, client_id=registrar._client.client_id)
    thief.start(10)
    thief.stop()
    thief.close()
    assert wait_until(lambda: registrar.node not in (None, first), timeout=15), "not registered again"
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(10)
    try:
        assert raw.exists(first) is None  # the old node went with the old session
        data, stat = raw.get(registrar.node)
        assert stat.ephemeralOwner == registrar._client.client_id[0] != 0
        assert Endpoint.from_json(data).ip == "10.9.9.9"
        assert raw.get_children(driver_path("BCS-MESOS-EXPIRY")) == [registrar.node.rsplit("/", 1)[1]]
    finally:
        raw.stop()
        raw.close()


def test_nodes_written_by_other_programs_are_read_tolerantly():
    assert Endpoint.from_json(b'{"ip":"10.0.0.1","port":"31000","extra":"x"}') == Endpoint("10.0.0.1", 31000)
    with pytest.raises(ValueError):
        Endpoint.from_json(b'{"port": 1}')
    # bcs-api uses the external address only when both external_ip and external_port are set
    assert Endpoint("10.0.0.1", 8443, external_ip="1.2.3.4").base_url(prefer_external=True) == "http://10.0.0.1:8443"
    assert Endpoint("10.0.0.1", 8443, external_ip="1.2.3.4", external_port=31443).base_url(
        prefer_external=True) == "http://1.2.3.4:31443"
    assert Endpoint("10.0.0.1", 8443, external_ip="1.2.3.4", external_port=31443).base_url() == "http://10.0.0.1:8443"


def test_requests_spread_over_three_drivers(zookeeper, discovery, fakes, registrars, gateway_route):
    drivers = [fakes(f"driver-{i}") for i in range(3)]
    for fake in drivers:
        registrars(zookeeper.hosts, driver_path("BCS-MESOS-SPREAD"), fake)
    assert discovery.wait_for(lambda s: len(s.drivers.get("BCS-MESOS-SPREAD", ())) == 3, 10)
    server, _ = gateway_route(discovery)
    reads_before = discovery.reads
    seen = Counter(served_by(mesos_get(server.url, "namespaces/ns1/applications?x=1", "BCS-MESOS-SPREAD"))
                   for _ in range(30))
    assert seen == {"driver-0": 10, "driver-1": 10, "driver-2": 10}
    assert discovery.reads == reads_before  # requests never touch ZooKeeper
    recorded = drivers[0].requests[0]
    assert recorded.path == "/mesosdriver/v4/namespaces/ns1/applications"
    assert recorded.query == "x=1"
    assert recorded.headers["Bcs-Clusterid"] == "BCS-MESOS-SPREAD"
    assert "Authorization" not in recorded.headers


def test_a_driver_whose_session_ended_gets_no_more_requests(zookeeper, discovery, fakes, registrars,
                                                            gateway_route):
    fakes_ = [fakes(f"d{i}") for i in range(3)]
    regs = [registrars(zookeeper.hosts, driver_path("BCS-MESOS-GONE"), fake) for fake in fakes_]
    assert discovery.wait_for(lambda s: len(s.drivers.get("BCS-MESOS-GONE", ())) == 3, 10)
    server, _ = gateway_route(discovery)
    regs[1].deregister()
    assert discovery.wait_for(lambda s: len(s.drivers.get("BCS-MESOS-GONE", ())) == 2, 10)
    before = fakes_[1].count()
    seen = Counter(served_by(mesos_get(server.url, "ping", "BCS-MESOS-GONE")) for _ in range(12))
    assert fakes_[1].count() == before
    assert seen == {"d0": 6, "d2": 6}


def test_a_dead_driver_still_listed_is_failed_over(zookeeper, discovery, fakes, registrars, gateway_route):
    alive, dead = fakes("alive"), fakes("dead")
    registrars(zookeeper.hosts, driver_path("BCS-MESOS-DEAD"), alive)
    registrars(zookeeper.hosts, driver_path("BCS-MESOS-DEAD"), dead)
    assert discovery.wait_for(lambda s: len(s.drivers.get("BCS-MESOS-DEAD", ())) == 2, 10)
    dead.stop()  # still registered: its port refuses connections
    server, _ = gateway_route(discovery)
    assert {served_by(mesos_get(server.url, "ping", "BCS-MESOS-DEAD")) for _ in range(6)} == {"alive"}


def test_zookeeper_outage_keeps_the_snapshot_and_recovery_sees_new_drivers(
        private_zookeeper, fakes, registrars, gateway_route):
    zk = private_zookeeper
    discovery = ZookeeperDiscovery(zk.hosts, timeout=SESSION_TIMEOUT, initial_wait=5)
    try:
        first, second = fakes("first"), fakes("second")
        registrars(zk.hosts, driver_path("BCS-MESOS-OUTAGE"), first)
        assert discovery.wait_for(lambda s: "BCS-MESOS-OUTAGE" in s.drivers, 10)
        server, layer = gateway_route(discovery)
        assert layer.health() == {"discovery": "ok"}

        zk.stop()
        assert wait_until(discovery.stale, 10)
        assert layer.health() == {"discovery": "stale"}
        assert served_by(mesos_get(server.url, "ping", "BCS-MESOS-OUTAGE")) == "first"

        zk.start()
        assert wait_until(lambda: not discovery.stale(), 20)
        registrars(zk.hosts, driver_path("BCS-MESOS-OUTAGE"), second)
        assert discovery.wait_for(lambda s: len(s.drivers.get("BCS-MESOS-OUTAGE", ())) == 2, 20)
        seen = {served_by(mesos_get(server.url, "ping", "BCS-MESOS-OUTAGE")) for _ in range(4)}
        assert seen == {"first", "second"}
    finally:
        discovery.close()


def test_scheduler_master_is_the_lowest_sequence_and_changes_when_it_leaves(
        zookeeper, discovery, fakes, registrars):
    one, two = fakes("sched-1"), fakes("sched-2")
    first = registrars(zookeeper.hosts, SCHEDULERS, one)
    registrars(zookeeper.hosts, SCHEDULERS, two)
    assert discovery.wait_for(lambda s: len(s.schedulers) >= 2, 10)
    master = discovery.scheduler_master()
    assert master is not None and master.port == one.port
    assert [e.port for e in discovery.schedulers()][:2] == [one.port, two.port]
    first.deregister()
    assert discovery.wait_for(lambda s: s.schedulers and s.schedulers[0].port == two.port, 10)


def test_a_forked_process_gets_its_own_client(zookeeper, discovery, monkeypatch):
    discovery.start()
    session = discovery._session
    monkeypatch.setattr("os.getpid", lambda: -1)
    discovery.start()
    assert discovery._session is not session
    monkeypatch.undo()
    discovery._session.close()  # the "child's" client, closed by the child (pid -1 is gone now)
    session.close()
    discovery._session = None


@pytest.mark.parametrize(
    ("headers", "cluster", "status", "bcs_code", "fragment"),
    [
        pytest.param({}, None, 400, 1405007, "BCS-ClusterID", id="missing-cluster-header"),
        pytest.param({}, "BCS-MESOS-NOPE", 404, 1405051, "BCS-MESOS-NOPE", id="never-registered-cluster"),
        pytest.param({}, "gone", 503, 1405051, "gone", id="registered-drivers-all-gone"),
        pytest.param({"X-Test-Anonymous": "1"}, "c1", 401, 1405057, "token", id="anonymous"),
        pytest.param({}, "c1", 502, 1405053, "", id="driver-unreachable"),
    ],
)
def test_route_errors_are_bcs_envelopes(gateway_route, headers, cluster, status, bcs_code, fragment):
    server, _ = gateway_route(StaticDiscovery({"c1": ["http://127.0.0.1:9"], "gone": []}))
    response = mesos_get(server.url, "namespaces/ns/applications", cluster, headers=headers)
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"result", "code", "message", "data"}
    assert (body["result"], body["code"], body["data"]) == (False, bcs_code, None)
    assert fragment in body["message"]
