"""A cluster whose agent has not reported yet is not remembered as such for long.

A worker that answered 502 "no credentials yet" kept answering so for up to its cache's
ttl (5 s) after the agent's tunnel connected to another worker, while ``GET
/rest/clusters/{id}`` already showed it connected. The not-ready answer is now kept for
:data:`~bcs_middleware.clusters.directory.NOT_READY_TTL` only: through a real ``serve`` with two
workers, no request started half a second after the tunnel shows connected is answered
"no credentials yet" — while asking again and again costs the store a few reads a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bcs_middleware.clusters.directory import NOT_READY_TTL, CachedDirectory
from bcs_middleware.core.records import ClusterRecord, CredentialRecord
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import Gateway, served_gateway
from tests.support.polling import wait_until

from .conftest import DENY_LOOPBACK, Agent, create_cluster

CLUSTER = "BCS-K8S-LATEAGENT"
#: How long after the tunnel shows connected a "no credentials yet" may still be answered.
STALE_BOUND = 0.5


# Two workers (this directory's conftest serves one): the agent's connection lands in one of them.
@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with served_gateway(tmp_path_factory.mktemp("gateway"), args=DENY_LOOPBACK, workers=2) as gw:
        yield gw


def test_no_worker_answers_not_ready_once_the_agent_is_connected(gateway: Gateway, apiserver: FakeAPIServer,
                                                                   tmp_path: Path) -> None:
    token = create_cluster(gateway, CLUSTER)
    answers: list[tuple[float, int, bool]] = []  # (started, status, "no credentials yet")
    stop = threading.Event()
    connected: list[float] = []

    def hammer() -> None:
        # Fresh connections land in either worker (SO_REUSEPORT); every answer is kept.
        while not stop.is_set():
            started = time.monotonic()
            status, body = gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/version", timeout=15)
            answers.append((started, status, b"no credentials yet" in body))

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            agent = gateway.json("GET", f"/rest/clusters/{CLUSTER}")["agent"]
            if agent["tunnel_connected"]:
                connected.append(time.monotonic())
                return

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(6)]
    for thread in threads:
        thread.start()
    # Both workers have answered "not ready" (and cached it) before the agent comes.
    wait_until(lambda: sum(not_ready for _, _, not_ready in answers) >= 40, 30, step=0.05)
    assert all(status == 502 and not_ready for _, status, not_ready in answers), answers[:5]
    # One connection, as the Go agent holds: one worker holds it, the other reaches it through
    # the peer link (and was told of the new credentials by nobody).
    agent = Agent(gateway, apiserver, CLUSTER, token, tmp_path, args=["--tunnel-connections", "1"]).start()
    watcher = threading.Thread(target=watch, daemon=True)
    try:
        watcher.start()
        watcher.join(60)
        assert connected, f"the agent did not connect:\n{agent.output()}"
        seen = connected[0]
        wait_until(lambda: sum(started > seen + 3 for started, _, _ in answers) >= 40, 30, step=0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(20)
        agent.stop()
    late_not_ready = [started - seen for started, _, not_ready in answers if not_ready and started > seen]
    print(f"\n{len(answers)} requests; 'no credentials yet' answered up to "
          f"{max(late_not_ready, default=0.0):.3f} s after the tunnel showed connected")
    assert max(late_not_ready, default=0.0) < STALE_BOUND, sorted(late_not_ready)[-5:]
    after = [status for started, status, _ in answers if started > seen + STALE_BOUND]
    assert len(after) >= 40 and set(after) == {200}, after


class CountingDirectory:
    """A cluster without credentials, and how often it was asked."""

    def __init__(self) -> None:
        self.reads = 0
        self.credentials: CredentialRecord | None = None

    def find_cluster(self, cluster_id: str) -> ClusterRecord | None:
        self.reads += 1
        return ClusterRecord(id=cluster_id, project_id="p", cluster_type="k8s", created_at=datetime.now(UTC))

    def get_credentials(self, cluster_id: str) -> CredentialRecord | None:
        return self.credentials


def test_asking_for_a_not_ready_cluster_again_and_again_reads_the_store_a_few_times_a_second() -> None:
    inner = CountingDirectory()
    directory = CachedDirectory(inner, ttl=5.0)
    started = time.monotonic()
    asked = 0
    while time.monotonic() - started < 1.0:
        assert directory.lookup("c1")[1] is None
        asked += 1
    assert asked > 1000
    assert inner.reads <= 1.0 / NOT_READY_TTL + 2, inner.reads
    # Reported: ready from the next load on, and then kept for the whole ttl.
    inner.credentials = CredentialRecord("c1", ("https://10.0.0.1:6443",), "", "token")
    assert directory.lookup("c1")[1] is inner.credentials or wait_until(
        lambda: directory.lookup("c1")[1] is inner.credentials, NOT_READY_TTL * 4)
    reads = inner.reads
    for _ in range(1000):
        assert directory.lookup("c1")[1] is inner.credentials
    assert inner.reads == reads
