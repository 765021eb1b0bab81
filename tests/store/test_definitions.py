"""Admission definitions in the SQL store: the DefinitionStore contract, across processes."""

from __future__ import annotations

import pytest
import trustme
from cryptography.fernet import Fernet

from bcs_middleware.admission.definitions import parse_bcs_definition, parse_k8s_configuration
from bcs_middleware.core.errors import Conflict
from bcs_middleware.store.definitions import SQLDefinitionStore
from bcs_middleware.store.sql import open_store
from tests.admission.conftest import bcs_definition, bcs_webhook, k8s_configuration, k8s_webhook
from tests.support.polling import wait_until


@pytest.fixture
def stores(database_url):  # type: ignore[no-untyped-def]
    """Two independent store objects on one database: two gateway processes."""
    key = Fernet.generate_key().decode()
    first = open_store(database_url, secret_key=key)
    second = open_store(database_url, secret_key=key, migrate=False)
    yield SQLDefinitionStore(first, refresh=0.2), SQLDefinitionStore(second, refresh=0.2)
    first.db.dispose()
    second.db.dispose()


CA = trustme.CA()


def _bcs(name: str, operation: str = "Create", kind: str = "Application"):  # type: ignore[no-untyped-def]
    return parse_bcs_definition(
        bcs_definition(name, [bcs_webhook("sidecar.bcs-system", CA)], operation=operation, kind=kind)
    )


def test_bcs_definitions_round_trip_and_reach_the_other_process(stores) -> None:  # type: ignore[no-untyped-def]
    one, two = stores
    assert one.put_bcs(_bcs("inject")) is True
    assert one.put_bcs(_bcs("inject")) is False  # replace by name
    assert [d.name for d in one.list_bcs()] == ["inject"]
    assert wait_until(lambda: [d.name for d in two.list_bcs()] == ["inject"], 5)
    definition = two.get_bcs("inject")
    assert definition is not None and definition.kind == "application" and definition.webhooks[0].name
    assert one.delete_bcs("inject") is True and one.delete_bcs("inject") is False
    assert wait_until(lambda: not two.list_bcs(), 5)


def test_one_bcs_definition_per_operation_and_kind(stores) -> None:  # type: ignore[no-untyped-def]
    one, two = stores
    one.put_bcs(_bcs("first", "Create", "Deployment"))
    with pytest.raises(Conflict):
        two.put_bcs(_bcs("second", "Create", "deployment"))
    two.put_bcs(_bcs("second", "Update", "Deployment"))
    assert [d.name for d in one.list_bcs()] == ["first", "second"]


def test_kubernetes_configurations_are_per_cluster(stores) -> None:  # type: ignore[no-untyped-def]
    one, _ = stores
    webhook = k8s_webhook("inject.example.com", "svc.bcs-system", CA)
    config = parse_k8s_configuration(k8s_configuration("sidecar", [webhook]))
    assert one.put_k8s("c1", config) is True
    assert one.put_k8s("c1", config) is False
    assert [c.name for c in one.list_k8s("c1")] == ["sidecar"]
    assert one.list_k8s("c2") == []
    assert one.get_k8s("c1", config.kind, "sidecar") is not None
    assert one.delete_k8s("c1", config.kind, "sidecar") is True
    assert one.list_k8s("c1") == []


def test_version_moves_on_every_change(stores) -> None:  # type: ignore[no-untyped-def]
    one, _ = stores
    before = one.version()
    one.put_bcs(_bcs("v"))
    assert one.version() > before
