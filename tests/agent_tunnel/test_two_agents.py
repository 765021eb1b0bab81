"""Two real ``kube-agent --tunnel`` processes for one cluster: they take turns, slowly.

The gateway keeps the newest connection of a cluster and closes the older one with
the close code ``CLOSE_REPLACED``; the replaced agent then waits ``--replaced-backoff``
(default 60 s) instead of coming back at once and replacing its successor in turn.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.polling import wait_until

from .conftest import CLUSTER, Agent, Gateway

OPENED = "tunnel to "  # the agent's log line for each tunnel it opened


def _connected(gateway: Gateway) -> bool:
    return bool(gateway.json("GET", f"/rest/clusters/{CLUSTER}")["agent"]["tunnel_connected"])


def test_two_agents_for_one_cluster_do_not_replace_each_other_over_and_over(
    gateway: Gateway, apiserver: FakeAPIServer, register_token: str, tmp_path: Path,
) -> None:
    # No request goes through the tunnel before the agents changed places: the gateway's pooled
    # apiserver connections would keep the replaced one open (draining) and hide the turn-taking.
    first = Agent(gateway, apiserver, CLUSTER, register_token, tmp_path).start()
    second: Agent | None = None
    try:
        assert wait_until(lambda: _connected(gateway), 30), first.output()
        second = Agent(gateway, apiserver, CLUSTER, register_token, tmp_path).start()
        started = time.monotonic()
        while time.monotonic() - started < 10:  # the wait is the test: connected throughout
            assert _connected(gateway)
            time.sleep(0.2)
        statuses = [gateway.call("GET", f"/tunnels/clusters/{CLUSTER}/version", timeout=5)[0] for _ in range(5)]
        logs = first.output() + second.output()
        assert set(statuses) == {200}, statuses
        # One connection each: the replaced agent waits (about a minute) instead of taking over again.
        assert logs.count(OPENED) == 2, logs
        assert "two agents serve one cluster" in first.output(), first.output()
        assert "two agents serve one cluster" not in second.output(), second.output()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert register_token not in first.output() + (second.output() if second else "")
