"""Grants become labelled bindings on every cluster; only owned objects are ever changed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bcs_middleware.rbac.model import MANAGED_BY_LABEL, OWNED_SELECTOR
from bcs_middleware.store.sql import SQLStore
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.polling import wait_for
from tests.support.servers import free_port

from .conftest import (
    SA_TOKEN,
    PermissionFile,
    add_cluster,
    binding_names,
    make_service,
    run_once,
    writes,
)

CRB = "ClusterRoleBinding"
RB = "RoleBinding"


def test_grants_appear_as_labelled_bindings_on_every_cluster(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
) -> None:
    a, b = clusters(), clusters()
    add_cluster(store, "BCS-K8S-A", url=a.url, ca_pem=a.ca_pem)
    add_cluster(store, "BCS-K8S-B", url=b.url, ca_pem=b.ca_pem)
    permissions.write([
        {"user": "alice", "cluster": "BCS-K8S-A", "namespace": "default", "role": "view"},
        {"group": "ops", "cluster": "*", "role": "edit"},
        {"user": "bob@example.com", "cluster": "*", "role": "system:aggregate-to-view"},
    ])
    service = make_service(store, permissions.path)
    try:
        assert sorted(run_once(service)) == ["BCS-K8S-A", "BCS-K8S-B"]
    finally:
        service.stop()
    owned_b = {(CRB, "", "bcs:group:ops:edit")}
    assert binding_names(a) == owned_b | {(RB, "default", "bcs:alice:view")} | {
        n for n in binding_names(a) if n[2].startswith("bcs:bob@example.com:system-aggregate-to-view-")}
    assert len(binding_names(a)) == 3 and len(binding_names(b)) == 2
    alice = a.store.get("rolebindings", "default", "bcs:alice:view")
    assert alice["metadata"]["labels"][MANAGED_BY_LABEL] == "bcs-middleware"
    assert alice["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}
    assert alice["subjects"] == [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]
    ops = b.store.get("clusterrolebindings", None, "bcs:group:ops:edit")
    assert ops["subjects"] == [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "ops"}]
    # Every pass listed what it owns by the label, as the cluster's service account.
    listed = [r for r in a.requests.snapshot() if r.method == "GET" and "bindings" in r.path]
    assert listed and all(r.params.get("labelSelector") == OWNED_SELECTOR for r in listed)
    assert all(r.headers.get("Authorization") == f"Bearer {a.token}" for r in listed)
    outcome = service.status()["clusters"]["BCS-K8S-A"]
    assert (outcome["result"], outcome["created"], outcome["failed"]) == ("ok", 3, 0)


def test_revoked_grant_removes_its_binding_and_foreign_bindings_are_untouched(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    foreign = {"metadata": {"name": "bcs:carol:view"},  # our naming, but not our label
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
               "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "carol"}]}
    api.create("clusterrolebindings", foreign)
    api.create("rolebindings", {"metadata": {"name": "hand-made", "namespace": "default",
                                             "labels": {"team": "x"}},
                                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                            "name": "edit"},
                                "subjects": [{"kind": "User", "name": "dave"}]})
    before_foreign = {n: api.store.get("clusterrolebindings", None, "bcs:carol:view")["metadata"]["resourceVersion"]
                      for n in ("crb",)}
    permissions.write([{"user": "alice", "cluster": "*", "role": "view"},
                       {"user": "alice", "cluster": "*", "namespace": "default", "role": "edit"},
                       {"user": "carol", "cluster": "*", "role": "view"}])
    service = make_service(store, permissions.path)
    try:
        run_once(service)
        assert {(CRB, "", "bcs:alice:view"), (RB, "default", "bcs:alice:edit")} <= binding_names(api)
        outcome = service.status()["clusters"]["BCS-K8S-A"]
        # carol's name is taken by an object we do not own: reported, left alone.
        assert outcome["failed"] == 1 and "not managed by bcs-middleware" in outcome["errors"][0]

        # Someone edits an owned binding: the next pass puts it back.
        edited = api.store.get("clusterrolebindings", None, "bcs:alice:view")
        edited["subjects"] = [{"kind": "User", "name": "mallory"}]
        api.store.replace("clusterrolebindings", edited)

        permissions.write([{"user": "alice", "cluster": "*", "role": "view"}])
        run_once(service)
    finally:
        service.stop()
    names = binding_names(api)
    assert (RB, "default", "bcs:alice:edit") not in names
    assert api.store.get("clusterrolebindings", None, "bcs:alice:view")["subjects"][0]["name"] == "alice"
    assert (RB, "default", "hand-made") in names
    carol = api.store.get("clusterrolebindings", None, "bcs:carol:view")
    assert carol["metadata"]["resourceVersion"] == before_foreign["crb"] and "labels" not in carol["metadata"]
    outcome = service.status()["clusters"]["BCS-K8S-A"]
    assert (outcome["deleted"], outcome["updated"], outcome["failed"]) == (1, 1, 0)
    deletes = [r for r in api.requests.snapshot() if r.method == "DELETE"]
    assert [r.path.rsplit("/", 1)[1] for r in deletes] == ["bcs:alice:edit"]


def test_an_unchanged_run_writes_nothing(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    permissions.write([{"user": "alice", "cluster": "*", "role": "view"}])
    service = make_service(store, permissions.path, interval=0.0)
    try:
        run_once(service)
        count = writes(api)
        run_once(service)  # periodic pass (interval 0): compares, changes nothing
    finally:
        service.stop()
    assert writes(api) == count
    assert service.status()["clusters"]["BCS-K8S-A"]["unchanged"] == 1


def test_unreachable_cluster_does_not_block_others_and_is_retried(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
) -> None:
    healthy = clusters()
    # Listening but not serving yet: TLS handshakes hang until the connect timeout.
    silent = FakeAPIServer(token=healthy.token)
    dead_port = free_port()
    add_cluster(store, "BCS-K8S-OK", url=healthy.url, ca_pem=healthy.ca_pem)
    add_cluster(store, "BCS-K8S-SILENT", url=silent.url, ca_pem=silent.ca_pem)
    add_cluster(store, "BCS-K8S-DEAD", url=f"https://127.0.0.1:{dead_port}", ca_pem=healthy.ca_pem)
    permissions.write([{"user": "alice", "cluster": "*", "role": "view"}])
    service = make_service(store, permissions.path, max_workers=3)
    try:
        service.start()
        # The healthy cluster is done while the silent one still waits for its handshake.
        wait_for(lambda: "BCS-K8S-OK" in service.status()["clusters"], timeout=5)
        assert "BCS-K8S-SILENT" not in service.status()["clusters"]
        assert (CRB, "", "bcs:alice:view") in binding_names(healthy)

        dead = wait_for(lambda: service.status()["clusters"].get("BCS-K8S-DEAD"), timeout=15)
        assert dead["result"] == "error" and dead["retry_in"] is not None
        assert "refused" in dead["error"].lower() or "127.0.0.1" in dead["error"]
        assert SA_TOKEN not in repr(dead)
        wait_for(lambda: service.status()["clusters"].get("BCS-K8S-SILENT"), timeout=15)
        assert service.status()["clusters"]["BCS-K8S-SILENT"]["result"] == "error"

        silent.start()  # the cluster comes back: a retry (with backoff) succeeds
        wait_for(lambda: service.status()["clusters"]["BCS-K8S-SILENT"]["result"] == "ok", timeout=20)
        assert (CRB, "", "bcs:alice:view") in binding_names(silent)
        first = service.status()["clusters"]["BCS-K8S-DEAD"]["finished_at"]
        wait_for(lambda: service.status()["clusters"]["BCS-K8S-DEAD"]["finished_at"] != first, timeout=10)
    finally:
        service.stop()
        silent.stop()


@pytest.mark.parametrize("raw, field", [
    pytest.param('{"version": 1, "grants": [{"user": "bob", "cluster": "*"}]}', "grants.0", id="missing-role"),
    pytest.param('{"version": 1, "grants": [{"user": "bob", "group": "g", "cluster": "*", "role": "view"}]}',
                 "exactly one of", id="user-and-group"),
    pytest.param('{"version": 2, "grants": []}', "version", id="wrong-version"),
    pytest.param('{"version": 1, "grants": [{"user": "bob", "cluster": "*", "role": "view", '
                 '"namespace": "Not_A_Namespace"}]}', "grants.0.namespace", id="bad-namespace"),
    pytest.param("version: 1\ngrants: [unclosed", "line", id="not-yaml"),
])
def test_bad_permission_data_is_rejected_and_changes_nothing(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
    caplog: pytest.LogCaptureFixture, raw: str, field: str,
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    permissions.write([{"user": "alice", "cluster": "*", "role": "view"}])
    service = make_service(store, permissions.path, interval=300.0)
    try:
        run_once(service)
        before, count = binding_names(api), writes(api)
        permissions.write(raw=raw)
        with caplog.at_level(logging.ERROR, logger="bcs_middleware.rbac"):
            assert run_once(service) == []
            run_once(service)  # the same bad file is reported once, not at every tick
    finally:
        service.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert field in errors[0] and "rejected" in errors[0] and "keeping the previous 1 grants" in errors[0]
    assert binding_names(api) == before and writes(api) == count
    assert service.status()["source"]["error"] and service.status()["source"]["grants"] == 1


def test_bad_data_at_start_applies_nothing(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    api.create("clusterrolebindings", {
        "metadata": {"name": "bcs:old:view", "labels": {MANAGED_BY_LABEL: "bcs-middleware"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "name": "old"}]})
    permissions.write(raw='{"version": 1, "grants": "all"}')
    service = make_service(store, permissions.path)
    try:
        with caplog.at_level(logging.ERROR, logger="bcs_middleware.rbac"):
            assert run_once(service) == []
    finally:
        service.stop()
    assert "no grants applied until valid data arrives" in caplog.text
    assert (CRB, "", "bcs:old:view") in binding_names(api) and len(api.requests) == 0


def test_missing_file_is_reported_and_a_later_file_is_picked_up(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], tmp_path: Path,
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    path = tmp_path / "later.yaml"
    service = make_service(store, path)
    try:
        assert run_once(service) == []
        assert "No such file" in service.status()["source"]["error"]
        path.write_text("version: 1\ngrants:\n- {user: alice, cluster: '*', role: view}\n")
        assert run_once(service) == ["BCS-K8S-A"]
    finally:
        service.stop()
    assert (CRB, "", "bcs:alice:view") in binding_names(api)


def test_a_name_taken_by_a_foreign_binding_waits_for_its_backoff(
    store: SQLStore, clusters: Callable[[], FakeAPIServer], permissions: PermissionFile,
) -> None:
    api = clusters()
    add_cluster(store, "BCS-K8S-A", url=api.url, ca_pem=api.ca_pem)
    api.create("clusterrolebindings", {
        "metadata": {"name": "bcs:carol:view"},  # our naming, not our label
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "carol"}]})
    permissions.write([{"user": "carol", "cluster": "*", "role": "view"}])
    # Ticks every 0.1 s; the first retry is due after 2 s (±20 %), the next after 4 s.
    service = make_service(store, permissions.path, tick=0.1, lease_ttl=5.0, backoff_base=2.0,
                           backoff_max=60.0)

    def posts() -> int:
        return sum(1 for r in api.requests.snapshot() if r.method == "POST" and "bindings" in r.path)

    try:
        service.start()
        wait_for(lambda: service.status()["clusters"].get("BCS-K8S-A"), timeout=10)
        outcome = service.status()["clusters"]["BCS-K8S-A"]
        assert outcome["failed"] == 1 and outcome["retry_in"] >= 1.5
        time.sleep(3.5)  # 35 ticks: at most the one retry after ~2 s
    finally:
        service.stop()
    assert 1 <= posts() <= 2, posts()
