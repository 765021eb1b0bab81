"""The data format and the bindings it implies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bcs_middleware.core.errors import ConfigError
from bcs_middleware.rbac.model import Grant, PermissionsError, binding_name, desired_bindings, load_permissions
from bcs_middleware.rbac.service import build_service
from bcs_middleware.rbac.sources import FileSource
from bcs_middleware.store.sql import SQLStore


@pytest.mark.parametrize("grant, name", [
    pytest.param(Grant("User", "alice", "*", "view"), "bcs:alice:view", id="user"),
    pytest.param(Grant("Group", "ops", "*", "edit"), "bcs:group:ops:edit", id="group"),
    pytest.param(Grant("User", "group", "*", "ops"), "bcs:group:ops", id="user-named-group"),
    pytest.param(Grant("User", "Alice", "*", "view"), None, id="upper-case-hashed"),
    pytest.param(Grant("User", "a:b", "*", "view"), None, id="colon-hashed"),
])
def test_binding_names_are_deterministic_and_never_collide(grant: Grant, name: str | None) -> None:
    got = binding_name(grant)
    assert got == binding_name(grant)
    if name is not None:
        assert got == name
    else:
        assert got.startswith("bcs:") and got.count(":") == 2 and len(got) < 253


def test_distinct_subjects_get_distinct_names() -> None:
    grants = [Grant("User", "Alice", "*", "view"), Grant("User", "alice", "*", "view"),
              Grant("User", "a:b", "*", "view"), Grant("User", "a-b", "*", "view"),
              Grant("Group", "ops", "*", "view"), Grant("User", "ops", "*", "view")]
    assert len({binding_name(g) for g in grants}) == len(grants)


def test_a_group_may_be_an_identity_providers_group_path() -> None:
    # Keycloak's group mapper sends full paths ("/team/sre") by default; Kubernetes group names
    # are free-form, so the subject keeps the path and only the binding name is sanitised.
    permissions = load_permissions(
        b'{"version": 1, "grants": [{"group": "/team/sre", "cluster": "C1", "role": "view"}]}')
    (binding,) = desired_bindings(permissions, "C1").values()
    assert binding.body["subjects"] == [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                                         "name": "/team/sre"}]
    assert binding.name.startswith("bcs:group:team-sre-") and "/" not in binding.name
    for bad in (b'"/team sre"', b'"a%2Fb"', b'""'):
        with pytest.raises(PermissionsError, match="group"):
            load_permissions(b'{"version": 1, "grants": [{"group": ' + bad + b', "cluster": "C1", "role": "view"}]}')
    with pytest.raises(PermissionsError, match="user"):
        load_permissions(b'{"version": 1, "grants": [{"user": "a/b", "cluster": "C1", "role": "view"}]}')


def test_yaml_and_json_with_the_same_grants_have_the_same_digest() -> None:
    as_json = load_permissions(b'{"version": 1, "grants": [{"user": "a", "cluster": "*", "role": "view"},'
                               b' {"group": "g", "cluster": "C1", "namespace": "ns", "role": "edit"}]}')
    as_yaml = load_permissions(b"version: 1\ngrants:\n- {group: g, cluster: C1, namespace: ns, role: edit}\n"
                               b"- {user: a, cluster: '*', role: view}\n- {user: a, cluster: '*', role: view}\n")
    assert as_json.digest == as_yaml.digest and len(as_yaml.grants) == 2


def test_desired_bindings_per_cluster() -> None:
    permissions = load_permissions(b'{"version": 1, "grants": ['
                                   b'{"user": "a", "cluster": "C1", "namespace": "ns", "role": "view"},'
                                   b'{"user": "a", "cluster": "C2", "role": "view"}]}')
    c1 = desired_bindings(permissions, "C1")
    assert list(c1) == [("RoleBinding", "ns", "bcs:a:view")]
    assert c1[("RoleBinding", "ns", "bcs:a:view")].body["metadata"]["namespace"] == "ns"
    assert list(desired_bindings(permissions, "C2")) == [("ClusterRoleBinding", "", "bcs:a:view")]
    assert desired_bindings(permissions, "C3") == {}


@pytest.mark.parametrize("kw, message", [
    pytest.param({}, "exactly one of", id="no-source"),
    pytest.param({"source_file": "/a", "source_url": "https://x/"}, "exactly one of", id="both"),
    pytest.param({"source_url": "http://x/", "source_token_file": "/t"}, "plain http", id="token-over-http"),
])
def test_build_service_refuses_bad_configuration(store: SQLStore, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_service(store, **kw)


def test_build_service_from_file(store: SQLStore, tmp_path: Path) -> None:
    service = build_service(store, source_file=str(tmp_path / "rbac.yaml"), interval=60)
    assert isinstance(service.source, FileSource) and service.reconciler.interval == 60
