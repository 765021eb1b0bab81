"""The management API served on its own (paste app ``management_api``): the gateway's ini keys and
typed sections, and the same settings the gateway's own management API gets from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
from cryptography.fernet import Fernet

from bcs_middleware.clusters.permissions import ClusterCreators
from bcs_middleware.compose.ini import MANAGEMENT_KEYS, gateway_config
from bcs_middleware.compose.management import api_settings, app_factory
from bcs_middleware.compose.resources import read_certificates
from bcs_middleware.core.errors import ConfigError
from bcs_middleware.core.quotas import Quotas


def test_its_keys_are_the_ones_it_always_took() -> None:
    assert set(MANAGEMENT_KEYS) == {
        "database_url", "data_dir", "secret_key", "gateway_ca_file", "gateway_cert_file", "public_url", "max_body",
        "cluster_creators", *(f"quota_{name}" for name in Quotas.names())}


def test_the_factory_gives_the_settings_the_gateway_gives_for_the_same_keys(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file, cert_file = tmp_path / "ca.crt", tmp_path / "server.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    ca.issue_cert("gateway.example").cert_chain_pems[0].write_to_path(str(cert_file))
    local = {"gateway_ca_file": str(ca_file), "gateway_cert_file": str(cert_file),
             "public_url": "https://gateway.example:8443", "max_body": "2MiB", "cluster_creators": "group:ops",
             "quota_tokens_per_user": "4", "quota_clusters_per_user": "unlimited",
             "secret_key": Fernet.generate_key().decode()}
    api = app_factory({}, data_dir=str(tmp_path / "api"), **local)
    try:
        settings = api.settings
        assert settings.gateway_ca_pem == ca_file.read_text()
        assert settings.gateway_cert_pem == cert_file.read_bytes()
        assert (settings.public_url, settings.max_body) == ("https://gateway.example:8443", 2 * 1024 * 1024)
        assert settings.cluster_creators == ClusterCreators(everyone=False, groups=frozenset({"ops"}))
        assert settings.quotas == Quotas(tokens_per_user=4, clusters_per_user=None)
        gateway = gateway_config("app:main", {"data_dir": str(tmp_path / "gw"), **local})
        assert api_settings(gateway.server, gateway.self_service, read_certificates(gateway.server)) == settings
    finally:
        api.store.db.dispose()


@pytest.mark.parametrize(("local", "message"), [
    pytest.param({"rbac": "false"}, r"^\[app:management_api\] unknown key 'rbac'", id="a-gateway-only-key"),
    pytest.param({"gateway_ca_file": "/nonexistent/ca.crt"},
                 r"^\[app:management_api\] gateway_ca_file: no such file", id="missing-ca-file"),
    pytest.param({"max_body": "lots"}, r"^\[app:management_api\] bad value for 'max_body'", id="bad-size"),
    pytest.param({"quota_tokens_per_user": "-1"}, "cannot be negative", id="negative-quota"),
])
def test_bad_options_are_refused_naming_section_and_key(tmp_path: Path, local: dict[str, str],
                                                        message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        app_factory({}, data_dir=str(tmp_path), **local)


def test_it_needs_a_database() -> None:
    with pytest.raises(ConfigError, match=r"^\[app:management_api\] needs database_url or data_dir"):
        app_factory({}, max_body="1MiB")
