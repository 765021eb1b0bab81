"""The application ``bcs-middleware serve`` runs, as a loader gunicorn calls in each worker:
the ini's, the embedded gateway or the Mesos driver — each built once in the master first, so
a configuration mistake stops the start with one clear message.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..serving.datadir import ADMIN_TOKEN_SOURCE
from ..serving.hooks import build_in_master
from . import serve_config
from .serve_options import audit_export_options


def ini_loader(config_path: Path, global_conf: Mapping[str, str]) -> Callable[[], Any]:
    """The ini's application; built once here to check it (without its background work)."""
    from paste.deploy import loadapp

    uri = f"config:{config_path}"

    def loader() -> Any:
        return loadapp(uri, global_conf=dict(global_conf))

    build_in_master(loader, source=str(config_path))
    return loader


def gateway_options(args: argparse.Namespace, data_dir: Path, ca_file: str | None,
                    cert_for_api: Path | None) -> dict[str, Any]:
    """The embedded gateway's options (as an ini's ``[app:main]`` would give them) from the flags."""
    options: dict[str, Any] = {"data_dir": str(data_dir), "bootstrap_users": {"admin": ADMIN_TOKEN_SOURCE}}
    flags: tuple[tuple[str, Any], ...] = (
        ("database_url", args.database_url), ("gateway_ca_file", ca_file and str(ca_file)),
        ("gateway_cert_file", cert_for_api and str(cert_for_api)), ("public_url", args.public_url),
        # The proxies gunicorn believes are the ones whose X-Forwarded-For the proxy extends.
        ("trusted_proxies", ",".join(args.forwarded_allow_ips)),
        ("access_log", "false" if args.no_access_log else None), ("audit_log", args.audit_log),
        ("audit_policy_file", args.audit_policy and str(Path(args.audit_policy).absolute())),
        ("zookeeper_hosts", args.zookeeper), ("zookeeper_root", args.zookeeper and args.zookeeper_root),
        ("static_drivers", args.static_driver and serve_config.flag_value("static_driver", args.static_driver)),
        ("driver_ca_file", args.driver_ca_file), ("client_cert_subjects", "\n".join(args.client_cert_map)),
        ("upstream_allow", " ".join(args.upstream_allow)), ("upstream_deny", " ".join(args.upstream_deny)),
        ("peer_address", args.peer_address), ("cluster_creators", args.cluster_creators),
        *recording_options(args),
        ("limits_config", args.limits_config and str(Path(args.limits_config).absolute())),
        ("authentication_config", args.authentication_config and str(Path(args.authentication_config).absolute())),
        ("superuser_groups", " ".join(args.superuser_group)),
    )
    options.update((key, value) for key, value in flags if value)
    options.update(audit_export_options(args))
    for spec in args.quota:
        name, sep, limit = spec.partition("=")
        if not sep:
            raise ConfigError(f"--quota {spec!r}: expected NAME=LIMIT")
        options[f"quota_{name.strip().replace('-', '_')}"] = limit
    return options


def recording_options(args: argparse.Namespace) -> tuple[tuple[str, Any], ...]:
    """The session recording flags as the gateway's ini keys (recording/settings.py)."""
    return (
        ("record", args.record), ("record_stdin", "true" if args.record_stdin else None),
        ("record_clusters", args.record_cluster and serve_config.flag_value("record_cluster", args.record_cluster)),
        ("recording_store", args.recording_store), ("recording_dir", args.recording_dir),
        ("recording_max_age", args.recording_max_age), ("recording_max_size", args.recording_max_size),
        ("recording_max_size_per_user", args.recording_max_size_per_user),
        ("recording_retention_interval", args.recording_retention_interval),
        ("recording_heartbeat_timeout", args.recording_heartbeat_timeout),
        ("recording_buffer", args.recording_buffer), ("recording_stall_timeout", args.recording_stall_timeout),
    )


def gateway_loader(args: argparse.Namespace, data_dir: Path, ca_file: str | None,
                   cert_for_api: Path | None) -> Callable[[], Any]:
    from ..compose.gateway import build_gateway, config_from_options
    from ..store.sql import open_store

    options = gateway_options(args, data_dir, ca_file, cert_for_api)
    config = config_from_options("serve", options)

    def check() -> None:
        # Migrate, check what instances sharing the database must agree on, bootstrap: once, here.
        store = open_store(config.store.database_url, data_dir=data_dir, secret_key=None)
        try:
            build_gateway(config, store=store, background=False)
        finally:
            store.db.dispose()

    build_in_master(check, source="the gateway")

    def loader() -> Any:
        # Parsed again: the bootstrap token the check may have generated is in its file now.
        return build_gateway(config_from_options("serve", options))

    return loader


def driver_loader(args: argparse.Namespace, data_dir: Path) -> Callable[[], Any]:
    """The mesos-driver role: admission definitions in the data directory (or --database-url)."""
    from ..compose.driver import app_factory

    if not args.cluster_id:
        raise ConfigError("serve --role driver needs --cluster-id")
    if bool(args.zookeeper) == bool(args.scheduler):
        raise ConfigError("serve --role driver needs --zookeeper or --scheduler URL (not both)")
    options: dict[str, Any] = {"cluster_id": args.cluster_id}
    if args.database_url:
        options["database_url"] = args.database_url
    else:
        options["data_dir"] = str(data_dir)
    if args.zookeeper:
        options["zookeeper_hosts"] = args.zookeeper
        options["zookeeper_root"] = args.zookeeper_root
    else:
        options["static_schedulers"] = " ".join(args.scheduler)
    if args.scheduler_ca_file:
        options["scheduler_ca_file"] = args.scheduler_ca_file
    if args.console_port:
        options["console_port"] = args.console_port
    if args.console_ca_file:
        options["console_ca_file"] = args.console_ca_file
    if args.console_http:
        options["console_scheme"] = "http"
    for key in ("upstream_allow", "upstream_deny"):
        if getattr(args, key):
            options[key] = " ".join(getattr(args, key))

    def loader() -> Any:
        return app_factory({}, **options)

    build_in_master(loader, source="the driver")  # migrate and fail on bad options before forking
    return loader
