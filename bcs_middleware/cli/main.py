"""The ``bcs-middleware`` command: ``serve``, ``certs``, ``kube-agent``, ``keygen``.

``serve`` runs the gateway under gunicorn. Without ``--config`` it uses the
embedded default — everything in one data directory:

* ``bcs.sqlite3``   the store (SQLite, WAL);
* ``secret.key``    the Fernet key encrypting credentials at rest (0600);
* ``admin.token``   the bootstrap admin's token (0600), unless ``BCS_ADMIN_TOKEN`` is set;
* ``tls/``          a CA and the HTTPS certificate it signed (keys 0600), renewed before expiry.

kubectl (client-go) never sends a bearer token to an ``http://`` server, so the
embedded default serves HTTPS; ``--insecure-http`` is an explicit, logged choice.
"""

from __future__ import annotations

import argparse
import configparser
import ipaddress
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..core.errors import ConfigError
from ..serving.datadir import ADMIN_TOKEN_FILE, ADMIN_TOKEN_SOURCE, announce_admin_token_file, server_metrics_dir
from ..serving.datadir import prepare as prepare_data_dir
from ..serving.hooks import build_in_master, post_worker_init
from ..telemetry.logsetup import configure_logging
from . import serve_config

if TYPE_CHECKING:
    from ..pki.files import GatewayPKI

log = logging.getLogger("bcs_middleware.cli.main")

DEFAULT_BIND = "127.0.0.1:8443"
# Per gevent worker: connections (watches, exec sessions, idle keep-alive) served at once;
# two workers hold 10,000 streams even when one takes more than its half.
DEFAULT_WORKER_CONNECTIONS = 8192


def _bind_is_loopback(bind: str) -> bool:
    host = bind.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind_problem(bind: str) -> str | None:
    """Why gunicorn could not listen on ``bind`` (checked before anything is printed)."""
    import errno
    import socket

    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - probing the operator's bind address
    if not port.isdigit():
        return None  # a unix socket or a spec gunicorn will judge itself
    if not 0 < int(port) < 65536:
        return f"no such port {port} (1-65535)"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As gunicorn binds: SO_REUSEADDR, so a port in TIME_WAIT is not reported busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "the address is already in use (is another gateway running?)"
            return exc.strerror or str(exc)
    return None


def _shared_data_dir(parser: configparser.ConfigParser, data_dir: Path, *, cert_file: str | None = None,
                     ca_file: str | None = None) -> dict[str, str]:
    """The global_conf that makes an ini's ``[DEFAULT] data_dir`` this data directory.

    Only ``[DEFAULT]`` values are replaced (PasteDeploy drops a section's own option that
    has the name of a global one); an app section that sets its own ``data_dir`` keeps it,
    with a warning when that splits the state from ``--data-dir``'s TLS files. An explicit
    certificate and CA replace ``[DEFAULT]``'s ``gateway_cert_file``/``gateway_ca_file``.
    """
    present = serve_config.defaults(parser)
    if "data_dir" in present:
        shared = {"data_dir": str(data_dir)}
        for key, value in (("gateway_cert_file", cert_file), ("gateway_ca_file", ca_file)):
            if value and key in present:
                shared[key] = str(Path(value).absolute())
        return shared
    for section in parser.sections():
        own = parser.get(section, "data_dir", fallback=None)
        if own and not own.startswith("%") and Path(own).absolute() != data_dir:
            log.warning("[%s] data_dir %s is not the data directory %s (where the TLS files are); "
                        "use data_dir in [DEFAULT] to share one", section, own, data_dir)
    return {}


class _Gunicorn:
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


def _child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def _post_fork(server: Any, worker: Any) -> None:
    # Each worker builds its own pools and engines lazily; nothing to reset here
    # beyond making sure app logging reaches gunicorn's error log.
    configure_logging(server.cfg.loglevel)


# Idle keep-alive connections a gthread worker holds beyond its threads (gunicorn's default
# worker_connections). They wait in the worker's poller and cost a socket and a TLS session,
# no thread; with too few, gthread answers "Connection: close" and the clients come back with
# a new TLS handshake while the worker has threads to spare.
KEEPALIVE_SLOTS = 1000


