"""Per-cluster authorization, attacked through a real ``bcs-middleware serve`` and a fake apiserver.

Alice creates her cluster; Bob is another ordinary user. Bob must learn nothing
about Alice's cluster (every answer is the 404 of a cluster that does not exist),
must not reach it through the tunnel (the apiserver sees nothing of him), and must
not touch its register token, credentials, permissions or admission configurations.
``view`` lets a user use a cluster, ``edit`` manage it; the RBAC subscription's
grants give ``view``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bcs_middleware.store.sql import open_store
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import SA_TOKEN, Gateway, gateway_ini, register_cluster, served_gateway
from tests.support.polling import wait_for

CLUSTER = "alice-c1"
MESOS = "alice-mesos"
MISSING = "no-such-cluster"
#: The gateway's cluster/permission cache bound in this module's configuration.
CACHE_TTL = 1.0
#: A namespace only Bob's attempts name, to tell them apart in the apiserver's request log.
PROBE = "bob-probe"


@dataclass
class World:
    gw: Gateway
    api: FakeAPIServer
    driver: FakeUpstream
    tokens: dict[str, str]
    register_token: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("cluster-permissions")
    grants = tmp / "grants.json"
    grants.write_text(json.dumps({"version": 1, "grants": [
        {"user": "erin", "cluster": CLUSTER, "namespace": "default", "role": "view"},
        {"user": "gina", "cluster": "*", "role": "view"},
    ]}))
    data = tmp / "data"
    driver = FakeUpstream()  # Alice's Mesos cluster's mesos-driver
    ini = tmp / "gateway.ini"
    gateway_ini(ini, data, rbac="true", rbac_source_file=str(grants), rbac_interval="2s",
                cluster_cache_ttl=f"{CACHE_TTL}s", token_cache_ttl="30s",
                static_drivers=f"\n    {MESOS} = {driver.url}")
    with FakeAPIServer(token=SA_TOKEN) as api, served_gateway(data, args=["--config", str(ini)]) as gw:
        tokens = {name: gw.user(name) for name in ("alice", "bob", "carol", "dave", "erin", "gina")}
        register_token = register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem, token=tokens["alice"])
        # Mesos clusters are registered by superusers (issue 25); Alice manages hers.
        gw.json("POST", "/rest/clusters/bcs", body={"id": MESOS, "project_id": "p1", "cluster_type": "mesos"})
        gw.grant("alice", "edit", cluster=MESOS)
        yield World(gw, api, driver, tokens, register_token)
    driver.stop()
    output = gw.server.output()
    assert register_token not in output and SA_TOKEN not in output


def _body(raw: bytes) -> dict[str, Any]:
    return json.loads(raw) if raw else {}


def _not_found_like_missing(world: World, method: str, path: str, token: str, body: Any = None) -> None:
    """``path`` on Alice's cluster answers exactly what it answers for a cluster that does not exist."""
    status, raw = world.gw.call(method, path, token=token, body=body)
    missing_status, missing_raw = world.gw.call(method, path.replace(CLUSTER, MISSING), token=token, body=body)
    assert status == 404, (method, path, status, raw)
    assert (status, raw.replace(CLUSTER.encode(), MISSING.encode())) == (missing_status, missing_raw)


def _bob_reached_apiserver(world: World) -> bool:
    return any(PROBE in r.path or r.headers.get("Impersonate-User") == "bob" for r in world.api.requests)


def _admin_cluster(world: World) -> str:
    """A cluster only the admin created."""
    status, raw = world.gw.call("POST", "/rest/clusters/bcs",
                                body={"id": "admin-only", "project_id": "p", "cluster_type": "k8s"})
    assert status in (201, 409), raw
    return "admin-only"


def _stored_configurations(world: World) -> list[tuple[str, str]]:
    """Alice's cluster's admission configurations as the database holds them (no cache in between)."""
    from sqlalchemy import select

    from bcs_middleware.store import models as m

    store = open_store(data_dir=world.gw.data, migrate=False)
    try:
        with store.db.connection() as conn:
            table = m.webhook_definitions
            rows = conn.execute(select(table.c.kind, table.c.name).where(table.c.cluster_id == CLUSTER)).all()
    finally:
        store.db.dispose()
    return sorted((r.kind, r.name) for r in rows)


def _audit(world: World) -> list[Any]:
    store = open_store(data_dir=world.gw.data, migrate=False)
    try:
        return sorted(store.list_audit(limit=1000), key=lambda a: a.id)  # oldest first
    finally:
        store.db.dispose()


# -- Bob, with no permission on Alice's cluster ----------------------------------------------


