"""Starting a gateway's background work: the last of its three steps (open, assemble, start).

What runs in the background — the ZooKeeper watch of Mesos drivers, the RBAC sync, the
agent tunnel's peer listener (and, through it, other workers' and instances' dials) — starts
in the process that serves, **once**, from one place (:class:`Startup`), and by one rule:

* under the gateway's gunicorn hooks (``bcs-middleware serve``, ``examples/gunicorn.conf.py``)
  it starts when the worker is initialised (:func:`bcs_middleware.core.worker_start.at_worker_start`,
  run by :func:`bcs_middleware.serving.hooks.post_worker_init`), before the first request;
* in a plain paste or gunicorn pipeline without those hooks, on the first request
  (:class:`StartOnFirstRequest`; ZooKeeper discovery also waits for its first snapshot then).

Whichever comes first starts it; the other does nothing. A build that only checks the
configuration (the server's master, :func:`bcs_middleware.serving.hooks.build_in_master`)
never serves, and forgets what it registered, so it starts nothing.

What stops at the process's exit is registered here too, when the work starts (gunicorn
workers leave through ``sys.exit``; :func:`bcs_middleware.serving.hooks.exit_now` runs the
handlers): the RBAC lease is handed over, the agents' connections closed.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..agent_tunnel.router import peer_listener_start
from ..core.worker_start import at_worker_start
from .resources import GatewayResources, process_holder

log = logging.getLogger(__name__)

#: How long a leaving worker waits for its running RBAC passes (then the lease is left to expire).
RBAC_EXIT_WAIT = 1.0


class Startup:
    """The background work of one gateway's resources, started at most once (thread-safe).

    :param resources: what :func:`~bcs_middleware.compose.resources.open_resources` opened.
    """

    def __init__(self, resources: GatewayResources) -> None:
        self.resources = resources
        self.started = False
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if self.started:
            return
        with self._lock:
            if self.started:
                return
            self._start()
            self.started = True

    def _start(self) -> None:
        resources = self.resources
        # The process that serves holds the agents: an application built before a fork
        # (gunicorn --preload) named its parent.
        resources.agents.holder = process_holder()
        # A worker leaving closes its agents' connections and clears their placements, so the
        # agents reconnect (to another worker) at once and nobody is sent to a dead holder.
        atexit.register(resources.agents.close)
        if resources.peer_address is not None:
            peer_listener_start(resources.agents, resources.store.db.secrets, resources.peer_address)()
        start_discovery = getattr(resources.discovery, "start", None)
        if start_discovery is not None:
            start_discovery()  # watch ZooKeeper from the start, not from the first Mesos request
        if resources.audit_sink is not None:
            resources.audit_sink.start()  # the export backends' spools and shipping threads
        if resources.rbac is not None:
            resources.rbac.start()
            # Hand the lease over at exit, unless a pass is still running after RBAC_EXIT_WAIT
            # (a cluster that does not answer): then the lease expires by itself and the stop
            # is not held up.
            atexit.register(resources.rbac.stop, RBAC_EXIT_WAIT)


class StartOnFirstRequest:
    """A WSGI app that runs ``start`` before its first request (then only passes requests on).

    :param app: the application.
    :param start: idempotent, thread-safe (a :class:`Startup`).
    """

    def __init__(self, app: Callable[..., Iterable[bytes]], start: Startup) -> None:
        self.app = app
        self.start = start

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if not self.start.started:
            self.start()
        return self.app(environ, start_response)


def start_when_serving(app: Callable[..., Iterable[bytes]], resources: GatewayResources) -> StartOnFirstRequest:
    """``app`` whose resources' background work starts when this process serves (module docs)."""
    startup = Startup(resources)
    # Weakly: an application built and dropped (a test, a check) leaves nothing to start behind.
    ref = weakref.ref(startup)

    def start_if_alive() -> None:
        alive = ref()
        if alive is not None:
            alive()

    at_worker_start(start_if_alive)
    return StartOnFirstRequest(app, startup)
