"""A large download through the agent, on the gateway's default (gevent) worker.

Under gevent a socket read that finds data never switches greenlets. The session's
reader, fed by an agent that sends faster than it decodes, used to keep the worker to
itself: the Pause it queued was never written, the agent kept sending, and past 32 MiB
buffered the gateway reset the stream as if the agent ignored flow control
(``bench/agent_tunnel_bench.py``: a 1 GiB download broke off after 26-58 MiB).
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tests.support.fake_upstream import FakeUpstream
from tests.support.polling import wait_until

from .conftest import Agent, Gateway, create_cluster

BULK = "BCS-K8S-NATBULK"
SIZE = 512 * 1024 * 1024


@dataclass
class _Upstream:
    """What :class:`Agent` reads of an apiserver: its URL and CA."""

    url: str
    ca_pem: str


@pytest.fixture(scope="module")
def bulk_agent(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with FakeUpstream(tls=context) as upstream:
        token = create_cluster(gateway, BULK)
        agent = Agent(gateway, _Upstream(upstream.url, ca.cert_pem.bytes().decode()),  # type: ignore[arg-type]
                      BULK, token, Path(tmp_path_factory.mktemp("bulk"))).start()
        try:
            assert wait_until(lambda: gateway.call("GET", f"/tunnels/clusters/{BULK}/echo")[0] == 200, 30,
                              step=0.2), agent.output()
            yield agent
        finally:
            agent.stop()


def test_a_large_download_through_the_agent_arrives_whole(gateway: Gateway, bulk_agent: Agent) -> None:
    req = urllib.request.Request(f"{gateway.url}/tunnels/clusters/{BULK}/download?bytes={SIZE}",
                                 headers={"Authorization": f"Bearer {gateway.admin}"})
    got = 0
    with urllib.request.urlopen(req, timeout=120, context=ssl.create_default_context(cafile=gateway.ca_file)) as resp:
        assert resp.status == 200
        while piece := resp.read(1 << 20):
            got += len(piece)
    assert got == SIZE
    assert "past their windows" not in gateway.server.output()
    # The tunnel carries the next request as well.
    assert gateway.call("GET", f"/tunnels/clusters/{BULK}/echo")[0] == 200
