"""Listing and deleting users and clusters, and the superuser flag, attacked through a real gateway.

An ordinary user must not list users, delete anyone, or make themselves a superuser;
a user must not learn of a cluster they cannot see from the cluster list; a deleted
user's tokens stop working; a deleted cluster is gone from the tunnel (its apiserver
sees nothing more), its register token reports nothing, and re-creating the same id
inherits none of its credentials or permissions.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import ADMIN, CLI, SA_TOKEN, Gateway, gateway_ini, register_cluster, served_gateway
from tests.support.polling import wait_for

CLUSTER = "lifecycle-c1"
#: The token and cluster caches' bound in this module's gateway.
TTL = 0.3


@dataclass
class World:
    gw: Gateway
    api: FakeAPIServer
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("lifecycle")
    data = tmp / "data"
    ini = tmp / "gateway.ini"
    gateway_ini(ini, data, cluster_cache_ttl=f"{TTL}s", token_cache_ttl=f"{TTL}s")
    with FakeAPIServer(token=SA_TOKEN) as api, served_gateway(data, args=["--config", str(ini)]) as gw:
        tokens = {name: gw.user(name) for name in ("alice", "bob", "mallory")}
        yield World(gw, api, tokens)


def _users(world: World) -> dict[str, bool]:
    return {u["name"]: u["is_super_user"] for u in world.gw.json("GET", "/rest/users/")}


def test_an_ordinary_user_cannot_list_users(world: World) -> None:
    for path in ("/rest/users/", "/rest/users"):
        status, raw = world.gw.call("GET", path, token=world.tokens["mallory"])
        assert status == 403, (path, status, raw)
        assert b"alice" not in raw
    assert world.gw.call("GET", "/rest/users/", token="")[0] == 401
    assert "alice" in _users(world)


@pytest.mark.parametrize("path", ["/rest/users/bob", "/rest/users/bob/", "/rest/users/admin"])
def test_an_ordinary_user_cannot_delete_anyone(world: World, path: str) -> None:
    status, _ = world.gw.call("DELETE", path, token=world.tokens["mallory"])
    assert status == 403
    assert {"bob", "admin"} <= set(_users(world))
    # Bob's token still works.
    assert world.gw.call("GET", "/rest/clusters/", token=world.tokens["bob"])[0] == 200


@pytest.mark.parametrize("body", [{"is_super_user": True}, {"is_superuser": True}])
def test_an_ordinary_user_cannot_promote_themselves(world: World, body: dict[str, bool]) -> None:
    for path in ("/rest/users/mallory", "/rest/users/mallory/"):
        status, _ = world.gw.call("PUT", path, token=world.tokens["mallory"], body=body)
        assert status == 403
    assert _users(world)["mallory"] is False
    time.sleep(TTL + 0.2)  # past the token cache: still no superuser
    assert world.gw.call("GET", "/rest/users/", token=world.tokens["mallory"])[0] == 403


def test_the_last_superuser_is_neither_demoted_nor_deleted(world: World) -> None:
    status, raw = world.gw.call("PUT", "/rest/users/admin", body={"is_super_user": False})
    assert status == 409 and json.loads(raw)["code_name"] == "LAST_SUPERUSER"
    status, raw = world.gw.call("DELETE", "/rest/users/admin")
    assert status == 409 and json.loads(raw)["code_name"] == "CANNOT_DELETE_SELF"
    assert _users(world)["admin"] is True
    assert world.gw.call("GET", "/rest/users/")[0] == 200


def test_a_demoted_superuser_loses_the_power(world: World) -> None:
    token = world.gw.user("temp-root")
    world.gw.json("PUT", "/rest/users/temp-root", body={"is_super_user": True})
    wait_for(lambda: world.gw.call("GET", "/rest/users/", token=token)[0] == 200, step=0.2)
    world.gw.json("PUT", "/rest/users/temp-root", body={"is_super_user": False})
    wait_for(lambda: world.gw.call("GET", "/rest/users/", token=token)[0] == 403, step=0.2)
    world.gw.json("DELETE", "/rest/users/temp-root")


def test_a_deleted_users_tokens_stop_working(world: World) -> None:
    token = world.gw.user("leaver")
    assert world.gw.call("GET", "/rest/clusters/", token=token)[0] == 200
    deleted = world.gw.json("DELETE", "/rest/users/leaver")
    assert deleted["tokens_revoked"] == 1
    wait_for(lambda: world.gw.call("GET", "/rest/clusters/", token=token)[0] == 401, step=0.2)
    # A new user of the same name does not get the old token back.
    world.gw.json("POST", "/rest/users/", body={"user_name": "leaver"})
    time.sleep(TTL + 0.2)  # the sleep is the test: past the cache bound, the state holds
    assert world.gw.call("GET", "/rest/clusters/", token=token)[0] == 401


def test_a_user_without_view_does_not_see_a_cluster_in_the_list(world: World) -> None:
    status, _ = world.gw.call("POST", "/rest/clusters/bcs", token=world.tokens["alice"],
                              body={"id": "alice-listed", "project_id": "p", "cluster_type": "k8s"})
    assert status == 201
    for name in ("bob", "mallory"):
        listed = world.gw.json("GET", "/rest/clusters/", token=world.tokens[name])
        assert "alice-listed" not in {c["id"] for c in listed}
    assert "alice-listed" in {c["id"] for c in world.gw.json("GET", "/rest/clusters/", token=world.tokens["alice"])}
    world.gw.grant("bob", "view", cluster="alice-listed")
    listed = world.gw.json("GET", "/rest/clusters/", token=world.tokens["bob"])
    assert {"id": "alice-listed", "permission": "view"}.items() <= next(
        c for c in listed if c["id"] == "alice-listed").items()
    # Mallory still sees nothing of it, nor may Bob (view) delete it.
    assert world.gw.call("DELETE", "/rest/clusters/alice-listed", token=world.tokens["mallory"])[0] == 404
    assert world.gw.call("DELETE", "/rest/clusters/alice-listed/", token=world.tokens["bob"])[0] == 403
    assert world.gw.call("GET", "/rest/clusters/alice-listed", token=world.tokens["alice"])[0] == 200


def _tunnel(world: World, token: str) -> int:
    return world.gw.call("GET", f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods", token=token)[0]


def test_a_deleted_cluster_is_gone_from_the_tunnel_and_its_register_token_reports_nothing(world: World) -> None:
    alice = world.tokens["alice"]
    register_token = register_cluster(world.gw, CLUSTER, server_url=world.api.url, ca_pem=world.api.ca_pem,
                                      token=alice)
    world.gw.grant("bob", "view", cluster=CLUSTER)
    assert _tunnel(world, alice) == 200 and _tunnel(world, world.tokens["bob"]) == 200

    deleted = world.gw.json("DELETE", f"/rest/clusters/{CLUSTER}", token=alice)
    assert deleted["deleted"]["register_token"] is True and deleted["deleted"]["credentials"] is True
    time.sleep(TTL + 0.3)  # every worker's cluster cache has expired
    before = len(world.api.requests)
    for token in (alice, world.tokens["bob"], ADMIN):
        assert _tunnel(world, token) == 404
    assert len(world.api.requests) == before, "the deleted cluster's apiserver was still reached"

    # The old register token reports nothing: not through the REST API, not through the real agent.
    evil = {"server_addresses": world.api.url, "cacert_data": world.api.ca_pem, "user_token": SA_TOKEN}
    assert world.gw.call("PUT", f"/rest/clusters/{CLUSTER}/credentials", token=register_token, body=evil)[0] == 401
    # The Go agent's form (token in the body, no Authorization) gets bcs-api's answer for it.
    status, body = world.gw.call("PUT", f"/clusters/{CLUSTER}/credentials", token="",
                                 body={**evil, "register_token": register_token})
    assert (status, json.loads(body)["code_name"]) == (400, "RTOKEN_NOT_FOUND")
    agent_kubeconfig = world.gw.data / f"agent-{CLUSTER}.kubeconfig"
    agent = subprocess.run(
        [CLI, "kube-agent", "--bke-address", world.gw.url, "--cluster-id", CLUSTER, "--kubeconfig",
         str(agent_kubeconfig), "--once"],
        env={**os.environ, "REGISTER_TOKEN": register_token, "SERVER_CERT": Path(world.gw.ca_file).read_text()},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert agent.returncode != 0
    before = len(world.api.requests)  # the agent itself read its apiserver

    # Mallory re-creates the same id: she inherits no credentials, token or permission.
    status, _ = world.gw.call("POST", "/rest/clusters/bcs", token=world.tokens["mallory"],
                              body={"id": CLUSTER, "project_id": "p", "cluster_type": "k8s"})
    assert status == 201
    time.sleep(TTL + 0.2)  # the sleep is the test: past the cache bound, the state holds
    assert world.gw.json("GET", f"/rest/clusters/{CLUSTER}/credentials",
                         token=world.tokens["mallory"])["reported"] is False
    assert world.gw.call("GET", f"/rest/clusters/{CLUSTER}/register_tokens", token=world.tokens["mallory"])[0] == 404
    assert _tunnel(world, world.tokens["mallory"]) != 200
    for name in ("alice", "bob"):
        assert world.gw.call("GET", f"/rest/clusters/{CLUSTER}", token=world.tokens[name])[0] == 404
    assert len(world.api.requests) == before
    world.gw.json("DELETE", f"/rest/clusters/{CLUSTER}", token=world.tokens["mallory"])
