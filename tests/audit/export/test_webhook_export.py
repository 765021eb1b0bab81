"""Audit events exported to a webhook by a real ``bcs-middleware serve``, through its spool.

The receiver is a real HTTPS server (trustme CA, bearer token) that goes down — its socket
closed, connections refused — and comes back on the same port. Audited requests are tunnel
requests without a token: each is refused 401 and audited (``RequestReceived`` and
``ResponseComplete``) as ``system:anonymous``, numbered in its query (``?seq=N``).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

from tests.audit.export.receivers import WebhookReceiver, webhook_receiver
from tests.support.gateway import Gateway, served_gateway
from tests.support.polling import wait_for, wait_until
from tests.support.servers import TrapListener

STAGES = ("RequestReceived", "ResponseComplete")


def audited(gw: Gateway, numbers: range) -> None:
    """One audited request per number, in order (each refused 401 for its missing token)."""
    for number in numbers:
        status, _ = gw.call("GET", f"/tunnels/clusters/BCS-K8S-AUDIT/api/v1/pods?seq={number}", token="")
        assert status == 401


def sequence(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """``(request number, stage)`` of each event, in the order received."""
    return [(int(e["requestURI"].rsplit("seq=", 1)[1]), e["stage"]) for e in events]


def expected(numbers: range) -> list[tuple[int, str]]:
    return [(n, stage) for n in numbers for stage in STAGES]


def metric(gw: Gateway, name: str, **labels: str) -> float:
    status, body = gw.call("GET", "/metrics")
    assert status == 200, body
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in body.decode().splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def export_args(receiver: WebhookReceiver, tmp_path: Path, *extra: str) -> list[str]:
    return ["--audit-webhook-config-file", str(receiver.kubeconfig(tmp_path / "siem.kubeconfig")),
            "--audit-webhook-batch-max-wait", "100ms", "--audit-webhook-initial-backoff", "200ms", *extra]


def test_an_outage_and_a_restart_of_serve_lose_nothing_and_send_nothing_twice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with webhook_receiver() as receiver:
        args = export_args(receiver, tmp_path)
        with served_gateway(data, args=args, workers=1) as gw:
            audited(gw, range(0, 5))
            wait_for(lambda: len(receiver.received()) >= 10, 60, "the first events never arrived")
            receiver.down()
            audited(gw, range(5, 10))
            wait_for(lambda: metric(gw, "bcs_audit_events_retried_total", backend="webhook") > 0, 60,
                     "the gateway never tried the receiver while it was down")
        # The server is gone; what it could not deliver is in its spool on disk.
        segments = list((data / "audit-spool" / "webhook").glob("*/*.seg"))
        assert segments and sum(p.stat().st_size for p in segments) > 0
        with served_gateway(data, args=args, workers=1) as gw:
            audited(gw, range(10, 15))
            receiver.up()
            wait_for(lambda: len(receiver.received()) >= 30, 90, "the spooled events never arrived")
            # One more: delivered in order, after everything before it, so a repeat would show by now.
            audited(gw, range(15, 16))
            wait_for(lambda: len(receiver.received()) >= 32, 60, "the last event never arrived")
            # This server's (counted once the receiver's answer is read, just after it kept them).
            assert wait_until(lambda: metric(gw, "bcs_audit_events_sent_total", backend="webhook") == 22, 30)
    events = receiver.received()
    assert sequence(events) == expected(range(16))  # every event, once, in order
    assert len({(e["auditID"], e["stage"]) for e in events}) == 32
    assert all(e["user"]["username"] == "system:anonymous" and e["responseStatus"]["code"] == 401
               for e in events if e["stage"] == "ResponseComplete")


def test_worker_restarts_lose_nothing_and_send_nothing_twice(tmp_path: Path) -> None:
    """Two workers, each with its own spool slot; gunicorn replaces both (HUP) during an outage."""
    data = tmp_path / "data"
    with webhook_receiver() as receiver, served_gateway(data, args=export_args(receiver, tmp_path)) as gw:
        receiver.down()
        audited(gw, range(0, 20))
        old_workers = _worker_pids(gw)
        gw.server.signal(signal.SIGHUP)
        wait_for(lambda: (now := _worker_pids(gw)) and len(now) == 2 and not now & old_workers, 60,
                 "gunicorn did not replace its workers")
        audited(gw, range(20, 40))
        receiver.up()
        wait_for(lambda: len(receiver.received()) >= 80, 120, "not every event arrived")
        audited(gw, range(40, 41))
        wait_for(lambda: len(receiver.received()) >= 82, 60, "the last event never arrived")
        events = receiver.received()
    keys = [(e["auditID"], e["stage"]) for e in events]
    assert len(keys) == len(set(keys)) == 82
    assert sorted(sequence(events)) == expected(range(41))
    # Each request's two events come from one worker's spool, in order.
    for number in range(41):
        stages = [stage for n, stage in sequence(events) if n == number]
        assert stages == list(STAGES)


def test_the_spool_of_a_worker_that_did_not_come_back_is_drained_by_another(tmp_path: Path) -> None:
    """Two workers spool during an outage; the server comes back with one: it sends both spools."""
    data = tmp_path / "data"
    with webhook_receiver() as receiver:
        args = export_args(receiver, tmp_path)
        receiver.down()
        sent = 0

        def slots() -> set[str]:
            return {p.parent.name for p in (data / "audit-spool" / "webhook").glob("*/*.seg")}

        with served_gateway(data, args=args) as gw:
            # Until both workers hold events (the kernel spreads connections over their sockets).
            while sent < 200 and not wait_until(lambda: slots() == {"0", "1"}, 0.5):
                audited(gw, range(sent, sent + 5))
                sent += 5
        assert slots() == {"0", "1"}
        with served_gateway(data, args=args, workers=1) as gw:
            receiver.up()
            wait_for(lambda: len(receiver.received()) >= 2 * sent, 120, "a spool was not drained")
            audited(gw, range(sent, sent + 1))
            wait_for(lambda: len(receiver.received()) >= 2 * sent + 2, 60, "the last event never arrived")
    events = receiver.received()
    assert len({(e["auditID"], e["stage"]) for e in events}) == len(events) == 2 * sent + 2
    assert sorted(sequence(events)) == expected(range(sent + 1))


def _worker_pids(gw: Gateway) -> set[int]:
    import subprocess

    out = subprocess.run(["pgrep", "-P", str(gw.server.proc.pid)], capture_output=True, text=True).stdout
    return {int(pid) for pid in out.split()}


def test_beyond_the_spool_bound_events_are_dropped_and_counted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with webhook_receiver() as receiver:
        receiver.down()
        args = export_args(receiver, tmp_path, "--audit-spool-max-size", "16Ki")
        with served_gateway(data, args=args, workers=1) as gw:
            audited(gw, range(0, 60))

            def counted() -> tuple[float, float]:
                return (metric(gw, "bcs_audit_events_spooled_total", backend="webhook"),
                        metric(gw, "bcs_audit_events_dropped_total", backend="webhook", reason="spool_full"))

            # Every event is either spooled or dropped, and counted (the last ones once the
            # buffer is written, within 50 ms).
            spooled, dropped = wait_for(lambda: sum(c := counted()) == 120 and c, 30, "events went uncounted")
            assert 0 < spooled < 60 and dropped > 0
            spool_bytes = sum(p.stat().st_size for p in (data / "audit-spool").glob("webhook/*/*.seg"))
            assert spool_bytes <= 16 * 1024
            receiver.up()
            wait_for(lambda: metric(gw, "bcs_audit_events_sent_total", backend="webhook") >= spooled, 90,
                     "the spooled events were not delivered")
            audited(gw, range(60, 61))  # room again: spooled and delivered
            wait_for(lambda: len(receiver.received()) >= spooled + 2, 60, "the event after the drops never arrived")
    events = receiver.received()
    assert len(events) == spooled + 2
    # What arrives is what was spooled — the oldest events, in order — and the one after.
    assert sequence(events) == (expected(range(60))[: int(spooled)] + expected(range(60, 61)))


def test_batch_mode_never_holds_a_request_on_a_receiver_that_does_not_answer(tmp_path: Path) -> None:
    trap = TrapListener(hold=True)  # accepts, then says nothing: not even the TLS handshake
    try:
        with webhook_receiver() as receiver:
            kubeconfig = receiver.kubeconfig(tmp_path / "siem.kubeconfig")
            kubeconfig.write_text(kubeconfig.read_text().replace(f":{receiver.port}/", f":{trap.port}/"))
            args = ["--audit-webhook-config-file", str(kubeconfig), "--audit-webhook-batch-max-wait", "10ms"]
            with served_gateway(tmp_path / "data", args=args, workers=1) as gw:
                started = time.monotonic()
                audited(gw, range(0, 10))
                took = time.monotonic() - started
                assert wait_until(lambda: trap.accepted >= 1, 30)
    finally:
        trap.close()
    # A request that waited for the export would wait out the connect timeout (5 s) each.
    assert took < 5, took


def test_blocking_mode_answers_only_once_the_request_event_is_delivered(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        args = export_args(receiver, tmp_path, "--audit-webhook-mode", "blocking")
        with served_gateway(tmp_path / "data", args=args, workers=1) as gw:
            for number in range(5):
                audited(gw, range(number, number + 1))
                # Its RequestReceived event was delivered before the answer was sent.
                assert (number, "RequestReceived") in sequence(receiver.received())
            receiver.down()
            audited(gw, range(5, 6))  # blocking, not strict: the request goes on (the event is spooled)
            receiver.up()
            wait_for(lambda: len(receiver.received()) >= 12, 60, "the spooled events never arrived")
    assert sequence(receiver.received()) == expected(range(6))
