"""A gunicorn configuration for the gateway: gunicorn --paste examples/gateway.ini -c examples/gunicorn.conf.py

Everything can be set from the environment (BCS_BIND, BCS_WORKERS, BCS_WORKER_CLASS,
BCS_WORKER_CONNECTIONS, BCS_THREADS, BCS_KEEPALIVE, BCS_HEADER_TIMEOUT, BCS_BODY_IDLE_TIMEOUT,
BCS_CERTFILE, BCS_KEYFILE, BCS_DATA_DIR, BCS_ZOOKEEPER, BCS_ADVERTISE_IP, BCS_FORWARDED_ALLOW_IPS,
BCS_INSECURE_HTTP, BCS_TLS_HOSTS, BCS_CA_FILE, BCS_PEER_ADDRESS).

Several workers and instances: a kube-agent's tunnel lands in one worker; each worker runs a peer
listener (started by ``post_worker_init`` below) through which the other workers and instances
reach the agents it holds. BCS_PEER_ADDRESS is the ini's ``peer_address``: the default 127.0.0.1
serves one instance; with several instances, an address of this host the others reach (and a
port range such as ``10.0.0.5:7400-7415`` to open in a firewall, one port per worker).

As ``bcs-middleware serve`` does, it uses one data directory (BCS_DATA_DIR, default ./bcs-data;
handed to the ini as its ``data_dir``), generates the bootstrap admin's token there
(``admin.token``, 0600) unless BCS_ADMIN_TOKEN is set or the database already holds one (another
instance made it), and serves HTTPS with a CA generated in ``data_dir/tls/`` (clients: ``curl
--cacert bcs-data/tls/ca.crt``) unless BCS_CERTFILE/BCS_KEYFILE name another certificate
(BCS_CA_FILE: the CA handed to clients then). BCS_INSECURE_HTTP=1 serves plain HTTP (kubectl then
cannot be used: client-go never sends a bearer token to an http:// server). The application is
built once in the master before any worker (``on_starting`` below): a configuration mistake, or a
secret key, CA or admin token that differs from what the instances sharing the database use,
stops the server with one message.

Worker class: long watch, ``logs -f`` and exec streams stay open for as long as their clients
keep them. The default is the gateway's **gevent** worker
(:class:`bcs_middleware.serving.gevent_worker.GatewayGeventWorker`): each connection is a greenlet of a few
kilobytes, so one worker holds thousands of streams; a request head must arrive within
``BCS_HEADER_TIMEOUT`` (TLS handshake included), a request body may not stall longer than
``BCS_BODY_IDLE_TIMEOUT``, idle keep-alive connections are closed after ``keepalive``, and beyond
``worker_connections`` a client is answered 503 with Retry-After instead of queueing.
``BCS_WORKER_CLASS=gthread`` runs gunicorn's threaded worker instead
(:class:`bcs_middleware.serving.gthread_worker.GatewayThreadWorker`): a thread per stream (size
``threads`` for the streams one worker may hold), none of the limits above.

gevent must patch the standard library before the application's modules are imported (a module
that took ``ssl.SSLContext`` by name keeps the unpatched class otherwise), so this file patches
first when it selects gevent: gunicorn reads it before it loads the application.
"""

from __future__ import annotations

import os

_WORKER_CLASS = os.environ.get("BCS_WORKER_CLASS") or "gevent"
if _WORKER_CLASS == "gevent":
    from gevent import monkey

    monkey.patch_all()

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from bcs_middleware.pki.files import default_gateway_hosts, ensure_gateway_pki  # noqa: E402
from bcs_middleware.pki.reload import CertificateRenewer  # noqa: E402
from bcs_middleware.serving import datadir  # noqa: E402

