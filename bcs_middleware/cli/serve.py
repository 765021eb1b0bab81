"""``bcs-middleware serve``: resolve the options, build the application once in the master, run
gunicorn.

Without ``--config`` it runs the embedded default — everything in one data directory:

* ``bcs.sqlite3``   the store (SQLite, WAL);
* ``secret.key``    the Fernet key encrypting credentials at rest (0600);
* ``admin.token``   the bootstrap admin's token (0600), unless ``BCS_ADMIN_TOKEN`` is set;
* ``tls/``          a CA and the HTTPS certificate it signed (keys 0600), renewed before expiry.

kubectl (client-go) never sends a bearer token to an ``http://`` server, so the
embedded default serves HTTPS; ``--insecure-http`` is an explicit, logged choice.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..serving.datadir import ADMIN_TOKEN_FILE, announce_admin_token_file, server_metrics_dir
from ..telemetry.logsetup import configure_logging
from . import serve_config
from .loaders import driver_loader, gateway_loader, ini_loader
from .runner import GunicornRunner, also_start, gunicorn_settings, registration_hooks
from .serve_options import (
    ServerOptions,
    bind_problem,
    check_serve_flags,
    ini_application,
    prepare_data_dir_flag,
)
from .serve_tls import ServeTLS, resolve_tls

log = logging.getLogger("bcs_middleware.cli.main")


@dataclass(frozen=True)
class _Application:
    """What ``serve`` runs: its role, and (with ``--config``) the ini's global and own options."""

    role: str
    global_conf: dict[str, str]
    app_conf: dict[str, str]  # the ini's application's options (none: the embedded one)


def cmd_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    data_dir = prepare_data_dir_flag(args.data_dir)
    config_path = Path(args.config).absolute() if args.config else None
    parser = serve_config.read_ini(config_path) if config_path else None
    opts = ServerOptions.resolve(args, serve_config.server_section(parser, config_path)
                                 if parser is not None and config_path else {})

    # This server's own metrics directory (two servers in one data directory must neither
    # wipe nor sum each other's); set before any metric is created (prometheus_client reads it then).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(server_metrics_dir(data_dir))

    busy = bind_problem(opts.bind)
    if busy:
        print(f"error: cannot listen on {opts.bind}: {busy}", file=sys.stderr)
        return 1
    problem = check_serve_flags(args, opts)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    app = _Application(args.role or "gateway", {}, {})
    if parser is not None and config_path is not None:
        app = _Application(*ini_application(args, parser, config_path, data_dir, opts.certfile, opts.ca_file))
    tls = resolve_tls(args, opts, role=app.role, app_conf=app.app_conf, data_dir=data_dir)

    # Build the application once here, in the master, before anything is printed or bound: a
    # configuration mistake, a database that cannot be opened and the checks instances sharing
    # a database must pass (serving.hooks.build_in_master) stop the start with one clear message.
    token_file_existed = (data_dir / ADMIN_TOKEN_FILE).exists()
    loader = _loader(args, config_path, app, data_dir, tls)
    settings = {**tls.settings, **gunicorn_settings(opts, args)}
    if args.zookeeper:
        cluster_id = app.app_conf.get("cluster_id") if app.app_conf else args.cluster_id
        settings.update(registration_hooks(args, opts.bind, tls.scheme, app.role, cluster_id or ""))
    if tls.renewer is not None:
        # In the master, once the sockets are bound (workers come and go).
        settings["when_ready"] = also_start(tls.renewer.start, settings.get("when_ready"))
    _announce(args, app, tls, data_dir, opts.bind, token_file_existed)
    GunicornRunner(loader, settings).run()
    return 0


def _loader(args: argparse.Namespace, config_path: Path | None, app: _Application, data_dir: Path,
            tls: ServeTLS) -> Callable[[], Any]:
    if config_path is not None:
        return ini_loader(config_path, app.global_conf)
    if app.role == "driver":
        return driver_loader(args, data_dir)
    return gateway_loader(args, data_dir, tls.ca_file, tls.cert_for_api)


def _announce(args: argparse.Namespace, app: _Application, tls: ServeTLS, data_dir: Path, bind: str,
              token_file_existed: bool) -> None:
    """The lines an operator reads when ``serve`` starts: the CA to trust, the admin token's file
    (when it was there before), and where the server listens."""
    if tls.pki is not None:
        print(f"HTTPS certificate authority: {tls.pki.ca_file}  (clients use: curl --cacert {tls.pki.ca_file})",
              flush=True)
        log.info("TLS: %s", tls.pki.reason)
    uses_token_file = not app.app_conf or f"file:{ADMIN_TOKEN_FILE}" in app.app_conf.get("bootstrap_users", "")
    if app.role == "gateway" and token_file_existed and uses_token_file:
        announce_admin_token_file(data_dir)
    print(f"bcs-middleware {__version__} {app.role} on {tls.scheme}://{bind}/  (data: {data_dir})", flush=True)
