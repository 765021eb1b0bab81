"""Per-upstream state is bounded: many distinct upstreams used once do not stay in a worker.

A real ``PooledTransport`` (its tables are :class:`~bcs_middleware.core.cache.Cache` tables, whose
bounds ``tests/core/test_cache.py`` checks with a hand-driven clock) against a
real TLS upstream reached under many identities (a CA bundle text of its own each,
as distinct clusters would have).
"""

from __future__ import annotations

import time

import trustme

from bcs_middleware.core.environ import Upstream
from bcs_middleware.outbound.transport import PooledTransport
from tests.support.fake_upstream import FakeUpstream


def test_a_transport_keeps_at_most_max_upstreams_identities_and_closes_what_it_drops(
    fake_tls: FakeUpstream, ca: trustme.CA
) -> None:
    transport = PooledTransport(max_upstreams=4, idle_timeout=30, state_ttl=30)
    pem = ca.cert_pem.bytes().decode()
    first = None
    try:
        for i in range(20):
            upstream = Upstream(base_urls=(f"{fake_tls.url}/c{i}",), path="/json",
                                ca_pem=f"# cluster {i}\n{pem}", name=f"cluster-{i}")
            resp = transport.send(upstream, "GET", [], None, None)
            resp.read()
            resp.release_conn()
            if first is None:
                first = next(iter(transport._pool._idle.values()))[0]
        assert transport._pool.keys <= 4 and len(transport._pool) <= 4
        assert len(transport._tls) <= 4 and len(transport._origins) <= 4
        assert first is not None and first.sock.fileno() == -1  # evicted, and closed
        assert transport.connections_opened == 20
    finally:
        transport.close()


def test_idle_connections_and_contexts_age_out_while_another_upstream_stays_busy(
    fake_tls: FakeUpstream, ca: trustme.CA
) -> None:
    transport = PooledTransport(idle_timeout=2.0, state_ttl=3.0)
    pem = ca.cert_pem.bytes().decode()

    def one(i: int) -> None:
        upstream = Upstream(base_urls=(f"{fake_tls.url}/c{i}",), path="/json",
                            ca_pem=f"# cluster {i}\n{pem}", name=f"cluster-{i}")
        resp = transport.send(upstream, "GET", [], None, None)
        resp.read()
        resp.release_conn()

    try:
        for i in range(10):
            one(i)
        assert transport._pool.keys > 1 and len(transport._tls) > 1
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (transport._pool.keys > 1 or len(transport._tls) > 1):
            one(99)  # the hot upstream
            time.sleep(0.05)
        assert transport._pool.keys == 1 and len(transport._tls) <= 1
        assert len(transport._origins) == 1
    finally:
        transport.close()
