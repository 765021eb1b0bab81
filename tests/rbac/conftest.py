"""Stores, fake clusters and permission files for the RBAC tests."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from bcs_middleware.rbac.service import RBACService
from bcs_middleware.rbac.sources import FileSource
from bcs_middleware.store.sql import SQLStore, open_store
from tests.support.fake_apiserver import FakeAPIServer

SA_TOKEN = "rbac-test-service-account-token-0123456789"


@pytest.fixture
def secret_key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def store(tmp_path: Path, secret_key: str) -> Iterator[SQLStore]:
    store = open_store(f"sqlite:///{tmp_path / 'bcs.sqlite3'}", secret_key=secret_key)
    yield store
    store.db.dispose()


def add_cluster(store: SQLStore, cluster_id: str, *, url: str, ca_pem: str, token: str = SA_TOKEN) -> None:
    if store.find_cluster(cluster_id) is None:
        store.create_cluster(cluster_id, project_id="p1", cluster_type="k8s")
    store.put_credentials(cluster_id, server_addresses=[url], cacert_pem=ca_pem, user_token=token)


@pytest.fixture
def clusters() -> Iterator[Callable[[], FakeAPIServer]]:
    """Start fake apiservers on demand; all are stopped at the end."""
    started: list[FakeAPIServer] = []

    def make() -> FakeAPIServer:
        api = FakeAPIServer(token=SA_TOKEN).start()
        started.append(api)
        return api

    yield make
    for api in started:
        api.stop()


class PermissionFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, grants: list[dict[str, Any]] | None = None, *, raw: str | None = None) -> None:
        text = raw if raw is not None else json.dumps({"version": 1, "grants": grants or []})
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)  # atomic, like a ConfigMap update


@pytest.fixture
def permissions(tmp_path: Path) -> PermissionFile:
    return PermissionFile(tmp_path / "rbac.json")


def make_service(store: SQLStore, path: Path, **kw: Any) -> RBACService:
    options: dict[str, Any] = {"interval": 300.0, "tick": 0.2, "lease_ttl": 5.0, "backoff_base": 0.2,
                               "backoff_max": 1.0, "max_workers": 4, "connect_timeout": 1.0,
                               "read_timeout": 5.0}
    options.update(kw)
    return RBACService(store, FileSource(path), **options)


def run_once(service: RBACService, timeout: float = 15.0) -> list[str]:
    """One tick and every pass it started, finished."""
    submitted = service.tick()
    assert service.wait_idle(timeout)
    return submitted


def binding_names(api: FakeAPIServer) -> set[tuple[str, str, str]]:
    return {(b["kind"], b["metadata"].get("namespace", ""), b["metadata"]["name"]) for b in api.bindings}


def writes(api: FakeAPIServer) -> int:
    return sum(1 for r in api.requests.snapshot() if r.method in ("POST", "PUT", "PATCH", "DELETE"))
