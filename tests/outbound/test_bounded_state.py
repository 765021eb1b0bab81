"""Per-upstream state is bounded: many distinct upstreams used once do not stay in a worker.

``LRUCache`` with a hand-driven clock, then a real ``PooledTransport`` against a
real TLS upstream reached under many identities (a CA bundle text of its own each,
as distinct clusters would have).
"""

from __future__ import annotations

import time

import trustme

from bcs_middleware.core.environ import Upstream
from bcs_middleware.core.lru import LRUCache
from bcs_middleware.outbound.transport import PooledTransport
from tests.support.fake_upstream import FakeUpstream


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_least_recently_used_entry_goes_first_and_is_handed_to_on_evict() -> None:
    evicted: list[tuple[str, int]] = []
    cache: LRUCache[str, int] = LRUCache(max_entries=2, on_evict=lambda k, v: evicted.append((k, v)),
                                         clock=Clock())
    cache.put("a", 1)
    cache.put("b", 2)
    cache._entries["a"][0] -= 5  # "a" used long enough ago that a hit refreshes it
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert evicted == [("b", 2)]
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3


def test_entries_unused_for_the_ttl_are_dropped_without_new_inserts() -> None:
    clock = Clock()
    evicted: list[str] = []
    cache: LRUCache[str, int] = LRUCache(max_entries=100, ttl=10, clock=clock,
                                         on_evict=lambda k, v: evicted.append(k))
    cache.put("old", 1)
    cache.put("hot", 2)
    for _ in range(6):
        clock.now += 3
        assert cache.get("hot") == 2
    assert "old" not in cache and evicted == ["old"]
    clock.now += 11
    cache.prune()
    assert len(cache) == 0


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
