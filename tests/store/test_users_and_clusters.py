"""Users' superuser flag, user and cluster deletion in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from cryptography.fernet import Fernet

from bcs_middleware.clusters.permissions import EDIT, VIEW, ClusterAuthorizer
from bcs_middleware.core import environ as env
from bcs_middleware.core.errors import Conflict
from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.migrate import upgrade
from bcs_middleware.store.sql import SQLStore


@pytest.fixture
def stores(database_url: str):  # type: ignore[no-untyped-def]
    box = SecretBox([Fernet.generate_key()])
    first, second = SQLStore(Database(database_url, secrets=box)), SQLStore(Database(database_url, secrets=box))
    upgrade(first.db)
    yield first, second
    first.db.dispose()
    second.db.dispose()


@pytest.mark.parametrize("action", ["demote", "delete"])
def test_two_superusers_removing_each_other_leave_one(stores, action: str) -> None:  # type: ignore[no-untyped-def]
    one, two = stores
    for attempt in range(20):  # a race: repeated so that an unlocked check would lose it
        names = (f"root{attempt}a", f"root{attempt}b")
        for name in names:
            one.create_user(name, is_superuser=True)
        for user in one.list_users():
            if user.is_superuser and user.name not in names:
                one.set_superuser(user.name, False)
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def remove(store: SQLStore, name: str, barrier: threading.Barrier = barrier,
                   outcomes: list[str] = outcomes) -> None:
            barrier.wait(timeout=10)
            try:
                store.set_superuser(name, False) if action == "demote" else store.delete_user(name)
                outcomes.append("done")
            except Conflict as exc:
                outcomes.append(exc.code_name)

        threads = [threading.Thread(target=remove, args=(s, n)) for s, n in zip((one, two), names, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(outcomes) == ["LAST_SUPERUSER", "done"], attempt
        assert len([u for u in one.list_users() if u.is_superuser]) == 1


def test_deleting_a_cluster_leaves_other_clusters_alone(stores) -> None:  # type: ignore[no-untyped-def]
    store, _ = stores
    alice = store.create_user("alice")
    for cluster in ("c1", "c2"):
        store.create_cluster(cluster, project_id="p", cluster_type="k8s", creator_id=alice.id)
        store.create_register_token(cluster)
        store.put_credentials(cluster, server_addresses=["https://10.0.0.1"], cacert_pem="x", user_token="t")
    removed = store.delete_cluster("c1")
    assert removed == {"register_token": True, "credentials": True, "permissions": {"alice": "edit"},
                       "admission_configurations": []}
    assert [c.id for c in store.list_clusters()] == ["c2"]
    assert store.get_credentials("c2") is not None and store.get_register_token("c2")
    assert store.user_cluster_permissions(alice.id) == {"c2": "edit"}


@pytest.mark.parametrize("rbac_grants", [True, False])
def test_the_cluster_list_agrees_with_the_per_cluster_decision(stores, rbac_grants: bool) -> None:  # type: ignore[no-untyped-def]
    store, _ = stores
    users = {name: store.create_user(name) for name in ("u1", "u2", "u3", "u4", "u5")}
    for cluster in ("c1", "c2", "c3"):
        store.create_cluster(cluster, project_id="p", cluster_type="k8s", creator_id=users["u5"].id)
    store.set_cluster_permission("c2", users["u1"].id, VIEW)
    store.set_cluster_permission("c3", users["u4"].id, EDIT)
    store.replace_rbac_grants({("User", "u1", "c1"), ("Group", "ops", "c2"), ("User", "u3", "*"),
                               ("User", "u4", "c3")})
    authorizer = ClusterAuthorizer(store, rbac_grants=rbac_grants)
    principals = [env.User(u.id, u.name) for u in users.values()] + [
        env.User(users["u2"].id, "u2", groups=("ops",)), env.User(0, "root", is_superuser=True)]
    for user in principals:
        listed = {c.id: p for c, p in authorizer.visible(user)}
        expected = {c: authorizer.permission(user, c) for c in ("c1", "c2", "c3")
                    if authorizer.allows(user, c, VIEW)}
        assert listed == expected, user
    assert {c.id for c, _ in authorizer.visible(principals[2])} == ({"c1", "c2", "c3"} if rbac_grants else set())
