"""bk-bcs's own formats against a real ZooKeeper and real ``bcs-middleware serve`` processes.

ZooKeeper fixtures are the nodes bk-bcs's Go mesos-driver writes (``bcs-mesos-driver/mesosdriver/
mesosdriver.go`` → ``RegisterDiscover.RegisterService(key, json.Marshal(MesosDriverServInfo))`` →
go-zookeeper's ``CreateProtectedEphemeralSequential``): under ``/bcs/services/endpoints/mesosdriver/
<cluster>/`` a node ``_c_<32 hex>-<ip><10-digit sequence>`` whose data is ``types.ServerInfo`` as Go
marshals it (every field, zero values included).
"""

from __future__ import annotations

import json
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from kazoo.client import KazooClient

from bcs_middleware.discovery.registration import driver_path, mesos_driver_path
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, TrapListener, free_port

from .conftest import mesos_get, served_by
from .test_discovery import discovery  # noqa: F401 - fixture

CLI = str(BIN / "bcs-middleware")
ADMIN = "compat-admin-token-" + "c" * 24


def go_driver_node(cluster: str, *, ip: str, port: int, external_ip: str = "", external_port: int = 0) -> bytes:
    """``json.Marshal(commtype.MesosDriverServInfo{...})`` — Go's field order, zero values written."""
    return json.dumps({
        "ip": ip, "ipv6": "", "port": port, "grpc_port": 0, "metric_port": 9091, "hostname": "mesos-master-1",
        "scheme": "http", "version": "v1.20.11", "cluster": cluster, "pid": 4242, "external_ip": external_ip,
        "external_ipv6": "", "external_port": external_port,
    }, separators=(",", ":")).encode()


def create_go_node(raw: KazooClient, parent: str, ip: str, data: bytes) -> str:
    """What ``CreateProtectedEphemeralSequential(parent + "/" + ip, data)`` creates."""
    raw.ensure_path(parent)
    return str(raw.create(f"{parent}/_c_{uuid.uuid4().hex}-{ip}", data, ephemeral=True, sequence=True))


def test_go_driver_nodes_route_to_their_external_address(zookeeper, discovery, fakes,  # noqa: F811
                                                         gateway_route) -> None:
    cluster = "BCS-MESOS-GOEXT"
    outside = fakes("outside")  # the driver as a gateway outside the cluster network reaches it
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(30)
    try:
        # the inner address is one nothing listens on: only the external one answers
        create_go_node(raw, driver_path(cluster), "10.255.0.1",
                       go_driver_node(cluster, ip="127.0.0.1", port=free_port(),
                                      external_ip="127.0.0.1", external_port=outside.port))
        assert discovery.wait_for(lambda snap: bool(snap.drivers.get(cluster)), 10)
        server, _ = gateway_route(discovery)
        assert served_by(mesos_get(server.url, "namespaces/ns/applications", cluster)) == "outside"
    finally:
        raw.stop()
        raw.close()


def test_never_registered_is_404_and_all_gone_is_503(zookeeper, discovery, fakes, gateway_route) -> None:  # noqa: F811
    cluster = "BCS-MESOS-GONE"
    driver = fakes("driver")
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(30)
    try:
        server, _ = gateway_route(discovery)
        never = mesos_get(server.url, "namespaces/ns/applications", "BCS-MESOS-NEVER")
        assert never.status_code == 404
        assert never.json() == {"result": False, "code": 1405051, "message": never.json()["message"], "data": None}
        node = create_go_node(raw, driver_path(cluster), "127.0.0.1",
                              go_driver_node(cluster, ip="127.0.0.1", port=driver.port))
        assert discovery.wait_for(lambda snap: bool(snap.drivers.get(cluster)), 10)
        assert served_by(mesos_get(server.url, "x", cluster)) == "driver"
        raw.delete(node)  # the driver died: its directory stays
        assert discovery.wait_for(lambda snap: not snap.drivers.get(cluster), 10)
        gone = mesos_get(server.url, "x", cluster)
        assert gone.status_code == 503
        assert (gone.json()["result"], gone.json()["code"]) == (False, 1405051)
        # the Mesos layout's driver nodes directly below mesosdriver/ are no clusters
        create_go_node(raw, mesos_driver_path(), "127.0.0.1", go_driver_node(cluster, ip="127.0.0.1", port=1))
        time.sleep(0.5)  # the sleep is the test: a window in which discovery would have taken the node
        assert not [c for c in discovery.snapshot.clusters if c.startswith("_c_")]
    finally:
        raw.stop()
        raw.close()