bind = [os.environ.get("BCS_BIND", "127.0.0.1:8443")]
workers = int(os.environ.get("BCS_WORKERS", "2"))
keepalive = int(os.environ.get("BCS_KEEPALIVE", "75"))
if _WORKER_CLASS == "gevent":
    from bcs_middleware.serving.gevent_worker import gevent_worker

    worker_class = gevent_worker(
        header_timeout=float(os.environ.get("BCS_HEADER_TIMEOUT", "10")),
        body_idle_timeout=float(os.environ.get("BCS_BODY_IDLE_TIMEOUT", "60")),
    )
    # Per worker; two workers hold 10,000 streams even when one takes more than its half.
    # Each connection holds two descriptors (client and upstream): raise the open-file limit.
    worker_connections = int(os.environ.get("BCS_WORKER_CONNECTIONS", "8192"))
else:
    from bcs_middleware.cli.serve_options import connection_slots

    # gunicorn's gthread with each connection counted once (a TCP health check was counted twice,
    # and a stopping worker then left with a kept-alive client's request unanswered) and its
    # lingering close off the main thread.
    worker_class = "bcs_middleware.serving.gthread_worker.GatewayThreadWorker"
    threads = int(os.environ.get("BCS_THREADS", "512"))
    # gthread counts idle keep-alive connections against worker_connections and closes a
    # connection after its answer when worker_connections - threads are idle already: clients
    # would pay a new TLS handshake while the worker has threads to spare (as serve sizes it).
    worker_connections = (int(os.environ.get("BCS_WORKER_CONNECTIONS", "0"))
                          or connection_slots("gthread", threads)["worker_connections"])
timeout = 60
graceful_timeout = 30
# gunicorn 27 opens a control socket at one fixed path by default; one per server here.
control_socket_disable = True
# gunicorn believes X-Forwarded-Proto (https or not) and SCRIPT_NAME/PATH_INFO headers from
# 127.0.0.1 by default, i.e. from any local client. Name the TLS-terminating proxies in front of
# the gateway, if any (comma-separated IPs/CIDRs); no one by default.
forwarded_allow_ips = os.environ.get("BCS_FORWARDED_ALLOW_IPS", "")

_data_dir = datadir.prepare(os.environ.get("BCS_DATA_DIR", datadir.DEFAULT_DATA_DIR))
# The ini's data_dir is this one (a --paste-global on the command line replaces this list).
raw_paste_global_conf = [f"data_dir={_data_dir}"]
if os.environ.get("BCS_PEER_ADDRESS"):
    raw_paste_global_conf += [f"peer_address={os.environ['BCS_PEER_ADDRESS']}"]
# Generated (when needed) by the application's first build, in on_starting below.
_admin_token_existed = (_data_dir / datadir.ADMIN_TOKEN_FILE).exists()

certfile = os.environ.get("BCS_CERTFILE") or None
keyfile = os.environ.get("BCS_KEYFILE") or None
_renewer = None
if os.environ.get("BCS_INSECURE_HTTP", "").lower() in ("1", "true", "yes"):
    if certfile:
        raise SystemExit("error: BCS_INSECURE_HTTP contradicts BCS_CERTFILE")
    print("WARNING: serving plain HTTP (BCS_INSECURE_HTTP): kubectl will not send bearer tokens to an "
          "http:// server, and tokens cross the network in clear text", file=sys.stderr, flush=True)
elif not certfile:
    _hosts = default_gateway_hosts() + [h for h in os.environ.get("BCS_TLS_HOSTS", "").split(",") if h]
    _pki = ensure_gateway_pki(_data_dir, _hosts)
    certfile, keyfile = str(_pki.cert_file), str(_pki.key_file)
    _renewer = CertificateRenewer(_data_dir, _hosts, interval=6 * 3600)
    print(f"HTTPS certificate authority: {_pki.ca_file}  (clients use: curl --cacert {_pki.ca_file})",
          flush=True)
elif not keyfile:
    raise SystemExit("error: BCS_CERTFILE and BCS_KEYFILE go together")
