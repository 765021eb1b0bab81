"""A stop that reaches a gunicorn worker before it serves: what both gateway workers do with it.

gunicorn forks a worker, which loads the application (seconds on a busy host), runs the
``post_worker_init`` hook (which starts the background work: ZooKeeper registration and
watch, the RBAC sync, the agent tunnel's peer listener, audit export) and then serves.
A SIGTERM can arrive at any of those moments — the master stops while a second worker is
still coming up:

* **while loading**: nothing has been served or started, so the worker leaves at once
  (otherwise the stop would wait for the load);
* **while starting**: leaving at once would raise ``SystemExit`` in the middle of the
  start — a ZooKeeper client half connected, a lock held — and the exit handlers that
  undo the start (deregistration, the RBAC lease) then wait on what was interrupted, until
  the master's ``graceful_timeout`` kills the worker. The start finishes instead, and the
  worker stops as a serving one does: its run loop sees the stop before accepting
  anything and it leaves through the same exit handlers;
* **before gunicorn's own handlers are installed** (just after the fork, still holding the
  master's handler, which would queue the signal in the child and lose it): the default
  action, which ends the process — it has done nothing yet.
"""

from __future__ import annotations

import signal
import sys
from typing import Any


class StopWhileStarting:
    """Mixin for a gunicorn worker class (before the gunicorn class in the bases)."""

    #: The application is loaded: a stop now waits for the start to finish.
    loaded = False

    def init_process(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        super().init_process()  # type: ignore[misc]

    def load_wsgi(self) -> None:
        super().load_wsgi()  # type: ignore[misc]
        self.loaded = True

    def handle_exit(self, sig: Any, frame: Any) -> None:
        if not self.loaded:
            sys.exit(0)
        super().handle_exit(sig, frame)  # type: ignore[misc]