@pytest.mark.parametrize("method,path", [
    pytest.param("GET", f"/rest/clusters/{CLUSTER}/register_tokens", id="read"),
    pytest.param("GET", f"/rest/clusters/{CLUSTER}/register_tokens/", id="read-trailing-slash"),
    pytest.param("POST", f"/rest/clusters/{CLUSTER}/register_tokens", id="create"),
    pytest.param("DELETE", f"/rest/clusters/{CLUSTER}/register_tokens", id="revoke"),
    pytest.param("DELETE", f"/rest/clusters/{CLUSTER}/register_tokens/", id="revoke-trailing-slash"),
])
def test_another_user_cannot_read_or_rotate_the_register_token(world: World, method: str, path: str) -> None:
    _not_found_like_missing(world, method, path, world.tokens["bob"])
    # Alice's token is still the one her agent holds (nothing was rotated or revoked).
    found = world.gw.json("GET", f"/rest/clusters/{CLUSTER}/register_tokens", token=world.tokens["alice"])
    assert found["token"] == world.register_token


def test_another_user_cannot_repoint_the_cluster(world: World) -> None:
    """The issue's example: without the register token Bob cannot re-point the cluster's addresses."""
    evil = {"server_addresses": "https://127.0.0.1:1", "cacert_data": world.api.ca_pem, "user_token": "x" * 20}
    for path in (f"/rest/clusters/{CLUSTER}/credentials", f"/clusters/{CLUSTER}/credentials"):
        status, _ = world.gw.call("PUT", path, token=world.tokens["bob"], body=evil)
        assert status in (403, 404)
    status, raw = world.gw.call("GET", f"/rest/clusters/{CLUSTER}/register_tokens", token=world.tokens["bob"])
    assert status == 404 and world.register_token.encode() not in raw
    addresses = world.gw.json("GET", f"/rest/clusters/{CLUSTER}/credentials")["server_addresses"]
    assert "https://127.0.0.1:1" not in addresses


@pytest.mark.parametrize("path", [
    pytest.param(f"/rest/clusters/{CLUSTER}", id="cluster"),
    pytest.param(f"/rest/clusters/{CLUSTER}/", id="cluster-trailing-slash"),
    pytest.param(f"/rest/clusters/{CLUSTER}/kubeconfig", id="kubeconfig"),
    pytest.param(f"/rest/clusters/{CLUSTER}/client_credentials", id="client-credentials"),
    pytest.param(f"/clusters/{CLUSTER}/client_credentials", id="client-credentials-alias"),
    pytest.param(f"/rest/clusters/{CLUSTER}/credentials", id="credential-status"),
    pytest.param(f"/clusters/{CLUSTER}/credentials/", id="credential-status-alias"),
    pytest.param(f"/rest/clusters/{CLUSTER}/permissions", id="permissions"),
    pytest.param(f"/rest/clusters/{CLUSTER}/permissions/alice", id="permission"),
])
def test_another_user_cannot_see_the_cluster(world: World, path: str) -> None:
    _not_found_like_missing(world, "GET", path, world.tokens["bob"])
    # The route exists and Alice, who holds edit, is answered.
    assert world.gw.call("GET", path, token=world.tokens["alice"])[0] == 200


@pytest.mark.parametrize("method,path,body", [
    pytest.param("PUT", f"/rest/clusters/{CLUSTER}/permissions/bob", {"permission": "edit"}, id="grant-self-edit"),
    pytest.param("PUT", f"/rest/clusters/{CLUSTER}/permissions/bob/", {"permission": "view"}, id="grant-self-view"),
    pytest.param("DELETE", f"/rest/clusters/{CLUSTER}/permissions/alice", None, id="remove-owner"),
])
def test_another_user_cannot_manage_permissions(world: World, method: str, path: str, body: Any) -> None:
    _not_found_like_missing(world, method, path, world.tokens["bob"], body)
    listed = world.gw.json("GET", f"/rest/clusters/{CLUSTER}/permissions", token=world.tokens["alice"])
    assert "bob" not in {p["user_name"] for p in listed}
    assert {"user_name": "alice", "permission": "edit"}.items() <= next(
        p for p in listed if p["user_name"] == "alice").items()


def _webhook_configuration(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": "https://127.0.0.1:9/validate"},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}],
            "failurePolicy": "Ignore",
        }],
    }


CONFIGS = f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations"


