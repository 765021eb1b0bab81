"""Schema upgrades keep existing data, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import command
from cryptography.fernet import Fernet
from sqlalchemy import inspect

from bcs_middleware.store.crypto import SecretBox
from bcs_middleware.store.database import Database
from bcs_middleware.store.migrate import alembic_config, current_revision, head_revision, upgrade
from bcs_middleware.store.sql import SQLStore


def test_upgrade_from_the_first_revision_keeps_data(database_url: str) -> None:
    store = SQLStore(Database(database_url, secrets=SecretBox([Fernet.generate_key()])))
    # A database made by the first release ...
    upgrade(store.db, "0001")
    assert current_revision(store.db) == "0001"
    user = store.create_user("old-user")
    _, token = store.create_token(user.id)
    store.create_cluster("old-cluster", project_id="p", cluster_type="k8s")
    register = store.create_register_token("old-cluster")
    # ... upgraded by this one.
    upgrade(store.db)
    assert current_revision(store.db) == head_revision()
    found = store.authenticate(token)
    assert found is not None and found[0].name == "old-user"
    assert store.authenticate_register_token(register) == "old-cluster"
    # Running it again (every worker does at start) changes nothing.
    upgrade(store.db)
    assert current_revision(store.db) == head_revision()
    store.db.dispose()


def test_every_revision_downgrades_cleanly(database_url: str) -> None:
    store = SQLStore(Database(database_url, secrets=SecretBox([Fernet.generate_key()])))
    upgrade(store.db)
    with store.db.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    with store.db.engine.connect() as conn:
        tables = set(inspect(conn).get_table_names()) - {"alembic_version"}
    assert tables == set()
    store.db.dispose()


def test_clusters_created_before_permissions_existed_keep_their_creator_as_editor(database_url: str) -> None:
    store = SQLStore(Database(database_url, secrets=SecretBox([Fernet.generate_key()])))
    upgrade(store.db, "0002_rbac")
    alice = store.create_user("alice")
    store.create_user("bob")
    store.create_cluster("alices", project_id="p", cluster_type="k8s")
    store.record_audit("alice", "cluster.create", "cluster:alices")
    store.record_audit("ghost", "cluster.create", "cluster:alices")  # a user since deleted
    store.record_audit("alice", "cluster.create", "cluster:gone")  # a cluster since deleted
    upgrade(store.db)
    assert [(p.user_name, p.permission) for p in store.list_cluster_permissions("alices")] == [("alice", "edit")]
    assert store.cluster_permission("alices", alice.id) == "edit"
    store.db.dispose()
