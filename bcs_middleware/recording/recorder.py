"""Session recording as a service: the policy per cluster, one :class:`Recording` per session, and
the process's writer that turns what the splices saw into asciicast text in the store.

The splice only appends what it read to the session's queue (:meth:`Recording.observe`); a
background writer, one per process (a greenlet under gevent, a thread under gthread), decodes
the queued bytes (:class:`~.cast.CastEncoder`) and writes them every :data:`PERIOD`. Between the
two sits a bounded buffer (``buffer`` bytes per session): when it is full the splice stops
reading (:meth:`Recording.hold`, like a slow client would make it) until the writer catches up;
when the writer takes nothing for ``stall_timeout`` the recording has failed, and the policy
decides — ``on``: the session goes on unrecorded (counted in ``bcs_recording_failures_total``),
``required``: the session is cut. A failed write is the same failure. Memory per session is
bounded by the buffer whatever the session's size.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from ..core.forksafe import PerProcess
from ..core.printable import escape
from ..telemetry import metrics
from .cast import CastEncoder, Item
from .catalog import RecordingSink, RecordingStore, RecordingUnavailable, SessionInfo
from .settings import Mode, RecordingSettings

__all__ = ["PERIOD", "Recording", "SessionRecorder"]

log = logging.getLogger(__name__)

#: Seconds between two passes of the writer.
PERIOD = 0.02
#: Seconds between two retention passes of a process.
PRUNE_EVERY = 600.0


class Recording:
    """One session being recorded: what the splice saw, queued (bounded) for the writer.

    :meth:`observe` and :meth:`hold` are the splice's
    (:class:`~bcs_middleware.core.splice.SpliceTap`); the rest is the writer's and the caller's.
    """

    def __init__(self, info: SessionInfo, sink: RecordingSink, *, mode: Mode, limit: int,
                 stall_timeout: float, stdin: bool, clock: Callable[[], float]) -> None:
        self.info = info
        self.mode = mode
        self._sink = sink
        self._limit = limit
        self._stall = stall_timeout
        self._stdin = stdin
        self._clock = clock
        self._queue: collections.deque[Item] = collections.deque()
        # Two counters, each written by one side only: what the splice queued, what the writer took.
        self.produced = 0
        self.consumed = 0
        self._full_since: float | None = None
        self.failure = ""
        self._encoder: CastEncoder | None = None
        self._ending: float | None = None
        self._summary = info
        self.done = threading.Event()
        self.started = clock()

    # -- the splice's side -------------------------------------------------------------

    def observe(self, to_upstream: bool, data: bytes) -> None:
        if self.failure or self._encoder is None:
            return
        self._queue.append((self._clock(), to_upstream, data))
        self.produced += len(data)

    def hold(self) -> Literal["go", "wait", "cut"]:
        if self.failure:
            return "cut" if self.mode == "required" else "go"
        if self.produced - self.consumed < self._limit:
            self._full_since = None
            return "go"
        now = self._clock()
        if self._full_since is None:
            self._full_since = now
        elif now - self._full_since > self._stall:
            self.fail("stall", f"the store took nothing for {self._stall:g}s")
            return "cut" if self.mode == "required" else "go"
        return "wait"

    # -- the caller's side -------------------------------------------------------------

    def start(self, transport: str, first: bytes = b"") -> None:
        """The upstream answered ``101``: record from now; ``first`` came right behind its head."""
        now = self._clock()
        self.started = now
        self._encoder = CastEncoder(transport, started=now, timestamp=self.info.started_at.timestamp(),
                                    stdin=self._stdin, title=_title(self.info))
        if first:
            self.observe(False, first)

    def fail(self, stage: str, reason: str) -> None:
        if self.failure:
            return
        self.failure = reason
        metrics.RECORDING_FAILURES.labels(stage).inc()
        log.warning("recording %s of a session on cluster %s failed (%s); policy %s: %s", self.info.id,
                    escape(self.info.cluster_id), reason, self.mode,
                    "the session is cut" if self.mode == "required" else "the session goes on unrecorded")

    @property
    def exit_code(self) -> int | None:
        return self._encoder.exit_code if self._encoder is not None else None

    # -- the writer's side -------------------------------------------------------------

    def write_pending(self) -> None:
        """Encode and write what is queued (the writer thread)."""
        items: list[Item] = []
        taken = 0
        while self._queue:
            item = self._queue.popleft()
            items.append(item)
            taken += len(item[2])
        if self.failure or self._encoder is None:
            self.consumed += taken
            return
        try:
            text = self._encoder.encode(items)
            if text:
                self._sink.write(text)
        except RecordingUnavailable as exc:
            self.fail("write", str(exc))
        finally:
            self.consumed += taken

    def end(self, when: float, summary: SessionInfo) -> None:
        """The session ended at ``when`` as ``summary`` says: the writer finishes the recording."""
        self._summary = summary
        self._ending = when

    @property
    def ending(self) -> bool:
        return self._ending is not None

    def close(self) -> None:
        """The last of it (the writer thread): flush, describe, close."""
        summary = self._summary
        try:
            if self._encoder is not None and not self.failure:
                rest = self._encoder.finish(self._ending or self._clock())
                if rest:
                    self._sink.write(rest)
        except RecordingUnavailable as exc:
            self.fail("finish", str(exc))
        status = "failed" if self.failure else "complete" if summary.status == "recording" else summary.status
        self.info = summary.ended(status=status, failure=self.failure, exit_code=self.exit_code)
        try:
            self._sink.close(self.info)
        except RecordingUnavailable as exc:
            self.fail("finish", str(exc))
            self.info = self.info.ended(status="failed", failure=self.failure)
        metrics.RECORDINGS.labels("failed" if self.failure else "recorded").inc()


def _title(info: SessionInfo) -> str:
    target = f"{info.namespace}/{info.pod}" if info.namespace else info.pod
    command = " ".join(info.command)
    return f"{info.user} {info.subresource} {info.cluster_id}:{target}" + (f" -- {command}" if command else "")


@dataclass
class _Writer:
    """The process's writer: the recordings in progress and the thread serving them."""

    active: set[Recording] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    last_prune: float = 0.0


