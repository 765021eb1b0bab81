"""The exporters :class:`~.settings.AuditExportSettings` describe, built without I/O beyond
reading the webhook's kubeconfig (each process opens its spool and connections on first use)."""

from __future__ import annotations

from pathlib import Path

from ...core.errors import ConfigError
from ...outbound.addresses import AddressPolicy
from ...outbound.transport import Transport
from .exporter import Exporter
from .settings import AuditExportSettings
from .syslog import SyslogBackend, SyslogTarget, parse_syslog_url
from .webhook import WebhookBackend, load_webhook_config

__all__ = ["SPOOL_DIR", "build_exporters"]

#: The spools' folder in the data directory.
SPOOL_DIR = "audit-spool"


def build_exporters(settings: AuditExportSettings, *, data_dir: Path | None, transport: Transport,
                    address_policy: AddressPolicy | None = None) -> list[Exporter]:
    """One :class:`Exporter` per configured backend (webhook first, then syslog).

    :param data_dir: where the spools are (``DATA_DIR/audit-spool``) unless the settings name a folder.
    :param transport: the process's outbound transport (the webhook's calls).
    :param address_policy: where syslog connections may go.
    """
    if not settings.enabled:
        return []
    root = settings.spool_dir or (data_dir / SPOOL_DIR if data_dir is not None else None)
    if root is None:
        raise ConfigError("audit export needs a data directory (or audit_spool_dir) for its spool")
    exporters = []
    if settings.webhook is not None:
        webhook = settings.webhook
        target = load_webhook_config(webhook.config_file, secrets_dir=root)
        exporters.append(Exporter(
            lambda: WebhookBackend(target, transport=transport, timeout=webhook.timeout, truncate=webhook.truncate),
            name="webhook", spool_root=root / "webhook", limits=settings.spool, batch=webhook.batch,
        ))
    if settings.syslog is not None:
        syslog = settings.syslog
        host, port, tls = parse_syslog_url(syslog.url)
        syslog_target = SyslogTarget(host=host, port=port, tls=tls, ca_file=syslog.ca_file,
                                     server_name=syslog.server_name, client_cert=syslog.client_cert,
                                     max_message_size=syslog.max_message_size)
        exporters.append(Exporter(
            lambda: SyslogBackend(syslog_target, address_policy=address_policy),
            name="syslog", spool_root=root / "syslog", limits=settings.spool, batch=syslog.batch,
        ))
    return exporters
