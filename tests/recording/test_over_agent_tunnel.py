"""Sessions to a cluster behind NAT, through a real ``kube-agent --tunnel``, are recorded the same way.

The gateway's address policy refuses the fake apiserver's address (``--upstream-deny
127.0.0.1/32``), so the agent's tunnel is the only way to it (as ``tests/agent_tunnel``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bcs_middleware.recording import asciicast
from tests.agent_tunnel.conftest import Agent, create_cluster
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, served_gateway

from .terminal_pod import EXIT_CODE, TerminalPod
from .test_kubectl_sessions import TRANSPORTS, finished_session, interactive, session_ids

NAT_CLUSTER = "BCS-K8S-RECNAT"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("natgateway")
    with served_gateway(data, args=["--upstream-deny", "127.0.0.1/32", "--record", "required"], workers=1) as gw:
        yield gw
    assert SA_TOKEN not in gw.server.output()


@pytest.fixture(scope="module")
def agent(gateway: Gateway, apiserver: FakeAPIServer, pod: TerminalPod,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    register_token = create_cluster(gateway, NAT_CLUSTER)
    running = Agent(gateway, apiserver, NAT_CLUSTER, register_token, tmp_path_factory.mktemp("agent")).start()
    try:
        running.wait_connected()
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("subresource", ["exec", "attach"])
@pytest.mark.parametrize("version", TRANSPORTS)
def test_a_session_through_the_agent_tunnel_is_recorded(gateway: Gateway, agent: Agent, pod: TerminalPod,
                                                        version: str | None, subresource: str,
                                                        tmp_path: Path) -> None:
    kubeconfig = gateway.kubeconfig(gateway.admin, tmp_path / "kc", cluster=NAT_CLUSTER)
    before = session_ids(gateway, gateway.admin, NAT_CLUSTER)
    code, seen = interactive(kubeconfig, version, subresource, pod)
    assert code == EXIT_CODE
    info = finished_session(gateway, gateway.admin, before, NAT_CLUSTER)
    assert info["status"] == "complete" and info["exit_code"] == EXIT_CODE and info["cluster_id"] == NAT_CLUSTER
    status, body = gateway.call("GET", f"/rest/sessions/{info['id']}/recording")
    assert status == 200
    header, events = asciicast.parse(body.decode().splitlines(keepends=True))
    events_list = list(events)
    assert "".join(e.data for e in events_list if e.code == "o").encode() == bytes(seen.stdout)
    assert (header.width, header.height) == seen.sizes[0]
    assert [e.data for e in events_list if e.code == "r"] == [f"{c}x{r}" for c, r in seen.sizes]
    assert not [e for e in events_list if e.code == "i"]
