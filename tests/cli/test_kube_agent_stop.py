"""``bcs-middleware kube-agent`` stops at once and cleanly: Ctrl-C (SIGINT) or SIGTERM, in both modes.

A real gateway (``serve``), a cluster registered through the REST API, the real agent command in
its own process, reporting (``--periodsync``) or holding its tunnel (``--tunnel``, gevent and
threads). Once it is at work, a stop signal ends it within a few seconds with exit code 0 and no
traceback, whatever it was doing (between two reports, in a backoff, serving the tunnel).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import CLI, SA_TOKEN, Gateway, served_gateway
from tests.support.kube import write_kubeconfig
from tests.support.polling import wait_until

CLUSTER = "BCS-K8S-AGENTSTOP"
#: What a stopped agent may take, measured from the signal to its exit.
STOP_WITHIN = 3.0


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # Two workers: a tunnelling agent then holds two connections (one per worker), in two loops.
    with served_gateway(tmp_path_factory.mktemp("agent-stop"), workers=2) as gw:
        yield gw


@pytest.fixture(scope="module")
def register_token(gateway: Gateway) -> str:
    gateway.json("POST", "/rest/clusters/bcs", body={"id": CLUSTER, "project_id": "p1", "cluster_type": "k8s"})
    return str(gateway.json("POST", f"/rest/clusters/{CLUSTER}/register_tokens")["token"])


def _agent(gw: Gateway, api: FakeAPIServer, token: str, workdir: Path, *args: str,
           gateway_url: str | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    kubeconfig = workdir / "agent.kubeconfig"
    write_kubeconfig(kubeconfig, server=api.url, token=SA_TOKEN, ca_pem=api.ca_pem)
    log = workdir / "agent.log"
    with log.open("wb") as out:
        # Its own process group, as a terminal's Ctrl-C reaches the foreground job.
        proc = subprocess.Popen(
            [CLI, "kube-agent", "--bke-address", gateway_url or gw.url, "--cluster-id", CLUSTER,
             "--kubeconfig", str(kubeconfig), *args],
            env={**os.environ, "REGISTER_TOKEN": token, "SERVER_CERT": Path(gw.ca_file).read_text(),
                 "PYTHONUNBUFFERED": "1"},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    return proc, log


def _stop(proc: subprocess.Popen[bytes], signum: int) -> float:
    """Send ``signum`` to the agent's process group; seconds until it exited (code 0)."""
    started = time.monotonic()
    os.killpg(proc.pid, signum)
    try:
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    assert code == 0, f"exit code {code}"
    return took


def _tunnel_connected(gw: Gateway) -> bool:
    status, body = gw.call("GET", f"/rest/clusters/{CLUSTER}")
    return status == 200 and bool(json.loads(body).get("agent", {}).get("tunnel_connected"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_reporting_agent_stops_at_once_between_reports(
        gateway: Gateway, apiserver: FakeAPIServer, register_token: str, tmp_path: Path, signum: int) -> None:
    proc, log = _agent(gateway, apiserver, register_token, tmp_path, "--periodsync", "60")
    assert wait_until(lambda: b"reported" in log.read_bytes() or proc.poll() is not None, 30), log.read_text()
    assert proc.poll() is None, log.read_text()
    took = _stop(proc, signum)
    output = log.read_text()
    assert "Traceback" not in output, output
    assert took < STOP_WITHIN, f"the agent took {took:.1f}s to stop"
    assert register_token not in output and SA_TOKEN not in output


def test_a_reporting_agent_stops_at_once_while_it_backs_off(
        gateway: Gateway, apiserver: FakeAPIServer, register_token: str, tmp_path: Path) -> None:
    """The gateway is unreachable: the agent retries with backoff, and Ctrl-C ends the wait."""
    from tests.support.servers import free_port

    proc, log = _agent(gateway, apiserver, register_token, tmp_path, "--periodsync", "60",
                       gateway_url=f"https://127.0.0.1:{free_port()}")
    assert wait_until(lambda: log.read_bytes().count(b"report failed") >= 3 or proc.poll() is not None, 60)
    took = _stop(proc, signal.SIGINT)
    output = log.read_text()
    assert "Traceback" not in output, output
    assert took < STOP_WITHIN, f"the agent took {took:.1f}s to stop"


@pytest.mark.parametrize("io", ["gevent", "threads"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_tunnelling_agent_stops_at_once_and_leaves_the_gateway(
        gateway: Gateway, apiserver: FakeAPIServer, register_token: str, tmp_path: Path, io: str,
        signum: int) -> None:
    proc, log = _agent(gateway, apiserver, register_token, tmp_path, "--tunnel", "--io", io)
    try:
        assert wait_until(lambda: _tunnel_connected(gateway) or proc.poll() is not None, 30), log.read_text()
        assert proc.poll() is None, log.read_text()
        status, _ = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/version")
        assert status == 200
        took = _stop(proc, signum)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert "Traceback" not in output, output
    assert took < STOP_WITHIN, f"the agent took {took:.1f}s to stop"
    # It said goodbye: the gateway knows at once, not after a ping timeout.
    assert wait_until(lambda: not _tunnel_connected(gateway), 5)


@pytest.mark.parametrize("io", ["gevent", "threads"])
def test_a_tunnelling_agent_stops_at_once_while_a_gateway_does_not_answer(
        gateway: Gateway, apiserver: FakeAPIServer, register_token: str, tmp_path: Path, io: str) -> None:
    """The gateway accepts the connection and never answers the TLS handshake: Ctrl-C still ends the agent."""
    from tests.support.servers import TrapListener

    trap = TrapListener(hold=True)
    try:
        proc, log = _agent(gateway, apiserver, register_token, tmp_path, "--tunnel", "--io", io,
                           gateway_url=f"https://127.0.0.1:{trap.port}")
        try:
            assert wait_until(lambda: trap.accepted >= 1 or proc.poll() is not None, 30), log.read_text()
            took = _stop(proc, signal.SIGINT)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        trap.close()
    output = log.read_text()
    assert "Traceback" not in output, output
    assert took < STOP_WITHIN, f"the agent took {took:.1f}s to stop"
