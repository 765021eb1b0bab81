"""gunicorn server and worker hooks shared by ``bcs-middleware serve`` and ``examples/gunicorn.conf.py``.

The application is built once in the server's master before any worker starts
(:func:`build_in_master`): configuration mistakes, migrations and the checks instances
sharing a database must pass (:mod:`bcs_middleware.compose.instance_checks`, the bootstrap
tokens) stop the server at start with one clear message, instead of every worker
failing to boot with a traceback. That build starts nothing in the background (what it
asked to start when serving is forgotten: :mod:`bcs_middleware.compose.start`); each worker
then builds its own application, whose background work starts once the worker is
initialised (:func:`post_worker_init`).
"""

from __future__ import annotations

import atexit
import configparser
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ..core.errors import ConfigError
from ..core.worker_start import discarding_worker_starts, worker_started

log = logging.getLogger(__name__)

# Set while the master builds the application once (build_in_master).
_IN_MASTER_BUILD: list[bool] = []
# What that build holds that the master must let go of once it is done (open databases).
_AFTER_MASTER_BUILD: list[Callable[[], None]] = []


def building_in_master() -> bool:
    """Whether the application is being built in the server's master, only to check it
    (what it opens there is let go of afterwards: :func:`after_master_build`)."""
    return bool(_IN_MASTER_BUILD)


def after_master_build(release: Callable[[], None]) -> None:
    """Call ``release()`` when the master's check build is over (close a database's pool, say)."""
    _AFTER_MASTER_BUILD.append(release)


def build_in_master(load: Callable[[], Any], *, source: str = "the configuration") -> None:
    """Build the application once with ``load()`` in this (master) process and throw it away.

    A mistake in an ini file (a missing section, a syntax error, a missing file, an entry
    point that does not exist) becomes a :class:`~bcs_middleware.core.errors.ConfigError`
    naming ``source``; the application's own ones already are.
    """
    _IN_MASTER_BUILD.append(True)
    try:
        with discarding_worker_starts():
            load()
    except (LookupError, OSError, ImportError, configparser.Error) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    finally:
        _IN_MASTER_BUILD.clear()
        while _AFTER_MASTER_BUILD:
            _AFTER_MASTER_BUILD.pop(0)()
        gc.collect()  # the discarded application's pools and files, before workers fork


def check_in_master(server: Any) -> None:
    """gunicorn's ``on_starting`` hook (``examples/gunicorn.conf.py``): :func:`build_in_master`
    with the server's application; a configuration error ends the server with its message."""
    try:
        build_in_master(server.app.load, source=getattr(server.app, "app_uri", None) or "the application")
    except ConfigError as exc:
        print(f"error: configuration: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def post_worker_init(worker: Any) -> None:
    """Note the worker's listening sockets, start what the application asked
    (:func:`bcs_middleware.core.worker_start.at_worker_start`);
    on SIGTERM, end open streams before the graceful stop; freeze the heap built so far.

    The listening sockets are the gateway's own addresses, which the upstream address
    policy refuses (:mod:`bcs_middleware.outbound.addresses`): a cluster reported at the
    gateway's own port must not make it call itself.

    gunicorn stops accepting and waits ``graceful_timeout`` for running requests;
    a watch never finishes by itself, so without this it would be cut at the end of
    that wait. Ending it at once sends the final chunk: the client sees a complete
    response and re-watches (on another instance). Ordinary requests finish as usual.
    """
    from ..apps.proxy import end_streams
    from ..outbound.addresses import note_gunicorn_listeners

    note_gunicorn_listeners(worker)
    workers = getattr(getattr(worker, "cfg", None), "workers", None)
    worker_started(workers if isinstance(workers, int) else None)

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        ended = end_streams()
        if ended:
            log.info("SIGTERM: ended %d open stream(s) cleanly", ended)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_term)
    # What the worker built before serving (its modules, classes, the application) lives as
    # long as the worker: frozen, the collector's full passes stop walking it. Unfrozen, each
    # such pass stops every request of the worker while it walks the whole heap.
    gc.collect()
    gc.freeze()


def exit_now(status: object = 0) -> NoReturn:
    """End a gunicorn master or worker that has stopped serving: as ``sys.exit(status)``, with
    every ``atexit`` handler (the RBAC lease handed over, agent connections closed, queued log
    and metric writes drained), but not the interpreter's own teardown.

    That teardown first joins every non-daemon thread: a thread pool's worker blocked on an
    upstream that never answers (an RBAC pass against a silent apiserver) held a stopped
    worker until its read timeout, 30 s. It then garbage-collects every object the process
    built: seconds of CPU in a process of this size (py-spy: ``gc_collect_main``), after the
    server has stopped answering and before it can be started again.
    """
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(_exit_code(status))


def _exit_code(status: object) -> int:
    """The process exit code ``sys.exit(status)`` gives (printing a non-integer ``status``)."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    with contextlib.suppress(Exception):
        print(status, file=sys.stderr)
    return 1
