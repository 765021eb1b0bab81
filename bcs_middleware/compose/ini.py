"""Ini strings → the typed configuration (:mod:`bcs_middleware.compose.config`).

The ini keys users write are flat and stay as they are (README, ``examples/*.ini``,
``bcs-middleware serve``'s options): each key table below says, for every key, its converter
and the section and attribute it fills. A key no table names is refused, naming the ini
section and the key (:func:`bcs_middleware.core.converters.convert_options`).

A new section adds its keys to the table (``"oidc_issuer": Key(conv.url, "oidc", "issuer")``)
and a field to the config; :func:`build_config` does the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..audit.export.settings import OPTIONS as AUDIT_EXPORT_OPTIONS
from ..clusters.permissions import ClusterCreators
from ..core import converters as conv
from ..core.errors import ConfigError
from ..core.quotas import Quotas, limit_value
from ..discovery.base import Endpoint
from ..layers.client_cert import parse_subject_map
from ..limits import settings as limit_settings
from ..recording import settings as recording_options
from .config import DriverConfig, GatewayConfig, IniContext, ManagementConfig, section_types

C = TypeVar("C")


@dataclass(frozen=True)
class Key:
    """One ini key: its converter, and the config ``section`` and ``attr`` its value fills
    (``section`` ``""``: a field of the config itself)."""

    convert: conv.Converter
    section: str
    attr: str


def _peer_address(value: str) -> str | None:
    return None if value.strip().lower() in ("off", "none") else value.strip()


GATEWAY_KEYS: dict[str, Key] = {
    "database_url": Key(conv.text, "store", "database_url"),
    "data_dir": Key(conv.text, "store", "data_dir"),
    "secret_key": Key(conv.text, "store", "secret_key"),
    "bootstrap_users": Key(conv.mapping, "auth", "bootstrap_users"),
    "token_cache_ttl": Key(conv.seconds, "auth", "token_cache_ttl"),
    "public_paths": Key(conv.aslist, "auth", "public_paths"),
    "client_cert_subjects": Key(parse_subject_map, "auth", "client_cert_subjects"),
    "metrics_token": Key(conv.text, "auth", "metrics_token"),
    "gateway_ca_file": Key(conv.text, "server", "gateway_ca_file"),
    "gateway_cert_file": Key(conv.text, "server", "gateway_cert_file"),
    "public_url": Key(conv.url, "server", "public_url"),
    "max_body": Key(conv.size, "server", "max_body"),
    "trusted_proxies": Key(conv.aslist, "server", "trusted_proxies"),
    "access_log": Key(conv.asbool, "server", "access_log"),
    "connect_timeout": Key(conv.seconds, "outbound", "connect_timeout"),
    "read_timeout": Key(conv.seconds, "outbound", "read_timeout"),
    "stream_idle_timeout": Key(conv.seconds, "outbound", "stream_idle_timeout"),
    "upstream_allow": Key(conv.networks, "outbound", "allow"),
    "upstream_deny": Key(conv.networks, "outbound", "deny"),
    "tls_server_name": Key(conv.text, "clusters", "tls_server_name"),
    "upstream_verify": Key(conv.asbool, "clusters", "verify"),
    "cluster_cache_ttl": Key(conv.seconds, "clusters", "cache_ttl"),
    "upgrade_idle_timeout": Key(conv.seconds, "clusters", "upgrade_idle_timeout"),
    "upgrade_max_duration": Key(conv.seconds, "clusters", "upgrade_max_duration"),
    "admission": Key(conv.asbool, "admission", "enabled"),
    "admission_max_body": Key(conv.size, "admission", "max_body"),
    "admission_budget": Key(conv.seconds, "admission", "budget"),
    "admission_buffer_memory": Key(conv.size, "admission", "buffer_memory"),
    "admission_buffer_wait": Key(conv.seconds, "admission", "buffer_wait"),
    "admission_breaker_threshold": Key(conv.positive_int, "admission", "breaker_threshold"),
    "admission_breaker_cooldown": Key(conv.seconds, "admission", "breaker_cooldown"),
    "admission_refresh": Key(conv.seconds, "admission", "refresh"),
    "webhook_address_map": Key(conv.mapping, "admission", "address_map"),
    "rbac": Key(conv.asbool, "rbac", "enabled"),
    "rbac_source_file": Key(conv.text, "rbac", "source_file"),
    "rbac_source_url": Key(conv.url, "rbac", "source_url"),
    "rbac_source_token_file": Key(conv.text, "rbac", "source_token_file"),
    "rbac_source_ca_file": Key(conv.text, "rbac", "source_ca_file"),
    "rbac_interval": Key(conv.seconds, "rbac", "interval"),
    "zookeeper_hosts": Key(conv.text, "discovery", "zookeeper_hosts"),
    "zookeeper_root": Key(conv.text, "discovery", "zookeeper_root"),
    "static_drivers": Key(conv.mapping, "discovery", "static_drivers"),
    "driver_ca_file": Key(conv.text, "mesos", "driver_ca_file"),
    "driver_verify": Key(conv.asbool, "mesos", "driver_verify"),
    "prefer_external": Key(conv.asbool, "mesos", "prefer_external"),
    "max_yaml": Key(conv.size, "mesos", "max_yaml"),
    "peer_address": Key(_peer_address, "agent_tunnel", "peer_address"),
    "audit_log": Key(conv.text, "audit", "log"),
    "audit_policy_file": Key(conv.text, "audit", "policy_file"),
    # The export keys are read by the audit section's from_ini (the export settings' own table).
    **{name: Key(convert, "audit", name) for name, convert in AUDIT_EXPORT_OPTIONS.items()},
    "cluster_creators": Key(ClusterCreators.parse, "self_service", "cluster_creators"),
    **{f"quota_{name}": Key(limit_value, "self_service", f"quota_{name}") for name in Quotas.names()},
    "limits_config": Key(limit_settings.load, "", "limits"),
    "authentication_config": Key(conv.text, "identity", "authentication_config"),
    "superuser_groups": Key(conv.aslist, "identity", "superuser_groups"),
    **{name: Key(convert, "recording", recording_options.ATTRIBUTES[name])
       for name, convert in recording_options.OPTIONS.items()},
}

# Keys an entry point's [DEFAULT] may leave empty: an empty value is no value.
_EMPTY_IS_UNSET = ("gateway_ca_file", "gateway_cert_file", "peer_address")


#: The management API on its own takes the gateway's keys of the sections it has.
MANAGEMENT_KEYS: dict[str, Key] = {
    name: key for name, key in GATEWAY_KEYS.items()
    if key.section in ("store", "self_service")
    or name in ("gateway_ca_file", "gateway_cert_file", "public_url", "max_body")
}


def _schedulers(value: str) -> list[Endpoint]:
    return [Endpoint.from_url(item) for item in conv.aslist(value)]


DRIVER_KEYS: dict[str, Key] = {
    "cluster_id": Key(conv.text, "", "cluster_id"),
    "zookeeper_hosts": Key(conv.text, "discovery", "zookeeper_hosts"),
    "zookeeper_root": Key(conv.text, "discovery", "zookeeper_root"),
    "zookeeper_timeout": Key(conv.seconds, "discovery", "zookeeper_timeout"),
    "static_schedulers": Key(_schedulers, "discovery", "static_schedulers"),
    "scheduler_prefix": Key(conv.text, "scheduler", "prefix"),
    "scheduler_ca_file": Key(conv.text, "scheduler", "ca_file"),
    "scheduler_verify": Key(conv.asbool, "scheduler", "verify"),
    "definitions_file": Key(conv.text, "scheduler", "definitions_file"),
    "definitions_require_superuser": Key(conv.asbool, "scheduler", "definitions_require_superuser"),
    "convert": Key(conv.asbool, "scheduler", "convert"),
    "database_url": Key(conv.text, "store", "database_url"),
    "data_dir": Key(conv.text, "store", "data_dir"),
    "secret_key": Key(conv.text, "store", "secret_key"),
    "console_port": Key(conv.asint, "console", "port"),
    "console_scheme": Key(conv.text, "console", "scheme"),
    "console_ca_file": Key(conv.text, "console", "ca_file"),
    "console_verify": Key(conv.asbool, "console", "verify"),
    "console_cert_file": Key(conv.text, "console", "cert_file"),
    "console_key_file": Key(conv.text, "console", "key_file"),
    "upstream_allow": Key(conv.networks, "outbound", "allow"),
    "upstream_deny": Key(conv.networks, "outbound", "deny"),
    "connect_timeout": Key(conv.seconds, "outbound", "connect_timeout"),
    "read_timeout": Key(conv.seconds, "outbound", "read_timeout"),
    "total_budget": Key(conv.seconds, "admission", "budget"),
    "default_timeout": Key(conv.seconds, "admission", "default_timeout"),
    "max_body": Key(conv.size, "admission", "max_body"),
    "address_map": Key(conv.mapping, "admission", "address_map"),
}


def build_config(config_type: type[C], section: str, local_conf: Mapping[str, Any],
                 keys: Mapping[str, Key], *, drop_empty: tuple[str, ...] = ()) -> C:
    """``config_type`` from the ini ``section``'s ``local_conf``, through the key table ``keys``.

    Every value is converted by its key's converter (an unknown key or a bad value is a
    :class:`ConfigError` naming ``section`` and the key), grouped by section, and each
    section built by its ``from_ini`` (or its constructor); sections no key names keep
    their defaults.
    """
    opts = conv.convert_options(section, local_conf, {name: key.convert for name, key in keys.items()})
    for name in drop_empty:
        if opts.get(name) == "":
            del opts[name]  # an empty [DEFAULT] value an entry point did not fill in
    data_dir = opts.get("data_dir")
    context = IniContext(section, Path(data_dir) if data_dir else None)
    grouped: dict[str, dict[str, Any]] = {}
    for name, value in opts.items():
        key = keys[name]
        grouped.setdefault(key.section, {})[key.attr] = value
    values: dict[str, Any] = dict(grouped.pop("", {}))
    for name, section_type in section_types(config_type).items():
        own = grouped.get(name)
        if own is None and not hasattr(section_type, "from_ini"):
            continue
        build = getattr(section_type, "from_ini", None)
        values[name] = build(dict(own or {}), context) if build is not None else section_type(**(own or {}))
    return config_type(**values)


def gateway_config(section: str, local_conf: Mapping[str, Any]) -> GatewayConfig:
    """The gateway's configuration from an ini section (``[app:main]``, ``serve``'s options)."""
    config = build_config(GatewayConfig, section, local_conf, GATEWAY_KEYS, drop_empty=_EMPTY_IS_UNSET)
    if not config.store.database_url and not config.store.data_dir:
        raise ConfigError(f"[{section}] needs database_url or data_dir")
    return config


def management_config(section: str, local_conf: Mapping[str, Any]) -> ManagementConfig:
    """The management API's configuration from an ini section (``[app:management_api]``)."""
    config = build_config(ManagementConfig, section, local_conf, MANAGEMENT_KEYS)
    if not config.store.database_url and not config.store.data_dir:
        raise ConfigError(f"[{section}] needs database_url or data_dir")
    return config


def driver_config(section: str, local_conf: Mapping[str, Any]) -> DriverConfig:
    """The mesos-driver's configuration from an ini section (``[app:driver]``, ``serve --role driver``)."""
    config = build_config(DriverConfig, section, local_conf, DRIVER_KEYS)
    if not config.cluster_id:
        raise ConfigError(f"[{section}] cluster_id is required")
    discovery = config.discovery
    if discovery.zookeeper_hosts and discovery.static_schedulers:
        raise ConfigError(f"[{section}] set zookeeper_hosts or static_schedulers, not both")
    if not discovery.zookeeper_hosts and not discovery.static_schedulers:
        raise ConfigError(f"[{section}] zookeeper_hosts or static_schedulers is required")
    if config.scheduler.definitions_file and (config.store.database_url or config.store.data_dir):
        raise ConfigError(f"[{section}] set definitions_file or database_url/data_dir, not both")
    if bool(config.console.cert_file) != bool(config.console.key_file):
        raise ConfigError(f"[{section}] set console_cert_file and console_key_file together")
    return config
