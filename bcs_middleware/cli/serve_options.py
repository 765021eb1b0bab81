"""``bcs-middleware serve``'s own options resolved: the server's (flag, else the ini's
``[server:main]``, else the default), the bind address, the data directory, the ini's
application and the gunicorn worker settings they make.

Everything here judges flags and files; nothing is started.
"""

from __future__ import annotations

import argparse
import configparser
import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..serving.datadir import prepare as prepare_data_dir
from . import serve_config

log = logging.getLogger("bcs_middleware.cli.main")

DEFAULT_BIND = "127.0.0.1:8443"
# Per gevent worker: connections (watches, exec sessions, idle keep-alive) served at once;
# two workers hold 10,000 streams even when one takes more than its half.
DEFAULT_WORKER_CONNECTIONS = 8192
# Idle keep-alive connections a gthread worker holds beyond its threads (gunicorn's default
# worker_connections). They wait in the worker's poller and cost a socket and a TLS session,
# no thread; with too few, gthread answers "Connection: close" and the clients come back with
# a new TLS handshake while the worker has threads to spare.
KEEPALIVE_SLOTS = 1000


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


def check_serve_flags(args: argparse.Namespace, opts: ServerOptions) -> str | None:
    """What is wrong with ``serve``'s flags taken together (a usage error), else ``None``;
    a malformed value raises :class:`ConfigError`."""
    if args.config and (args.quota or args.cluster_creators):
        return "with --config, set quota_<name> and cluster_creators in the ini's [app:main]"
    if bool(opts.certfile) != bool(opts.keyfile):
        return "--certfile and --keyfile go together"
    if args.insecure_http and opts.certfile:
        return "--insecure-http contradicts --certfile/--keyfile"
    if args.tls_check_interval <= 0:
        return "--tls-check-interval must be positive"
    if opts.keepalive <= 0 or args.header_timeout <= 0 or args.body_idle_timeout <= 0:
        return "--keepalive, --header-timeout and --body-idle-timeout must be positive"
    if args.client_ca_file and args.insecure_http:
        return "--client-ca-file needs HTTPS"
    for spec in args.static_driver:
        if "=" not in spec or not spec.partition("=")[0].strip() or not spec.partition("=")[2].strip():
            raise ConfigError(f"--static-driver {spec!r}: expected CLUSTER=URL")
    if opts.ca_file and not Path(opts.ca_file).is_file():
        raise ConfigError(f"--ca-file {opts.ca_file}: no such file")
    return None


def bind_is_loopback(bind: str) -> bool:
    host = bind.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_problem(bind: str) -> str | None:
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


def prepare_data_dir_flag(path: str) -> Path:
    try:
        return prepare_data_dir(path)
    except OSError as exc:
        raise ConfigError(f"--data-dir {path}: {exc.strerror or exc}") from None