else:
    # Another certificate: the gateway hands out BCS_CA_FILE (if any), not the generated CA.
    raw_paste_global_conf += [f"gateway_cert_file={Path(certfile).absolute()}"]
    if os.environ.get("BCS_CA_FILE"):
        raw_paste_global_conf += [f"gateway_ca_file={Path(os.environ['BCS_CA_FILE']).absolute()}"]


def ssl_context(conf, default_ssl_context_factory):  # type: ignore[no-untyped-def]
    # gthread asks for a server context per connection; reuse one while the files are unchanged.
    from bcs_middleware.pki.reload import gunicorn_ssl_context

    return gunicorn_ssl_context(conf, default_ssl_context_factory)

loglevel = "info"
errorlog = "-"
# The gateway writes its own JSON access log (logger bcs_middleware.access); gunicorn's is off.
accesslog = None
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # Escapes control characters in messages: a client's text in a log line forges no line.
        "plain": {"class": "bcs_middleware.telemetry.logsetup.EscapingFormatter",
                  "format": "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"},
        "json": {"format": "%(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"},
        "access": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"},
    },
    "root": {"handlers": ["stderr"], "level": "INFO"},
    "loggers": {
        "bcs_middleware": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "bcs_middleware.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
        "gunicorn.error": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "gunicorn.access": {"handlers": [], "level": "INFO", "propagate": False},
    },
}

# /metrics aggregates every worker's samples through prometheus_client's multiprocess mode, from
# this server's own directory (data_dir/prometheus/<master pid>): servers sharing the data directory
# neither sum nor wipe each other's; directories of servers that are gone are removed.
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(datadir.server_metrics_dir(_data_dir))


def on_starting(server):  # type: ignore[no-untyped-def]
    # Build the application once, here, before the socket is bound and any worker starts: it
    # migrates, checks what instances sharing the database agree on and makes the admin token.
    from bcs_middleware.serving.hooks import check_in_master

    check_in_master(server)
    if _admin_token_existed:
        datadir.announce_admin_token_file(_data_dir)


def post_fork(server, worker):  # type: ignore[no-untyped-def]
    # Process-owned resources (engines, HTTP pools, batch queues, watcher threads) are made on
    # first use in each process and forgotten in a forked child (bcs_middleware.core.forksafe.
    # PerProcess), so nothing inherited from the master is shared. Nothing to do here beyond
    # what gunicorn does; a custom resource of yours belongs in a PerProcess too.
    server.log.debug("worker %s forked", worker.pid)


def post_worker_init(worker):  # type: ignore[no-untyped-def]
    # Notes the worker's listening sockets (the upstream address policy refuses them), starts the
    # worker's peer listener (other workers and instances reach the kube-agents it holds), and
    # SIGTERM ends open watch/log streams cleanly instead of cutting them at graceful_timeout.
    from bcs_middleware.serving.hooks import post_worker_init as bcs_post_worker_init

    bcs_post_worker_init(worker)


def child_exit(server, worker):  # type: ignore[no-untyped-def]
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def when_ready(server):  # type: ignore[no-untyped-def]
    if _renewer is not None:
        _renewer.start()  # keeps the generated certificate fresh while serving
    # One ZooKeeper registration per server (not per worker), once the socket is bound: the
    # gateway announces itself under /bcs/services/endpoints/apiserver/ from a registration
    # process of its own (any worker class; see bcs_middleware.discovery.registration).
    hosts = os.environ.get("BCS_ZOOKEEPER")
    if not hosts:
        return
    from bcs_middleware.discovery.base import Endpoint
    from bcs_middleware.discovery.registration import apiserver_path, gunicorn_hooks

    host, _, port = bind[0].rpartition(":")
    endpoint = Endpoint(ip=os.environ.get("BCS_ADVERTISE_IP", host.strip("[]")), port=int(port),
                        scheme="https" if certfile else "http")
    register, server.bcs_deregister = gunicorn_hooks(hosts, apiserver_path(), endpoint)
    register(server)


def on_exit(server):  # type: ignore[no-untyped-def]
    deregister = getattr(server, "bcs_deregister", None)
    if deregister is not None:
        deregister(server)
