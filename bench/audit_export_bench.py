"""What the audit export costs: the spool's appends (fsync on and off), its reads, and events a
second delivered end to end to a real HTTPS webhook receiver.

    python bench/audit_export_bench.py [--events 20000] [--event-bytes 900] [--batch 100]

Figures go to bench/README.md ("audit_export_bench.py").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bcs_middleware.audit.events import AuditEvent
from bcs_middleware.audit.export.exporter import Exporter
from bcs_middleware.audit.export.settings import BatchOptions
from bcs_middleware.audit.export.spool import Spool, SpoolLimits
from bcs_middleware.audit.export.webhook import WebhookBackend, WebhookTarget
from bcs_middleware.outbound.transport import PooledTransport
from tests.audit.export.receivers import webhook_receiver


def event(number: int, size: int) -> AuditEvent:
    return AuditEvent({"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
                       "auditID": f"{number:08d}", "stage": "ResponseComplete", "pad": "x" * max(size - 120, 0)})


def spool_figures(events: int, size: int, batch: int, fsync: bool) -> tuple[float, float]:
    records = [str(event(n, size)).encode() for n in range(events)]
    with tempfile.TemporaryDirectory() as folder:
        spool = Spool.claim(Path(folder), SpoolLimits(max_bytes=1 << 34, fsync=fsync))
        started = time.perf_counter()
        for start in range(0, events, batch):
            spool.append(records[start:start + batch])
        appended = time.perf_counter() - started
        started = time.perf_counter()
        while chunk := spool.read(400, 32 << 20):
            spool.ack(len(chunk))
        read = time.perf_counter() - started
        spool.close()
    return events / appended, events / read


def delivered_per_second(events: int, size: int) -> float:
    with webhook_receiver() as receiver, tempfile.TemporaryDirectory() as folder:
        target = WebhookTarget(server=f"https://localhost:{receiver.port}/audit",
                               ca_pem=receiver.ca.cert_pem.bytes().decode(), token=receiver.token)
        transport = PooledTransport()
        exporter = Exporter(lambda: WebhookBackend(target, transport=transport), name="webhook",
                            spool_root=Path(folder), limits=SpoolLimits(max_bytes=1 << 34),
                            batch=BatchOptions(max_wait=0.05, throttle_qps=None, buffer_size=events))
        exporter.start()
        started = time.perf_counter()
        submit = time.perf_counter()
        for number in range(events):
            exporter.submit(event(number, size))
        submit = time.perf_counter() - submit
        assert exporter.drain(300)
        took = time.perf_counter() - started
        exporter.stop()
        assert len(receiver.received()) == events
    print(f"  submit() on the request thread: {submit / events * 1e6:.2f} us per event")
    return events / took


def main() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--event-bytes", type=int, default=900)
    parser.add_argument("--batch", type=int, default=100, help="events per append (the writer's 50 ms batch)")
    args = parser.parse_args()
    for fsync in (True, False):
        append, read = spool_figures(args.events, args.event_bytes, args.batch, fsync)
        print(f"spool, fsync={fsync}: append {append:,.0f} events/s (batches of {args.batch}), "
              f"read+ack {read:,.0f} events/s")
    print(f"webhook end to end: {delivered_per_second(args.events, args.event_bytes):,.0f} events/s delivered")


if __name__ == "__main__":
    main()
