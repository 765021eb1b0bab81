"""``PooledTransport`` bookkeeping over a real socket: connections are counted and kept alive."""

from __future__ import annotations

from bcs_middleware.core.environ import Upstream
from bcs_middleware.outbound.transport import PooledTransport
from tests.support.fake_upstream import FakeUpstream


def test_transport_counts_connections_and_reuses_them() -> None:
    transport = PooledTransport()
    with FakeUpstream() as fake:
        upstream = Upstream(base_urls=(fake.url,), path="/echo")
        for _ in range(20):
            resp = transport.send(upstream, "GET", [], None, None)
            resp.read()
            resp.release_conn()
        assert transport.connections_opened == 1
        transport.close()
        resp = transport.send(upstream, "GET", [], None, None)
        resp.read()
        resp.release_conn()
        assert transport.connections_opened == 2
        transport.close()
    assert fake.accepted == 2
