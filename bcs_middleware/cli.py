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
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .datadir import ADMIN_TOKEN_FILE, admin_token_source, announce_admin_token
from .lifecycle import post_worker_init
from .logsetup import configure_logging

log = logging.getLogger("bcs_middleware.cli")

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


def _shared_data_dir(config_file: Path, data_dir: Path, *, cert_file: str | None = None,
                     ca_file: str | None = None) -> dict[str, str]:
    """The global_conf that makes an ini's ``[DEFAULT] data_dir`` this data directory.

    Only ``[DEFAULT]`` values are replaced (PasteDeploy drops a section's own option that
    has the name of a global one); an app section that sets its own ``data_dir`` keeps it,
    with a warning when that splits the state from ``--data-dir``'s TLS files. An explicit
    certificate and CA replace ``[DEFAULT]``'s ``gateway_cert_file``/``gateway_ca_file``.
    """
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config_file)
    defaults = parser.defaults()
    if "data_dir" in defaults:
        shared = {"data_dir": str(data_dir)}
        for key, value in (("gateway_cert_file", cert_file), ("gateway_ca_file", ca_file)):
            if value and key in defaults:
                shared[key] = str(Path(value).absolute())
        return shared
    for section in parser.sections():
        own = parser.get(section, "data_dir", fallback=None)
        if own and not own.startswith("%") and Path(own).absolute() != data_dir:
            log.warning("[%s] data_dir %s is not the data directory %s (where the TLS files are); "
                        "use data_dir in [DEFAULT] to share one", section, own, data_dir)
    return {}


def _server_section(config_file: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config_file)
    return dict(parser["server:main"]) if parser.has_section("server:main") else {}


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
        from .lifecycle import exit_now

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