def shared_data_dir(parser: configparser.ConfigParser, data_dir: Path, *, cert_file: str | None = None,
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


def ini_application(args: argparse.Namespace, parser: configparser.ConfigParser, config_path: Path,
                     data_dir: Path, certfile: str | None,
                     ca_file: str | None) -> tuple[str, dict[str, str], dict[str, str]]:
    """The ini's application: its role, the ``global_conf`` the flags fill in, and its options
    (:mod:`bcs_middleware.cli.serve_config`). A flag it would not take, or another ``--role``, is refused."""
    given = serve_config.given_app_flags(args)
    global_conf = {**shared_data_dir(parser, data_dir, cert_file=certfile, ca_file=ca_file if certfile else None),
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


def worker_settings(opts: ServerOptions, args: argparse.Namespace) -> dict[str, Any]:
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


#: ``serve``'s audit export flags: (flag destination = the gateway's ini key, is a file path,
#: argparse keywords). kube-apiserver's names for the webhook (pkg/server/options/audit.go).
AUDIT_EXPORT_FLAGS: tuple[tuple[str, bool, dict[str, Any]], ...] = (
    ("audit_webhook_config_file", True, {
        "metavar": "KUBECONFIG",
        "help": "export audit events to a webhook, as kube-apiserver: a kubeconfig file giving its server, "
                "CA, and client certificate/key or token; events go through a durable spool in the data "
                "directory, so an outage of the receiver loses nothing up to --audit-spool-max-size"}),
    ("audit_webhook_mode", False, {
        "choices": ("batch", "blocking", "blocking-strict"),
        "help": "batch (default): sent in the background, a request never waits; blocking: a request waits "
                "until its events are delivered (30 s at most, or until an attempt failed; the events stay "
                "spooled): a round trip to the receiver per event; blocking-strict: as blocking, and the "
                "request's RequestReceived event is delivered before it is forwarded - a receiver that "
                "does not take it fails the request (500) with nothing sent to the cluster, so the "
                "receiver's availability becomes the gateway's"}),
    ("audit_webhook_batch_buffer_size", False, {
        "metavar": "N", "help": "events waiting in memory for the spool before more are dropped (10000)"}),
    ("audit_webhook_batch_max_size", False, {"metavar": "N", "help": "events in one batch at most (400)"}),
    ("audit_webhook_batch_max_wait", False, {
        "metavar": "DURATION", "help": "how long a batch waits for more events before it is sent (30s)"}),
    ("audit_webhook_batch_throttle_enable", False, {
        "metavar": "true|false", "help": "throttle the batches sent (default true)"}),
    ("audit_webhook_batch_throttle_qps", False, {"metavar": "QPS", "help": "batches a second at most (10)"}),
    ("audit_webhook_batch_throttle_burst", False, {"metavar": "N", "help": "batches sent at once (15)"}),
    ("audit_webhook_initial_backoff", False, {
        "metavar": "DURATION", "help": "wait before the first retry of a failed batch; each next one 1.5 "
                                       "times longer, up to 5m (10s)"}),
    ("audit_webhook_truncate_enabled", False, {
        "metavar": "true|false", "help": "truncate events and split batches as kube-apiserver (default false)"}),
    ("audit_webhook_truncate_max_batch_size", False, {
        "metavar": "BYTES", "help": "with truncation: a batch's size at most, else it is split (10Mi)"}),
    ("audit_webhook_truncate_max_event_size", False, {
        "metavar": "BYTES", "help": "with truncation: an event's size at most; a larger one loses its request "
                                    "and response objects, and is dropped if still larger (100Ki)"}),
    ("audit_syslog_url", False, {
        "metavar": "tcp://HOST:PORT|tls://HOST:PORT",
        "help": "export audit events as RFC 5424 syslog messages over TCP (RFC 6587 octet counting) or TLS "
                "(RFC 5425, verified), through a durable spool in the data directory"}),
    ("audit_syslog_ca_file", True, {"metavar": "FILE", "help": "the CA the syslog receiver's certificate "
                                                                "chains to (default: the system's)"}),
    ("audit_syslog_client_cert_file", True, {"metavar": "FILE", "help": "a client certificate for the syslog "
                                                                         "receiver"}),
    ("audit_syslog_client_key_file", True, {"metavar": "FILE", "help": "its key"}),
    ("audit_syslog_server_name", False, {"metavar": "NAME", "help": "the name the syslog receiver's "
                                                                     "certificate must carry (default: HOST)"}),
    ("audit_spool_max_size", False, {
        "metavar": "BYTES", "help": "each backend's spool per worker at most (256Mi); beyond it events are "
                                    "dropped and counted (bcs_audit_events_dropped)"}),
    ("audit_spool_fsync", False, {
        "metavar": "true|false", "help": "fsync each spooled batch (default true: a machine crash loses "
                                         "nothing spooled; false: a process crash still loses nothing)"}),
)


def audit_export_options(args: argparse.Namespace) -> dict[str, str]:
    """The audit export flags given, as the gateway's ini options (file paths made absolute)."""
    options = {}
    for dest, is_path, _ in AUDIT_EXPORT_FLAGS:
        value = getattr(args, dest, None)
        if value is not None:
            options[dest] = str(Path(value).absolute()) if is_path else str(value)
    return options
