"""Agent placements and tunnel-reported credentials in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from bcs_middleware.core.records import Holder
from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.migrate import upgrade
from bcs_middleware.store.sql import SQLStore


@pytest.fixture
def stores(database_url: str):  # type: ignore[no-untyped-def]
    box = SecretBox([Fernet.generate_key()])
    first, second = SQLStore(Database(database_url, secrets=box)), SQLStore(Database(database_url, secrets=box))
    upgrade(first.db)
    first.create_cluster("c1", project_id="p", cluster_type="k8s")
    yield first, second
    first.db.dispose()
    second.db.dispose()


def test_credentials_remember_that_they_came_through_a_tunnel(stores) -> None:  # type: ignore[no-untyped-def]
    one, two = stores
    one.report_credentials("c1", server_addresses=["https://10.0.0.1:443"], cacert_pem="ca", user_token="t",
                           via_tunnel=True)
    assert two.get_credentials("c1").via_tunnel is True
    # A direct report afterwards (the same register token) points the gateway back at the address itself.
    one.report_credentials("c1", server_addresses=["https://10.0.0.1:443"], cacert_pem="ca", user_token="t")
    assert two.get_credentials("c1").via_tunnel is False


def test_the_newest_holder_wins_and_only_the_holder_clears(stores) -> None:  # type: ignore[no-untyped-def]
    one, two = stores
    one.put_placement("c1", Holder("gw-a/1"))
    placed = two.put_placement("c1", Holder("gw-b/2", "10.0.0.2:7100", "ab" * 32))
    assert not one.clear_placement("c1", "gw-a/1")  # the older holder's detach leaves the newer one
    found = one.get_placement("c1")
    assert found is not None and found.holder_id == "gw-b/2" and found.peer_address == "10.0.0.2:7100"
    assert found.connected_at == placed.connected_at
    assert two.touch_placements("gw-b/2") == 1
    assert one.get_placement("c1").seen_at >= found.seen_at  # type: ignore[union-attr]
    assert two.clear_placement("c1", "gw-b/2")
    assert one.get_placement("c1") is None


def test_adopting_records_a_holder_only_where_none_live_is(stores) -> None:  # type: ignore[no-untyped-def]
    """Several workers hold connections of one agent; one placement names any live one of them."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from bcs_middleware.store import models as m

    one, two = stores
    one.create_cluster("c2", project_id="p", cluster_type="k8s")
    one.create_cluster("c3", project_id="p", cluster_type="k8s")
    one.put_placement("c1", Holder("gw-a/1"))  # a live holder: kept
    one.put_placement("c3", Holder("gw-c/3"))  # a holder whose heartbeat stopped: taken over
    with one.db.transaction() as conn:
        conn.execute(update(m.agent_placements).where(m.agent_placements.c.cluster_id == "c3")
                     .values(seen_at=datetime.now(UTC) - timedelta(seconds=60)))
    # c2 has no placement; "gone" is no cluster at all (deleted meanwhile): skipped, no error.
    adopted = two.adopt_placements(["c1", "c2", "c3", "gone"], Holder("gw-b/2", "10.0.0.2:7100", "cd" * 32),
                                   stale_after=15)
    assert adopted == 2
    assert one.get_placement("c1").holder_id == "gw-a/1"  # type: ignore[union-attr]
    assert one.get_placement("c2").holder_id == "gw-b/2"  # type: ignore[union-attr]
    assert one.get_placement("c3").peer_address == "10.0.0.2:7100"  # type: ignore[union-attr]
    assert two.adopt_placements(["c1", "c2", "c3"], Holder("gw-b/2"), stale_after=15) == 0
    assert two.adopt_placements([], Holder("gw-b/2"), stale_after=15) == 0


def test_deleting_the_cluster_removes_its_placement(stores) -> None:  # type: ignore[no-untyped-def]
    one, two = stores
    one.put_placement("c1", Holder("gw-a/1"))
    two.delete_cluster("c1")
    assert one.get_placement("c1") is None


def test_register_token_digests_are_read_in_one_call_for_many_clusters(stores) -> None:  # type: ignore[no-untyped-def]
    from bcs_middleware.store.crypto import token_digest
    from bcs_middleware.store.rows import IN_BATCH as _IN_BATCH

    one, two = stores
    ids = [f"many-{i}" for i in range(_IN_BATCH + 3)]  # more than one IN batch
    for cluster_id in ids:
        one.create_cluster(cluster_id, project_id="p", cluster_type="k8s")
    tokens = {cluster_id: one.create_register_token(cluster_id) for cluster_id in ids[::2]}
    found = two.register_token_digests([*ids, "no-such-cluster"])
    assert found == {cluster_id: token_digest(token) for cluster_id, token in tokens.items()}
    one.revoke_register_token(ids[0])
    assert ids[0] not in two.register_token_digests(ids[:1])
