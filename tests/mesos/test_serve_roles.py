"""Both roles as operators run them: `serve` (gateway) and `serve --role driver`, found through ZooKeeper."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bcs_middleware.discovery.base import DEFAULT_ROOT
from bcs_middleware.discovery.registration import apiserver_path, driver_path
from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port

from .conftest import SCHEDULERS

CLI = str(BIN / "bcs-middleware")
ADMIN = "mesos-roles-admin-token-" + "m" * 20
CLUSTER = "BCS-MESOS-ROLES"


def _request(url: str, cafile: str, *, method: str = "GET", body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context(cafile=cafile)) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_gateway_finds_the_driver_in_zookeeper_and_both_register(zookeeper, fakes, registrars,  # type: ignore[no-untyped-def]
                                                                  tmp_path: Path) -> None:
    scheduler = fakes("scheduler")
    registrars(zookeeper.hosts, SCHEDULERS, scheduler)
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(10)
    driver_data, gateway_data = tmp_path / "driver", tmp_path / "gateway"
    driver_port, gateway_port = free_port(), free_port()
    driver = ServerProcess(
        [CLI, "serve", "--role", "driver", "--cluster-id", CLUSTER, "--zookeeper", zookeeper.hosts,
         "--data-dir", str(driver_data), "--bind", f"127.0.0.1:{driver_port}", "--workers", "2", "--threads", "4",
         "--graceful-timeout", "3"],
        port=driver_port, scheme="https", timeout=60)
    try:
        assert wait_until(lambda: raw.exists(driver_path(CLUSTER)) and raw.get_children(driver_path(CLUSTER)), 15)
        children = raw.get_children(driver_path(CLUSTER))
        assert len(children) == 1  # one registration per server, not per worker
        node = json.loads(raw.get(f"{driver_path(CLUSTER)}/{children[0]}")[0])
        assert node["ip"] == "127.0.0.1" and node["port"] == driver_port and node["scheme"] == "https"
        assert node["cluster"] == CLUSTER

        with ServerProcess(
            [CLI, "serve", "--zookeeper", zookeeper.hosts, "--data-dir", str(gateway_data),
             "--bind", f"127.0.0.1:{gateway_port}", "--workers", "2", "--threads", "4",
             "--driver-ca-file", str(driver_data / "tls" / "ca.crt"), "--graceful-timeout", "3"],
            port=gateway_port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60,
        ) as gateway:
            assert gateway.proc.poll() is None
            cafile = str(gateway_data / "tls" / "ca.crt")
            base = f"https://localhost:{gateway_port}"
            assert wait_until(lambda: raw.exists(apiserver_path(DEFAULT_ROOT))
                          and raw.get_children(apiserver_path(DEFAULT_ROOT)), 15)
            status, ready = _request(f"{base}/readyz", cafile)
            assert status == 200 and json.loads(ready)["discovery"] == "ok"

            url = f"{base}/bcsapi/v4/scheduler/mesos/namespaces/prod/applications?x=1"
            auth = {"Authorization": f"Bearer {ADMIN}", "BCS-ClusterID": CLUSTER,
                    "Content-Type": "application/x-yaml"}
            body = (b"apiVersion: v4\nkind: application\nmetadata:\n  name: web\n  namespace: prod\n"
                    b"spec:\n  instance: 1\n  template:\n    spec:\n      containers:\n      - image: nginx\n")
            assert wait_until(lambda: _request(url, cafile, method="POST", body=body, headers=auth)[0] == 200, 20)
            received = scheduler.requests[-1]
            assert (received.method, received.path) == ("POST", "/v1/apps")  # converted by the driver
            assert received.json()["ID"] == "web" and received.json()["RunAs"] == "prod"
            assert "authorization" not in {k.lower() for k in received.headers}

            missing = _request(url, cafile, method="POST", body=body,
                               headers={"Authorization": f"Bearer {ADMIN}"})
            assert missing[0] == 400
            unknown = _request(url, cafile, headers={"Authorization": f"Bearer {ADMIN}",
                                                      "BCS-ClusterID": "BCS-MESOS-NONE"})
            # never registered: bcs-api's "mesos cluster not found", with a real 404
            assert unknown[0] == 404 and b"BCS-MESOS-NONE" in unknown[1]
            assert json.loads(unknown[1])["code"] == 1405051
            assert _request(url, cafile, headers={"BCS-ClusterID": CLUSTER})[0] == 401
        gateway_output = gateway.output()
        assert ADMIN not in gateway_output

        # A clean shutdown removes the node (SIGTERM, as an init system sends it).
        driver.signal(signal.SIGTERM)
        assert wait_until(lambda: not raw.get_children(driver_path(CLUSTER)), 15)
        assert driver.proc.wait(20) == 0
    finally:
        driver.stop()
        raw.stop()
        raw.close()


def _children(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of a process's children (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def test_a_gevent_server_keeps_one_registration_across_worker_restarts_and_drops_it_when_killed(  # type: ignore[no-untyped-def]
        zookeeper, tmp_path: Path) -> None:
    """The default (gevent) worker with --zookeeper: workers forked from a patched master must not
    inherit the ZooKeeper session, and the registration must not outlive the server."""
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(10)
    port = free_port()
    # A root of its own: the shared ZooKeeper may still hold another test's gateway node until
    # that server's session times out, and this test counts nodes.
    root = "/bcs-gevent-registration/services/endpoints"
    gateway = ServerProcess(
        [CLI, "serve", "--zookeeper", zookeeper.hosts, "--zookeeper-root", root,
         "--data-dir", str(tmp_path / "gw"),
         "--bind", f"127.0.0.1:{port}", "--workers", "2", "--graceful-timeout", "3"],
        port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60)
    directory = apiserver_path(root)
    try:
        assert wait_until(lambda: raw.exists(directory) and raw.get_children(directory), 15)
        [node] = raw.get_children(directory)
        session = raw.exists(f"{directory}/{node}").ephemeralOwner
        assert wait_until(lambda: len(_children(gateway.proc.pid)) == 3, 15)  # two workers and the registration
        children = _children(gateway.proc.pid)
        keepers = [pid for pid, cmd in children if "discovery.registration" in cmd]
        workers = [pid for pid, _ in children if pid not in keepers]
        assert len(keepers) == 1 and len(workers) == 2
        # A worker dies and gunicorn forks another from the (gevent-patched) master.
        os.kill(workers[0], signal.SIGKILL)
        assert wait_until(lambda: len(_children(gateway.proc.pid)) == 3
                      and workers[0] not in {pid for pid, _ in _children(gateway.proc.pid)}, 15)
        # Longer than the registrar's session timeout (10 s) would be needed to see a lost session
        # expire; two processes reading one session's socket break it within a few pings instead.
        time.sleep(4)
        assert raw.get_children(directory) == [node]
        assert raw.exists(f"{directory}/{node}").ephemeralOwner == session
        cafile = str(tmp_path / "gw" / "tls" / "ca.crt")
        assert _request(f"https://localhost:{port}/healthz", cafile)[0] == 200

        # The master killed outright (no hooks run): the registration process sees it and deletes
        # the node at once instead of leaving it for the session timeout.
        gateway.proc.kill()
        gateway.proc.wait(10)
        assert wait_until(lambda: not raw.get_children(directory), 3)
        assert wait_until(lambda: not _alive(keepers[0]), 5)
    finally:
        gateway.stop()
        raw.stop()
        raw.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


#: What a requested stop may take, from SIGTERM to the master's exit: the registration's
#: deletion (bounded at 2 s when ZooKeeper does not answer), then the workers' stop (a kept-alive
#: connection lingers 2 s after its last answer), with room for a busy CI machine (5.7 s was
#: seen). A stop held by what these tests take away would take ZooKeeper's session timeout
#: (10 s) or gunicorn's graceful timeout (30 s).
STOP_WITHIN = 8.0


def _hold_keepalive(port: int, cafile: str) -> http.client.HTTPSConnection:
    """A kept-alive connection after one answer, as a gateway's pool holds one to a driver."""
    conn = http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(cafile=cafile),
                                       timeout=30)
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    assert response.status == 200 and not response.will_close
    return conn


