"""The standalone ``[filter:audit]`` exports as ``serve`` does: a plain ``gunicorn --paste``
pipeline (no gateway hooks) ships its audit events to a real HTTPS webhook receiver, through the
spool in the data directory, across an outage of the receiver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bcs_middleware.core.errors import ConfigError
from bcs_middleware.layers.audit import filter_factory
from bcs_middleware.store.crypto import token_digest
from tests.audit.export.receivers import webhook_receiver
from tests.support.polling import wait_for
from tests.support.servers import gunicorn, http_get

TOKEN = "paste-audit-token-" + "t" * 30
HELLO = (
    "def app_factory(global_conf, **local):\n"
    "    def app(environ, start_response):\n"
    "        start_response('200 OK', [('Content-Type', 'application/json')])\n"
    "        return [b'{}']\n"
    "    return app\n"
)


def _pipeline(folder: Path, kubeconfig: Path) -> Path:
    (folder / "tokens.txt").write_text(f"carol {token_digest(TOKEN)}\n")
    (folder / "hello.py").write_text(HELLO)
    ini = folder / "audited.ini"
    ini.write_text(
        "[DEFAULT]\ndata_dir = %(here)s/data\n\n"
        "[pipeline:main]\npipeline = request_context audit token_auth hello\n\n"
        "[filter:request_context]\nuse = egg:bcs-middleware#request_context\naccess_log = false\n\n"
        "[filter:audit]\nuse = egg:bcs-middleware#audit\nget data_dir = data_dir\n"
        f"audit_webhook_config_file = {kubeconfig}\n"
        "audit_webhook_batch_max_wait = 100ms\naudit_webhook_initial_backoff = 200ms\n\n"
        "[filter:token_auth]\nuse = egg:bcs-middleware#token_auth\ntokens_file = %(here)s/tokens.txt\n\n"
        "[app:hello]\npaste.app_factory = hello:app_factory\n")
    return ini


def test_a_paste_pipelines_audit_filter_exports_to_a_webhook_across_an_outage(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        ini = _pipeline(tmp_path, receiver.kubeconfig(tmp_path / "siem.kubeconfig"))
        with gunicorn(str(ini), workers=1, env={"PYTHONPATH": str(tmp_path)}) as server:
            base = f"http://127.0.0.1:{server.port}/tunnels/clusters/C/api/v1/pods"
            for number in range(3):
                auth = {"Authorization": f"Bearer {TOKEN}"} if number % 2 == 0 else {}
                http_get(f"{base}?seq={number}", headers=auth)
            wait_for(lambda: len(receiver.received()) >= 6, 60, "the first events at the receiver")
            receiver.down()
            for number in range(3, 6):
                http_get(f"{base}?seq={number}", headers={"Authorization": f"Bearer {TOKEN}"})
            # Spooled in the data directory meanwhile, sent when the receiver is back.
            assert any((tmp_path / "data" / "audit-spool" / "webhook").rglob("*"))
            receiver.up()
            events = wait_for(lambda: (got := receiver.received()) and len(got) >= 12 and got, 60,
                              "every event at the receiver")
        assert TOKEN not in server.output()
    seen = [(int(e["requestURI"].rsplit("seq=", 1)[1]), e["stage"], e["user"]["username"]) for e in events]
    assert seen == [(n, stage, "carol" if n % 2 == 0 or n >= 3 else "system:anonymous")
                    for n in range(6) for stage in ("RequestReceived", "ResponseComplete")]
    assert [e["responseStatus"]["code"] for e in events if e["stage"] == "ResponseComplete"] == \
        [200, 401, 200, 200, 200, 200]
    assert TOKEN not in json.dumps(events)


def test_the_audit_filter_checks_its_export_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs log"):
        filter_factory({})
    with pytest.raises(ConfigError, match=r"\[filter:audit\] audit_webhook_config_file: no such file"):
        filter_factory({}, audit_webhook_config_file=str(tmp_path / "absent.kubeconfig"), data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"\[filter:audit\] the audit_syslog_\* settings need audit_syslog_url"):
        filter_factory({}, log="-", audit_syslog_server_name="siem")
    with pytest.raises(ConfigError, match="needs data_dir"):
        filter_factory({}, audit_syslog_url="tcp://127.0.0.1:6514")


def test_under_the_gateways_hooks_a_left_spool_is_sent_before_any_request(tmp_path: Path) -> None:
    """Events spooled while the receiver was down are sent by the next server's worker as it
    starts (``post_worker_init``: ``examples/gunicorn.conf.py``), with no request to wake it."""
    with webhook_receiver() as receiver:
        ini = _pipeline(tmp_path, receiver.kubeconfig(tmp_path / "siem.kubeconfig"))
        env = {"PYTHONPATH": str(tmp_path)}
        receiver.down()
        with gunicorn(str(ini), workers=1, env=env) as server:
            for number in range(2):
                http_get(f"http://127.0.0.1:{server.port}/tunnels/clusters/C/api/v1/pods?seq={number}")
        assert receiver.received() == []
        receiver.up()
        conf = Path(__file__).resolve().parents[3] / "examples" / "gunicorn.conf.py"
        hooked = {**env, "BCS_DATA_DIR": str(tmp_path / "data"), "BCS_INSECURE_HTTP": "1", "BCS_WORKERS": "1"}
        with gunicorn(str(ini), workers=1, env=hooked, extra=["-c", str(conf)]):
            events = wait_for(lambda: (got := receiver.received()) and len(got) >= 4 and got, 60,
                              "the spooled events at the receiver, with no request")
    assert [(e["requestURI"].rsplit("seq=", 1)[1], e["stage"]) for e in events] == [
        (str(n), stage) for n in range(2) for stage in ("RequestReceived", "ResponseComplete")]
