"""``serve``'s command line: its flags, grouped by what they configure (nothing runs here)."""

from __future__ import annotations

import argparse

from . import serve_config
from .serve import cmd_serve
from .serve_options import AUDIT_EXPORT_FLAGS, DEFAULT_BIND, DEFAULT_WORKER_CONNECTIONS, KEEPALIVE_SLOTS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to the ``bcs-middleware`` parser's subparsers."""
    serve = sub.add_parser(
        "serve", help="run the gateway (or a mesos-driver) under gunicorn",
        description="Run the gateway under gunicorn: HTTPS with a CA generated in the data directory (unless "
                    "--certfile), a bootstrap admin token (env BCS_ADMIN_TOKEN, else DATA_DIR/admin.token, generated "
                    "once), SQLite in the data directory (unless --database-url). With --config, the ini's app "
                    "uses the same data directory.",
    )
    for add in (_add_server_flags, _add_data_and_tls_flags, _add_gateway_flags, _add_mesos_flags,
                _add_operation_flags, _add_recording_flags, _add_audit_export_flags):
        add(serve)
    serve.set_defaults(func=cmd_serve)


def _add_server_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``: gunicorn: where and how it listens, its workers and their timeouts."""
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
                            "connections evenly (default on; one worker always uses the master's socket)")
    serve.add_argument("--keepalive", type=int, metavar="SECONDS",
                       help="an idle keep-alive connection is closed after this (default 75)")
    serve.add_argument("--header-timeout", type=float, default=10, metavar="SECONDS",
                       help="gevent: the TLS handshake and the first request head must arrive within "
                            "this (default 10)")
    serve.add_argument("--body-idle-timeout", type=float, default=60, metavar="SECONDS",
                       help="gevent: a request body (or the client reading its answer) may not stall "
                            "longer (default 60)")


def _add_data_and_tls_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``: the data directory, the database and TLS."""
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
    serve.add_argument("--authentication-config", metavar="FILE",
                       help="accept identity-provider JWTs as kube-apiserver does: its AuthenticationConfiguration "
                            "(apiserver.config.k8s.io) file, several issuers, claim mappings, CEL rules")
    serve.add_argument("--superuser-group", action="append", default=[], metavar="GROUP",
                       help="users an identity provider puts in GROUP are superusers (repeatable)")


def _add_gateway_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``: the gateway's policies and the role."""
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
    serve.add_argument("--limits-config", metavar="FILE.yaml",
                       help="gateway: per-user rate and in-flight limits, fair queuing and the discovery cache "
                            "(a YAML file; README: Fair share). Without it the defaults apply")
    serve.add_argument("--insecure-http", action="store_true",
                       help="serve plain HTTP (kubectl will not send tokens over it)")
    serve.add_argument("--role", choices=("gateway", "driver"),
                       help="gateway (bcs-api, the default) or a Mesos cluster's driver (mesos-driver); with "
                            "--config, the ini's application is the role (a different --role is refused)")


def _add_mesos_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``: ZooKeeper, the Mesos drivers and schedulers."""
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


def _add_recording_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``: exec/attach session recording (the ini keys of the same names, recording/settings.py)."""
    serve.add_argument("--record", choices=("off", "on", "required"),
                       help="record kubectl exec/attach sessions as asciicast v2: on (a recording that fails is "
                            "counted, the session goes on), required (a session that cannot be recorded is "
                            "refused), off (default)")
    serve.add_argument("--record-cluster", action="append", default=[], metavar="ID=MODE",
                       help="the recording policy of one cluster (off, on, required; repeatable)")
    serve.add_argument("--record-stdin", action="store_true",
                       help="record what users type too (off by default: stdin carries passwords)")
    serve.add_argument("--recording-store", choices=("directory", "database"),
                       help="where recordings live: files in --recording-dir (default) or the database, so "
                            "every instance sharing it lists and serves every recording")
    serve.add_argument("--recording-dir", metavar="PATH",
                       help="the directory store's folder (default DATA_DIR/recordings)")
    serve.add_argument("--recording-max-age", metavar="DURATION",
                       help="delete recordings older than this (default 720h; 0: keep)")
    serve.add_argument("--recording-max-size", metavar="SIZE",
                       help="delete the oldest recordings beyond this total (default 10GiB; 0: no bound)")
    serve.add_argument("--recording-max-size-per-user", metavar="SIZE",
                       help="a user over this loses their own oldest recordings first, so no user's sessions "
                            "evict another's (default: a tenth of --recording-max-size; 0: no bound)")
    serve.add_argument("--recording-retention-interval", metavar="DURATION",
                       help="how often each worker applies retention and ends sessions whose writer is gone "
                            "(default 10m)")
    serve.add_argument("--recording-buffer", metavar="SIZE",
                       help="bytes of one session held while the store catches up (default 4MiB)")
    serve.add_argument("--recording-stall-timeout", metavar="DURATION",
                       help="a store that takes nothing this long (a write: twice this) has failed the "
                            "recording; creating one that takes longer refuses a required session (default 10s)")
    serve.add_argument("--recording-heartbeat-timeout", metavar="DURATION",
                       help="a session whose writer gave no heartbeat this long is ended as interrupted "
                            "(default 5m; a writer on this host that is gone is seen at once)")


def _add_operation_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``: proxies in front, stopping, logs and audit."""
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


def _add_audit_export_flags(serve: argparse.ArgumentParser) -> None:
    """``serve``: audit events exported to a webhook and to syslog (gateway)."""
    group = serve.add_argument_group("audit export (gateway)")
    for dest, _is_path, keywords in AUDIT_EXPORT_FLAGS:
        group.add_argument("--" + dest.replace("_", "-"), dest=dest, **keywords)
