"""One reconciler per deployment: two services on one database, SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from bcs_middleware.rbac.leader import LeaderLease
from bcs_middleware.store.database import Database
from bcs_middleware.store.sql import SQLStore, open_store
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.polling import wait_for

from .conftest import PermissionFile, add_cluster, binding_names, make_service


def test_lease_is_exclusive_renewable_and_taken_over_after_expiry(database_url: str, secret_key: str) -> None:
    first = open_store(database_url, secret_key=secret_key)
    second = open_store(database_url, secret_key=secret_key)  # another process's view of the same database
    try:
        a = LeaderLease(first, holder="a", ttl=0.5)
        b = LeaderLease(second, holder="b", ttl=0.5)
        assert a.acquire() and not b.acquire()
        assert a.acquire() and not b.acquire()  # renewal keeps it
        time.sleep(0.6)  # the sleep is the test: past the lease's 0.5 s
        assert b.acquire() and not a.acquire()  # expired: taken over; the old holder knows
        b.release()
        assert a.acquire()
        current = a.current()
        assert current is not None and current["holder"] == "a" and current["active"]
    finally:
        first.db.dispose()
        second.db.dispose()


def test_two_services_on_one_database_only_one_reconciles(
    database_url: str, secret_key: str, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
) -> None:
    stores = [open_store(database_url, secret_key=secret_key) for _ in range(2)]
    api = clusters()
    add_cluster(stores[0], "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    permissions.write([{"user": "alice", "cluster": "*", "role": "view"}])
    # A 3 s lease: renewed every pass (0.3 s), so a loaded CI machine delaying one renewal past a
    # 1 s lease made the leader look lapsed (seen once); the takeover below still waits it out.
    services = [make_service(s, permissions.path, holder=f"gw{i}", lease_ttl=3.0, interval=0.3)
                for i, s in enumerate(stores)]
    try:
        for service in services:
            service.start()
        leader = wait_for(lambda: next((s for s in services if s.status()["clusters"]), None), timeout=15)
        follower = services[1 - services.index(leader)]
        time.sleep(1.0)  # several ticks and periodic passes of both
        assert leader.lease.is_leader and not follower.lease.is_leader
        assert not follower.status()["clusters"]
        assert not follower.reconciler.in_flight() and len(leader.reconciler._states) == 1

        # The leader dies without releasing: the follower waits for expiry, then takes over.
        leader.stop(release=False)
        stopped_at = time.monotonic()
        permissions.write([{"user": "bob", "cluster": "*", "role": "edit"}])
        wait_for(lambda: {n[2] for n in binding_names(api)} == {"bcs:bob:edit"}, timeout=10)
        assert time.monotonic() - stopped_at >= 1.5  # not before the lease ran out
        assert follower.lease.is_leader
        status: dict[str, Any] = wait_for(lambda: follower.status()["clusters"].get("BCS-K8S-A"), timeout=15)
        assert status["result"] == "ok" and status["deleted"] == 1
    finally:
        for service in services:
            service.stop()
        for store in stores:
            store.db.dispose()


def test_clean_stop_hands_over_at_once(store: SQLStore, secret_key: str) -> None:
    other = SQLStore(Database(store.db.url, secrets=store.db.secrets))
    try:
        a = LeaderLease(store, holder="a", ttl=60)
        b = LeaderLease(other, holder="b", ttl=60)
        assert a.acquire() and not b.acquire()
        a.release()
        assert b.acquire()
    finally:
        other.db.dispose()


@pytest.mark.parametrize("ttl, tick", [pytest.param(1.0, 0.5, id="ttl-equals-two-ticks")])
def test_lease_shorter_than_two_ticks_is_refused(store: SQLStore, ttl: float, tick: float,
                                                 permissions: PermissionFile) -> None:
    with pytest.raises(ValueError, match="lease_ttl"):
        make_service(store, permissions.path, lease_ttl=ttl, tick=tick)
