"""gunicorn worker hooks shared by ``bcs-middleware serve`` and ``examples/gunicorn.conf.py``."""

from __future__ import annotations

import gc
import logging
import signal
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# Work an application built in this worker asks to start once the worker serves.
_AT_WORKER_START: list[Callable[[], None]] = []
# How many workers this worker's gunicorn runs (``None`` outside a gunicorn worker).
_WORKERS: list[int] = []


def serving_workers() -> int | None:
    """How many workers the gunicorn serving this process runs, once its worker started."""
    return _WORKERS[0] if _WORKERS else None


def at_worker_start(start: Callable[[], None]) -> None:
    """Run ``start()`` in this gunicorn worker once it is initialised (:func:`post_worker_init`).

    For listeners and threads an application needs while serving: they start after the
    fork, after gevent patched the worker, and never in a process that only builds the
    application (the ``serve`` master, tests).
    """
    _AT_WORKER_START.append(start)


def post_worker_init(worker: Any) -> None:
    """Note the worker's listening sockets, start what the application asked (:func:`at_worker_start`);
    on SIGTERM, end open streams before the graceful stop.

    The listening sockets are the gateway's own addresses, which the upstream address
    policy refuses (:mod:`bcs_middleware.upstream.addresses`): a cluster reported at the
    gateway's own port must not make it call itself.

    gunicorn stops accepting and waits ``graceful_timeout`` for running requests;
    a watch never finishes by itself, so without this it would be cut at the end of
    that wait. Ending it at once sends the final chunk: the client sees a complete
    response and re-watches (on another instance). Ordinary requests finish as usual.
    """
    from .upstream.addresses import note_gunicorn_listeners
    from .upstream.proxy import end_streams

    note_gunicorn_listeners(worker)
    workers = getattr(getattr(worker, "cfg", None), "workers", None)
    if isinstance(workers, int) and workers > 0:
        _WORKERS[:] = [workers]
    while _AT_WORKER_START:
        _AT_WORKER_START.pop(0)()

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        ended = end_streams()
        if ended:
            log.info("SIGTERM: ended %d open stream(s) cleanly", ended)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_term)


def before_exit() -> None:
    """Called as a gunicorn master or worker process leaves: skip the collector's passes over
    what the process built.

    The interpreter's teardown runs full garbage collections over every object the process
    ever made (modules, the application, caches): seconds of CPU in a master or worker of this
    size, after the server has stopped serving and before it can be restarted. Frozen objects
    are left out of those passes (``gc.freeze``); everything is still torn down and every
    ``atexit`` handler (lease release, agent connections, log flush) still runs.
    """
    gc.freeze()
