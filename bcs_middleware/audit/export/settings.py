"""Audit export settings: what ``serve --audit-webhook-* / --audit-syslog-* / --audit-spool-*`` and
the gateway's ini keys of the same names (underscores) set.

The webhook's names and defaults are kube-apiserver's
(``staging/src/k8s.io/apiserver/pkg/server/options/audit.go``): mode ``batch``, a buffer of
10000 events, batches of at most 400 sent at least every 30 s, throttled to 10 batches a
second (burst 15), a first retry after 10 s; truncation off, 10 MiB batches and 100 KiB
events when on. What kube-apiserver's buffer drops when its webhook is down, the spool
keeps (``audit_spool_max_size``, default 256 MiB per backend and process).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ...core import converters as conv
from ...core.errors import ConfigError
from .spool import SpoolLimits
from .truncate import TruncateLimits

__all__ = ["OPTIONS", "AuditExportSettings", "BatchOptions", "SyslogSettings", "WebhookSettings",
           "settings_from_options"]

Mode = Literal["batch", "blocking", "blocking-strict"]
MODES: tuple[Mode, ...] = ("batch", "blocking", "blocking-strict")


@dataclass(frozen=True)
class BatchOptions:
    """How events reach a backend.

    :param mode: ``batch``: queued, spooled and sent by a background thread, never holding
        a request up; ``blocking``: the request waits (at most ``blocking_timeout``) until its
        event is delivered — spooled all the same, so one not delivered in time is sent
        later; ``blocking-strict``: as ``blocking``, and the request's ``RequestReceived``
        event is delivered before anything is forwarded — one that could not be delivered
        fails the request (500) with nothing sent upstream, as kube-apiserver's.
    :param buffer_size: events waiting in memory for the spool; more are dropped (counted).
    :param max_size: events in one batch.
    :param max_wait: seconds the first event of a batch waits for others.
    :param throttle_qps: batches a second at most (``None``: no throttle); ``throttle_burst`` at once.
    :param initial_backoff: seconds before the first retry; each next one 1.5 times longer,
        at most ``max_backoff``. Retries go on as long as the spool holds the events.
    """

    mode: Mode = "batch"
    buffer_size: int = 10000
    max_size: int = 400
    max_wait: float = 30.0
    throttle_qps: float | None = 10.0
    throttle_burst: int = 15
    initial_backoff: float = 10.0
    max_backoff: float = 300.0
    blocking_timeout: float = 30.0


@dataclass(frozen=True)
class WebhookSettings:
    config_file: Path
    batch: BatchOptions = BatchOptions()
    truncate: TruncateLimits | None = None
    timeout: float = 30.0


@dataclass(frozen=True)
class SyslogSettings:
    url: str
    ca_file: str | None = None
    client_cert: tuple[str, str] | None = None
    server_name: str | None = None
    max_message_size: int = 64 * 1024
    batch: BatchOptions = BatchOptions(max_wait=1.0, throttle_qps=None)


@dataclass(frozen=True)
class AuditExportSettings:
    """Where audit events are exported besides the audit log (nothing by default).

    :param spool_dir: the spools' folder (default ``DATA_DIR/audit-spool``): one folder per
        backend, one slot per process in it (:mod:`.spool`).
    """

    webhook: WebhookSettings | None = None
    syslog: SyslogSettings | None = None
    spool: SpoolLimits = field(default_factory=SpoolLimits)
    spool_dir: Path | None = None

    @property
    def enabled(self) -> bool:
        return self.webhook is not None or self.syslog is not None


def _mode(value: str) -> str:
    value = value.strip()
    if value not in MODES:
        raise ValueError(f"one of {', '.join(MODES)}")
    return value


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise ValueError("must be positive")
    return number


def _duration(value: str) -> float:
    # kube-apiserver's flags are Go durations (30s, 1m30s is not needed: 90s).
    return conv.seconds(value)


OPTIONS: dict[str, conv.Converter] = {
    "audit_webhook_config_file": conv.text,
    "audit_webhook_mode": _mode,
    "audit_webhook_batch_buffer_size": conv.positive_int,
    "audit_webhook_batch_max_size": conv.positive_int,
    "audit_webhook_batch_max_wait": _duration,
    "audit_webhook_batch_throttle_enable": conv.asbool,
    "audit_webhook_batch_throttle_qps": _positive,
    "audit_webhook_batch_throttle_burst": conv.positive_int,
    "audit_webhook_initial_backoff": _duration,
    "audit_webhook_truncate_enabled": conv.asbool,
    "audit_webhook_truncate_max_batch_size": conv.size,
    "audit_webhook_truncate_max_event_size": conv.size,
    "audit_syslog_url": conv.text,
    "audit_syslog_ca_file": conv.text,
    "audit_syslog_client_cert_file": conv.text,
    "audit_syslog_client_key_file": conv.text,
    "audit_syslog_server_name": conv.text,
    "audit_syslog_max_message_size": conv.size,
    "audit_spool_dir": conv.text,
    "audit_spool_max_size": conv.size,
    "audit_spool_fsync": conv.asbool,
}


def settings_from_options(options: Mapping[str, Any], *, section: str, base: Path | None) -> AuditExportSettings:
    """Converted ``audit_*`` options (:data:`OPTIONS`) → settings; a ConfigError names the key.

    :param base: where a relative path is (the data directory), ``None``: the working directory.
    """
    def path(key: str) -> Path | None:
        value = options.get(key)
        if not value:
            return None
        given = Path(value)
        return given if given.is_absolute() or base is None else base / given

    webhook = _webhook(options, path("audit_webhook_config_file"), section)
    syslog = None
    if options.get("audit_syslog_url"):
        from .syslog import parse_syslog_url

        parse_syslog_url(options["audit_syslog_url"])
        cert, key = path("audit_syslog_client_cert_file"), path("audit_syslog_client_key_file")
        if bool(cert) != bool(key):
            raise ConfigError(f"[{section}] audit_syslog_client_cert_file and audit_syslog_client_key_file go together")
        for file in (path("audit_syslog_ca_file"), cert, key):
            if file is not None and not file.is_file():
                raise ConfigError(f"[{section}] audit syslog: no such file {file}")
        ca = path("audit_syslog_ca_file")
        syslog = SyslogSettings(
            url=options["audit_syslog_url"], ca_file=str(ca) if ca else None,
            client_cert=(str(cert), str(key)) if cert and key else None,
            server_name=options.get("audit_syslog_server_name") or None,
            max_message_size=options.get("audit_syslog_max_message_size", 64 * 1024),
        )
    elif any(k.startswith("audit_syslog_") and options.get(k) for k in options):
        raise ConfigError(f"[{section}] the audit_syslog_* settings need audit_syslog_url")
    limits = SpoolLimits(max_bytes=options.get("audit_spool_max_size", SpoolLimits.max_bytes),
                         fsync=options.get("audit_spool_fsync", True))
    limits = SpoolLimits(max_bytes=limits.max_bytes, fsync=limits.fsync,
                         segment_bytes=min(SpoolLimits.segment_bytes, max(limits.max_bytes // 8, 4096)))
    return AuditExportSettings(webhook=webhook, syslog=syslog, spool=limits, spool_dir=path("audit_spool_dir"))


def _webhook(options: Mapping[str, Any], config_file: Path | None, section: str) -> WebhookSettings | None:
    if config_file is None:
        if any(k.startswith("audit_webhook_") and k in options for k in OPTIONS):
            raise ConfigError(f"[{section}] the audit_webhook_* settings need audit_webhook_config_file")
        return None
    defaults = BatchOptions()
    throttled = options.get("audit_webhook_batch_throttle_enable", True)
    batch = BatchOptions(
        mode=options.get("audit_webhook_mode", defaults.mode),
        buffer_size=options.get("audit_webhook_batch_buffer_size", defaults.buffer_size),
        max_size=options.get("audit_webhook_batch_max_size", defaults.max_size),
        max_wait=options.get("audit_webhook_batch_max_wait", defaults.max_wait),
        throttle_qps=options.get("audit_webhook_batch_throttle_qps", defaults.throttle_qps) if throttled else None,
        throttle_burst=options.get("audit_webhook_batch_throttle_burst", defaults.throttle_burst),
        initial_backoff=options.get("audit_webhook_initial_backoff", defaults.initial_backoff),
    )
    truncate = None
    if options.get("audit_webhook_truncate_enabled"):
        limits = TruncateLimits()
        truncate = TruncateLimits(
            max_batch_size=options.get("audit_webhook_truncate_max_batch_size", limits.max_batch_size),
            max_event_size=options.get("audit_webhook_truncate_max_event_size", limits.max_event_size),
        )
        # kube-apiserver's AuditTruncateOptions.Validate
        if truncate.max_event_size <= 0 or truncate.max_batch_size < truncate.max_event_size:
            raise ConfigError(f"[{section}] audit_webhook_truncate_max_batch_size must be at least "
                              "audit_webhook_truncate_max_event_size")
    if not config_file.is_file():
        raise ConfigError(f"[{section}] audit_webhook_config_file: no such file {config_file}")
    return WebhookSettings(config_file=config_file, batch=batch, truncate=truncate)