def cmd_serve(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    configure_logging(args.log_level)

    # Must be set before any metric is created (prometheus_client reads it then).
    metrics_dir = data_dir / "prometheus"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(mode=0o700)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)

    settings: dict[str, Any] = {}
    renewer = None  # keeps the generated certificate fresh while serving
    server = _server_section(Path(args.config)) if args.config else {}
    bind = args.bind or server.get("bind") or DEFAULT_BIND
    busy = _bind_problem(bind)
    if busy:
        print(f"error: cannot listen on {bind}: {busy}", file=sys.stderr)
        return 1
    if args.config and (args.audit_log or args.audit_policy):
        print("error: with --config, set audit_log/audit_policy_file in the ini's [app:main]", file=sys.stderr)
        return 2
    if args.config and args.peer_address:
        print("error: with --config, set peer_address in the ini's [app:main]", file=sys.stderr)
        return 2
    certfile = args.certfile or server.get("certfile")
    keyfile = args.keyfile or server.get("keyfile")
    ca_file = args.ca_file or server.get("ca_file")
    if bool(certfile) != bool(keyfile):
        print("error: --certfile and --keyfile go together", file=sys.stderr)
        return 2
    if args.insecure_http and certfile:
        print("error: --insecure-http contradicts --certfile/--keyfile", file=sys.stderr)
        return 2

    scheme = "https"
    cert_for_api: Path | None = None
    if args.insecure_http:
        scheme = "http"
        log.warning(
            "serving plain HTTP (--insecure-http): kubectl will not send bearer tokens to an http:// "
            "server, so kubectl cannot be used through this gateway%s",
            "" if _bind_is_loopback(bind)
            else "; and user tokens and cluster credentials cross the network in clear text",
        )
    elif certfile:
        settings.update(certfile=str(certfile), keyfile=str(keyfile))
        cert_for_api = Path(certfile)
        if not ca_file:
            log.warning("no --ca-file: client_credentials and kubeconfigs will not carry a CA")
    else:
        from .tls import CertificateRenewer, default_gateway_hosts, ensure_gateway_pki

        if args.tls_check_interval <= 0:
            print("error: --tls-check-interval must be positive", file=sys.stderr)
            return 2

        hosts = default_gateway_hosts() + [h for spec in args.tls_host for h in spec.split(",") if h]
        pki = ensure_gateway_pki(data_dir, hosts)
        renewer = CertificateRenewer(data_dir, hosts, interval=args.tls_check_interval)
        settings.update(certfile=str(pki.cert_file), keyfile=str(pki.key_file))
        ca_file, cert_for_api = str(pki.ca_file), pki.cert_file
        log.info("TLS: %s", pki.reason)
        print(f"HTTPS certificate authority: {pki.ca_file}  (clients use: curl --cacert {pki.ca_file})", flush=True)

    if args.client_ca_file:
        if scheme != "https":
            print("error: --client-ca-file needs HTTPS", file=sys.stderr)
            return 2
        import ssl

        # OPTIONAL: token clients keep working; a certificate that is presented must verify.
        settings.update(ca_certs=str(Path(args.client_ca_file).absolute()), cert_reqs=ssl.CERT_OPTIONAL)

    if args.keepalive <= 0 or args.header_timeout <= 0 or args.body_idle_timeout <= 0:
        print("error: --keepalive, --header-timeout and --body-idle-timeout must be positive", file=sys.stderr)
        return 2
    from .tls import gunicorn_ssl_context

    settings.update(_worker_settings(args))
    settings.update(
        bind=[bind],
        workers=args.workers,
        # Every worker listens on its own SO_REUSEPORT socket and the kernel spreads new
        # connections over them. On one shared socket the worker that wakes first accepts a
        # whole burst: measured (bench/README.md) one gevent worker holding every connection
        # while the other idled. The cost: connections still in a stopping worker's accept
        # queue are reset.
        reuse_port=args.reuse_port,
        timeout=60,
        graceful_timeout=args.graceful_timeout,
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

    loader: Callable[[], Any]
    if args.config:
        config_path = str(Path(args.config).absolute())
        # One data directory: the ini's data_dir is this one (the CA above is in it too).
        global_conf = _shared_data_dir(Path(config_path), data_dir, cert_file=certfile,
                                       ca_file=ca_file if certfile else None)
        if f"file:{ADMIN_TOKEN_FILE}" in Path(config_path).read_text():
            # The ini's bootstrap admin reads the data directory's token: make it once, here.
            announce_admin_token(data_dir, *admin_token_source(data_dir))

        def loader() -> Any:
            from paste.deploy import loadapp

            return loadapp(f"config:{config_path}", global_conf=global_conf)

        # Not built in the master: an app may start background work (the RBAC sync), which
        # must live in a worker. Migrations are safe from several workers at once (locked).
    elif args.role == "driver":
        loader = _driver_loader(args, data_dir)
    else:
        loader = _gateway_loader(args, data_dir, ca_file, cert_for_api)

    if args.zookeeper:
        settings.update(_registration_hooks(args, bind, scheme))
    if renewer is not None:
        # In the master, once the sockets are bound (workers come and go).
        settings["when_ready"] = _also_start(renewer.start, settings.get("when_ready"))
    print(f"bcs-middleware {__version__} {args.role} on {scheme}://{bind}/  (data: {data_dir})", flush=True)
    _Gunicorn(loader, settings).run()
    return 0


def _runs_on_gevent(argv: Sequence[str]) -> bool:
    """Will this command line run ``serve`` on the gevent worker (the default), or a tunnelling
    ``kube-agent`` on gevent (its default ``--io``)?"""
    if argv and argv[0] == "kube-agent":
        return "--tunnel" in argv and not any(
            arg == "--io=threads" or (arg == "--io" and argv[i + 1:i + 2] == ["threads"])
            for i, arg in enumerate(argv))
    if not argv or argv[0] != "serve":
        return False
    chosen = "gevent"
    for i, arg in enumerate(argv):
        if arg == "--worker-class" and i + 1 < len(argv):
            chosen = argv[i + 1]
        elif arg.startswith("--worker-class="):
            chosen = arg.partition("=")[2]
    return chosen == "gevent"


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


def _worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """gunicorn's worker class and its connection settings, from ``serve``'s options."""
    if args.worker_class == "gthread":
        slots = connection_slots("gthread", args.threads)["worker_connections"]
        return {
            # gunicorn's gthread, each connection counted once and closed off its main thread.
            "worker_class": "bcs_middleware.gthread_worker.GatewayThreadWorker",
            "threads": args.threads,
            "worker_connections": args.worker_connections or slots,
            "keepalive": args.keepalive,
        }
    from .serving import gevent_worker

    connections = args.worker_connections or DEFAULT_WORKER_CONNECTIONS
    _warn_if_few_descriptors(connections)
    return {
        "worker_class": gevent_worker(header_timeout=args.header_timeout,
                                      body_idle_timeout=args.body_idle_timeout),
        "worker_connections": connections,
        "keepalive": args.keepalive,
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
    from .gateway import build_gateway, config_from_options
    from .store import open_store

    token_source, new_admin_token = admin_token_source(data_dir)
    options: dict[str, Any] = {
        "data_dir": str(data_dir),
        "bootstrap_users": {"admin": token_source},
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
        drivers: dict[str, list[str]] = {}
        for spec in args.static_driver:
            cluster, _, url = spec.partition("=")
            drivers.setdefault(cluster.strip(), []).append(url.strip())
        options["static_drivers"] = {cluster: " ".join(urls) for cluster, urls in drivers.items()}
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
    config = config_from_options("serve", options)
    store = open_store(config.database_url, data_dir=data_dir, secret_key=None)
    build_gateway(config, store=store, background=False)  # migrate + bootstrap once, in the master
    store.dispose()
    announce_admin_token(data_dir, token_source, new_admin_token)

    def loader() -> Any:
        return build_gateway(config)

    return loader


def _driver_loader(args: argparse.Namespace, data_dir: Path) -> Callable[[], Any]:
    """The mesos-driver role: admission definitions in the data directory (or --database-url)."""
    from .driver import app_factory
    from .errors import ConfigError
    from .store import open_store

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
    open_store(args.database_url, data_dir=data_dir).dispose()  # migrate once, in the master
    app_factory({}, **options)  # fail on bad options before forking

    def loader() -> Any:
        return app_factory({}, **options)

    return loader


def _also_start(start: Callable[[], None], hook: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """A gunicorn server hook that calls ``start()`` and then ``hook`` (when there is one)."""

    def when_ready(server: Any) -> None:
        start()
        if hook is not None:
            hook(server)

    return when_ready


def _registration_hooks(args: argparse.Namespace, bind: str, scheme: str) -> dict[str, Any]:
    """One ZooKeeper node per server, in the source system's layout, removed on clean exit."""
    import socket

    from .discovery import DEFAULT_ROOT, Endpoint
    from .discovery.registration import apiserver_path, driver_path, gunicorn_hooks, mesos_driver_path

    address = args.advertise or bind
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - reading a bind address, not binding
        host = socket.gethostbyname(socket.gethostname())
    root = args.zookeeper_root or DEFAULT_ROOT
    endpoint = Endpoint(ip=host, port=int(port), scheme=scheme, cluster=args.cluster_id or "",
                        hostname=socket.gethostname(), version=__version__)
    if args.role == "driver":
        # Both layouts, as bk-bcs's driver registers (the gateways' and the Mesos cluster's own).
        when_ready, on_exit = gunicorn_hooks(args.zookeeper, driver_path(args.cluster_id, root), endpoint,
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
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="run the gateway (or a mesos-driver) under gunicorn",
        description="Run the gateway under gunicorn: HTTPS with a CA generated in the data directory (unless "
                    "--certfile), a bootstrap admin token (env BCS_ADMIN_TOKEN, else DATA_DIR/admin.token, generated "
                    "once), SQLite in the data directory (unless --database-url). With --config, the ini's app "
                    "uses the same data directory.",
    )
    serve.add_argument("--config", help="a PasteDeploy ini file (default: the embedded gateway)")
    serve.add_argument("--bind", help=f"HOST:PORT to listen on (default {DEFAULT_BIND})")
    serve.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (default 2)")
    serve.add_argument("--worker-class", choices=("gevent", "gthread"), default="gevent",
                       help="gevent (default): each connection is a greenlet, thousands of open "
                            "watches per worker; gthread: each connection being served holds a thread")
    serve.add_argument("--worker-connections", type=int, metavar="N",
                       help="connections one worker serves at once; beyond it clients get 503 with "
                            f"Retry-After (default {DEFAULT_WORKER_CONNECTIONS} under gevent, "
                            f"threads + {KEEPALIVE_SLOTS} under gthread)")
    serve.add_argument("--threads", type=int, default=128,
                       help="gthread only: threads per worker; each open watch/log/exec stream holds "
                            "one (default 128; threads start on demand)")
    serve.add_argument("--reuse-port", action=argparse.BooleanOptionalAction, default=True,
                       help="one SO_REUSEPORT listening socket per worker, so the kernel spreads "
                            "connections evenly (default on)")
    serve.add_argument("--keepalive", type=int, default=75, metavar="SECONDS",
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
    serve.add_argument("--insecure-http", action="store_true",
                       help="serve plain HTTP (kubectl will not send tokens over it)")
    serve.add_argument("--role", choices=("gateway", "driver"), default="gateway",
                       help="gateway (bcs-api) or a Mesos cluster's driver (mesos-driver)")
    serve.add_argument("--zookeeper", metavar="HOSTS",
                       help="ZooKeeper hosts (h1:2181,h2:2181): discovery, and this server's registration")
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
    serve.add_argument("--graceful-timeout", type=int, default=30, metavar="SECONDS",
                       help="on SIGTERM, how long workers may finish requests in flight (default 30)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"),
                       help="level of the log on stderr (default info)")
    serve.add_argument("--no-access-log", action="store_true", help="do not write the JSON access log to stdout")
    serve.add_argument("--audit-log", metavar="PATH|-",
                       help="write a Kubernetes audit.k8s.io/v1 Event (JSON line) per stage of every tunnel "
                            "request to this file (appended, 0600), or to stdout with '-'")
    serve.add_argument("--audit-policy", metavar="FILE",
                       help="an audit.k8s.io/v1 Policy (YAML/JSON) choosing level and stages per user, verb, "
                            "resource, namespace (default: every request at Metadata level)")
    serve.set_defaults(func=cmd_serve)

    from . import cli_certs

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

    from .client import commands as client_commands

    client_commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import ConfigError

    if _runs_on_gevent(sys.argv[1:] if argv is None else argv):
        _patch_for_gevent()  # before build_parser imports the client modules (and urllib3)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"bcs-middleware: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
