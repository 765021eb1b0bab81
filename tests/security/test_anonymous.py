"""Attacks on anonymous access (the AuthenticationConfiguration's ``anonymous``), through a real ``serve``.

One gateway enables anonymous on a few exact paths (:data:`CONDITIONS`), among them a management
write and a Mesos path to show that listing a path never opens those; ``system:unauthenticated``
is granted ``view`` on :data:`OPEN` only. A second gateway has ``anonymous: {enabled: false}``. The
fake apiserver behind both decides with its own RBAC objects for impersonated requests, as a
cluster does: ``system:unauthenticated`` may only ``get``/``list`` pods in ``default``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_apiserver import FakeAPIServer, rbac_authorizer
from tests.support.gateway import (
    ADMIN,
    CLI,
    SA_TOKEN,
    Gateway,
    free_port,
    gateway_ini,
    register_cluster,
    served_gateway,
)

OPEN = "BCS-K8S-ANON1"
CLOSED = "BCS-K8S-ANON2"
PODS = f"/tunnels/clusters/{OPEN}/api/v1/namespaces/default/pods"
CLOSED_PODS = f"/tunnels/clusters/{CLOSED}/api/v1/namespaces/default/pods"
SECRETS = f"/tunnels/clusters/{OPEN}/api/v1/namespaces/default/secrets"
MESOS = "/bcsapi/v4/scheduler/mesos/namespaces/default/applications"
#: The management API's reads, each listed so that anonymous reaches it: what it answers is the
#: endpoint's own rule for a user holding only view.
READS = {f"/rest/clusters/{OPEN}": 200, f"/rest/clusters/{OPEN}/client_credentials": 200,
         f"/rest/clusters/{OPEN}/kubeconfig": 200, "/rest/sessions": 200,
         f"/rest/clusters/{OPEN}/credentials": 403, f"/rest/clusters/{OPEN}/register_tokens": 403,
         f"/rest/clusters/{OPEN}/permissions": 403, f"/rest/clusters/{OPEN}/group_permissions": 403,
         "/rest/users/": 403, "/rest/users/admin": 403, "/rest/users/0/tokens": 403}
CONDITIONS = [PODS, CLOSED_PODS, SECRETS, "/rest/whoami", "/rest/clusters", "/rest/clusters/bcs",
              f"/rest/clusters/{OPEN}/group_permissions/system:unauthenticated", MESOS, *READS]
#: Paths the enabled gateway answers 401 without credentials (not listed, or never anonymous).
REFUSED = [("GET", f"/tunnels/clusters/{OPEN}/api/v1/namespaces"), ("GET", f"/tunnels/clusters/{OPEN}/version"),
           ("GET", PODS + "/"), ("GET", "/rest/users"), ("POST", "/rest/clusters/bcs"),
           ("PUT", f"/rest/clusters/{OPEN}/group_permissions/system:unauthenticated"), ("POST", "/rest/users/"),
           ("DELETE", f"/rest/clusters/{OPEN}"), ("POST", f"/rest/clusters/{OPEN}/register_tokens"),
           ("GET", MESOS)]


@dataclass
class World:
    gw: Gateway
    off: Gateway
    api: FakeAPIServer


def _config(path: Path, anonymous: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AuthenticationConfiguration",
                                "anonymous": anonymous}))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("anonymous")
    on = _config(tmp / "on.json", {"enabled": True, "conditions": [{"path": p} for p in CONDITIONS]})
    off = _config(tmp / "off.json", {"enabled": False})
    with FakeAPIServer(token=SA_TOKEN) as api, \
            served_gateway(tmp / "on", args=["--config", str(gateway_ini(
                tmp / "on.ini", tmp / "on", rbac="true", authentication_config=str(on)))]) as gw, \
            served_gateway(tmp / "off", args=["--config", str(gateway_ini(
                tmp / "off.ini", tmp / "off", rbac="true", authentication_config=str(off)))]) as gw_off:
        api.authorize(rbac_authorizer(api))
        api.create("roles", {"metadata": {"name": "pod-reader", "namespace": "default"},
                             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
        api.create("rolebindings", {
            "metadata": {"name": "anonymous-pod-reader", "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "Group", "name": "system:unauthenticated"}]})
        for each in (gw, gw_off):
            register_cluster(each, OPEN, server_url=api.url, ca_pem=api.ca_pem)
            register_cluster(each, CLOSED, server_url=api.url, ca_pem=api.ca_pem)
            each.json("PUT", f"/rest/clusters/{OPEN}/group_permissions/system:unauthenticated",
                      body={"permission": "view"})
        yield World(gw, gw_off, api)


def _upstream(world: World, path: str) -> list[Any]:
    return [r for r in world.api.requests.snapshot() if r.path == path]


def test_anonymous_off_is_401_everywhere(world: World) -> None:
    before = len(world.api.requests.snapshot())
    for method, path in [("GET", PODS), ("GET", CLOSED_PODS), ("GET", "/rest/whoami"), ("GET", "/rest/clusters"),
                         *REFUSED]:
        status, raw = world.off.call(method, path, token="", body=b"{}" if method != "GET" else None)
        assert status == 401, (method, path, raw)
    assert len(world.api.requests.snapshot()) == before  # nothing reached the cluster


def test_anonymous_on_reaches_only_the_condition_paths(world: World) -> None:
    status, raw = world.gw.call("GET", PODS, token="")
    assert status == 200, raw
    for method, path in REFUSED:
        status, raw = world.gw.call(method, path, token="", body=b"{}" if method != "GET" else None)
        assert status == 401, (method, path, raw)
        assert json.loads(raw)["message"] == "missing bearer token" or b"Unauthorized" in raw, raw


def test_anonymous_is_impersonated_as_system_anonymous_and_the_clusters_rbac_decides(world: World) -> None:
    status, raw = world.gw.call("GET", PODS, token="")
    assert status == 200, raw
    seen = _upstream(world, "/api/v1/namespaces/default/pods")[-1]
    assert seen.headers.get("Impersonate-User") == "system:anonymous"
    # Never system:authenticated: every "any signed-in user" binding would apply to anonymous.
    assert seen.headers.getlist("Impersonate-Group") == ["system:unauthenticated"]
    assert seen.headers.get("Authorization") == f"Bearer {SA_TOKEN}"
    # The cluster's RBAC gives system:unauthenticated get/list on pods only: a write and a
    # secret on condition paths are the cluster's 403, not the gateway's decision.
    status, raw = world.gw.call("POST", PODS, token="", body={"apiVersion": "v1", "kind": "Pod",
                                                               "metadata": {"name": "anon"}})
    assert status == 403, raw
    assert b'User \\"system:anonymous\\" cannot create resource \\"pods\\"' in raw, raw
    status, raw = world.gw.call("GET", SECRETS, token="")
    assert status == 403, raw


def test_anonymous_holds_only_what_system_unauthenticated_was_granted(world: World) -> None:
    before = len(world.api.requests.snapshot())
    status, raw = world.gw.call("GET", CLOSED_PODS, token="")  # a condition path of a cluster not granted
    assert status == 404, raw
    assert len(world.api.requests.snapshot()) == before
    status, raw = world.gw.call("GET", "/rest/clusters", token="")
    assert status == 200, raw
    assert [c["id"] for c in json.loads(raw)] == [OPEN]


def test_anonymous_can_never_write_the_management_api_nor_be_a_superuser(world: World) -> None:
    status, raw = world.gw.call("GET", "/rest/whoami", token="")
    assert status == 200, raw
    me = json.loads(raw)
    assert (me["user_name"], me["groups"], me["is_superuser"], me["authenticated_by"]) == \
        ("system:anonymous", ["system:unauthenticated"], False, "anonymous")
    # Listed in the conditions and still refused: no management write is ever anonymous.
    status, raw = world.gw.call("POST", "/rest/clusters/bcs", token="",
                                body={"id": "BCS-K8S-ANON9", "project_id": "p", "cluster_type": "k8s"})
    assert status == 401, raw
    status, raw = world.gw.call("PUT", f"/rest/clusters/{OPEN}/group_permissions/system:unauthenticated",
                                token="", body={"permission": "edit"})
    assert status == 401, raw
    status, raw = world.gw.call("POST", "/rest/users/", token="", body={"user_name": "anon"})
    assert status == 401, raw
    assert world.gw.call("GET", "/rest/clusters/BCS-K8S-ANON9")[0] == 404
    grants = world.gw.json("GET", f"/rest/clusters/{OPEN}/group_permissions")
    assert [(g["group"], g["permission"]) for g in grants] == [("system:unauthenticated", "view")]


def test_anonymous_management_reads_are_those_of_a_view_holder_with_no_secret(world: World) -> None:
    answers = {path: world.gw.call("GET", path, token="") for path in READS}
    assert {path: status for path, (status, _) in answers.items()} == READS, answers
    credentials = json.loads(answers[f"/rest/clusters/{OPEN}/client_credentials"][1])
    assert credentials["user_token"] == ""  # its own token, which it has none of
    assert b"token: ''" in answers[f"/rest/clusters/{OPEN}/kubeconfig"][1]
    assert json.loads(answers["/rest/sessions"][1]) == {"sessions": []}
    assert SA_TOKEN.encode() not in b"".join(raw for _, raw in answers.values())


def test_system_unauthenticated_holds_view_only_granted_by_a_superuser(world: World) -> None:
    grant = f"/rest/clusters/{CLOSED}/group_permissions/system:unauthenticated"
    status, raw = world.gw.call("PUT", grant, body={"permission": "edit"})
    assert status == 400, raw
    editor = world.gw.user("anon-editor")
    world.gw.json("PUT", f"/rest/clusters/{CLOSED}/permissions/anon-editor", body={"permission": "edit"})
    status, raw = world.gw.call("PUT", grant, token=editor, body={"permission": "view"})
    assert status == 403, raw  # a cluster's editor cannot open it to the world; a superuser can
    assert world.gw.call("GET", CLOSED_PODS, token="")[0] == 404


def test_a_bad_token_on_a_condition_path_is_401_not_anonymous(world: World) -> None:
    for header in ("Bearer " + "x" * 43, "Basic YWRtaW46YWRtaW4=", "Bearer"):
        status, raw = world.gw.call("GET", PODS, token="", headers={"Authorization": header})
        assert status == 401, (header, raw)


@pytest.mark.parametrize("header, value", [("Impersonate-User", "admin"), ("Impersonate-Group", "system:masters"),
                                           ("Impersonate-Uid", "1")])
def test_an_anonymous_clients_impersonation_is_refused(world: World, header: str, value: str) -> None:
    status, raw = world.gw.call("GET", PODS, token="", headers={header: value})
    assert status == 403, raw
    assert json.loads(raw)["message"] == f"the {header} header is not allowed through the gateway"
    assert not [r for r in world.api.requests.snapshot() if value in r.headers.getlist(header)]


def test_conflicting_settings_are_refused_at_start(tmp_path: Path) -> None:
    anonymous = _config(tmp_path / "a.json", {"enabled": True})
    for options, expected in (
        ({"rbac": "false"}, "anonymous cannot be enabled while rbac is off"),
        ({"rbac": "true", "superuser_groups": "ops system:unauthenticated"},
         "'system:unauthenticated' is what a request without credentials is"),
    ):
        ini = gateway_ini(tmp_path / "gw.ini", tmp_path / "data", authentication_config=str(anonymous), **options)
        done = subprocess.run(
            [CLI, "serve", "--config", str(ini), "--bind", f"127.0.0.1:{free_port()}"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "BCS_ADMIN_TOKEN": ADMIN})
        assert done.returncode != 0, (options, done.stdout, done.stderr)
        assert expected in done.stderr, (options, done.stderr)
