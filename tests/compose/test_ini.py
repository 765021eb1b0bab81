"""The flat ini keys users write, read into the nested typed configuration."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pytest

from bcs_middleware.audit.export.settings import OPTIONS as AUDIT_EXPORT_OPTIONS
from bcs_middleware.compose.config import DriverConfig, GatewayConfig, IniContext, section_types
from bcs_middleware.compose.ini import DRIVER_KEYS, GATEWAY_KEYS, Key, build_config, driver_config, gateway_config
from bcs_middleware.core import converters as conv
from bcs_middleware.core.errors import ConfigError


@pytest.mark.parametrize(("config_type", "keys"), [
    pytest.param(GatewayConfig, GATEWAY_KEYS, id="gateway"),
    pytest.param(DriverConfig, DRIVER_KEYS, id="driver"),
])
def test_every_ini_key_fills_an_attribute_of_its_section(config_type: type[Any], keys: dict[str, Key]) -> None:
    sections = section_types(config_type)
    top = {item.name for item in fields(config_type)}
    for name, key in keys.items():
        if key.section == "":
            assert key.attr in top, name
            continue
        attrs = {item.name for item in fields(sections[key.section])}
        # quota_<name> keys are gathered into one Quotas value by the section; the audit export's
        # keys are read by its own settings (the audit section's from_ini).
        assert key.attr in attrs or (key.section == "self_service" and key.attr.startswith("quota_")) \
            or (key.section == "audit" and key.attr in AUDIT_EXPORT_OPTIONS), name


def test_ini_values_land_in_their_sections(tmp_path: Path) -> None:
    config = gateway_config("app:main", {
        "data_dir": str(tmp_path), "admission_budget": "7s", "webhook_address_map": "a.b = 127.0.0.1",
        "rbac": "false", "upstream_deny": "10.0.0.0/8", "tls_server_name": "kubernetes",
        "static_drivers": "BCS-MESOS-1 = http://10.1.1.1:8080 http://10.1.1.2:8080", "peer_address": "off",
        "audit_log": "-", "token_cache_ttl": "1s"})
    assert config.store.data_dir == tmp_path
    assert config.admission.budget == 7.0 and config.admission.address_map == (("a.b", "127.0.0.1"),)
    assert not config.rbac.enabled and not config.rbac.grants
    assert config.outbound.deny == ("10.0.0.0/8",)
    assert config.clusters.tls_server_name == "kubernetes"
    assert config.discovery.static_drivers == (("BCS-MESOS-1", ("http://10.1.1.1:8080", "http://10.1.1.2:8080")),)
    assert config.agent_tunnel.peer_address is None
    assert config.audit.log == "-" and config.auth.token_cache_ttl == 1.0


def test_the_driver_shares_the_gateways_sections() -> None:
    config = driver_config("app:driver", {
        "cluster_id": "BCS-MESOS-1", "static_schedulers": "http://10.0.0.9:8080", "total_budget": "3s",
        "max_body": "1MiB", "upstream_allow": "10.0.0.0/8", "database_url": "sqlite://"})
    assert config.admission.budget == 3.0 and config.admission.max_body == 1024 * 1024
    assert config.outbound.allow == ("10.0.0.0/8",) and config.store.database_url == "sqlite://"
    assert [e.base_url() for e in config.discovery.static_schedulers] == ["http://10.0.0.9:8080"]
    assert type(config.admission) is type(GatewayConfig().admission)


@pytest.mark.parametrize(("read", "options", "message"), [
    pytest.param(gateway_config, {"data_dir": "/x", "admission_budgt": "1s"},
                 r"\[app:x\] unknown key 'admission_budgt'", id="gateway-unknown-key"),
    pytest.param(gateway_config, {"data_dir": "/x", "admission_budget": "soon"},
                 r"\[app:x\] bad value for 'admission_budget'", id="gateway-bad-value"),
    pytest.param(gateway_config, {"admission": "true"}, r"\[app:x\] needs database_url or data_dir",
                 id="gateway-no-store"),
    pytest.param(gateway_config, {"data_dir": "/x", "gateway_ca_file": "/nowhere/ca.crt"},
                 r"\[app:x\] gateway_ca_file: no such file", id="gateway-missing-file"),
    pytest.param(driver_config, {"cluster_id": "C", "static_schedulers": "http://h:1", "admission": "true"},
                 r"\[app:x\] unknown key 'admission'", id="driver-does-not-take-gateway-keys"),
    pytest.param(driver_config, {"static_schedulers": "http://h:1"}, r"\[app:x\] cluster_id is required",
                 id="driver-no-cluster"),
    pytest.param(driver_config, {"cluster_id": "C", "zookeeper_hosts": "z:2181", "static_schedulers": "http://h:1"},
                 r"\[app:x\] set zookeeper_hosts or static_schedulers, not both", id="driver-two-discoveries"),
    pytest.param(driver_config, {"cluster_id": "C", "static_schedulers": "http://h:1", "console_cert_file": "c"},
                 r"\[app:x\] set console_cert_file and console_key_file together", id="driver-half-a-cert"),
])
def test_bad_options_name_the_section_and_key(read: Any, options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read("app:x", options)


@dataclass(frozen=True)
class LimitsSettings:
    """A section another change adds: a frozen dataclass with defaults, and a from_ini."""

    rate: float = 10.0
    burst: int = 20

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> LimitsSettings:
        if values.get("burst", 20) < values.get("rate", 10.0):
            raise ConfigError(f"[{context.section}] limits_burst must be at least limits_rate")
        return cls(**values)


@dataclass(frozen=True)
class ExtendedConfig(GatewayConfig):
    limits: LimitsSettings = field(default_factory=LimitsSettings)


def test_a_new_section_slots_in_with_one_field_and_its_keys(tmp_path: Path) -> None:
    keys = {**GATEWAY_KEYS, "limits_rate": Key(conv.seconds, "limits", "rate"),
            "limits_burst": Key(conv.positive_int, "limits", "burst")}
    config = build_config(ExtendedConfig, "app:main", {"data_dir": str(tmp_path), "limits_burst": "50",
                                                       "admission": "false"}, keys)
    assert config.limits == LimitsSettings(rate=10.0, burst=50) and not config.admission.enabled
    assert build_config(ExtendedConfig, "app:main", {"data_dir": str(tmp_path)}, keys).limits == LimitsSettings()
    with pytest.raises(ConfigError, match="limits_burst must be at least"):
        build_config(ExtendedConfig, "app:main", {"data_dir": str(tmp_path), "limits_burst": "1"}, keys)