def _children(raw: KazooClient, path: str) -> list[str]:
    return raw.get_children(path) if raw.exists(path) else []


def test_a_driver_registers_in_both_layouts_and_deregisters_first_on_sigterm(
        zookeeper, registrars, tmp_path: Path) -> None:
    from bcs_middleware.discovery.base import Endpoint

    cluster = "BCS-MESOS-SIGTERM"
    root = "/compat-sigterm"
    silent = TrapListener(hold=True)  # a scheduler that accepts and never answers: requests stay in flight
    registrars(zookeeper.hosts, f"{root}/scheduler", Endpoint(ip="127.0.0.1", port=silent.port))
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(30)
    port = free_port()
    driver = ServerProcess(
        [CLI, "serve", "--role", "driver", "--cluster-id", cluster, "--zookeeper", zookeeper.hosts,
         "--zookeeper-root", root, "--data-dir", str(tmp_path / "driver"), "--bind", f"127.0.0.1:{port}",
         "--workers", "1", "--threads", "4", "--graceful-timeout", "10", "--insecure-http"],
        port=port, timeout=60)
    try:
        gateways_layout, mesos_layout = driver_path(cluster, root), mesos_driver_path(root)
        assert wait_until(lambda: bool(_children(raw, gateways_layout)), 15)
        assert wait_until(lambda: any(n.startswith("_c_") for n in _children(raw, mesos_layout)), 15)
        [node] = _children(raw, gateways_layout)
        assert node.startswith("_c_") and node[3:35].isalnum() and node.endswith(tuple("0123456789"))
        assert node[:-10].endswith("-127.0.0.1")
        data = json.loads(raw.get(f"{gateways_layout}/{node}")[0])
        assert (data["cluster"], data["port"]) == (cluster, port)

        # a request in flight to a scheduler that never answers keeps the worker busy for the
        # whole graceful timeout: the nodes must not wait for it
        def stuck() -> None:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/mesosdriver/v4/namespaces/ns/applications",
                                         headers={"BCS-ClusterID": cluster})
            try:
                urllib.request.urlopen(req, timeout=30).read()
            except (urllib.error.URLError, OSError):
                pass

        threading.Thread(target=stuck, daemon=True).start()
        assert wait_until(lambda: silent.accepted >= 1, 10)  # the request is in flight at the scheduler
        driver.signal(signal.SIGTERM)
        sent = time.monotonic()
        assert wait_until(lambda: not _children(raw, gateways_layout)
                          and not any(n.startswith("_c_") for n in _children(raw, mesos_layout)), 1.0, 0.02), \
            "the driver's nodes outlived SIGTERM by more than 1 s"
        assert time.monotonic() - sent < 1.0
        assert driver.proc.poll() is None  # still finishing its request: deregistered first
    finally:
        driver.stop()
        silent.close()
        raw.stop()
        raw.close()


def test_a_gateway_whose_zookeeper_is_down_exits_within_the_graceful_timeout(private_zookeeper,
                                                                               tmp_path: Path) -> None:
    port = free_port()
    gateway = ServerProcess(
        [CLI, "serve", "--zookeeper", private_zookeeper.hosts, "--data-dir", str(tmp_path / "gw"),
         "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4", "--graceful-timeout", "3"],
        port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60)
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "gw" / "tls" / "ca.crt"))
        with urllib.request.urlopen(f"https://localhost:{port}/healthz", timeout=10, context=ctx) as resp:
            assert resp.status == 200
        private_zookeeper.stop()
        time.sleep(1.0)  # the sleep is the test: the gateway has lost its ZooKeeper when it is told to stop
        gateway.signal(signal.SIGTERM)
        started = time.monotonic()
        wait_until(lambda: gateway.proc.poll() is not None, 20, step=0.1)
        took = time.monotonic() - started
        assert gateway.proc.poll() is not None, "the gateway still runs 20 s after SIGTERM"
        assert took < 3 + 1.5, f"exited after {took:.1f} s (graceful timeout 3 s)"
    finally:
        gateway.stop(timeout=5)

