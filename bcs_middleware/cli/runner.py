"""Running gunicorn for ``bcs-middleware serve``: gevent's patching before anything is imported,
the settings every ``serve`` gives gunicorn, its server hooks, and gunicorn run in this process.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..serving.hooks import post_worker_init
from ..telemetry.logsetup import configure_logging
from .serve_options import ServerOptions, worker_settings


class GunicornRunner:
    """Run gunicorn in this process with settings from the CLI, loading the app per worker."""

    def __init__(self, loader: Callable[[], Any], settings: dict[str, Any]) -> None:
        from gunicorn.app.base import BaseApplication

        outer = self

        class Application(BaseApplication):
            def load_config(self) -> None:
                for key, value in outer.settings.items():
                    self.cfg.set(key, value)

            def load(self) -> Any:
                return outer.loader()

        self.loader = loader
        self.settings = settings
        self.app = Application()

    def run(self) -> None:
        from ..serving.hooks import exit_now

        try:
            self.app.run()
        except SystemExit as stop:  # the master at its end, and every worker (forked inside run())
            exit_now(stop.code)


def gunicorn_settings(opts: ServerOptions, args: argparse.Namespace) -> dict[str, Any]:
    """What every ``serve`` sets in gunicorn (the TLS files and the hooks of ZooKeeper and the
    certificate renewer are added by the caller)."""
    from ..pki.reload import gunicorn_ssl_context

    return {
        **worker_settings(opts, args),
        "bind": [opts.bind],
        "workers": opts.workers,
        # Every worker listens on its own SO_REUSEPORT socket and the kernel spreads new
        # connections over them. On one shared socket the worker that wakes first accepts a
        # whole burst (bench/README.md: one gevent worker holding every connection while the
        # other idled). The cost: connections still in a stopping worker's accept queue are reset.
        # One worker has nothing to spread, and its own socket would refuse every connection
        # while gunicorn replaces it (the master holds no listener then): it uses the master's.
        "reuse_port": args.reuse_port and opts.workers > 1,
        "timeout": 60,
        "graceful_timeout": opts.graceful_timeout,
        "loglevel": args.log_level,
        "errorlog": "-",
        # gunicorn believes X-Forwarded-Proto (and SCRIPT_NAME/PATH_INFO headers) from
        # 127.0.0.1 by default: any local client could change the scheme and path the
        # gateway sees. Trusted only when the operator names the proxies.
        "forwarded_allow_ips": ",".join(args.forwarded_allow_ips),
        "control_socket_disable": True,
        "child_exit": child_exit,
        "post_fork": post_fork,
        "post_worker_init": post_worker_init,
        "ssl_context": gunicorn_ssl_context,
        "proc_name": "bcs-middleware",
    }


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def post_fork(server: Any, worker: Any) -> None:
    # Process-owned resources are PerProcess values (core/forksafe.py): nothing to reset
    # here beyond making sure app logging reaches gunicorn's error log.
    configure_logging(server.cfg.loglevel)


def also_start(start: Callable[[], None], hook: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """A gunicorn server hook that calls ``start()`` and then ``hook`` (when there is one)."""

    def when_ready(server: Any) -> None:
        start()
        if hook is not None:
            hook(server)

    return when_ready


def registration_hooks(args: argparse.Namespace, bind: str, scheme: str, role: str,
                        cluster_id: str) -> dict[str, Any]:
    """One ZooKeeper node per server, in the source system's layout, removed on clean exit."""
    import socket

    from ..discovery.base import DEFAULT_ROOT, Endpoint
    from ..discovery.registration import apiserver_path, driver_path, gunicorn_hooks, mesos_driver_path

    address = args.advertise or bind
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - reading a bind address, not binding
        host = socket.gethostbyname(socket.gethostname())
    root = args.zookeeper_root or DEFAULT_ROOT
    endpoint = Endpoint(ip=host, port=int(port), scheme=scheme, cluster=cluster_id,
                        hostname=socket.gethostname(), version=__version__)
    if role == "driver":
        # Both layouts, as bk-bcs's driver registers (the gateways' and the Mesos cluster's own).
        when_ready, on_exit = gunicorn_hooks(args.zookeeper, driver_path(cluster_id, root), endpoint,
                                             also=[(mesos_driver_path(root), endpoint)])
    else:
        when_ready, on_exit = gunicorn_hooks(args.zookeeper, apiserver_path(root), endpoint)
    return {"when_ready": when_ready, "on_exit": on_exit}