@pytest.mark.parametrize("method,path,body", [
    pytest.param("GET", CONFIGS, None, id="list"),
    pytest.param("POST", CONFIGS, _webhook_configuration("bob-hook"), id="create"),
    pytest.param("GET", f"{CONFIGS}/validatingwebhookconfigurations/alice-hook", None, id="read"),
    pytest.param("PUT", f"{CONFIGS}/validatingwebhookconfigurations/alice-hook", _webhook_configuration("alice-hook"),
                 id="replace"),
    pytest.param("DELETE", f"{CONFIGS}/ValidatingWebhookConfiguration/alice-hook", None, id="delete-kind-name"),
])
def test_another_user_cannot_manage_admission_configurations(world: World, method: str, path: str,
                                                             body: Any) -> None:
    alice = world.tokens["alice"]
    if not _stored_configurations(world):
        status, raw = world.gw.call("POST", CONFIGS, token=alice, body=_webhook_configuration("alice-hook"))
        assert status == 201, raw
    stored = _stored_configurations(world)
    _not_found_like_missing(world, method, path, world.tokens["bob"], body)
    assert _stored_configurations(world) == stored == [("ValidatingWebhookConfiguration", "alice-hook")]


def test_an_edit_holder_manages_only_their_clusters_configurations(world: World) -> None:
    alice = world.tokens["alice"]
    # The gateway-wide bcs definitions and the dry-run review stay superuser-only.
    assert world.gw.call("GET", "/rest/admissionwebhooks", token=alice)[0] == 403
    assert world.gw.call("POST", "/rest/admission/review", token=alice, body={})[0] == 403
    status, _ = world.gw.call("GET", f"/rest/clusters/{_admin_cluster(world)}/admissionwebhookconfigurations",
                              token=alice)
    assert status == 404


@pytest.mark.parametrize("method,path", [
    pytest.param("GET", "/api/v1/namespaces/{probe}/pods", id="list"),
    pytest.param("GET", "/api/v1/namespaces/{probe}/pods/", id="trailing-slash"),
    pytest.param("GET", "//api/v1/namespaces/{probe}/pods", id="doubled-slash"),
    pytest.param("GET", "/API/v1/namespaces/{probe}/pods", id="path-case"),
    pytest.param("POST", "/api/v1/namespaces/{probe}/configmaps", id="create"),
    pytest.param("PUT", "/api/v1/namespaces/{probe}/configmaps/x", id="replace"),
    pytest.param("PATCH", "/api/v1/namespaces/{probe}/configmaps/x", id="patch"),
    pytest.param("DELETE", "/api/v1/namespaces/{probe}/configmaps/x", id="delete"),
])
def test_another_user_cannot_use_the_cluster_through_the_tunnel(world: World, method: str, path: str) -> None:
    rest = path.format(probe=PROBE)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": PROBE}}
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    results = []
    for tunnel_path in (f"/tunnels/clusters/{CLUSTER}{rest}", f"/tunnels/clusters/{MISSING}{rest}"):
        status, raw = world.gw.call(method, tunnel_path, token=world.tokens["bob"],
                                    body=None if method in ("GET", "DELETE") else body, headers=headers)
        results.append((status, _body(raw)))
    (status, status_doc), (missing_status, missing_doc) = results
    assert status == missing_status == 404, results
    assert status_doc["kind"] == "Status" and status_doc["reason"] == "NotFound", results
    assert json.dumps(status_doc).replace(CLUSTER, MISSING) == json.dumps(missing_doc)
    assert not _bob_reached_apiserver(world)


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_another_user_cannot_reach_a_mesos_clusters_drivers(world: World, method: str) -> None:
    path = f"/bcsapi/v4/scheduler/mesos/namespaces/{PROBE}/applications"
    body = {"kind": "application", "metadata": {"name": "x", "namespace": PROBE}} if method == "POST" else None
    answers = []
    for cluster in (MESOS, MISSING):
        status, raw = world.gw.call(method, path, token=world.tokens["bob"], body=body,
                                    headers={"BCS-ClusterID": cluster})
        answers.append((status, raw.replace(cluster.encode(), b"<id>")))
    assert answers[0] == answers[1] and answers[0][0] == 404, answers
    assert not any(PROBE in r.path for r in world.driver.requests)
    # Alice, who holds edit, reaches her cluster's driver.
    world.gw.call("GET", "/bcsapi/v4/scheduler/mesos/alice-was-here", token=world.tokens["alice"],
                  headers={"BCS-ClusterID": MESOS})
    assert world.driver.requests[-1].path == "/mesosdriver/v4/alice-was-here"