def connection_slots(worker_class: str, threads: int) -> dict[str, int]:
    """gunicorn's ``worker_connections`` for ``worker_class``.

    gthread counts every open connection (busy, queued or idle in keep-alive) against
    ``worker_connections`` and keeps at most ``worker_connections - threads`` idle: give it
    ``threads`` busy ones plus :data:`KEEPALIVE_SLOTS` idle ones. gevent's
    ``worker_connections`` is its greenlet bound and keeps gunicorn's meaning (no override).
    """
    if worker_class == "gthread":
        return {"worker_connections": threads + KEEPALIVE_SLOTS}
    return {}


@dataclass(frozen=True)
class ServerOptions:
    """The gunicorn side of ``serve``: each a flag, else the ini's ``[server:main]``, else the default."""

    bind: str
    workers: int
    worker_class: str
    threads: int
    worker_connections: int | None
    keepalive: int
    graceful_timeout: int
    certfile: str | None
    keyfile: str | None
    ca_file: str | None

    @classmethod
    def resolve(cls, args: argparse.Namespace, server: Mapping[str, Any]) -> ServerOptions:
        def pick(dest: str, default: Any) -> Any:
            value = getattr(args, dest)
            return value if value is not None else server.get(dest, default)

        options = cls(
            bind=pick("bind", DEFAULT_BIND), workers=pick("workers", 2), worker_class=pick("worker_class", "gevent"),
            threads=pick("threads", 128), worker_connections=pick("worker_connections", None),
            keepalive=pick("keepalive", 75), graceful_timeout=pick("graceful_timeout", 30),
            certfile=pick("certfile", None), keyfile=pick("keyfile", None), ca_file=pick("ca_file", None),
        )
        for name in ("workers", "threads", "worker_connections"):
            value = getattr(options, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")
        if options.graceful_timeout < 0:
            raise ConfigError("--graceful-timeout must not be negative")
        return options


def _data_dir(path: str) -> Path:
    try:
        return prepare_data_dir(path)
    except OSError as exc:
        raise ConfigError(f"--data-dir {path}: {exc.strerror or exc}") from None


def _check_certificate(certfile: str, keyfile: str) -> None:
    """The certificate and key load as gunicorn will load them (a clear error now, not in every worker)."""
    import ssl

    def no_passphrase() -> str:
        raise ConfigError(f"--keyfile {keyfile} is encrypted: serve needs an unencrypted key (mode 0600)")

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile, password=no_passphrase)
    except ssl.SSLError as exc:
        raise ConfigError(f"--certfile {certfile} / --keyfile {keyfile}: {exc.reason or exc} (not a PEM "
                          "certificate and its private key?)") from None
    except OSError as exc:
        raise ConfigError(f"--certfile {certfile} / --keyfile {keyfile}: {exc.strerror or exc}") from None


