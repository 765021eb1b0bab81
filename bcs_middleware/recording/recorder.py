"""Session recording as a service: the policy per cluster, one :class:`Recording` per session, and
the process's writer that turns what the splices saw into asciicast text in the store.

The splice only appends what it read to the session's queue (:meth:`Recording.observe`); a
background writer, one per process (a greenlet under gevent, a thread under gthread), decodes
the queued bytes (:class:`~.cast.CastEncoder`) and writes them every :data:`PERIOD`. Every call
into the store — creating a recording, writing, closing, heartbeats, retention — runs on a
small pool of operating-system threads (:class:`~bcs_middleware.core.offload.Offload`): a store
whose ``open()`` or ``write()`` hangs in the kernel (NFS, a full FUSE mount) holds those
threads, never the gevent worker's other requests, and a call that does not return in time is
the recording's failure (creating: ``stall_timeout``; writing: twice that). Between the
two sits a bounded buffer (``buffer`` bytes per session): when it is full the splice stops
reading (:meth:`Recording.hold`, like a slow client would make it) until the writer catches up;
when the writer takes nothing for ``stall_timeout`` the recording has failed, and the policy
decides — ``on``: the session goes on unrecorded (counted in ``bcs_recording_failures_total``),
``required``: the session is cut. A failed write is the same failure. Memory per session is
bounded by the buffer whatever the session's size.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ..core.forksafe import PerProcess
from ..core.offload import Offload, OffloadBusy, OffloadTimeout
from ..core.printable import escape
from ..telemetry import metrics
from .cast import CastEncoder, Item
from .catalog import RecordingSink, RecordingStore, RecordingUnavailable, SessionInfo
from .liveness import holder_gone, process_identity
from .settings import Mode, RecordingSettings

__all__ = ["PERIOD", "Recording", "SessionRecorder"]

log = logging.getLogger(__name__)

#: Seconds between two passes of the writer.
PERIOD = 0.02

#: Threads for the store's calls per process, and the most calls outstanding on them: enough
#: for the writer and sessions starting meanwhile; when a hung store holds them all, a new
#: call fails at once instead of queueing without bound.
STORE_THREADS = 2
STORE_PENDING = 16

#: Runs one store call bounded in time; :class:`RecordingUnavailable` when it cannot.
StoreCall = Callable[..., Any]


def _direct(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Recording:
    """One session being recorded: what the splice saw, queued (bounded) for the writer.

    :meth:`observe` and :meth:`hold` are the splice's
    (:class:`~bcs_middleware.core.splice.SpliceTap`); the rest is the writer's and the caller's.
    """

    def __init__(self, info: SessionInfo, sink: RecordingSink, *, mode: Mode, limit: int,
                 stall_timeout: float, stdin: bool, clock: Callable[[], float],
                 store_call: StoreCall = _direct, max_size: int | None = None) -> None:
        self.info = info
        self.mode = mode
        self._sink = sink
        self._store_call = store_call
        self._limit = limit
        self._stall = stall_timeout
        self._stdin = stdin
        self._clock = clock
        self._max_size = max_size
        #: bytes written to the store so far (the writer's).
        self.written = 0
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

    def start(self, transport: str, first: bytes = b"", *, subprotocol: str = "") -> None:
        """The upstream answered ``101`` (WebSocket: naming ``subprotocol``): record from now;
        ``first`` came right behind its head."""
        now = self._clock()
        self.started = now
        self._encoder = CastEncoder(transport, started=now, timestamp=self.info.started_at.timestamp(),
                                    stdin=self._stdin, title=_title(self.info), subprotocol=subprotocol)
        if first:
            self.observe(False, first)

    def fail(self, stage: str, reason: str) -> None:
        if self.failure:
            return
        self.failure = reason
        self._queue.clear()  # nothing more is written: hold no more of it
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
            self._write(self._encoder.encode(items))
        except RecordingUnavailable as exc:
            self.fail("write", str(exc))
        finally:
            self.consumed += taken

    def _write(self, text: str) -> None:
        """Write ``text``, or the whole lines of it that keep the recording within its bound.

        Retention deletes finished recordings only, so a live one is bounded here (by one user's
        bound, which the per-user cap on long-running requests multiplies at most). Past it the
        recording fails: ``on`` lets the session go on unrecorded, ``required`` cuts it.
        """
        if not text:
            return
        data = text.encode()
        over = self._max_size is not None and self.written + len(data) > self._max_size
        if over:
            assert self._max_size is not None
            # Every event is one line: what is cut after a line break is still a playable cast.
            data = data[:data.rfind(b"\n", 0, self._max_size - self.written) + 1]
            text = data.decode()
        if data:
            self._store_call(self._sink.write, text)
            self.written += len(data)
        if over:
            self.fail("size", f"the recording reached its bound of {self._max_size} bytes "
                              "(recording_max_size_per_user, else recording_max_size)")

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
                self._write(self._encoder.finish(self._ending or self._clock()))
        except RecordingUnavailable as exc:
            self.fail("finish", str(exc))
        status = "failed" if self.failure else "complete" if summary.status == "recording" else summary.status
        self.info = summary.ended(status=status, failure=self.failure, exit_code=self.exit_code)
        try:
            self._store_call(self._sink.close, self.info)
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
    last_pass: float | None = None
    last_heartbeat: float | None = None


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
        self._offload = Offload(threads=STORE_THREADS, pending=STORE_PENDING, name="bcs-recording-store")

    def _store_call(self, timeout: float) -> StoreCall:
        """Calls into the store on the offload's threads, each at most ``timeout`` seconds."""
        def call(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return self._offload.call(fn, *args, timeout=timeout)
            except OffloadTimeout:
                raise RecordingUnavailable(f"the recording store did not answer within {timeout:g}s") from None
            except OffloadBusy:
                raise RecordingUnavailable("the recording store is not answering (its threads are all held)") \
                    from None

        return call

    def _maintenance(self) -> StoreCall:
        # Heartbeats, recovery and retention: bounded like a write, so a hung store costs the
        # writer (and the recordings it serves) no more than a write would.
        return self._store_call(2 * self.settings.stall_timeout)

    def mode_for(self, cluster_id: str) -> Mode:
        return self.settings.mode_for(cluster_id)

    def begin(self, info: SessionInfo, mode: Mode) -> Recording:
        """Create the session's recording in the store; :class:`RecordingUnavailable` when it cannot be."""
        info = info.ended(id=uuid.uuid4().hex, stdin_recorded=self.settings.stdin, holder=process_identity())
        try:
            sink = self._store_call(self.settings.stall_timeout)(self.store.create, info)
        except RecordingUnavailable:
            metrics.RECORDING_FAILURES.labels("create").inc()
            raise
        recording = Recording(info, sink, mode=mode, limit=self.settings.buffer,
                              stall_timeout=self.settings.stall_timeout, stdin=self.settings.stdin,
                              clock=self._clock, store_call=self._store_call(2 * self.settings.stall_timeout),
                              max_size=self.settings.max_bytes_per_recording)
        writer = self._writer.get()
        with writer.lock:
            writer.active.add(recording)
        self.start()
        writer.wake.set()  # an idle writer waits for its next retention pass: now it has work
        return recording

    def start(self) -> None:
        """Run this process's writer (idempotent): it writes the sessions, beats their hearts,
        and applies retention at once and every ``retention_interval`` (:meth:`maintain`)."""
        writer = self._writer.get()
        with writer.lock:
            if writer.thread is None or not writer.thread.is_alive():
                writer.thread = threading.Thread(target=self._run, args=(writer,), name="bcs-recorder", daemon=True)
                writer.thread.start()

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
            writer.wake.wait(self._next_wait(writer))
            writer.wake.clear()
            with writer.lock:
                active = list(writer.active)
            for recording in active:
                self._serve(writer, recording)
            now = self._clock()
            if writer.last_heartbeat is None or now - writer.last_heartbeat >= self.settings.heartbeat_every:
                writer.last_heartbeat = now
                self._heartbeat([r.info.id for r in active if not r.ending])
            if writer.last_pass is None or now - writer.last_pass >= self.settings.retention_interval:
                writer.last_pass = now
                self.maintain()

    def _next_wait(self, writer: _Writer) -> float:
        """How long the writer sleeps: a period while it has recordings, else until its next
        retention pass (:meth:`begin` wakes it). So a worker whose clusters record nothing (the
        policy turned off after sessions were recorded) still applies retention and ends the
        sessions a dead worker left, at no cost in between."""
        if writer.active or writer.last_pass is None:
            return self._period
        return max(self._period, writer.last_pass + self.settings.retention_interval - self._clock())

    def _heartbeat(self, session_ids: list[str]) -> None:
        if not session_ids:
            return
        try:
            self._maintenance()(self.store.heartbeat, session_ids, datetime.now(UTC))
        except Exception as exc:  # the writer goes on: a missed heartbeat is only a later one
            log.warning("recording heartbeat failed: %s", type(exc).__name__)

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

    def maintain(self) -> tuple[int, int]:
        """One pass (the writer's, every ``retention_interval``): end the sessions whose writer
        is gone (:meth:`recover`), then apply retention (:meth:`prune`); how many of each."""
        return self.recover(), self.prune()

    def recover(self) -> int:
        """End as ``interrupted`` each session still marked ``recording`` whose writer process is
        gone (on this host) or silent for ``heartbeat_timeout`` (anywhere), what it wrote kept."""
        now = datetime.now(UTC)
        writer = self._writer.get()
        with writer.lock:
            mine = {r.info.id for r in writer.active}
        try:
            running = self._maintenance()(self.store.in_progress)
        except Exception as exc:
            log.warning("listing the recordings in progress failed: %s", type(exc).__name__)
            return 0
        ended = 0
        for info in running:
            if info.id in mine:
                continue
            last = info.heartbeat_at or info.started_at
            gone = holder_gone(info.holder)
            silent = (now - last).total_seconds() > self.settings.heartbeat_timeout
            if not (gone or (gone is None and silent)):
                continue
            why = "its writer process is gone" if gone else \
                f"its writer gave no sign of life for {self.settings.heartbeat_timeout:g}s"
            try:
                ended_info = info.ended(status="interrupted", ended_at=max(last, info.started_at),
                                        failure=f"the session's recording was cut short: {why}")
                self._maintenance()(self.store.interrupt, ended_info)
            except RecordingUnavailable as exc:
                log.warning("ending the interrupted recording %s failed: %s", info.id, exc)
                continue
            ended += 1
            metrics.RECORDINGS.labels("interrupted").inc()
            log.warning("recording %s of a session of %s on cluster %s was interrupted (%s): ended, what it "
                        "wrote kept", info.id, escape(info.user), escape(info.cluster_id), why)
        return ended

    def prune(self) -> int:
        """Apply retention now (:mod:`.retention`)."""
        try:
            deleted = self._maintenance()(functools.partial(self.store.prune, now=datetime.now(UTC),
                                                            retention=self.settings.retention))
        except Exception as exc:
            log.warning("pruning recordings failed: %s", type(exc).__name__)
            return 0
        if deleted:
            log.info("retention deleted %d recordings", deleted)
        return deleted
