"""Which process writes a recording, and whether it still lives.

A process is named ``HOST/PID/START``: ``START`` is the process's start time in clock ticks
since boot (``/proc/PID/stat``, field 22, ``proc(5)``), so a PID the kernel handed to another
process since is not taken for the writer. Only the host can tell whether its own processes
live; a writer on another host (instances sharing a database or a network directory) is
judged by its heartbeats instead.
"""

from __future__ import annotations

import functools
import os
import socket

from ..core.forksafe import process_alive

__all__ = ["holder_gone", "process_identity"]


def _start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ")".
    fields = stat[stat.rindex(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


@functools.cache
def _host() -> str:
    return socket.gethostname()


def process_identity(pid: int | None = None) -> str:
    """``HOST/PID/START`` of this process (or of ``pid`` on this host)."""
    pid = os.getpid() if pid is None else pid
    return f"{_host()}/{pid}/{_start_ticks(pid) or ''}"


def holder_gone(holder: str) -> bool | None:
    """``True``: the process ``holder`` names is gone; ``False``: it lives; ``None``: it is
    another host's (or unnamed), so only its heartbeats can tell."""
    host, _, rest = holder.partition("/")
    pid_text, _, start = rest.partition("/")
    if not host or host != _host() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    if not process_alive(pid):
        return True
    now = _start_ticks(pid)
    return bool(start) and now is not None and now != start