def _check_client_ca(path: str) -> None:
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--client-ca-file {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _refuse_a_second_ca(database_url: str | None, data_dir: Path, tls_dir: Path) -> None:
    """Before making a CA in ``tls_dir``: refuse when the database records the gateways' CA already —
    this instance must hand out that one, not mint its own."""
    from ..compose.instance_checks import recorded_ca
    from ..store.crypto import SecretBox
    from ..store.database import Database, sqlite_url
    from ..store.sql import SQLStore

    if (tls_dir / "ca.crt").exists():
        return
    store = SQLStore(Database(database_url or sqlite_url(data_dir), secrets=SecretBox([])))
    try:
        store.db.migrate()
        recorded = recorded_ca(store)
    finally:
        store.db.dispose()
    if recorded is not None:
        raise ConfigError(
            f"the database {store.db.display_url} records the CA the gateways hand to clients ({recorded}), and "
            f"{tls_dir} has no CA: this instance would make a CA of its own, which no client trusts. Copy ca.crt "
            f"and ca.key from another instance's DATA_DIR/tls/ into {tls_dir}/ (mode 0600 for the key), or serve "
            "--certfile/--keyfile signed by that CA with --ca-file"
        )


def _ini_application(args: argparse.Namespace, parser: configparser.ConfigParser, config_path: Path,
                     data_dir: Path, certfile: str | None,
                     ca_file: str | None) -> tuple[str, dict[str, str], dict[str, str]]:
    """The ini's application: its role, the ``global_conf`` the flags fill in, and its options
    (:mod:`bcs_middleware.cli.serve_config`). A flag it would not take, or another ``--role``, is refused."""
    given = serve_config.given_app_flags(args)
    global_conf = {**_shared_data_dir(parser, data_dir, cert_file=certfile, ca_file=ca_file if certfile else None),
                   **serve_config.fill_defaults(parser, given)}
    # Server options that are application options too: the ini's [DEFAULT] gets them when it has the key.
    present = serve_config.defaults(parser)
    for value, key in ((args.zookeeper, "zookeeper_hosts"), (",".join(args.forwarded_allow_ips), "trusted_proxies")):
        if value and key in present:
            global_conf[key] = value
    role, app_conf = serve_config.app_context(f"config:{config_path}", global_conf)
    serve_config.refuse_unused_flags(given, app_conf, config_path)
    if args.role is not None and args.role != role:
        raise ConfigError(f"--role {args.role}: the application of {config_path} is "
                          f"{'a ' + role if role != 'other' else 'neither a gateway nor a driver'}")
    return role, global_conf, app_conf


def _generated_pki(data_dir: Path, hosts: list[str]) -> GatewayPKI:
    """The data directory's CA and server certificate (made or renewed as needed)."""
    from ..pki.files import ensure_gateway_pki

    try:
        return ensure_gateway_pki(data_dir, hosts)
    except ValueError as exc:  # a --tls-host that is no host name or address
        raise ConfigError(f"--tls-host: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{data_dir / 'tls'}: {exc.strerror or exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    data_dir = _data_dir(args.data_dir)
    config_path = Path(args.config).absolute() if args.config else None
    parser = serve_config.read_ini(config_path) if config_path else None
    opts = ServerOptions.resolve(args, serve_config.server_section(parser, config_path)
                                 if parser is not None and config_path else {})

    # This server's own metrics directory (two servers in one data directory must neither
    # wipe nor sum each other's); set before any metric is created (prometheus_client reads it then).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(server_metrics_dir(data_dir))

    settings: dict[str, Any] = {}
    renewer = None  # keeps the generated certificate fresh while serving
    bind = opts.bind
    busy = _bind_problem(bind)
    if busy:
        print(f"error: cannot listen on {bind}: {busy}", file=sys.stderr)
        return 1
    if args.config and (args.quota or args.cluster_creators):
        print("error: with --config, set quota_<name> and cluster_creators in the ini's [app:main]",
              file=sys.stderr)
        return 2
    certfile, keyfile, ca_file = opts.certfile, opts.keyfile, opts.ca_file
    if bool(certfile) != bool(keyfile):
        print("error: --certfile and --keyfile go together", file=sys.stderr)
        return 2
    if args.insecure_http and certfile:
        print("error: --insecure-http contradicts --certfile/--keyfile", file=sys.stderr)
        return 2
    if args.tls_check_interval <= 0:
        print("error: --tls-check-interval must be positive", file=sys.stderr)
        return 2
    if opts.keepalive <= 0 or args.header_timeout <= 0 or args.body_idle_timeout <= 0:
        print("error: --keepalive, --header-timeout and --body-idle-timeout must be positive", file=sys.stderr)
        return 2
    for spec in args.static_driver:
        if "=" not in spec or not spec.partition("=")[0].strip() or not spec.partition("=")[2].strip():
            raise ConfigError(f"--static-driver {spec!r}: expected CLUSTER=URL")
    if ca_file and not Path(ca_file).is_file():
        raise ConfigError(f"--ca-file {ca_file}: no such file")

    role = args.role or "gateway"
    global_conf: dict[str, str] = {}
    app_conf: dict[str, str] = {}  # the ini's application's options (none: the embedded one)
    if parser is not None and config_path is not None:
        role, global_conf, app_conf = _ini_application(args, parser, config_path, data_dir, certfile, ca_file)

    scheme = "https"
    cert_for_api: Path | None = None
    pki = None
    if args.insecure_http:
        scheme = "http"
        log.warning(
            "serving plain HTTP (--insecure-http): kubectl will not send bearer tokens to an http:// "
            "server, so kubectl cannot be used through this gateway%s",
            "" if _bind_is_loopback(bind)
            else "; and user tokens and cluster credentials cross the network in clear text",
        )
    elif certfile and keyfile:
        _check_certificate(certfile, keyfile)
        settings.update(certfile=str(certfile), keyfile=str(keyfile))
        cert_for_api = Path(certfile)
        if not ca_file:
            log.warning("no --ca-file: client_credentials and kubeconfigs will not carry a CA")
    else:
        from ..pki.files import default_gateway_hosts
        from ..pki.reload import CertificateRenewer

        hosts = default_gateway_hosts() + [h for spec in args.tls_host for h in spec.split(",") if h]
        if role == "gateway":
            database_url = app_conf.get("database_url") or None if app_conf else args.database_url
            app_data = Path(app_conf["data_dir"]).absolute() if app_conf.get("data_dir") else data_dir
            _refuse_a_second_ca(database_url, app_data, data_dir / "tls")
        pki = _generated_pki(data_dir, hosts)
        renewer = CertificateRenewer(data_dir, hosts, interval=args.tls_check_interval)
        settings.update(certfile=str(pki.cert_file), keyfile=str(pki.key_file))
        ca_file, cert_for_api = str(pki.ca_file), pki.cert_file

    if args.client_ca_file:
        if scheme != "https":
            print("error: --client-ca-file needs HTTPS", file=sys.stderr)
            return 2
        import ssl

        _check_client_ca(args.client_ca_file)
        # OPTIONAL: token clients keep working; a certificate that is presented must verify.
        settings.update(ca_certs=str(Path(args.client_ca_file).absolute()), cert_reqs=ssl.CERT_OPTIONAL)

    # Build the application once here, in the master, before anything is printed or bound: a
    # configuration mistake, a database that cannot be opened and the checks instances sharing
    # a database must pass (lifecycle.build_in_master) stop the start with one clear message.
    token_file = data_dir / ADMIN_TOKEN_FILE
    token_file_existed = token_file.exists()
    loader: Callable[[], Any]
    if config_path is not None:
        loader = _ini_loader(config_path, global_conf)
    elif role == "driver":
        loader = _driver_loader(args, data_dir)
    else:
        loader = _gateway_loader(args, data_dir, ca_file, cert_for_api)
    from ..pki.reload import gunicorn_ssl_context

    settings.update(_worker_settings(opts, args))
    settings.update(
        bind=[bind],
        workers=opts.workers,
        # Every worker listens on its own SO_REUSEPORT socket and the kernel spreads new
        # connections over them. On one shared socket the worker that wakes first accepts a
        # whole burst: measured (bench/README.md) one gevent worker holding every connection
        # while the other idled. The cost: connections still in a stopping worker's accept
        # queue are reset.
        reuse_port=args.reuse_port,
        timeout=60,
        graceful_timeout=opts.graceful_timeout,
        loglevel=args.log_level,
        errorlog="-",
        # gunicorn believes X-Forwarded-Proto (and SCRIPT_NAME/PATH_INFO headers) from
        # 127.0.0.1 by default: any local client could change the scheme and path the
        # gateway sees. Trusted only when the operator names the proxies.
        forwarded_allow_ips=",".join(args.forwarded_allow_ips),
        control_socket_disable=True,
        child_exit=_child_exit,
        post_fork=_post_fork,
        post_worker_init=post_worker_init,
        ssl_context=gunicorn_ssl_context,
        proc_name="bcs-middleware",
    )

    if args.zookeeper:
        cluster_id = app_conf.get("cluster_id") if app_conf else args.cluster_id
        settings.update(_registration_hooks(args, bind, scheme, role, cluster_id or ""))
    if renewer is not None:
        # In the master, once the sockets are bound (workers come and go).
        settings["when_ready"] = _also_start(renewer.start, settings.get("when_ready"))
    if pki is not None:
        print(f"HTTPS certificate authority: {pki.ca_file}  (clients use: curl --cacert {pki.ca_file})", flush=True)
        log.info("TLS: %s", pki.reason)
    uses_token_file = not app_conf or f"file:{ADMIN_TOKEN_FILE}" in app_conf.get("bootstrap_users", "")
    if role == "gateway" and token_file_existed and uses_token_file:
        announce_admin_token_file(data_dir)
    print(f"bcs-middleware {__version__} {role} on {scheme}://{bind}/  (data: {data_dir})", flush=True)
    _Gunicorn(loader, settings).run()
    return 0


def _ini_loader(config_path: Path, global_conf: Mapping[str, str]) -> Callable[[], Any]:
    """The ini's application; built once here to check it (without its background work)."""
    from paste.deploy import loadapp

    uri = f"config:{config_path}"

    def loader() -> Any:
        return loadapp(uri, global_conf=dict(global_conf))

    build_in_master(loader, source=str(config_path))
    return loader


def _runs_on_gevent(argv: Sequence[str]) -> bool:
    """Will this command line run ``serve`` on the gevent worker (the default), or a tunnelling
    ``kube-agent`` on gevent (its default ``--io``)?"""
    if argv and argv[0] == "kube-agent":
        return "--tunnel" in argv and not any(
            arg == "--io=threads" or (arg == "--io" and argv[i + 1:i + 2] == ["threads"])
            for i, arg in enumerate(argv))
    if not argv or argv[0] != "serve":
        return False
    chosen = serve_config.option_value(argv, "--worker-class") or serve_config.ini_worker_class(argv)
    return (chosen or "gevent") == "gevent"


def _patch_for_gevent() -> None:
    """Monkey-patch now, in the master, before the application's modules are imported.

    gunicorn's gevent worker patches only in each worker, after the master has imported
    the application (the gateway is built once in the master): a module that took
    ``ssl.SSLContext`` by name by then (urllib3) keeps the unpatched class, and building a
    context with it recurses forever. Patched here, every module sees gevent's classes;
    the worker's own patching then changes nothing.
    """
    from gevent import monkey

    monkey.patch_all()


def _worker_settings(opts: ServerOptions, args: argparse.Namespace) -> dict[str, Any]:
    """gunicorn's worker class and its connection settings, from ``serve``'s options."""
    if opts.worker_class == "gthread":
        slots = connection_slots("gthread", opts.threads)["worker_connections"]
        return {
            # gunicorn's gthread, each connection counted once and closed off its main thread.
            "worker_class": "bcs_middleware.serving.gthread_worker.GatewayThreadWorker",
            "threads": opts.threads,
            "worker_connections": opts.worker_connections or slots,
            "keepalive": opts.keepalive,
        }
    from ..serving.gevent_worker import gevent_worker

    connections = opts.worker_connections or DEFAULT_WORKER_CONNECTIONS
    _warn_if_few_descriptors(connections)
    return {
        "worker_class": gevent_worker(header_timeout=args.header_timeout,
                                      body_idle_timeout=args.body_idle_timeout),
        "worker_connections": connections,
        "keepalive": opts.keepalive,
    }


def _warn_if_few_descriptors(connections: int) -> None:
    # Each stream holds two descriptors (client and upstream); past the limit accept() fails
    # and clients wait in the kernel's queue. Raising it is the operator's call (ulimit -n,
    # systemd LimitNOFILE=), not the program's.
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * connections + 64
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning("the open-file limit (%d) is below what %d connections per worker need (%d): "
                    "raise it (ulimit -n, LimitNOFILE=) or lower --worker-connections", soft,
                    connections, needed)


def _gateway_loader(args: argparse.Namespace, data_dir: Path, ca_file: str | None,
                    cert_for_api: Path | None) -> Callable[[], Any]:
    from ..compose.gateway import build_gateway, config_from_options
    from ..core.errors import ConfigError
    from ..store.sql import open_store

    options: dict[str, Any] = {
        "data_dir": str(data_dir),
        "bootstrap_users": {"admin": ADMIN_TOKEN_SOURCE},
    }
    if args.database_url:
        options["database_url"] = args.database_url
    if ca_file:
        options["gateway_ca_file"] = str(ca_file)
    if cert_for_api:
        options["gateway_cert_file"] = str(cert_for_api)
    if args.public_url:
        options["public_url"] = args.public_url
    if args.forwarded_allow_ips:
        # The proxies gunicorn believes are the ones whose X-Forwarded-For the proxy extends.
        options["trusted_proxies"] = ",".join(args.forwarded_allow_ips)
    if args.no_access_log:
        options["access_log"] = "false"
    if args.audit_log:
        options["audit_log"] = args.audit_log
    if args.audit_policy:
        options["audit_policy_file"] = str(Path(args.audit_policy).absolute())
    if args.zookeeper:
        options["zookeeper_hosts"] = args.zookeeper
        options["zookeeper_root"] = args.zookeeper_root
    if args.static_driver:
        options["static_drivers"] = serve_config.flag_value("static_driver", args.static_driver)
    if args.driver_ca_file:
        options["driver_ca_file"] = args.driver_ca_file
    if args.client_cert_map:
        options["client_cert_subjects"] = "\n".join(args.client_cert_map)
    if args.upstream_allow:
        options["upstream_allow"] = " ".join(args.upstream_allow)
    if args.upstream_deny:
        options["upstream_deny"] = " ".join(args.upstream_deny)
    if args.peer_address:
        options["peer_address"] = args.peer_address
    if args.cluster_creators:
        options["cluster_creators"] = args.cluster_creators
    for spec in args.quota:
        name, sep, limit = spec.partition("=")
        if not sep:
            raise ConfigError(f"--quota {spec!r}: expected NAME=LIMIT")
        options[f"quota_{name.strip().replace('-', '_')}"] = limit
    config = config_from_options("serve", options)

    def check() -> None:
        # Migrate, check what instances sharing the database must agree on, bootstrap: once, here.
        store = open_store(config.database_url, data_dir=data_dir, secret_key=None)
        try:
            build_gateway(config, store=store, background=False)
        finally:
            store.db.dispose()

    build_in_master(check, source="the gateway")

    def loader() -> Any:
        # Parsed again: the bootstrap token the check may have generated is in its file now.
        return build_gateway(config_from_options("serve", options))

    return loader


def _driver_loader(args: argparse.Namespace, data_dir: Path) -> Callable[[], Any]:
    """The mesos-driver role: admission definitions in the data directory (or --database-url)."""
    from ..compose.driver import app_factory

    if not args.cluster_id:
        raise ConfigError("serve --role driver needs --cluster-id")
    if bool(args.zookeeper) == bool(args.scheduler):
        raise ConfigError("serve --role driver needs --zookeeper or --scheduler URL (not both)")
    options: dict[str, Any] = {"cluster_id": args.cluster_id}
    if args.database_url:
        options["database_url"] = args.database_url
    else:
        options["data_dir"] = str(data_dir)
    if args.zookeeper:
        options["zookeeper_hosts"] = args.zookeeper
        options["zookeeper_root"] = args.zookeeper_root
    else:
        options["static_schedulers"] = " ".join(args.scheduler)
    if args.scheduler_ca_file:
        options["scheduler_ca_file"] = args.scheduler_ca_file
    if args.console_port:
        options["console_port"] = args.console_port
    if args.console_ca_file:
        options["console_ca_file"] = args.console_ca_file
    if args.console_http:
        options["console_scheme"] = "http"
    for key in ("upstream_allow", "upstream_deny"):
        if getattr(args, key):
            options[key] = " ".join(getattr(args, key))

    def loader() -> Any:
        return app_factory({}, **options)

    build_in_master(loader, source="the driver")  # migrate and fail on bad options before forking
    return loader


def _also_start(start: Callable[[], None], hook: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """A gunicorn server hook that calls ``start()`` and then ``hook`` (when there is one)."""

    def when_ready(server: Any) -> None:
        start()
        if hook is not None:
            hook(server)

    return when_ready


def _registration_hooks(args: argparse.Namespace, bind: str, scheme: str, role: str,
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


def cmd_keygen(args: argparse.Namespace) -> int:
    from cryptography.fernet import Fernet

    print(Fernet.generate_key().decode())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcs-middleware", description="Multi-cluster container API gateway.")
    parser.add_argument("--version", action="version", version=f"bcs-middleware {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser(
        "serve", help="run the gateway (or a mesos-driver) under gunicorn",
        description="Run the gateway under gunicorn: HTTPS with a CA generated in the data directory (unless "
                    "--certfile), a bootstrap admin token (env BCS_ADMIN_TOKEN, else DATA_DIR/admin.token, generated "
                    "once), SQLite in the data directory (unless --database-url). With --config, the ini's app "
                    "uses the same data directory.",
    )
    serve.add_argument("--config", metavar="FILE.ini",
                       help="a PasteDeploy ini file: its application, and its [server:main] for what the flags "
                            "below do not set (default: the embedded gateway). Flags that configure the "
                            "application fill the ini's [DEFAULT] values of the same name, and are refused when "
                            "the application does not take them from there")
    serve.add_argument("--bind", help=f"HOST:PORT to listen on (default {DEFAULT_BIND})")
    serve.add_argument("--workers", type=int, help="gunicorn worker processes (default 2)")
    serve.add_argument("--worker-class", choices=serve_config.WORKER_CLASSES,
                       help="gevent (default): each connection is a greenlet, thousands of open "
                            "watches per worker; gthread: each connection being served holds a thread")
    serve.add_argument("--worker-connections", type=int, metavar="N",
                       help="connections one worker serves at once; beyond it clients get 503 with "
                            f"Retry-After (default {DEFAULT_WORKER_CONNECTIONS} under gevent, "
                            f"threads + {KEEPALIVE_SLOTS} under gthread)")
    serve.add_argument("--threads", type=int,
                       help="gthread only: threads per worker; each open watch/log/exec stream holds "
                            "one (default 128; threads start on demand)")
    serve.add_argument("--reuse-port", action=argparse.BooleanOptionalAction, default=True,
                       help="one SO_REUSEPORT listening socket per worker, so the kernel spreads "
                            "connections evenly (default on)")
    serve.add_argument("--keepalive", type=int, metavar="SECONDS",
                       help="an idle keep-alive connection is closed after this (default 75)")
    serve.add_argument("--header-timeout", type=float, default=10, metavar="SECONDS",
                       help="gevent: the TLS handshake and the first request head must arrive within "
                            "this (default 10)")
    serve.add_argument("--body-idle-timeout", type=float, default=60, metavar="SECONDS",
                       help="gevent: a request body (or the client reading its answer) may not stall "
                            "longer (default 60)")
    serve.add_argument("--data-dir", default="./bcs-data", help="data directory (default ./bcs-data)")
    serve.add_argument("--database-url", metavar="URL",
                       help="use this database instead of SQLite in the data directory (postgresql://… needs "
                            "pip install 'bcs-middleware[postgresql]')")
    serve.add_argument("--public-url", help="the gateway's external https URL, if clients reach it by another name")
    serve.add_argument("--tls-host", action="append", default=[], metavar="NAME",
                       help="extra name or IP for the generated certificate (repeatable, comma-separated)")
    serve.add_argument("--tls-check-interval", type=float, default=6 * 3600, metavar="SECONDS",
                       help="how often a running gateway checks its generated certificate; it is "
                            "renewed 30 days before it expires, without a restart (default 6 h)")
    serve.add_argument("--certfile", help="serve this certificate instead of a generated one")
    serve.add_argument("--keyfile", help="the key of --certfile")
    serve.add_argument("--ca-file", help="the CA that signed --certfile (handed to clients)")
    serve.add_argument("--client-ca-file",
                       help="ask clients for a certificate signed by this CA (optional for token clients)")
    serve.add_argument("--client-cert-map", action="append", default=[], metavar="'SUBJECT -> user:NAME|cluster:ID'",
                       help="map a client certificate subject (e.g. 'CN=kube-agent,O=BCS-K8S-001') to a principal")
    serve.add_argument("--upstream-allow", action="append", default=[], metavar="CIDR",
                       help="gateway: connect to cluster apiservers only in these networks (repeatable, "
                            "comma-separated; default any not refused)")
    serve.add_argument("--upstream-deny", action="append", default=[], metavar="CIDR",
                       help="gateway: never connect to cluster apiservers in these networks, e.g. 127.0.0.0/8 "
                            "(repeatable, comma-separated; wins over --upstream-allow)")
    serve.add_argument("--peer-address", metavar="HOST[:PORT|:LOW-HIGH]|off",
                       help="where each worker listens for the other workers and instances that forward requests "
                            "to the kube-agents it holds, and the address they are told (default 127.0.0.1: one "
                            "instance; several instances: an address of this host they reach, and a port range "
                            "for a firewall; off: an agent serves only the worker it connected to)")
    serve.add_argument("--cluster-creators", metavar="everyone|superusers|'user:NAME group:NAME ...'",
                       help="gateway: who may register clusters (default everyone; superusers always may)")
    serve.add_argument("--quota", action="append", default=[], metavar="NAME=LIMIT",
                       help="gateway: a per-user quota (a number, or unlimited; superusers are exempt): "
                            "clusters_per_user (default 50), tokens_per_user (20), "
                            "webhook_configurations_per_cluster (20), permissions_per_cluster (200); repeatable")
    serve.add_argument("--insecure-http", action="store_true",
                       help="serve plain HTTP (kubectl will not send tokens over it)")
    serve.add_argument("--role", choices=("gateway", "driver"),
                       help="gateway (bcs-api, the default) or a Mesos cluster's driver (mesos-driver); with "
                            "--config, the ini's application is the role (a different --role is refused)")
    serve.add_argument("--zookeeper", metavar="HOSTS",
                       help="ZooKeeper hosts (h1:2181,h2:2181): discovery, and this server's registration (with "
                            "--config: the registration, and the ini's [DEFAULT] zookeeper_hosts if it has one)")
    serve.add_argument("--zookeeper-root", default="/bcs/services/endpoints", metavar="PATH",
                       help="ZooKeeper path under which servers register and are discovered "
                            "(default /bcs/services/endpoints)")
    serve.add_argument("--advertise", metavar="HOST:PORT", help="address registered in ZooKeeper (default --bind)")
    serve.add_argument("--static-driver", action="append", default=[], metavar="CLUSTER=URL",
                       help="gateway without ZooKeeper: a mesos-driver of a cluster (repeatable)")
    serve.add_argument("--driver-ca-file", help="gateway: the CA https mesos-drivers' certificates chain to")
    serve.add_argument("--cluster-id", help="driver: the Mesos cluster this driver serves")
    serve.add_argument("--scheduler", action="append", default=[], metavar="URL",
                       help="driver without ZooKeeper: the scheduler (first = master; repeatable)")
    serve.add_argument("--scheduler-ca-file", help="driver: the CA an https scheduler's certificate chains to")
    serve.add_argument("--console-port", type=int, help="driver: the webconsole proxy port on the hosts (8083)")
    serve.add_argument("--console-ca-file", help="driver: the CA the webconsole proxies' certificates chain to")
    serve.add_argument("--console-http", action="store_true",
                       help="driver: the webconsole proxies run without TLS (http/ws)")
    serve.add_argument("--forwarded-allow-ips", action="append", default=[], metavar="IP|CIDR",
                       help="a TLS-terminating proxy in front of the gateway whose X-Forwarded-Proto "
                            "(https) is believed (repeatable, comma-separated; default: none — "
                            "gunicorn's own default trusts 127.0.0.1)")
    serve.add_argument("--graceful-timeout", type=int, metavar="SECONDS",
                       help="on SIGTERM, how long workers may finish requests in flight (default 30)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"),
                       help="level of the log on stderr (default info)")
    serve.add_argument("--no-access-log", action="store_true", help="do not write the JSON access log to stdout")
    serve.add_argument("--audit-log", metavar="PATH|-",
                       help="write a Kubernetes audit.k8s.io/v1 Event (JSON line) per stage of every tunnel "
                            "request to this file (appended, 0600; a missing folder is created 0700), or to "
                            "stdout with '-'")
    serve.add_argument("--audit-policy", metavar="FILE",
                       help="an audit.k8s.io/v1 Policy (YAML/JSON) choosing level and stages per user, verb, "
                            "resource, namespace (default: every request at Metadata level)")
    serve.set_defaults(func=cmd_serve)

    from . import certs as cli_certs

    certs = sub.add_parser("certs", help="write TLS certificates (gateway, webhook service, client)",
                           description="Write TLS certificates signed by a CA: for the gateway, for an admission "
                                       "webhook's Service (prints its caBundle), or a client certificate.")
    cli_certs.configure_parser(certs)
    certs.set_defaults(func=cli_certs.run)

    from . import kube_agent

    agent = sub.add_parser("kube-agent", help="report this cluster's apiserver credentials to a gateway",
                           description=kube_agent.DESCRIPTION, epilog=kube_agent.ENVIRONMENT,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    kube_agent.configure_parser(agent)
    agent.set_defaults(func=kube_agent.run)

    keygen = sub.add_parser("keygen", help="print a new secret key (for BCS_SECRET_KEY / secret_key)",
                            description="Print a new Fernet key. Credentials are encrypted at rest with it "
                                        "(env BCS_SECRET_KEY or the ini's secret_key; several comma-separated "
                                        "keys: the first encrypts, all decrypt, for rotation).")
    keygen.set_defaults(func=cmd_keygen)

    from . import instances as cli_shared

    cli_shared.register(sub)

    from .client import commands as client_commands

    client_commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if _runs_on_gevent(sys.argv[1:] if argv is None else argv):
        _patch_for_gevent()  # before build_parser imports the client modules (and urllib3)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        # A bare command: what it can do, on stderr, and the usage-error status (as argparse's own).
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"bcs-middleware: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
