"""One backend fed through its durable spool: a bounded buffer, a spool writer and a shipper.

Per process (each gunicorn worker has its own, made on first use or when the worker
starts — never in a master that only builds the application)::

    request thread ── submit() ──► buffer (≤ buffer_size events, else dropped, counted)
                                      │ every 50 ms: one append (+ fsync) of what queued
                                      ▼
                                   spool slot (≤ max_bytes, else dropped, counted)
                                      │ batches of ≤ max_size, after ≤ max_wait, throttled
                                      ▼
                                   backend.process() ── ok: acknowledged (cursor moves)
                                                     └─ failed: retried after a backoff
                                                        (x1.5 up to max_backoff), for as
                                                        long as it takes

In ``batch`` mode a request never waits for any of it: ``submit`` appends to a deque.
In ``blocking`` modes the request thread appends its event to the spool itself and waits
for the shipper to acknowledge it (:class:`~.settings.BatchOptions`).

When the process leaves (``atexit``: a worker's graceful stop or restart) the buffer is
written to the spool and the slot released: the next process to claim it — the restarted
worker — delivers what is left, nothing twice. Only a process killed outright loses its
buffer (at most 50 ms of events; ``blocking`` loses none). Slots of processes that did not
come back are drained by a live one (:func:`.spool.orphans`).
"""

from __future__ import annotations

import atexit
import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import InternalError
from ...core.forksafe import PerProcess
from ...telemetry import metrics
from ..events import AuditEvent
from .backend import AuditBackend, DeliveryFailed, Outcome
from .settings import BatchOptions
from .spool import Spool, SpoolLimits, orphans

log = logging.getLogger(__name__)

__all__ = ["AuditExportUnavailable", "Exporter"]

#: Seconds between the buffer's appends to the spool.
WRITE_PERIOD = 0.05
#: Seconds between looks for slots no process holds.
ORPHAN_PERIOD = 10.0
#: Bytes of events read for one batch at most (``max_size`` bounds the count).
_MAX_BATCH_BYTES = 32 * 1024 * 1024
#: Seconds a leaving process gives its shipper to finish the batch it is sending.
STOP_WAIT = 5.0


class AuditExportUnavailable(InternalError):
    """``blocking-strict``: the request's ``RequestReceived`` event could not be delivered.

    ``500``, as kube-apiserver answers it (``endpoints/filters/audit.go``: "failed to store
    audit event"): the gateway cannot serve the request as its operator requires.
    """

    code_name = "AUDIT_UNAVAILABLE"


@dataclass
class _Running:
    """One process's share of an :class:`Exporter`."""

    spool: Spool
    backend: AuditBackend
    buffer: collections.deque[AuditEvent] = field(default_factory=collections.deque)
    wake: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    acked: threading.Condition = field(default_factory=threading.Condition)
    append_lock: threading.Lock = field(default_factory=threading.Lock)
    #: batches of this process's spool that failed (a blocking request's event in one failed).
    failures: int = 0
    threads: list[threading.Thread] = field(default_factory=list)


class _Throttle:
    """A token bucket: ``qps`` batches a second, ``burst`` at once."""

    def __init__(self, qps: float | None, burst: int) -> None:
        self.qps = qps
        self.burst = float(max(burst, 1))
        self.tokens = self.burst
        self.at = time.monotonic()

    def delay(self) -> float:
        """Seconds to wait before the next batch (0: take a token now)."""
        if self.qps is None:
            return 0.0
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.qps)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.qps


