"""What a plain user can give themselves is bounded: quotas and who may register clusters.

The attacker is an ordinary user of a real ``bcs-middleware serve`` (2 gunicorn workers, one
PostgreSQL shared by both): they create clusters, admission webhook configurations, cluster
permissions — one by one and from many clients at once — and a superuser issues them tokens.
Each quota must refuse at exactly its limit (``403 QUOTA_EXCEEDED`` naming the quota and the
limit, nothing created), however many requests race in the two workers; superusers are
exempt. A second set of gateways restricts who may register clusters at all.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.support.gateway import ADMIN, CLI, Gateway, gateway_ini, served_gateway
from tests.support.postgres import PostgresServer
from tests.support.servers import free_port

LIMITS = {"clusters_per_user": 3, "tokens_per_user": 3, "webhook_configurations_per_cluster": 2,
          "permissions_per_cluster": 4}
#: Concurrent clients per race (each request on its own connection, spread over both workers).
CLIENTS = 12
BUNDLE = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()


@pytest.fixture(scope="module")
def gateway(postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    args = ["--database-url", postgres_server.create_database()]
    for name, limit in LIMITS.items():
        args += ["--quota", f"{name}={limit}"]
    with served_gateway(tmp_path_factory.mktemp("quotas"), workers=2, args=args) as gw:
        yield gw


def _cluster(gw: Gateway, token: str, cluster_id: str) -> tuple[int, dict[str, Any]]:
    status, body = gw.call("POST", "/rest/clusters/bcs", token=token,
                           body={"id": cluster_id, "project_id": "p", "cluster_type": "k8s"})
    return status, json.loads(body)


def _configuration(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{"name": f"{name}.example.com", "clientConfig": {"url": "https://hook.example.com/",
                                                                      "caBundle": BUNDLE},
                      "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["pods"]}],
                      "sideEffects": "None", "admissionReviewVersions": ["v1"]}],
    }


def _over(status: int, body: dict[str, Any], quota: str) -> bool:
    return (status, body.get("code_name"), body.get("quota"), body.get("limit")) == (
        403, "QUOTA_EXCEEDED", quota, LIMITS[quota])


def _race(attempt: Callable[[int], tuple[int, bytes]]) -> list[int]:
    """``CLIENTS`` attempts released at once; their statuses (quota refusals checked)."""
    barrier = threading.Barrier(CLIENTS)

    def one(n: int) -> int:
        barrier.wait(30)
        status, raw = attempt(n)
        if status != 201 and status != 200:
            assert status == 403 and json.loads(raw)["code_name"] == "QUOTA_EXCEEDED", (status, raw[:300])
        return status

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [f.result(timeout=120) for f in [pool.submit(one, n) for n in range(CLIENTS)]]


def test_a_plain_user_gets_exactly_the_cluster_quota(gateway: Gateway) -> None:
    token = gateway.user("seq-clusters")
    for n in range(LIMITS["clusters_per_user"]):
        assert _cluster(gateway, token, f"seq-{n}")[0] == 201
    status, body = _cluster(gateway, token, "seq-over")
    assert _over(status, body, "clusters_per_user"), body
    assert "used 3, limited: 3" in body["message"]
    assert gateway.call("GET", "/rest/clusters/seq-over")[0] == 404  # nothing was created
    # Handing a cluster to someone else does not free its place; deleting it does.
    other = gateway.user("seq-heir")
    gateway.json("PUT", "/rest/clusters/seq-0/permissions/seq-heir", token=token, body={"permission": "edit"})
    gateway.json("DELETE", "/rest/clusters/seq-0/permissions/seq-clusters", token=other)
    assert _over(*_cluster(gateway, token, "seq-over"), "clusters_per_user")
    gateway.json("DELETE", "/rest/clusters/seq-1", token=token)
    assert _cluster(gateway, token, "seq-over")[0] == 201
    # Superusers are exempt.
    for n in range(LIMITS["clusters_per_user"] + 2):
        assert _cluster(gateway, ADMIN, f"admin-{n}")[0] == 201


def test_a_plain_user_gets_exactly_the_configuration_and_permission_quotas(gateway: Gateway) -> None:
    token = gateway.user("seq-editor")
    assert _cluster(gateway, token, "seq-editors")[0] == 201
    path = "/rest/clusters/seq-editors/admissionwebhookconfigurations"
    for n in range(LIMITS["webhook_configurations_per_cluster"]):
        assert gateway.call("POST", path, token=token, body=_configuration(f"cfg-{n}"))[0] == 201
    status, raw = gateway.call("POST", path, token=token, body=_configuration("cfg-over"))
    assert _over(status, json.loads(raw), "webhook_configurations_per_cluster"), raw
    assert len(gateway.json("GET", path, token=token)["items"]) == 2
    # Replacing one is not creating one; the superuser may add past the limit.
    item = f"{path}/validatingwebhookconfigurations/cfg-0"
    assert gateway.call("PUT", item, token=token, body=_configuration("cfg-0"))[0] == 200
    assert gateway.call("POST", path, body=_configuration("cfg-admin"))[0] == 201

    # The creator's edit is the first of the cluster's grants.
    for n in range(LIMITS["permissions_per_cluster"] - 1):
        gateway.user(f"grantee-{n}")
        assert gateway.call("PUT", f"/rest/clusters/seq-editors/permissions/grantee-{n}", token=token,
                            body={"permission": "view"})[0] == 201
    gateway.user("grantee-over")
    status, raw = gateway.call("PUT", "/rest/clusters/seq-editors/permissions/grantee-over", token=token,
                               body={"permission": "view"})
    assert _over(status, json.loads(raw), "permissions_per_cluster"), raw
    assert gateway.call("PUT", "/rest/clusters/seq-editors/permissions/grantee-0", token=token,
                        body={"permission": "edit"})[0] == 200  # a change is not a grant
    assert len(gateway.json("GET", "/rest/clusters/seq-editors/permissions", token=token)) == 4


def test_tokens_issued_to_a_plain_user_stop_at_the_quota(gateway: Gateway) -> None:
    gateway.user("seq-tokens")  # its first token
    user_id = gateway.json("GET", "/rest/users/seq-tokens")["id"]
    path = f"/rest/users/{user_id}/tokens"
    for _ in range(LIMITS["tokens_per_user"] - 1):
        assert gateway.call("POST", path, body={})[0] == 201
    status, raw = gateway.call("POST", path, body={})
    assert _over(status, json.loads(raw), "tokens_per_user"), raw
    first = gateway.json("GET", path)[0]["id"]
    gateway.json("DELETE", f"{path}/{first}")  # revoked: no longer counted
    assert gateway.call("POST", path, body={})[0] == 201
    # A superuser's own tokens are not bounded.
    admin_id = gateway.json("GET", "/rest/users/admin")["id"]
    for _ in range(LIMITS["tokens_per_user"] + 1):
        assert gateway.call("POST", f"/rest/users/{admin_id}/tokens", body={})[0] == 201


def test_concurrent_creates_from_many_clients_stop_exactly_at_each_limit(gateway: Gateway) -> None:
    token = gateway.user("racer")
    statuses = _race(lambda n: gateway.call("POST", "/rest/clusters/bcs", token=token,
                                            body={"id": f"race-{n}", "project_id": "p", "cluster_type": "k8s"}))
    assert statuses.count(201) == LIMITS["clusters_per_user"], statuses
    mine = [c for c in gateway.json("GET", "/rest/clusters/", token=token) if c["id"].startswith("race-")]
    assert len(mine) == LIMITS["clusters_per_user"]

    cluster = mine[0]["id"]
    path = f"/rest/clusters/{cluster}/admissionwebhookconfigurations"
    statuses = _race(lambda n: gateway.call("POST", path, token=token, body=_configuration(f"race-cfg-{n}")))
    assert statuses.count(201) == LIMITS["webhook_configurations_per_cluster"], statuses
    assert len(gateway.json("GET", path, token=token)["items"]) == LIMITS["webhook_configurations_per_cluster"]

    for n in range(CLIENTS):
        gateway.user(f"race-grantee-{n}")
    statuses = _race(lambda n: gateway.call("PUT", f"/rest/clusters/{cluster}/permissions/race-grantee-{n}",
                                            token=token, body={"permission": "view"}))
    assert statuses.count(201) == LIMITS["permissions_per_cluster"] - 1, statuses
    assert len(gateway.json("GET", f"/rest/clusters/{cluster}/permissions", token=token)) == 4

    gateway.user("race-tokens")
    user_id = gateway.json("GET", "/rest/users/race-tokens")["id"]
    statuses = _race(lambda n: gateway.call("POST", f"/rest/users/{user_id}/tokens", body={}))
    assert statuses.count(201) == LIMITS["tokens_per_user"] - 1, statuses
    assert len([t for t in gateway.json("GET", f"/rest/users/{user_id}/tokens") if not t["revoked_at"]]) == 3


# -- who may register clusters ---------------------------------------------------------------


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Gateway]]:
    tmp = tmp_path_factory.mktemp("creators")
    ini = gateway_ini(tmp / "named.ini", tmp / "named", cluster_creators="user:alice, user:admin-helper")
    with served_gateway(tmp / "superusers", workers=1, args=["--cluster-creators", "superusers"]) as only_su, \
            served_gateway(tmp / "named", workers=1, args=["--config", str(ini)]) as named:
        yield {"superusers": only_su, "named": named}


def test_cluster_creation_is_refused_to_whom_the_configuration_does_not_name(
        restricted: dict[str, Gateway]) -> None:
    only_su, named = restricted["superusers"], restricted["named"]
    bob = only_su.user("bob")
    status, body = _cluster(only_su, bob, "bobs")
    assert (status, body["code_name"]) == (403, "CLUSTER_CREATION_FORBIDDEN"), body
    assert "superusers" in body["message"]
    assert only_su.call("GET", "/rest/clusters/bobs")[0] == 404
    assert _cluster(only_su, ADMIN, "admins")[0] == 201
    # The superuser registers it for bob and hands it over: bob manages it.
    only_su.grant("bob", "edit", cluster="admins")
    assert only_su.call("POST", "/rest/clusters/admins/register_tokens", token=bob)[0] == 201

    alice, mallory = named.user("alice"), named.user("mallory")
    assert _cluster(named, alice, "alices")[0] == 201
    status, body = _cluster(named, mallory, "mallorys")
    assert (status, body["code_name"]) == (403, "CLUSTER_CREATION_FORBIDDEN"), body
    assert "alice" not in body["message"]  # who else may is not hers to learn
    assert _cluster(named, ADMIN, "by-admin")[0] == 201


def test_creators_and_quotas_refuse_bad_settings_at_start(tmp_path: Path) -> None:
    for args, expected in (
        (["--cluster-creators", "root"], "user:NAME / group:NAME"),
        (["--quota", "clusters=3"], "unknown key 'quota_clusters'"),
        (["--quota", "tokens_per_user=-1"], "cannot be negative"),
        (["--quota", "tokens_per_user"], "expected NAME=LIMIT"),
    ):
        done = subprocess.run(
            [CLI, "serve", "--data-dir", str(tmp_path / "data"), "--bind", f"127.0.0.1:{free_port()}", *args],
            capture_output=True, text=True, timeout=60, env={**os.environ, "BCS_ADMIN_TOKEN": ADMIN})
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert expected in done.stderr, (args, done.stderr)
