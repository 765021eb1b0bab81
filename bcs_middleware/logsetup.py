"""Logging for ``bcs-middleware serve``: plain lines on stderr, the access log as JSON lines on stdout.

The access log is written by :class:`LineWriterHandler`: request threads only append
the record's message to a deque, and one writer thread per process turns whatever has
queued up into text and writes it every 50 ms in a single ``write``. Under gunicorn's
threads every syscall and every contended lock on a request thread hands the
interpreter lock to another thread, so (measured, bench/README.md):

* writing (and flushing) a line per request on the request thread cost about a fifth
  of the tunnel's throughput;
* a ``queue.Queue`` (a mutex and a condition per put) and a writer holding the
  handler's lock across its ``write`` still cost about a tenth: request threads
  blocked on that lock while the write released the interpreter lock.

So the deque needs no lock (``append``/``popleft`` are atomic), the writer takes only
its own lock, and a message that formats itself lazily (the access line) is
formatted on the writer thread.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, TextIO

_BATCH = 512
_PERIOD = 0.05  # seconds a line may wait before it is written


class LineWriterHandler(logging.Handler):
    """Write each record's message as one line to ``stream``, from a background thread.

    A record without ``args`` has its ``msg`` queued as it is and turned into text
    (``str()``) on the writer thread, so a message object may defer its formatting
    (``record.getMessage()`` gives the same text anywhere). Fork-safe: a process that
    finds itself forked starts its own writer on first use. Lines are never dropped:
    when ``max_queued`` are waiting (the stream is stuck) the request thread writes
    its line itself. Whatever is queued is written at exit.
    """

    def __init__(self, stream: TextIO, *, max_queued: int = 65536) -> None:
        super().__init__()
        self.stream = stream
        self.max_queued = max_queued
        self._started = False
        self._pending: collections.deque[Any] = collections.deque()
        self._start_lock = threading.Lock()
        # Not the handler's own lock (``Handler.handle`` takes that around every
        # emit): request threads must never wait for a write in progress.
        self._write_lock = threading.Lock()
        # A fork hook rather than a getpid() per line (a syscall per request).
        _handlers.add(self)

    def _forget(self) -> None:
        """In a forked child: the parent's writer thread and lines are not ours."""
        self._started = False
        self._pending = collections.deque()
        self._start_lock = threading.Lock()
        self._write_lock = threading.Lock()

    def _ensure_writer(self) -> None:
        if self._started:
            return
        with self._start_lock:
            if self._started:
                return
            threading.Thread(target=self._run, name="bcs-access-log", daemon=True).start()
            atexit.register(self.drain)
            self._started = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.submit(record.getMessage() if record.args else record.msg)
        except Exception:
            self.handleError(record)

    def submit(self, message: Any) -> None:
        """Queue one message (``str()`` is taken on the writer thread)."""
        self._ensure_writer()
        if len(self._pending) < self.max_queued:
            self._pending.append(message)
        else:
            self._write([message])

    @classmethod
    def sole_handler(cls, logger: logging.Logger, level: int) -> LineWriterHandler | None:
        """The handler when it alone would see ``logger``'s records at ``level``, unfiltered.

        Then a caller may :meth:`submit` its message directly: building a
        ``LogRecord`` only for this handler to take its ``msg`` back costs more than
        the rest of the line's handling (bench/README.md).
        """
        handlers = logger.handlers
        if len(handlers) != 1 or logger.propagate or logger.filters or logger.disabled:
            return None
        handler = handlers[0]
        if type(handler) is not cls or handler.filters or handler.level > level:
            return None
        return handler

    def _run(self) -> None:
        # Polling on a short period rather than waking on every append: a wake-up per
        # request would hand the interpreter lock to this thread once per request.
        while True:
            time.sleep(_PERIOD)
            self.drain()

    def drain(self) -> None:
        """Write everything queued so far (the writer thread, and once at exit)."""
        pending = self._pending
        batch: list[Any] = []
        while pending:
            try:
                batch.append(pending.popleft())
            except IndexError:
                break
            if len(batch) >= _BATCH:
                self._write(batch)
                batch = []
        if batch:
            self._write(batch)

    def _write(self, messages: list[Any]) -> None:
        lines = []
        for message in messages:
            try:
                lines.append(str(message))
            except Exception:  # a message that cannot format itself loses only its own line
                lines.append("<unformattable log message>")
        with self._write_lock:
            try:
                self.stream.write("\n".join(lines) + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # stdout gone (closed pipe): nothing sensible left to do with a log line


_handlers: weakref.WeakSet[LineWriterHandler] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for handler in list(_handlers):
        handler._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


def configure_logging(level: str) -> None:
    """Idempotent: the ``bcs_middleware`` loggers to stderr, the access log to stdout."""
    root = logging.getLogger("bcs_middleware")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level.upper())
    access = logging.getLogger("bcs_middleware.access")
    if not access.handlers:
        access.addHandler(LineWriterHandler(sys.stdout))
        access.propagate = False
        access.setLevel(logging.INFO)
