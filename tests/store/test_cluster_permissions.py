"""Cluster permissions and the RBAC grants in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from bcs_middleware.clusters.permissions import EDIT, VIEW, ClusterAuthorizer
from bcs_middleware.core import environ as env
from bcs_middleware.core.errors import Conflict, NotFound
from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.migrate import upgrade
from bcs_middleware.store.sql import SQLStore


@pytest.fixture
def store(database_url: str):  # type: ignore[no-untyped-def]
    store = SQLStore(Database(database_url, secrets=SecretBox([Fernet.generate_key()])))
    upgrade(store.db)
    yield store
    store.db.dispose()


def test_the_creator_gets_edit_and_nobody_else_anything(store: SQLStore) -> None:
    alice, bob = store.create_user("alice"), store.create_user("bob")
    store.create_cluster("c1", project_id="p", cluster_type="k8s", creator_id=alice.id)
    assert store.cluster_permission("c1", alice.id) == EDIT
    assert store.cluster_permission("c1", bob.id) is None
    authorizer = ClusterAuthorizer(store)
    as_user = env.User(bob.id, "bob")
    with pytest.raises(NotFound) as hidden:
        authorizer.require(as_user, "c1", VIEW)
    with pytest.raises(NotFound) as missing:
        authorizer.require(as_user, "c2", VIEW)
    assert hidden.value.message.replace("c1", "c2") == missing.value.message
    assert authorizer.require(env.User(0, "root", is_superuser=True), "c1", EDIT).id == "c1"


def test_the_last_edit_holder_stays_unless_asked_to_go(store: SQLStore) -> None:
    alice, bob = store.create_user("alice"), store.create_user("bob")
    store.create_cluster("c1", project_id="p", cluster_type="k8s", creator_id=alice.id)
    for permission in (None, VIEW):
        with pytest.raises(Conflict):
            store.set_cluster_permission("c1", alice.id, permission)
    assert store.set_cluster_permission("c1", bob.id, EDIT) is None
    assert store.set_cluster_permission("c1", alice.id, VIEW) == EDIT
    with pytest.raises(Conflict):
        store.set_cluster_permission("c1", bob.id, None)
    assert store.set_cluster_permission("c1", bob.id, None, keep_an_editor=False) == EDIT
    assert [(p.user_name, p.permission) for p in store.list_cluster_permissions("c1")] == [("alice", VIEW)]


def test_rbac_grants_give_view_by_user_group_or_wildcard(store: SQLStore) -> None:
    ids = {name: store.create_user(name).id for name in ("u1", "u2", "u3", "u4")}
    for cluster in ("c1", "c2"):
        store.create_cluster(cluster, project_id="p", cluster_type="k8s")
    store.replace_rbac_grants({("User", "u1", "c1"), ("Group", "ops", "c2"), ("User", "u3", "*")})
    authorizer = ClusterAuthorizer(store, rbac_grants=True)
    off = ClusterAuthorizer(store, rbac_grants=False)

    def perms(a: ClusterAuthorizer, name: str, groups: tuple[str, ...] = ()) -> list[str | None]:
        user = env.User(ids[name], name, groups=groups)
        return [a.permission(user, c) for c in ("c1", "c2")]

    assert perms(authorizer, "u1") == [VIEW, None]
    assert perms(authorizer, "u2", ("ops",)) == [None, VIEW]
    assert perms(authorizer, "u3") == [VIEW, VIEW]
    assert perms(authorizer, "u4") == [None, None]
    assert perms(off, "u3") == [None, None]
    store.replace_rbac_grants(set())
    assert perms(authorizer, "u3") == [None, None]


def test_a_revoked_register_token_stops_authenticating_and_can_be_replaced(store: SQLStore) -> None:
    store.create_cluster("c1", project_id="p", cluster_type="k8s")
    old = store.create_register_token("c1")
    store.revoke_register_token("c1")
    assert store.authenticate_register_token(old) is None
    with pytest.raises(NotFound):
        store.revoke_register_token("c1")
    new = store.create_register_token("c1")
    assert store.authenticate_register_token(new) == "c1"


def test_groups_hold_permissions_and_the_stronger_counts(store: SQLStore) -> None:
    from bcs_middleware.core.quotas import QuotaExceeded

    alice = store.create_user("alice")
    store.create_cluster("c1", project_id="p", cluster_type="k8s", creator_id=alice.id)
    store.create_cluster("c2", project_id="p", cluster_type="k8s")
    assert store.set_group_permission("c1", "dev", VIEW) is None
    assert store.set_group_permission("c1", "ops", EDIT) is None
    assert store.set_group_permission("c2", "dev", VIEW) is None
    assert store.group_cluster_permission("c1", ("dev",)) == VIEW
    assert store.group_cluster_permission("c1", ("dev", "ops")) == EDIT
    assert store.group_cluster_permission("c1", ()) is None
    assert store.groups_cluster_permissions(("dev", "ops")) == {"c1": EDIT, "c2": VIEW}
    authorizer = ClusterAuthorizer(store)
    provider_user = env.User(env.NO_RECORD, "idp:carol", groups=("dev",), authenticated_by="oidc")
    assert authorizer.permission(provider_user, "c1") == VIEW
    assert [(c.id, p) for c, p in authorizer.visible(provider_user)] == [("c1", VIEW), ("c2", VIEW)]
    # A user's own grant and a group's: the stronger.
    bob = store.create_user("bob")
    store.set_cluster_permission("c2", bob.id, EDIT, keep_an_editor=False)
    assert ClusterAuthorizer(store).permission(env.User(bob.id, "bob", groups=("dev",)), "c2") == EDIT
    with pytest.raises(QuotaExceeded):
        store.set_group_permission("c1", "qa", VIEW, limit=2)
    assert store.set_group_permission("c1", "dev", EDIT, limit=2) == VIEW  # a change is never refused
    assert store.set_group_permission("c1", "dev", None) == EDIT
    assert [r.group_name for r in store.list_group_permissions("c1")] == ["ops"]
    with pytest.raises(NotFound):
        store.set_group_permission("nope", "dev", VIEW)
