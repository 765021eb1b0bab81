"""Audit export settings from the gateway's ini keys (the serve flags fill the same keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bcs_middleware.audit.export.settings import BatchOptions
from bcs_middleware.audit.export.truncate import TruncateLimits
from bcs_middleware.compose.gateway import config_from_options
from bcs_middleware.core.errors import ConfigError


def test_kube_apiserver_defaults_and_names(tmp_path: Path) -> None:
    (tmp_path / "hook.kubeconfig").write_text("{}")
    config = config_from_options("app:main", {"data_dir": str(tmp_path),
                                              "audit_webhook_config_file": "hook.kubeconfig"})
    webhook = config.audit.export.webhook
    assert webhook is not None
    assert webhook.config_file == tmp_path / "hook.kubeconfig"  # relative: in the data directory
    assert webhook.batch == BatchOptions()
    assert (webhook.batch.buffer_size, webhook.batch.max_size, webhook.batch.max_wait) == (10000, 400, 30.0)
    assert (webhook.batch.throttle_qps, webhook.batch.throttle_burst, webhook.batch.initial_backoff) == (10.0, 15, 10.0)
    assert webhook.truncate is None
    assert config.audit.export.syslog is None


def test_every_key_is_read(tmp_path: Path) -> None:
    (tmp_path / "hook.kubeconfig").write_text("{}")
    (tmp_path / "ca.crt").write_text("")
    config = config_from_options("app:main", {
        "data_dir": str(tmp_path), "audit_webhook_config_file": "hook.kubeconfig", "audit_webhook_mode": "blocking",
        "audit_webhook_batch_buffer_size": "50", "audit_webhook_batch_max_size": "5",
        "audit_webhook_batch_max_wait": "2s", "audit_webhook_batch_throttle_enable": "false",
        "audit_webhook_initial_backoff": "500ms", "audit_webhook_truncate_enabled": "true",
        "audit_webhook_truncate_max_batch_size": "1Mi", "audit_webhook_truncate_max_event_size": "10Ki",
        "audit_syslog_url": "tls://siem.example:6514", "audit_syslog_ca_file": "ca.crt",
        "audit_spool_max_size": "1Gi", "audit_spool_fsync": "false",
    })
    export = config.audit.export
    assert export.webhook is not None and export.syslog is not None
    assert export.webhook.batch.mode == "blocking"
    batch = export.webhook.batch
    assert (batch.buffer_size, batch.max_size, batch.max_wait) == (50, 5, 2.0)
    assert export.webhook.batch.throttle_qps is None and export.webhook.batch.initial_backoff == 0.5
    assert export.webhook.truncate == TruncateLimits(max_batch_size=1024 * 1024, max_event_size=10 * 1024)
    assert export.syslog.ca_file == str(tmp_path / "ca.crt")
    assert (export.spool.max_bytes, export.spool.fsync) == (1024 ** 3, False)


@pytest.mark.parametrize(("options", "message"), [
    pytest.param({"audit_webhook_mode": "batch"}, "need audit_webhook_config_file", id="webhook-key-alone"),
    pytest.param({"audit_syslog_ca_file": "/x"}, "need audit_syslog_url", id="syslog-key-alone"),
    pytest.param({"audit_syslog_url": "udp://siem:514"}, "tcp://HOST:PORT", id="udp"),
    pytest.param({"audit_syslog_url": "tcp://siem"}, "a port is needed", id="no-port"),
    pytest.param({"audit_webhook_config_file": "missing.kubeconfig"}, "no such file", id="missing-kubeconfig"),
    pytest.param({"audit_webhook_config_file": "hook.kubeconfig", "audit_webhook_mode": "fast"}, "bad value",
                 id="unknown-mode"),
    pytest.param({"audit_webhook_config_file": "hook.kubeconfig", "audit_webhook_truncate_enabled": "true",
                  "audit_webhook_truncate_max_batch_size": "1Ki"}, "at least", id="batch-below-event"),
    pytest.param({"audit_webhook_batch_max_size": "0", "audit_webhook_config_file": "hook.kubeconfig"},
                 "bad value", id="zero-batch"),
])
def test_a_bad_setting_is_refused_naming_it(tmp_path: Path, options: dict[str, str], message: str) -> None:
    (tmp_path / "hook.kubeconfig").write_text("{}")
    with pytest.raises(ConfigError, match=message):
        config_from_options("app:main", {"data_dir": str(tmp_path), **options})
