"""Work to start once this process serves as a gunicorn worker, and how many workers there are.

Code below the serving floor (the agent tunnel's peer listener, the agent endpoint) needs both,
but must not import the gunicorn hooks of :mod:`bcs_middleware.serving`, which sit above it: it
registers here, and the worker's hook (:func:`bcs_middleware.serving.hooks.post_worker_init`)
calls :func:`worker_started` once the worker is initialised — after the fork, after gevent
patched the worker, and never in a process that only builds the application (the ``serve``
master, tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

# Work an application built in this process asks to start once the worker serves.
_AT_WORKER_START: list[Callable[[], None]] = []
# How many workers this worker's gunicorn runs (empty outside a gunicorn worker).
_WORKERS: list[int] = []


def at_worker_start(start: Callable[[], None]) -> None:
    """Run ``start()`` in this gunicorn worker once it is initialised (listeners, threads)."""
    _AT_WORKER_START.append(start)


def worker_started(workers: int | None) -> None:
    """The serving hook's call: note how many ``workers`` gunicorn runs (if known), then run
    and forget what :func:`at_worker_start` registered, in order."""
    if workers is not None and workers > 0:
        _WORKERS[:] = [workers]
    while _AT_WORKER_START:
        _AT_WORKER_START.pop(0)()


def serving_workers() -> int | None:
    """How many workers the gunicorn serving this process runs, once its worker started."""
    return _WORKERS[0] if _WORKERS else None


@contextlib.contextmanager
def discarding_worker_starts() -> Iterator[None]:
    """Forget what :func:`at_worker_start` registers inside: an application built only to
    check the configuration (the server's master) never serves, and its workers, forked
    from it, must not start its work."""
    before = len(_AT_WORKER_START)
    try:
        yield
    finally:
        del _AT_WORKER_START[before:]