class SessionRecorder:
    """Decides whether a session is recorded, starts its :class:`Recording`, writes it.

    :param store: where recordings live (:class:`~.directory.DirectoryStore`, or the database's
        :class:`~bcs_middleware.store.recordings.RecordingRepository`).
    :param settings: the policy, stdin, buffer and retention.
    """

    def __init__(self, store: RecordingStore, settings: RecordingSettings, *,
                 clock: Callable[[], float] = time.monotonic, period: float = PERIOD) -> None:
        self.store = store
        self.settings = settings
        self._clock = clock
        self._period = period
        self._writer: PerProcess[_Writer] = PerProcess(_Writer)

    def mode_for(self, cluster_id: str) -> Mode:
        return self.settings.mode_for(cluster_id)

    def begin(self, info: SessionInfo, mode: Mode) -> Recording:
        """Create the session's recording in the store; :class:`RecordingUnavailable` when it cannot be."""
        info = info.ended(id=uuid.uuid4().hex, stdin_recorded=self.settings.stdin)
        try:
            sink = self.store.create(info)
        except RecordingUnavailable:
            metrics.RECORDING_FAILURES.labels("create").inc()
            raise
        recording = Recording(info, sink, mode=mode, limit=self.settings.buffer,
                              stall_timeout=self.settings.stall_timeout, stdin=self.settings.stdin,
                              clock=self._clock)
        writer = self._writer.get()
        with writer.lock:
            writer.active.add(recording)
            if writer.thread is None or not writer.thread.is_alive():
                writer.thread = threading.Thread(target=self._run, args=(writer,), name="bcs-recorder", daemon=True)
                writer.thread.start()
        return recording

    def finish(self, recording: Recording, summary: SessionInfo) -> SessionInfo:
        """End the recording and wait (at most ``stall_timeout``) until the writer has closed it."""
        recording.end(self._clock(), summary)
        writer = self._writer.get()
        writer.wake.set()
        if not recording.done.wait(self.settings.stall_timeout + 1.0):
            recording.fail("finish", "the store did not finish the recording in time")
            return summary.ended(id=recording.info.id, status="failed", failure=recording.failure)
        return recording.info

    def _run(self, writer: _Writer) -> None:
        while True:
            writer.wake.wait(self._period)
            writer.wake.clear()
            with writer.lock:
                active = list(writer.active)
            for recording in active:
                self._serve(writer, recording)
            now = self._clock()
            if now - writer.last_prune >= PRUNE_EVERY:
                writer.last_prune = now
                self.prune()

    def _serve(self, writer: _Writer, recording: Recording) -> None:
        try:
            recording.write_pending()
            if recording.ending:
                recording.write_pending()
                recording.close()
                with writer.lock:
                    writer.active.discard(recording)
                recording.done.set()
        except Exception:  # a recording must never take the writer (and every other recording) down
            log.exception("recording %s: unexpected error", recording.info.id)
            recording.fail("write", "unexpected error")
            with writer.lock:
                writer.active.discard(recording)
            recording.done.set()

    def prune(self) -> int:
        """Apply retention now (the writer does every :data:`PRUNE_EVERY` seconds)."""
        try:
            deleted = self.store.prune(now=datetime.now(UTC), max_age=self.settings.max_age,
                                       max_bytes=self.settings.max_bytes)
        except Exception as exc:
            log.warning("pruning recordings failed: %s", type(exc).__name__)
            return 0
        if deleted:
            log.info("retention deleted %d recordings", deleted)
        return deleted