def _stopped_within(server: ServerProcess) -> float:
    started = time.monotonic()
    server.signal(signal.SIGTERM)
    code = server.proc.wait(60)
    took = time.monotonic() - started
    assert code == 0, f"exit code {code}"
    return took


def test_a_driver_stops_within_seconds_and_takes_its_nodes_along(zookeeper, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM with a gateway's kept-alive connection open and gunicorn's default graceful timeout
    (30 s): the connection, idle, is no reason to wait; both of the driver's nodes are gone."""
    raw = KazooClient(hosts=zookeeper.hosts)
    raw.start(10)
    cluster = "BCS-MESOS-STOP"
    port = free_port()
    driver = ServerProcess(
        [CLI, "serve", "--role", "driver", "--cluster-id", cluster, "--zookeeper", zookeeper.hosts,
         "--data-dir", str(tmp_path), "--bind", f"127.0.0.1:{port}", "--workers", "2"],
        port=port, scheme="https", timeout=60)
    held = None
    try:
        mesos_layout = f"{DEFAULT_ROOT}/mesosdriver"
        assert wait_until(lambda: raw.exists(driver_path(cluster)) and raw.get_children(driver_path(cluster)), 15)
        ours = [name for name in raw.get_children(mesos_layout) if name.startswith("_c_")
                and json.loads(raw.get(f"{mesos_layout}/{name}")[0])["port"] == port]
        assert len(ours) == 1  # the Mesos cluster's own layout too
        held = _hold_keepalive(port, str(tmp_path / "tls" / "ca.crt"))
        took = _stopped_within(driver)
        assert took < STOP_WITHIN, f"the driver took {took:.1f}s to stop: {driver.output()[-3000:]}"
        # Deleted before the driver stopped answering, not left to the session's expiry.
        assert raw.get_children(driver_path(cluster)) == []
        assert not raw.exists(f"{mesos_layout}/{ours[0]}")
        assert "Traceback" not in driver.output()
    finally:
        if held is not None:
            held.close()
        driver.stop()
        raw.stop()
        raw.close()


@pytest.mark.parametrize("how", ["stopped", "hung"])
def test_a_gateway_whose_zookeeper_is_gone_stops_within_seconds(private_zookeeper, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                how: str) -> None:
    """ZooKeeper stopped, or hung (it accepts and never answers): the registration cannot be
    deleted, and the stop is not held up by it (it expires with the session)."""
    port = free_port()
    cafile = str(tmp_path / "tls" / "ca.crt")
    gateway = ServerProcess(
        [CLI, "serve", "--zookeeper", private_zookeeper.hosts, "--data-dir", str(tmp_path),
         "--bind", f"127.0.0.1:{port}", "--workers", "2"],
        port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60)
    java = private_zookeeper.process.proc if private_zookeeper.process else None
    held = None
    try:
        # Discovery running in the workers, the gateway registered, a client kept alive.
        assert wait_until(lambda: json.loads(_request(f"https://localhost:{port}/readyz", cafile)[1])
                      .get("discovery") == "ok", 20)
        held = _hold_keepalive(port, cafile)
        if how == "stopped":
            private_zookeeper.stop()
            # The workers' ZooKeeper clients noticed (a hung server is noticed only at the session's end).
            assert wait_until(lambda: json.loads(_request(f"https://localhost:{port}/readyz", cafile)[1])
                          .get("discovery") != "ok", 30)
        else:
            assert java is not None
            java.send_signal(signal.SIGSTOP)
        took = _stopped_within(gateway)
        output = gateway.output()
        assert took < STOP_WITHIN, f"the gateway took {took:.1f}s to stop"
        assert "Traceback" not in output, output[-3000:]
        assert "killing it" not in output  # the registration process left by itself
        assert ADMIN not in output
    finally:
        if held is not None:
            held.close()
        if java is not None and how == "hung":
            java.send_signal(signal.SIGCONT)
        gateway.stop()