class Exporter:
    """Export audit events to one backend without losing them (see the module docs).

    :param make_backend: builds the backend, once per process.
    :param name: the backend's metrics label and spool folder (``webhook``, ``syslog``).
    :param spool_root: the backend's spool folder (slots in it).
    :param limits: the spool's bound and fsync policy.
    :param batch: mode, buffer, batch size and wait, throttle, backoff.
    """

    def __init__(self, make_backend: Callable[[], AuditBackend], *, name: str, spool_root: Path,
                 limits: SpoolLimits, batch: BatchOptions) -> None:
        self.make_backend = make_backend
        self.name = name
        self.spool_root = spool_root
        self.limits = limits
        self.batch = batch
        self._running: PerProcess[_Running] = PerProcess(self._start)

    # -- the request side ---------------------------------------------------------

    def submit(self, event: AuditEvent) -> None:
        """Hand ``event`` over (see the mode in :class:`~.settings.BatchOptions`).

        :raises AuditExportUnavailable: ``blocking-strict``, a ``RequestReceived`` event not
            delivered within ``blocking_timeout``.
        """
        running = self._running.get()
        if self.batch.mode == "batch":
            if len(running.buffer) >= self.batch.buffer_size:
                metrics.AUDIT_DROPPED.labels(self.name, "buffer_full").inc()
                return
            running.buffer.append(event)
            return
        delivered = self._append_and_wait(running, event)
        if not delivered and self.batch.mode == "blocking-strict" and event.event.get("stage") == "RequestReceived":
            raise AuditExportUnavailable("the audit backend did not take the request's event: the request is "
                                         "refused (audit mode blocking-strict)")

    def _append_and_wait(self, running: _Running, event: AuditEvent) -> bool:
        record = str(event).encode()
        with running.append_lock:
            kept = running.spool.append([record])
            sequence = running.spool.appended
            failures = running.failures
        self._count_appended(running, 1, kept)
        if not kept:
            return False
        running.wake.set()
        deadline = time.monotonic() + self.batch.blocking_timeout
        with running.acked:
            while running.spool.acked < sequence:
                remaining = deadline - time.monotonic()
                # A failed attempt after this event was spooled: it stays spooled, to be sent
                # on a later attempt; the request does not wait for that one.
                if remaining <= 0 or running.failures > failures:
                    return False
                running.acked.wait(remaining)
        return True

    # -- the process's threads ----------------------------------------------------

    def start(self) -> None:
        """Claim this process's spool slot and start its threads (done on first use otherwise)."""
        self._running.get()

    def _start(self) -> _Running:
        spool = Spool.claim(self.spool_root, self.limits)
        if spool.damaged:
            metrics.AUDIT_DROPPED.labels(self.name, "damaged").inc(spool.damaged)
        if spool.pending:
            log.info("audit %s: %d events left in the spool %s are sent first", self.name, spool.pending,
                     spool.directory)
        running = _Running(spool=spool, backend=self.make_backend())
        metrics.AUDIT_SPOOL_BYTES.labels(self.name).set(spool.size)
        for target, label in ((self._write_loop, "writer"), (self._ship_loop, "shipper")):
            thread = threading.Thread(target=target, args=(running,), name=f"bcs-audit-{self.name}-{label}",
                                      daemon=True)
            thread.start()
            running.threads.append(thread)
        atexit.register(self.stop)
        return running

    def _write_loop(self, running: _Running) -> None:
        while not running.stopping.is_set():
            running.stopping.wait(WRITE_PERIOD)
            try:
                self._write_buffer(running)
            except Exception:  # a full disk must not end the writer: the next round tries again
                log.exception("audit %s: writing to the spool %s failed", self.name, running.spool.directory)

    def _write_buffer(self, running: _Running) -> None:
        # Taken and appended under one lock: two callers (the writer, a leaving process) keep the order.
        with running.append_lock:
            events: list[AuditEvent] = []
            while running.buffer:
                try:
                    events.append(running.buffer.popleft())
                except IndexError:
                    break
            if not events:
                return
            records = [str(event).encode() for event in events]
            kept = running.spool.append(records)
        self._count_appended(running, len(records), kept)
        running.wake.set()

    def _count_appended(self, running: _Running, offered: int, kept: int) -> None:
        if kept:
            metrics.AUDIT_SPOOLED.labels(self.name).inc(kept)
        if kept < offered:
            metrics.AUDIT_DROPPED.labels(self.name, "spool_full").inc(offered - kept)
            log.warning("audit %s: the spool is at its bound (%d bytes): %d events dropped", self.name,
                        self.limits.max_bytes, offered - kept)
        metrics.AUDIT_SPOOL_BYTES.labels(self.name).set(running.spool.size)

    def _ship_loop(self, running: _Running) -> None:
        throttle = _Throttle(self.batch.throttle_qps, self.batch.throttle_burst)
        backoff = self.batch.initial_backoff
        waiting_since: float | None = None
        next_orphan_look = time.monotonic()
        max_wait = self.batch.max_wait if self.batch.mode == "batch" else 0.0
        while not running.stopping.is_set():
            spool = running.spool
            if not spool.pending:
                waiting_since = None
                if time.monotonic() >= next_orphan_look:
                    next_orphan_look = time.monotonic() + ORPHAN_PERIOD
                    self._drain_orphans(running, throttle)
                running.wake.wait(1.0)
                running.wake.clear()
                continue
            now = time.monotonic()
            if spool.pending < self.batch.max_size and max_wait > 0:
                waiting_since = waiting_since or now
                if now - waiting_since < max_wait:
                    running.wake.wait(max_wait - (now - waiting_since))
                    running.wake.clear()
                    continue
            if not self._ship_one(running, spool, throttle):
                self._pause(running, backoff)
                backoff = min(backoff * 1.5, self.batch.max_backoff)
                continue
            backoff = self.batch.initial_backoff
            waiting_since = None

    def _ship_one(self, running: _Running, spool: Spool, throttle: _Throttle) -> bool:
        """Send one batch of ``spool``; ``False`` when it failed (to be retried)."""
        delay = throttle.delay()
        if delay:
            self._pause(running, delay)
            return True
        records = spool.read(self.batch.max_size, _MAX_BATCH_BYTES)
        if not records:
            return True
        try:
            outcome = running.backend.process(records)
        except DeliveryFailed as failure:
            self._acknowledge(running, spool, failure.outcome)
            spool.rewind()
            left = len(records) - failure.outcome.done
            metrics.AUDIT_RETRIED.labels(self.name).inc(left)
            if spool is running.spool:
                with running.acked:
                    running.failures += 1
                    running.acked.notify_all()
            log.warning("audit %s: %s; %d events will be retried (%d waiting in the spool)", self.name,
                        failure, left, spool.pending)
            return False
        except Exception:
            spool.rewind()
            log.exception("audit %s: the backend failed unexpectedly; the batch will be retried", self.name)
            return False
        self._acknowledge(running, spool, outcome)
        if outcome.done < len(records):
            spool.rewind()
        return True

    def _acknowledge(self, running: _Running, spool: Spool, outcome: Outcome) -> None:
        spool.ack(outcome.done)
        if outcome.delivered:
            metrics.AUDIT_SENT.labels(self.name).inc(outcome.delivered)
        if outcome.dropped:
            metrics.AUDIT_DROPPED.labels(self.name, "rejected").inc(outcome.dropped)
        if spool is running.spool:
            metrics.AUDIT_SPOOL_BYTES.labels(self.name).set(spool.size)
            with running.acked:
                running.acked.notify_all()

    def _drain_orphans(self, running: _Running, throttle: _Throttle) -> None:
        for orphan in orphans(self.spool_root, self.limits):
            log.info("audit %s: sending the %d events left in %s by a process that is gone", self.name,
                     orphan.pending, orphan.directory)
            try:
                backoff = self.batch.initial_backoff
                while orphan.pending and not running.stopping.is_set():
                    if not self._ship_one(running, orphan, throttle):
                        self._pause(running, backoff)
                        backoff = min(backoff * 1.5, self.batch.max_backoff)
                    if running.spool.pending >= self.batch.max_size:
                        return  # this process's own events come first; the orphan is taken up again later
            finally:
                orphan.close()

    def _pause(self, running: _Running, seconds: float) -> None:
        # Jitter (kube-apiserver's backoff has 0.2): instances recovering together spread out.
        seconds *= 1 + 0.2 * random.random()  # noqa: S311 - not a secret
        if self.batch.mode == "batch":
            running.stopping.wait(seconds)
            return
        # Blocking modes: a request waiting for its event cuts the backoff short, as each of
        # kube-apiserver's blocking requests makes its own call.
        running.wake.clear()
        running.wake.wait(seconds)

    # -- leaving ------------------------------------------------------------------

    def stop(self, timeout: float = STOP_WAIT) -> None:
        """Write the buffer to the spool, stop the threads, release the slot (idempotent)."""
        running = self._running.peek()
        if running is None or running.stopping.is_set():
            return
        running.stopping.set()
        running.wake.set()
        deadline = time.monotonic() + timeout
        writer, shipper = running.threads
        writer.join(max(deadline - time.monotonic(), 0.0))
        # The buffer first: gunicorn kills a worker that outlives its graceful timeout, and a
        # batch being sent must not cost the events still in memory.
        try:
            self._write_buffer(running)
        except OSError:
            log.exception("audit %s: writing the last events to the spool failed", self.name)
        shipper.join(max(deadline - time.monotonic(), 0.0))
        if any(thread.is_alive() for thread in running.threads):
            # A send still running (a receiver that does not answer): the slot stays held
            # until the process is gone, so no other process reads it meanwhile.
            log.warning("audit %s: a delivery was still running at exit; the spool is kept", self.name)
            return
        running.backend.shutdown()
        running.spool.close()

    def drain(self, timeout: float) -> bool:
        """Write the buffer and wait until the spool is empty (tests, tools); ``False`` on timeout."""
        running = self._running.get()
        self._write_buffer(running)
        deadline = time.monotonic() + timeout
        while running.spool.pending:
            if time.monotonic() > deadline:
                return False
            running.wake.set()
            time.sleep(0.02)
        return True