def test_a_lookalike_cluster_id_gives_no_access(world: World) -> None:
    bob = world.tokens["bob"]
    status, _ = world.gw.call("POST", "/rest/clusters/bcs", token=bob,
                              body={"id": CLUSTER.upper(), "project_id": "p", "cluster_type": "k8s"})
    assert status in (201, 409)
    status, _ = world.gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/{PROBE}", token=bob)
    assert status == 404
    _not_found_like_missing(world, "GET", f"/rest/clusters/{CLUSTER}/register_tokens", bob)
    assert not _bob_reached_apiserver(world)


# -- view and edit ---------------------------------------------------------------------------


def test_a_view_holder_uses_the_cluster_but_cannot_manage_it(world: World, tmp_path: Path) -> None:
    alice, carol = world.tokens["alice"], world.tokens["carol"]
    granted = world.gw.json("PUT", f"/rest/clusters/{CLUSTER}/permissions/carol", token=alice,
                            body={"permission": "view"})
    assert granted["permission"] == "view"

    def tunnel_ok() -> bool:
        return world.gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces", token=carol)[0] == 200

    wait_for(tunnel_ok, CACHE_TTL * 5 + 5, step=0.2)
    seen = world.api.requests.last("/api/v1/namespaces")
    assert seen is not None and seen.headers.get("Impersonate-User") == "carol"
    assert world.gw.call("GET", f"/rest/clusters/{CLUSTER}", token=carol)[0] == 200
    world.gw.kubeconfig(carol, tmp_path / "carol.kubeconfig", cluster=CLUSTER)
    for method, path, body in [
        ("GET", f"/rest/clusters/{CLUSTER}/register_tokens", None),
        ("POST", f"/rest/clusters/{CLUSTER}/register_tokens", None),
        ("DELETE", f"/rest/clusters/{CLUSTER}/register_tokens", None),
        ("GET", f"/rest/clusters/{CLUSTER}/credentials", None),
        ("GET", f"/rest/clusters/{CLUSTER}/permissions", None),
        ("PUT", f"/rest/clusters/{CLUSTER}/permissions/carol", {"permission": "edit"}),
        ("GET", CONFIGS, None),
    ]:
        status, raw = world.gw.call(method, path, token=carol, body=body)
        assert status == 403, (method, path, status, raw)
        assert world.register_token.encode() not in raw

    # Revoked: within the cache bound Carol gets the 404 of a cluster that does not exist.
    world.gw.json("DELETE", f"/rest/clusters/{CLUSTER}/permissions/carol", token=alice)
    wait_for(lambda: world.gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces", token=carol)[0] == 404,
             CACHE_TTL * 5 + 5, step=0.2)
    _not_found_like_missing(world, "GET", f"/rest/clusters/{CLUSTER}", carol)


def test_an_edit_holder_manages_the_cluster(world: World) -> None:
    alice, dave = world.tokens["alice"], world.tokens["dave"]
    assert world.gw.call("GET", f"/rest/clusters/{CLUSTER}/register_tokens", token=dave)[0] == 404
    world.gw.json("PUT", f"/rest/clusters/{CLUSTER}/permissions/dave", token=alice, body={"permission": "edit"})
    assert world.gw.json("GET", f"/rest/clusters/{CLUSTER}/register_tokens", token=dave)["token"] == \
        world.register_token
    status = world.gw.json("GET", f"/rest/clusters/{CLUSTER}/credentials", token=dave)
    assert status["has_ca"] and status["has_token"] and status["server_addresses"]
    assert SA_TOKEN not in json.dumps(status) and "BEGIN CERTIFICATE" not in json.dumps(status)
    assert world.gw.json("GET", f"/rest/clusters/{CLUSTER}/permissions/dave", token=dave)["permission"] == "edit"
    # Dave may hand out view, and take edit back from himself while Alice still holds it.
    world.gw.json("PUT", f"/rest/clusters/{CLUSTER}/permissions/bob", token=dave, body={"permission": "view"})
    world.gw.json("DELETE", f"/rest/clusters/{CLUSTER}/permissions/bob", token=dave)
    world.gw.json("DELETE", f"/rest/clusters/{CLUSTER}/permissions/dave", token=dave)
    assert world.gw.call("GET", f"/rest/clusters/{CLUSTER}/permissions", token=dave)[0] == 404


