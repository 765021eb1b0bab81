"""Per-user quotas in the store: exact at the limit, sequential and concurrent, on SQLite and PostgreSQL.

The concurrent cases race creates from several threads, each with its own store object (its
own engine and connections: what several gunicorn workers or gateway instances are), on one
database; exactly ``limit`` of them may win.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import trustme
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from cryptography.fernet import Fernet

from bcs_middleware.admission.definitions import parse_bcs_definition, parse_k8s_configuration
from bcs_middleware.core.errors import Conflict
from bcs_middleware.core.quotas import QuotaExceeded, Quotas
from bcs_middleware.store import models as m
from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.definitions import SQLDefinitionStore
from bcs_middleware.store.migrate import upgrade
from bcs_middleware.store.sql import SQLStore, open_store
from tests.admission.conftest import bcs_definition, bcs_webhook, k8s_configuration, k8s_webhook

#: Racers in the concurrent cases, and the limit they race for.
RACERS = 12
LIMIT = 4
CA = trustme.CA()


@pytest.fixture
def key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def store(database_url: str, key: str) -> Iterator[SQLStore]:
    made = open_store(database_url, secret_key=key)
    yield made
    made.db.dispose()


@pytest.fixture
def processes(database_url: str, key: str, store: SQLStore) -> Iterator[list[SQLStore]]:
    """One store object per racer on the same (migrated) database: separate engines and pools."""
    made = [open_store(database_url, secret_key=key, migrate=False) for _ in range(RACERS)]
    yield made
    for one in made:
        one.db.dispose()


def race(processes: list[SQLStore], attempt: Callable[[SQLStore, int], object]) -> tuple[int, int]:
    """Run ``attempt(store, n)`` for every racer at once; ``(won, refused by quota)``."""
    barrier = threading.Barrier(len(processes))
    outcomes: list[str] = []

    def one(n: int) -> None:
        barrier.wait(30)
        try:
            attempt(processes[n], n)
        except QuotaExceeded:
            outcomes.append("quota")
            return
        outcomes.append("won")

    with ThreadPoolExecutor(len(processes)) as pool:
        for future in [pool.submit(one, n) for n in range(len(processes))]:
            future.result(timeout=120)
    return outcomes.count("won"), outcomes.count("quota")


def _k8s(name: str):  # type: ignore[no-untyped-def]
    return parse_k8s_configuration(k8s_configuration(name, [k8s_webhook(f"{name}.example.com", "hook.ns", CA)]))


def test_the_cluster_quota_counts_what_the_user_created_and_still_exists(store: SQLStore) -> None:
    alice, bob = store.create_user("alice"), store.create_user("bob")
    for n in range(3):
        store.create_cluster(f"a{n}", project_id="p", cluster_type="k8s", creator_id=alice.id, limit=3)
    with pytest.raises(QuotaExceeded) as over:
        store.create_cluster("a3", project_id="p", cluster_type="k8s", creator_id=alice.id, limit=3)
    assert (over.value.quota, over.value.limit, over.value.status) == ("clusters_per_user", 3, 403)
    assert "used 3, limited: 3" in over.value.message and "'alice'" in over.value.message
    assert store.find_cluster("a3") is None
    # Handing edit to bob and leaving does not move the cluster to bob's count ...
    store.set_cluster_permission("a0", bob.id, "edit")
    store.set_cluster_permission("a0", alice.id, None)
    with pytest.raises(QuotaExceeded):
        store.create_cluster("a3", project_id="p", cluster_type="k8s", creator_id=alice.id, limit=3)
    store.create_cluster("b0", project_id="p", cluster_type="k8s", creator_id=bob.id, limit=1)
    # ... deleting one frees a place, and a lowered limit refuses naming what is used.
    store.delete_cluster("a1")
    store.create_cluster("a3", project_id="p", cluster_type="k8s", creator_id=alice.id, limit=3)
    with pytest.raises(QuotaExceeded) as lowered:
        store.create_cluster("a4", project_id="p", cluster_type="k8s", creator_id=alice.id, limit=1)
    assert "used 3, limited: 1" in lowered.value.message
    # An existing id is still a conflict, not a quota matter; no limit is no limit.
    with pytest.raises(Conflict):
        store.create_cluster("a0", project_id="p", cluster_type="k8s", creator_id=bob.id, limit=None)
    store.create_cluster("a4", project_id="p", cluster_type="k8s", creator_id=alice.id)


def test_a_deleted_user_frees_their_count_and_a_new_user_inherits_none_of_it(store: SQLStore) -> None:
    admin = store.create_user("admin", is_superuser=True)
    gone = store.create_user("gone")
    store.create_cluster("g0", project_id="p", cluster_type="k8s", creator_id=gone.id, limit=1)
    store.set_cluster_permission("g0", admin.id, "edit")
    store.delete_user("gone")
    with store.db.connection() as conn:
        assert conn.execute(m.clusters.select().where(m.clusters.c.id == "g0")).one().created_by is None
    fresh = store.create_user("fresh")
    store.create_cluster("f0", project_id="p", cluster_type="k8s", creator_id=fresh.id, limit=1)


def test_the_token_quota_counts_usable_tokens_and_spares_superusers(store: SQLStore) -> None:
    carol = store.create_user("carol")
    tokens = [store.create_token(carol.id, limit=3)[0] for _ in range(2)]
    store.create_token(carol.id, expires_at=datetime.now(UTC) - timedelta(seconds=1))  # expired: not counted
    store.create_token(carol.id, limit=3)
    with pytest.raises(QuotaExceeded) as over:
        store.create_token(carol.id, limit=3)
    assert over.value.quota == "tokens_per_user" and "'carol'" in over.value.message
    store.revoke_token(carol.id, tokens[0].id)
    store.create_token(carol.id, limit=3)
    root = store.create_user("root", is_superuser=True)
    for _ in range(3):
        store.create_token(root.id, limit=1)


def test_the_permission_quota_counts_grants_not_changes(store: SQLStore) -> None:
    owner = store.create_user("owner")
    users = [store.create_user(f"u{n}") for n in range(4)]
    store.create_cluster("c1", project_id="p", cluster_type="k8s", creator_id=owner.id)
    for user in users[:2]:
        store.set_cluster_permission("c1", user.id, "view", limit=3)
    with pytest.raises(QuotaExceeded) as over:
        store.set_cluster_permission("c1", users[2].id, "view", limit=3)
    assert over.value.quota == "permissions_per_cluster" and "'c1'" in over.value.message
    assert store.set_cluster_permission("c1", users[0].id, "edit", limit=3) == "view"  # a change: allowed
    assert store.set_cluster_permission("c1", users[1].id, None, limit=3) == "view"
    store.set_cluster_permission("c1", users[2].id, "view", limit=3)


def test_the_definition_quota_counts_a_clusters_configurations_and_bcs_definitions(store: SQLStore) -> None:
    store.create_cluster("c1", project_id="p", cluster_type="mesos")
    k8s = SQLDefinitionStore(store, refresh=0)
    mesos = SQLDefinitionStore(store, refresh=0, bcs_cluster="c1")
    assert k8s.put_k8s("c1", _k8s("one"), limit=2) is True
    bcs = parse_bcs_definition(bcs_definition("inject", [bcs_webhook("hook.ns", CA)]))
    assert mesos.put_bcs(bcs, limit=2) is True
    with pytest.raises(QuotaExceeded) as over:
        k8s.put_k8s("c1", _k8s("two"), limit=2)
    assert over.value.quota == "webhook_configurations_per_cluster"
    assert k8s.put_k8s("c1", _k8s("one"), limit=2) is False  # replacing is not creating
    assert mesos.put_bcs(bcs, limit=2) is False
    assert [c.name for c in k8s.list_k8s("c1")] == ["one"]
    # Deleting the cluster takes both kinds with it: an id registered again starts empty.
    removed = store.delete_cluster("c1")
    assert sorted(removed["admission_configurations"]) == ["MutatingWebhookConfiguration/one",
                                                            "admissionwebhook/inject"]
    store.create_cluster("c1", project_id="p", cluster_type="mesos")
    assert k8s.list_k8s("c1") == [] and SQLDefinitionStore(store, refresh=0, bcs_cluster="c1").list_bcs() == []


def test_concurrent_cluster_creates_stop_exactly_at_the_limit(store: SQLStore, processes: list[SQLStore]) -> None:
    racer = store.create_user("racer")
    store.create_cluster("pre", project_id="p", cluster_type="k8s", creator_id=racer.id)
    won, refused = race(processes, lambda s, n: s.create_cluster(
        f"race-{n}", project_id="p", cluster_type="k8s", creator_id=racer.id, limit=LIMIT))
    assert (won, refused) == (LIMIT - 1, RACERS - LIMIT + 1)
    with store.db.connection() as conn:
        assert len(conn.execute(m.clusters.select().where(m.clusters.c.created_by == racer.id)).all()) == LIMIT


def test_concurrent_token_issues_stop_exactly_at_the_limit(store: SQLStore, processes: list[SQLStore]) -> None:
    user = store.create_user("many-tokens")
    won, _ = race(processes, lambda s, n: s.create_token(user.id, limit=LIMIT))
    assert won == LIMIT
    assert len([t for t in store.list_tokens(user.id) if t.usable(datetime.now(UTC))]) == LIMIT


def test_concurrent_grants_stop_exactly_at_the_limit(store: SQLStore, processes: list[SQLStore]) -> None:
    owner = store.create_user("granter")
    store.create_cluster("shared", project_id="p", cluster_type="k8s", creator_id=owner.id)
    users = [store.create_user(f"grantee-{n}") for n in range(RACERS)]
    won, _ = race(processes, lambda s, n: s.set_cluster_permission("shared", users[n].id, "view", limit=LIMIT))
    assert won == LIMIT - 1  # the creator's edit is one of the cluster's grants
    assert len(store.list_cluster_permissions("shared")) == LIMIT


def test_concurrent_configurations_stop_exactly_at_the_limit(store: SQLStore, processes: list[SQLStore]) -> None:
    store.create_cluster("hooks", project_id="p", cluster_type="k8s")
    won, _ = race(processes, lambda s, n: SQLDefinitionStore(s, refresh=0).put_k8s(
        "hooks", _k8s(f"cfg-{n}"), limit=LIMIT))
    assert won == LIMIT
    assert len(SQLDefinitionStore(store, refresh=0).list_k8s("hooks")) == LIMIT


def test_quota_values_are_non_negative_numbers_or_unlimited() -> None:
    assert Quotas().clusters_per_user == 50
    with pytest.raises(ValueError, match="non-negative"):
        Quotas(tokens_per_user=-1)
    assert Quotas(tokens_per_user=None).limit("tokens_per_user", None) is None


def test_clusters_registered_before_the_quota_count_for_their_creator(database_url: str) -> None:
    store = SQLStore(Database(database_url, secrets=SecretBox([Fernet.generate_key()])))
    upgrade(store.db, "0004_agent_tunnels")
    alice = store.create_user("alice")
    bob = store.create_user("bob")
    for cluster in ("old-1", "old-2", "again", "orphan"):
        store.create_cluster(cluster, project_id="p", cluster_type="k8s")
    store.record_audit("alice", "cluster.create", "cluster:old-1")
    store.record_audit("alice", "cluster.create", "cluster:old-2")
    store.record_audit("alice", "cluster.create", "cluster:again")
    store.record_audit("bob", "cluster.create", "cluster:again")  # deleted and registered again by bob
    store.record_audit("ghost", "cluster.create", "cluster:orphan")  # a user since deleted
    register = store.create_register_token("old-1")
    upgrade(store.db)
    with store.db.connection() as conn:
        creators = {r.id: r.created_by for r in conn.execute(m.clusters.select())}
    assert creators == {"old-1": alice.id, "old-2": alice.id, "again": bob.id, "orphan": None}
    # The upgrade lost nothing that references clusters (SQLite rebuilds would have).
    assert store.authenticate_register_token(register) == "old-1"
    with pytest.raises(QuotaExceeded):
        store.create_cluster("new", project_id="p", cluster_type="k8s", creator_id=alice.id, limit=2)
    store.db.dispose()


def test_the_migrated_schema_is_the_models(database_url: str) -> None:
    from bcs_middleware.rbac import tables

    assert tables.leases.metadata is m.metadata
    store = SQLStore(Database(database_url, secrets=SecretBox([Fernet.generate_key()])))
    upgrade(store.db)
    with store.db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), m.metadata)
    assert diff == []
    store.db.dispose()
