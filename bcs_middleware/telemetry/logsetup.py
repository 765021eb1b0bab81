"""Logging for ``bcs-middleware serve``: plain lines on stderr, the access log as JSON lines on stdout.

The access log is written by :class:`LineWriterHandler`: request threads only put the
record's message on a :class:`~bcs_middleware.telemetry.batching.BatchQueue`, and its thread turns
whatever has queued up into text and writes it every 50 ms in a single ``write``. Under gunicorn's
threads every syscall and every contended lock on a request thread hands the
interpreter lock to another thread, so (measured, bench/README.md):

* writing (and flushing) a line per request on the request thread cost about a fifth
  of the tunnel's throughput;
* a ``queue.Queue`` (a mutex and a condition per put) and a writer holding the
  handler's lock across its ``write`` still cost about a tenth: request threads
  blocked on that lock while the write released the interpreter lock.

So the queue needs no lock on the request's side, the writer takes only the queue's
lock, and a message that formats itself lazily (the access line) is formatted on the
writer thread.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

from ..core.printable import escape
from .batching import BatchQueue

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
        # Writes happen under the queue's lock, not the handler's own (``Handler.handle``
        # takes that around every emit): request threads never wait for a write.
        self._queue = BatchQueue(self._write, period=_PERIOD, name="bcs-access-log",
                                 max_items=max_queued)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.submit(record.getMessage() if record.args else record.msg)
        except Exception:
            self.handleError(record)

    def submit(self, message: Any) -> None:
        """Queue one message (``str()`` is taken on the writer thread); written at once
        when ``max_queued`` are waiting."""
        self._queue.put(message)

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

    def drain(self) -> None:
        """Write everything queued so far (the writer thread does every 50 ms, and at exit)."""
        self._queue.drain()

    def _write(self, messages: list[Any]) -> None:
        lines = []
        for message in messages:
            try:
                lines.append(str(message))
            except Exception:  # a message that cannot format itself loses only its own line
                lines.append("<unformattable log message>")
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stdout gone (closed pipe): nothing sensible left to do with a log line


class EscapingFormatter(logging.Formatter):
    """A formatter whose messages carry no control character: one record, one line.

    Log calls escape the client text they interpolate (:func:`bcs_middleware.core.printable.escape`);
    this is the net under them for every ``bcs_middleware`` logger of ``serve``. A
    traceback keeps its line breaks — it is the server's text — but the message above it
    is escaped.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)


def configure_logging(level: str) -> None:
    """Idempotent: the ``bcs_middleware`` loggers to stderr, the access log to stdout."""
    root = logging.getLogger("bcs_middleware")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(EscapingFormatter("%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level.upper())
    access = logging.getLogger("bcs_middleware.access")
    if not access.handlers:
        access.addHandler(LineWriterHandler(sys.stdout))
        access.propagate = False
        access.setLevel(logging.INFO)