def test_the_last_edit_holder_cannot_lock_the_cluster_out_by_accident(world: World) -> None:
    alice = world.tokens["alice"]
    listed = world.gw.json("GET", f"/rest/clusters/{CLUSTER}/permissions", token=alice)
    assert [p["user_name"] for p in listed if p["permission"] == "edit"] == ["alice"]
    for method, body in (("DELETE", None), ("PUT", {"permission": "view"})):
        status, raw = world.gw.call(method, f"/rest/clusters/{CLUSTER}/permissions/alice", token=alice, body=body)
        assert status == 409 and _body(raw)["code_name"] == "LAST_EDIT_HOLDER", raw
    assert world.gw.json("GET", f"/rest/clusters/{CLUSTER}/permissions/alice", token=alice)["permission"] == "edit"
    for bad in ({"permission": "admin"}, {"permission": "view", "x": 1}, {}):
        status, raw = world.gw.call("PUT", f"/rest/clusters/{CLUSTER}/permissions/carol", token=alice, body=bad)
        assert status == 400, raw
    status, raw = world.gw.call("PUT", f"/rest/clusters/{CLUSTER}/permissions/nobody", token=alice,
                                body={"permission": "view"})
    assert status == 404 and _body(raw)["code_name"] == "USER_NOT_FOUND"


# -- register token rotation and the credential audit -----------------------------------------


def _report(world: World, cluster: str, token: str, address: str) -> tuple[int, bytes]:
    return world.gw.call("PUT", f"/rest/clusters/{cluster}/credentials", token=token, body={
        "server_addresses": address, "cacert_data": world.api.ca_pem, "user_token": SA_TOKEN})


def test_a_revoked_register_token_cannot_report_credentials(world: World) -> None:
    owner = world.tokens["dave"]
    cluster = "rotate-c1"
    old = register_cluster(world.gw, cluster, server_url=world.api.url, ca_pem=world.api.ca_pem, token=owner)
    # Warm every worker's token cache with the old token.
    for _ in range(6):
        assert _report(world, cluster, old, world.api.url)[0] == 200
    revoked = world.gw.json("DELETE", f"/rest/clusters/{cluster}/register_tokens", token=owner)
    assert revoked["revoked"] is True
    for _ in range(6):
        status, _ = _report(world, cluster, old, "https://127.0.0.1:1")
        assert status == 401
    status, raw = world.gw.call("GET", f"/rest/clusters/{cluster}/register_tokens", token=owner)
    assert status == 404 and _body(raw)["code_name"] == "REGISTER_TOKEN_NOT_FOUND"
    assert world.gw.json("GET", f"/rest/clusters/{cluster}/credentials", token=owner)["server_addresses"] == \
        [world.api.url]
    # A new token can be created and works; a second POST does not silently rotate it.
    new = world.gw.json("POST", f"/rest/clusters/{cluster}/register_tokens", token=owner)["token"]
    assert new != old
    assert world.gw.call("POST", f"/rest/clusters/{cluster}/register_tokens", token=owner)[0] == 409
    assert _report(world, cluster, new, world.api.url)[0] == 200
    actions = [(a.actor, a.action) for a in _audit(world) if a.target == f"cluster:{cluster}"]
    assert ("dave", "register_token.revoke") in actions


def test_credential_changes_are_audited_with_old_and_new_addresses(world: World) -> None:
    owner = world.tokens["dave"]
    cluster = "audit-c1"
    token = register_cluster(world.gw, cluster, server_url=world.api.url, ca_pem=world.api.ca_pem, token=owner)
    moved = f"https://localhost:{world.api.port}"
    assert _report(world, cluster, token, moved)[0] == 200
    entries = [a for a in _audit(world) if a.target == f"cluster:{cluster}" and a.action == "credentials.put"]
    assert entries[-1].detail == {"old_server_addresses": [world.api.url], "server_addresses": [moved]}
    assert entries[-1].actor == f"cluster-agent:{cluster}"
    assert entries[0].detail["old_server_addresses"] is None
    for entry in entries:
        text = json.dumps(entry.detail)
        assert SA_TOKEN not in text and "CERTIFICATE" not in text and token not in text


# -- the RBAC subscription ----------------------------------------------------------------------


@pytest.mark.parametrize("user", ["erin", "gina"])
def test_an_rbac_grant_gives_view(world: World, user: str) -> None:
    token = world.tokens[user]
    wait_for(lambda: world.gw.call("GET", f"/rest/clusters/{CLUSTER}", token=token)[0] == 200, 30, step=0.2)
    assert world.gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods", token=token)[0] == 200
    seen = world.api.requests.last("/api/v1/namespaces/default/pods")
    assert seen is not None and seen.headers.get("Impersonate-User") == user
    status, raw = world.gw.call("GET", f"/rest/clusters/{CLUSTER}/register_tokens", token=token)
    assert status == 403 and world.register_token.encode() not in raw
    # The grant names one cluster (erin) or every cluster (gina): erin sees no other.
    other = world.gw.call("GET", f"/rest/clusters/{_admin_cluster(world)}", token=token)[0]
    assert other == (404 if user == "erin" else 200)
