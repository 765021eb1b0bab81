"""Where audit events go: a file (appended, 0600) or standard output, written off the request thread."""

from __future__ import annotations

import io
import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from ..core.errors import ConfigError
from ..telemetry.logsetup import LineWriterHandler
from .events import AuditEvent

__all__ = ["AuditSink"]

log = logging.getLogger(__name__)


class AuditSink:
    """Where events go: a file (appended, 0600) or a stream, written by a background thread."""

    def __init__(self, stream: TextIO) -> None:
        self._writer = LineWriterHandler(stream)

    @classmethod
    def open(cls, target: str) -> AuditSink:
        """``-`` or ``stdout``: standard output; otherwise a file path.

        A missing folder is created 0700 (as kube-apiserver's ``--audit-log-path`` does);
        one that cannot be is a :class:`ConfigError` naming the path.
        """
        if target in ("-", "stdout"):
            return cls(sys.stdout)
        path = Path(target)
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(mode=0o700, parents=True)
                log.info("created the audit log's folder %s (mode 0700)", path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"audit log {target}: {exc.strerror or exc}") from None
        return cls(io.TextIOWrapper(io.FileIO(fd, "a", closefd=True), encoding="utf-8", line_buffering=False))

    def emit(self, event: AuditEvent) -> None:
        self._writer.submit(event)

    def drain(self) -> None:
        self._writer.drain()

    def close(self) -> None:
        """Write what is queued and close the file (standard output stays open)."""
        self._writer.drain()
        if self._writer.stream is not sys.stdout:
            self._writer.stream.close()
