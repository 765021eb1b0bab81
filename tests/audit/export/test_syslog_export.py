"""Audit events exported as RFC 5424 syslog by a real ``bcs-middleware serve`` to a real rsyslog
(Debian's, ``imtcp``; TLS through its ``gtls`` driver), which writes them to a file as received."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trustme

from tests.audit.export.receivers import Rsyslog, need_rsyslog
from tests.audit.export.test_webhook_export import audited, expected, metric, sequence
from tests.support.gateway import served_gateway
from tests.support.polling import wait_for, wait_until

# RFC 5424 §6: PRI VERSION SP TIMESTAMP SP HOSTNAME SP APP-NAME SP PROCID SP MSGID SP SD SP MSG
_MESSAGE = re.compile(r'<110>1 (\S+) (\S+) bcs-middleware (\d+) audit \[meta sequenceId="(\d+)"\] (\{.*\})')


@pytest.fixture(params=["tcp", "tls"])
def rsyslog(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    need_rsyslog(tls=request.param == "tls")
    folder = tmp_path / "rsyslog"
    folder.mkdir()
    server = Rsyslog(folder, tls=request.param == "tls")
    server.start()
    yield server
    server.stop()


def syslog_args(server: Rsyslog, *extra: str) -> list[str]:
    if server.tls:
        url = f"tls://localhost:{server.port}"
        return ["--audit-syslog-url", url, "--audit-syslog-ca-file", str(server.folder / "ca.crt"), *extra]
    return ["--audit-syslog-url", f"tcp://127.0.0.1:{server.port}", *extra]


def parsed(lines: list[str]) -> list[tuple[str, int, dict]]:
    found = []
    for line in lines:
        match = _MESSAGE.fullmatch(line)
        assert match, line
        found.append((match.group(1), int(match.group(4)), json.loads(match.group(5))))
    return found


def test_every_event_arrives_once_in_order_as_rfc5424(rsyslog: Rsyslog, tmp_path: Path) -> None:
    with served_gateway(tmp_path / "data", args=syslog_args(rsyslog), workers=1) as gw:
        audited(gw, range(10))
        messages = parsed(rsyslog.messages(20))
        # Counted once the write returned (rsyslog may have written them to its file before).
        assert wait_until(lambda: metric(gw, "bcs_audit_events_sent_total", backend="syslog") == 20, 30)
    events = [event for _, _, event in messages]
    assert sequence(events) == expected(range(10))
    assert [seq for _, seq, _ in messages] == list(range(1, 21))
    # The message's time is the event's (when it happened), not when it was sent.
    assert all(stamp == event["stageTimestamp"] for stamp, _, event in messages)
    assert all(event["apiVersion"] == "audit.k8s.io/v1" for event in events)


def test_a_restarted_syslog_receiver_loses_nothing(rsyslog: Rsyslog, tmp_path: Path) -> None:
    args = syslog_args(rsyslog, "--audit-spool-max-size", "1Mi")
    with served_gateway(tmp_path / "data", args=args, workers=1) as gw:
        audited(gw, range(5))
        rsyslog.messages(10)
        rsyslog.stop()  # the gateway's connection is closed by the receiver
        audited(gw, range(5, 10))
        wait_for(lambda: metric(gw, "bcs_audit_events_retried_total", backend="syslog") > 0, 60,
                 "the gateway never tried the receiver while it was down")
        rsyslog.start()
        audited(gw, range(10, 12))
        messages = parsed(rsyslog.messages(24, timeout=90))
    assert sequence([event for _, _, event in messages]) == expected(range(12))


def test_a_receiver_whose_certificate_another_ca_signed_gets_nothing(tmp_path: Path) -> None:
    """TLS is verified: a listener with a certificate the configured CA did not sign (someone
    in the middle) is never sent an event; the events wait in the spool."""
    need_rsyslog(tls=True)
    folder = tmp_path / "rsyslog"
    folder.mkdir()
    impostor = Rsyslog(folder, tls=True, ca=trustme.CA())
    impostor.start()
    try:
        trusted = trustme.CA()
        trusted.cert_pem.write_to_path(str(tmp_path / "trusted-ca.crt"))
        args = ["--audit-syslog-url", f"tls://localhost:{impostor.port}",
                "--audit-syslog-ca-file", str(tmp_path / "trusted-ca.crt")]
        with served_gateway(tmp_path / "data", args=args, workers=1) as gw:
            audited(gw, range(3))
            wait_for(lambda: metric(gw, "bcs_audit_events_retried_total", backend="syslog") >= 6, 60,
                     "the gateway never tried to deliver")
            assert metric(gw, "bcs_audit_events_sent_total", backend="syslog") == 0
            assert "certificate verify failed" in gw.server.output()
    finally:
        impostor.stop()
    assert impostor.lines() == []


def test_a_client_cannot_forge_or_split_a_syslog_message(tmp_path: Path) -> None:
    """Octet counting frames each message by its length, and the event's JSON escapes what the
    client sent: a User-Agent dressed as a frame boundary and a message stays inside its event."""
    need_rsyslog()
    folder = tmp_path / "rsyslog"
    folder.mkdir()
    server = Rsyslog(folder, tls=False)
    server.start()
    forged = '" }\t 120 <14>1 2026-01-01T00:00:00Z evil forged - - - {"kind":"Event","user":"root"} 9'
    try:
        with served_gateway(tmp_path / "data", args=syslog_args(server), workers=1) as gw:
            for number in range(3):
                status, _ = gw.call("GET", f"/tunnels/clusters/BCS-K8S-AUDIT/api?seq={number}", token="",
                                    headers={"User-Agent": forged})
                assert status == 401
            audited(gw, range(3, 4))
            messages = parsed(server.messages(8))
            assert wait_until(lambda: len(server.lines()) == 8, 5) and len(server.lines()) == 8
    finally:
        server.stop()
    events = [event for _, _, event in messages]
    assert sequence(events) == expected(range(4))
    assert [e["userAgent"] for e in events[:6]] == [forged] * 6
    assert not any("forged" in line.split("{", 1)[0] for line in server.lines())
