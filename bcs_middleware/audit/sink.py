"""Where audit events go: a file (appended, 0600) or standard output, written off the request
thread, and the export backends (:mod:`bcs_middleware.audit.export`), each through its spool.

Every event goes everywhere from this one place (:meth:`AuditSink.emit`).
"""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..core.errors import ConfigError
from ..telemetry.logsetup import LineWriterHandler
from .events import AuditEvent
from .export.exporter import Exporter

__all__ = ["AuditSink"]

log = logging.getLogger(__name__)


class AuditSink:
    """Where events go: a file (appended, 0600) or a stream, written by a background thread,
    and each exporter (a webhook, syslog).

    :param stream: the audit log, ``None``: none (events are only exported).
    :param exporters: the export backends, in the order they are handed each event.
    """

    def __init__(self, stream: TextIO | None, *, exporters: Sequence[Exporter] = ()) -> None:
        self._writer = LineWriterHandler(stream) if stream is not None else None
        self.exporters = tuple(exporters)

    @classmethod
    def open(cls, target: str | None, *, exporters: Sequence[Exporter] = ()) -> AuditSink:
        """``-`` or ``stdout``: standard output; ``None``: no audit log; otherwise a file path.

        A missing folder is created 0700 (as kube-apiserver's ``--audit-log-path`` does);
        one that cannot be is a :class:`ConfigError` naming the path.
        """
        if target is None:
            return cls(None, exporters=exporters)
        if target in ("-", "stdout"):
            return cls(sys.stdout, exporters=exporters)
        path = Path(target)
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(mode=0o700, parents=True)
                log.info("created the audit log's folder %s (mode 0700)", path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"audit log {target}: {exc.strerror or exc}") from None
        return cls(io.TextIOWrapper(io.FileIO(fd, "a", closefd=True), encoding="utf-8", line_buffering=False),
                   exporters=exporters)

    def emit(self, event: AuditEvent) -> None:
        """Hand ``event`` to the log and every exporter.

        :raises ~bcs_middleware.audit.export.exporter.AuditExportUnavailable: an exporter in
            ``blocking-strict`` mode could not deliver a ``RequestReceived`` event.
        """
        if self._writer is not None:
            self._writer.submit(event)
        for exporter in self.exporters:
            exporter.submit(event)

    @property
    def strict(self) -> bool:
        """An exporter in ``blocking-strict`` mode: a request's ``RequestReceived`` event must be
        delivered before the request is forwarded."""
        return any(exporter.batch.mode == "blocking-strict" for exporter in self.exporters)

    def start(self) -> None:
        """Start the exporters' spools and threads in this process (a worker, once it serves)."""
        for exporter in self.exporters:
            exporter.start()

    def drain(self) -> None:
        if self._writer is not None:
            self._writer.drain()

    def close(self) -> None:
        """Write what is queued and close the file (standard output stays open); stop the exporters."""
        for exporter in self.exporters:
            exporter.stop()
        if self._writer is None:
            return
        self._writer.drain()
        if self._writer.stream is not sys.stdout:
            self._writer.stream.close()
