"""Who may register clusters and the quota settings: parsing, groups, and the paste options."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from werkzeug.test import Client

from bcs_middleware.apps.management.app import ManagementAPI
from bcs_middleware.apps.management.calls import APISettings
from bcs_middleware.clusters.permissions import ClusterCreators, reserved_cluster_id
from bcs_middleware.compose.gateway import config_from_options
from bcs_middleware.compose.management import app_factory
from bcs_middleware.core import environ as env
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.core.quotas import Quotas
from bcs_middleware.layers.auth import StoreAuthenticator, TokenAuthMiddleware
from bcs_middleware.store.sql import open_store


@pytest.mark.parametrize(
    ("spec", "allowed", "refused"),
    [
        pytest.param("everyone", ["anyone"], [], id="everyone"),
        pytest.param("superusers", [], ["anyone", "alice"], id="superusers"),
        pytest.param("user:alice, group:ops", ["alice", "in-ops"], ["anyone"], id="named"),
        pytest.param("group:ops group:dev", ["in-ops"], ["alice", "anyone"], id="groups"),
    ],
)
def test_cluster_creators_name_users_and_groups(spec: str, allowed: list[str], refused: list[str]) -> None:
    creators = ClusterCreators.parse(spec)
    users = {"anyone": env.User(1, "anyone"), "alice": env.User(2, "alice"),
             "in-ops": env.User(3, "carol", groups=("ops",))}
    assert [n for n in allowed + refused if creators.allows(users[n])] == allowed
    assert creators.allows(env.User(9, "root", is_superuser=True))


@pytest.mark.parametrize("spec", ["", "root", "user:", "group:", "everyone superusers", "role:x"])
def test_cluster_creators_refuse_what_they_do_not_know(spec: str) -> None:
    with pytest.raises(ValueError, match="everyone, superusers"):
        ClusterCreators.parse(spec)


class _Drivers:
    def __init__(self, served: set[str]) -> None:
        self.served = served

    def registered(self, cluster_id: str) -> bool:
        return cluster_id in self.served

    def drivers(self, cluster_id: str) -> tuple[object, ...]:
        return ()


def test_reserved_ids_are_mesos_ones_and_those_drivers_serve() -> None:
    drivers = _Drivers({"BCS-MESOS-1"})
    assert reserved_cluster_id("anything", "mesos", None)
    assert reserved_cluster_id("BCS-MESOS-1", "k8s", drivers)
    assert reserved_cluster_id("BCS-K8S-1", "k8s", drivers) is None
    assert reserved_cluster_id("BCS-K8S-1", "k8s", None) is None


def test_the_ini_options_become_typed_settings(tmp_path: Path) -> None:
    config = config_from_options("app:main", {
        "data_dir": str(tmp_path), "cluster_creators": "user:alice", "quota_clusters_per_user": "3",
        "quota_tokens_per_user": "unlimited"})
    assert config.self_service.cluster_creators == ClusterCreators(everyone=False, users=frozenset({"alice"}))
    assert config.self_service.quotas == Quotas(clusters_per_user=3, tokens_per_user=None)
    assert config_from_options("app:main", {"data_dir": str(tmp_path)}).self_service.quotas == Quotas()
    for key, value, message in (("quota_clusters", "3", "unknown key 'quota_clusters'"),
                                ("quota_tokens_per_user", "-2", "cannot be negative"),
                                ("quota_tokens_per_user", "many", "not a quota"),
                                ("cluster_creators", "root", "user:NAME")):
        with pytest.raises(ConfigError, match=message):
            config_from_options("app:main", {"data_dir": str(tmp_path), key: value})
    api = app_factory({}, data_dir=str(tmp_path / "api"), cluster_creators="superusers",
                      quota_permissions_per_cluster="7")
    assert api.settings.quotas.permissions_per_cluster == 7 and not api.settings.cluster_creators.everyone
    api.store.db.dispose()


def test_group_members_register_clusters_and_others_do_not(tmp_path: Path) -> None:
    """Groups come from the authenticator (here the store's, given a group mapping)."""
    store = open_store(data_dir=tmp_path, secret_key=Fernet.generate_key().decode())
    tokens = {}
    for name in ("carol", "dave"):
        user = store.create_user(name)
        tokens[name] = store.create_token(user.id)[1]
    api = ManagementAPI(store, settings=APISettings(cluster_creators=ClusterCreators.parse("group:ops"),
                                                    quotas=Quotas(clusters_per_user=1)))
    client = Client(TokenAuthMiddleware(api, authenticator=StoreAuthenticator(store, groups={"carol": ["ops"]})))

    def create(name: str, cluster_id: str):  # type: ignore[no-untyped-def]
        return client.post("/rest/clusters/bcs", headers={"Authorization": f"Bearer {tokens[name]}"},
                           json={"id": cluster_id, "project_id": "p", "cluster_type": "k8s"})

    assert create("carol", "carols").status_code == 201
    refused = create("dave", "daves")
    assert (refused.status_code, refused.get_json()["code_name"]) == (403, "CLUSTER_CREATION_FORBIDDEN")
    over = create("carol", "carols-2")
    assert over.status_code == 403
    assert over.get_json() == {"code_name": "QUOTA_EXCEEDED", "quota": "clusters_per_user", "limit": 1,
                               "message": over.get_json()["message"]}
    assert [c.id for c in store.list_clusters()] == ["carols"]
    store.db.dispose()
