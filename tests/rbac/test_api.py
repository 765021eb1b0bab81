"""GET /rest/rbac/status: superusers only, the same answer from any process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from werkzeug.test import Client

from bcs_middleware.apps.rbac_status import RBACStatusApp
from bcs_middleware.core import environ as env
from bcs_middleware.store.database import Database
from bcs_middleware.store.sql import SQLStore
from tests.support.fake_apiserver import FakeAPIServer

from .conftest import PermissionFile, add_cluster, make_service, run_once


def _client(store: SQLStore, user: env.User | None, *, enabled: bool = True) -> Client:
    app = RBACStatusApp(store, enabled=enabled)

    def with_user(environ: dict[str, Any], start_response: Any) -> Any:
        if user is not None:
            environ[env.USER] = user
        return app(environ, start_response)

    return Client(with_user)


@pytest.mark.parametrize("user, method, status, code_name", [
    pytest.param(None, "GET", 401, "UNAUTHORIZED", id="anonymous"),
    pytest.param(env.User(2, "alice"), "GET", 403, "FORBIDDEN", id="not-superuser"),
    pytest.param(env.User(1, "admin", is_superuser=True), "POST", 405, None, id="post"),
])
def test_status_is_refused_to_others(store: SQLStore, user: env.User | None, method: str, status: int,
                                     code_name: str | None) -> None:
    response = _client(store, user).open("/rest/rbac/status", method=method)
    assert response.status_code == status
    if code_name:
        assert response.get_json()["code_name"] == code_name


def test_status_shows_leader_source_and_cluster_outcomes(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    permissions.write([{"user": "alice", "cluster": "*", "role": "view"}])
    service = make_service(store, permissions.path, holder="gw-test")
    admin = env.User(1, "admin", is_superuser=True)
    try:
        before = _client(store, admin).get("/rest/rbac/status").get_json()
        assert before == {"enabled": True, "leader": None, "source": None, "clusters": []}
        run_once(service)
        # Another process (its own SQLStore) reads what the leader wrote.
        other = SQLStore(Database(store.db.url, secrets=store.db.secrets))
        try:
            document = _client(other, admin).get("/rest/rbac/status").get_json()
        finally:
            other.db.dispose()
    finally:
        service.stop()
    assert document["leader"]["holder"] == "gw-test" and document["leader"]["active"]
    assert document["source"]["grants"] == 1 and document["source"]["error"] is None
    [cluster] = document["clusters"]
    assert (cluster["cluster_id"], cluster["result"], cluster["created"]) == ("BCS-K8S-A", "ok", 1)
    assert api.token not in str(document)


def test_status_when_disabled(store: SQLStore) -> None:
    admin = env.User(1, "admin", is_superuser=True)
    document = _client(store, admin, enabled=False).get("/rest/rbac/status").get_json()
    assert document["enabled"] is False
