"""The exporter in one process: what a leaving process keeps, the throttle, blocking's waits."""

from __future__ import annotations

import time
from pathlib import Path

from bcs_middleware.audit.events import AuditEvent
from bcs_middleware.audit.export.exporter import Exporter, _Throttle
from bcs_middleware.audit.export.settings import BatchOptions
from bcs_middleware.audit.export.spool import Spool, SpoolLimits
from bcs_middleware.audit.export.webhook import WebhookBackend, WebhookTarget
from bcs_middleware.outbound.transport import PooledTransport
from bcs_middleware.telemetry import metrics
from tests.audit.export.receivers import WebhookReceiver, webhook_receiver
from tests.support.polling import wait_for


def event(number: int, stage: str = "ResponseComplete") -> AuditEvent:
    return AuditEvent({"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
                       "auditID": str(number), "stage": stage})


def exporter(receiver: WebhookReceiver, root: Path, **batch: object) -> Exporter:
    target = WebhookTarget(server=f"https://localhost:{receiver.port}/audit",
                           ca_pem=receiver.ca.cert_pem.bytes().decode(), token=receiver.token)
    options = {"max_wait": 0.05, "initial_backoff": 0.1, "throttle_qps": None, **batch}
    return Exporter(lambda: WebhookBackend(target, transport=PooledTransport(connect_timeout=2), timeout=5),
                    name="webhook", spool_root=root, limits=SpoolLimits(), batch=BatchOptions(**options))  # type: ignore[arg-type]


def test_a_leaving_process_spools_what_it_still_held_in_memory(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        receiver.down()
        sender = exporter(receiver, tmp_path, max_wait=30.0)
        sender.start()
        for number in range(50):
            sender.submit(event(number))
        sender.stop()  # at once: most are still in the buffer, none was delivered
        assert receiver.received() == []
    spool = Spool.claim(tmp_path, SpoolLimits())
    assert spool.pending == 50
    got = spool.read(100, 1 << 20)
    assert [b'"auditID":"%d"' % n in record for n, record in enumerate(got)] == [True] * 50


def test_delivery_resumes_after_the_backoff_once_the_receiver_is_back(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        receiver.down()
        sender = exporter(receiver, tmp_path)
        for number in range(5):
            sender.submit(event(number))
        retried = metrics.AUDIT_RETRIED.labels("webhook")._value.get()
        # The outage lasts until at least two attempts failed (the second after a backoff).
        wait_for(lambda: metrics.AUDIT_RETRIED.labels("webhook")._value.get() >= retried + 10, 30,
                 "the exporter did not retry")
        receiver.up()
        wait_for(lambda: len(receiver.received()) == 5, 30, "not delivered after the outage")
        sender.stop()
    assert [e["auditID"] for e in receiver.received()] == ["0", "1", "2", "3", "4"]


def test_blocking_waits_for_delivery_and_not_longer_than_a_failed_attempt(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        sender = exporter(receiver, tmp_path, mode="blocking", blocking_timeout=20.0)
        sender.submit(event(0, "RequestReceived"))
        assert [e["auditID"] for e in receiver.received()] == ["0"]  # delivered before submit returned
        receiver.down()
        started = time.monotonic()
        sender.submit(event(1, "RequestReceived"))
        assert time.monotonic() - started < 10  # the refused connection ends the wait, not the 20 s
        receiver.up()
        wait_for(lambda: len(receiver.received()) == 2, 30, "the spooled event was not sent later")
        sender.stop()


def test_the_throttle_lets_a_burst_through_then_spaces_batches() -> None:
    throttle = _Throttle(qps=10.0, burst=3)
    assert [throttle.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert 0.05 < throttle.delay() <= 0.1
    assert _Throttle(qps=None, burst=1).delay() == 0.0
