"""The driver composition (the source system's "mesos-driver" role) and its app factory.

One driver (usually three replicas) per Mesos cluster. Request flow::

    DriverApp
      ├ /healthz /readyz                         health; readiness = discovery fresh + a master known
      ├ {driver_prefix}namespaces/{ns}/admissionwebhook…, {driver_prefix}admissionwebhooks
      │                                          AdmissionWebhookAPI (definition CRUD, never intercepted)
      └ {driver_prefix}{uri}                     BCS-ClusterID == cluster_id, else 400 (1405234)
          ├ webconsole/{uri}?host_ip=IP          WebconsoleRouting → the console proxy of that host
          │                                      (HTTP or WebSocket; layers/webconsole_route.py)
          └ AdmissionMiddleware (bcs definitions)
              └ SchedulerRouting                 bcs.upstream = scheduler master (read per request)
                  └ UpstreamProxy                → the scheduler's /v1 call (bcs_middleware.scheduler),
                                                   or {scheduler_prefix}{uri}?{query} for the rest

Protocol conversion: the routes the source's driver converts (applications,
processes, deployments, configmaps, secrets, services ...) become the
bcs-scheduler's own ``/v1`` calls, after admission saw the v4 body — see
:mod:`bcs_middleware.scheduler.routes`. The scheduler's answer is relayed as
it came (status and body), as the source relays it.

A body is decoded once, as the source's Go driver and scheduler decode it
(:func:`bcs_middleware.scheduler.routes.canonical`: keys matched to the Go types'
JSON tags case-insensitively and rewritten to the tags' spelling, a field given in
several spellings merged as Go merges it, duplicate keys refused): admission judges
that document (``bcs.document``), and the conversion and the scheduler get it.

The scheduler master is read from the discovery snapshot for every request, so
when the master changes the next request follows it.

Errors under ``{driver_prefix}`` are the source's bcs envelope
(``bcs.error_style = "bcs"``); the header filter and admission failures are
HTTP 400 with code 1405234, as the source's driver answers them.

Registration: the driver announces itself in ZooKeeper once per gunicorn
server (not per worker) — see :func:`gunicorn_hooks`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..admission.store import DefinitionStore, MemoryDefinitionStore, load_definitions_file
from ..apps.admission_api import AdmissionWebhookAPI
from ..apps.proxy import UpstreamProxy
from ..core import environ as env
from ..core import facts as request_facts
from ..core.bodies import media_type, parse_json, read_bounded, replace_body
from ..core.errors import (
    BadRequest,
    BcsCode,
    BCSError,
    ConfigError,
    NotFound,
    ServiceUnavailable,
    UnsupportedMediaType,
    answer_unexpected,
)
from ..discovery.base import DEFAULT_ROOT, Discovery, Endpoint
from ..discovery.static import StaticDiscovery
from ..layers.admission import AdmissionMiddleware
from ..layers.mesos_route import DRIVER_PATH, safe_subpath
from ..layers.webconsole_route import WEBCONSOLE, WebconsoleRouting
from ..outbound.addresses import AddressPolicy
from ..outbound.transport import PooledTransport
from ..scheduler.routes import canonical, scheduler_call
from .config import DriverConfig
from .ini import driver_config

log = logging.getLogger(__name__)



def _json(start_response: Any, status: str, body: dict[str, Any]) -> list[bytes]:
    payload = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(payload))),
                            ("Cache-Control", "no-store")])
    return [payload]


class SchedulerRouting:
    """Set ``bcs.upstream`` to the scheduler master for ``{driver_prefix}{uri}``.

    :param app: the upstream proxy.
    :param discovery: where the scheduler master is (read per request, from memory).
    :param driver_prefix: the incoming path prefix.
    :param scheduler_prefix: the path prefix on the scheduler.
    :param ca_pem: PEM bundle ``https`` schedulers must chain to.
    :param verify: ``False`` turns TLS verification towards schedulers off (explicit, logged).
    :param convert: turn the source's converted routes into scheduler ``/v1`` calls
        (:mod:`bcs_middleware.scheduler`); ``False`` forwards everything unchanged.
    :param max_body: largest body read for a conversion (413 beyond).
    """

    def __init__(
        self,
        app: Any,
        *,
        discovery: Discovery,
        driver_prefix: str = DRIVER_PATH,
        scheduler_prefix: str = "/v4/",
        ca_pem: str | None = None,
        verify: bool = True,
        convert: bool = True,
        max_body: int = 3 * 1024 * 1024,
    ) -> None:
        self.app = app
        self.discovery = discovery
        self.driver_prefix = driver_prefix
        self.scheduler_prefix = scheduler_prefix.rstrip("/") + "/"
        self.ca_pem = ca_pem
        self.verify = verify
        self.convert = convert
        self.max_body = max_body

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        try:
            uri = safe_subpath(environ.get("PATH_INFO", ""), self.driver_prefix,
                               environ.get("RAW_URI") or environ.get("REQUEST_URI"))
            master = self.discovery.scheduler_master()
            if master is None:
                raise ServiceUnavailable("no scheduler master is known", code_name="NO_SCHEDULER",
                                         bcs_code=BcsCode.HTTP_DO)
            path, query = self.scheduler_prefix + uri, environ.get("QUERY_STRING", "")
            call = self.scheduler_call(environ, uri) if self.convert else None
        except BCSError as exc:
            return exc(environ, start_response)
        if call is not None:
            environ["REQUEST_METHOD"], path, query = call.method, call.path, call.query
            replace_body(environ, call.body or b"", content_type="application/json" if call.body else None)
        environ[env.UPSTREAM] = env.Upstream(
            base_urls=(master.base_url(),),
            path=path,
            query=query,
            ca_pem=self.ca_pem,
            verify=self.verify,
            name="scheduler",
        )
        return self.app(environ, start_response)

    def scheduler_call(self, environ: dict[str, Any], uri: str) -> Any:
        method = environ.get("REQUEST_METHOD", "GET")

        def body() -> Any:
            admitted = env.get_document(environ)
            if admitted is not None:  # admission decoded it for this receiver and judged it
                return admitted.value
            # Only JSON is converted: admission reads JSON and YAML, and a YAML body it did not
            # read (no definition could match) is not turned into objects here either.
            mime = media_type(environ)
            if mime and ("json" not in mime or "yaml" in mime):
                raise UnsupportedMediaType("the body must be JSON (application/json)")
            document = parse_json(read_bounded(environ, self.max_body), what="the request body")
            return canonical(method, uri, document)

        return scheduler_call(method, uri, environ.get("QUERY_STRING", ""), body)


class DriverApp:
    """The mesos-driver role as one WSGI app (see module doc).

    :param cluster_id: the Mesos cluster this driver serves.
    :param discovery: where the scheduler master is.
    :param admission: the admission layer wrapping the scheduler route.
    :param definitions_api: the definition CRUD app.
    :param webconsole: the webconsole route (``None``: no webconsole).
    """

    def __init__(
        self,
        *,
        cluster_id: str,
        discovery: Discovery,
        admission: Any,
        definitions_api: Any,
        webconsole: Any = None,
    ) -> None:
        self.webconsole = webconsole
        self.cluster_id = cluster_id
        self.discovery = discovery
        self.admission = admission
        self.definitions_api = definitions_api
        # The driver's paths are the route table's (core/routes.py): one table decides
        # which path is the driver API and which a definition route.
        self.driver_prefix = DRIVER_PATH
        self.cluster = env.Cluster(cluster_id, "", "mesos")

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        # The driver's edge: an exception no layer meant is a 500 in the route's style.
        begun: list[str] = []

        def noting_start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            begun.append(status)
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        try:
            return self._route(environ, noting_start_response)
        except OSError:
            raise  # the client's connection, or a handed-over socket: the server closes it
        except Exception:
            if begun:
                raise
            return answer_unexpected(environ, start_response)

    def _route(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        # By the route table (core/routes.py), as the gateway's dispatcher: one answer to
        # "is this a definition route", which admission's exemption reads too.
        route = request_facts.of(environ).route
        path = environ.get("PATH_INFO", "")
        if route is not None and route.kind == "health":
            return _json(start_response, "200 OK", {"status": "ok"})
        if route is not None and route.kind == "readiness":
            return self.readyz(start_response)
        if route is None or route.kind != "driver" or not path.startswith(self.driver_prefix):
            return NotFound(f"no route for {path}")(environ, start_response)
        environ[env.ERROR_STYLE] = "bcs"
        rest = path[len(self.driver_prefix):]
        if route.definitions:
            return self.definitions_api(environ, start_response)
        cluster_id = str(environ.get("HTTP_BCS_CLUSTERID", "")).strip()
        if cluster_id != self.cluster_id:
            # The source's header filter: a missing and a wrong header are one failure.
            return BadRequest(
                f"http header BCS-ClusterID {cluster_id!r} is not this driver's cluster {self.cluster_id!r}",
                code_name="CLUSTER_ID_REQUIRED" if not cluster_id else "WRONG_CLUSTER",
                bcs_code=BcsCode.MESOS_DRIVER_HTTP_FILTER_FAILED,
            )(environ, start_response)
        environ[env.CLUSTER] = self.cluster
        if rest.startswith(WEBCONSOLE) and self.webconsole is not None:
            return self.webconsole(environ, start_response)
        return self.admission(environ, start_response)

    def readyz(self, start_response: Any) -> list[bytes]:
        stale = self.discovery.stale()
        master = self.discovery.scheduler_master()
        body = {
            "status": "ready" if not stale and master is not None else "not ready",
            "cluster": self.cluster_id,
            "discovery": "stale" if stale else "ok",
            "scheduler": master.base_url() if master is not None else None,
        }
        status = "200 OK" if body["status"] == "ready" else "503 Service Unavailable"
        return _json(start_response, status, body)


def build_driver(
    *,
    cluster_id: str,
    discovery: Discovery,
    admission_store: DefinitionStore | None = None,
    scheduler_prefix: str = "/v4/",
    proxy: Any = None,
    scheduler_ca_pem: str | None = None,
    scheduler_verify: bool = True,
    admission_options: Mapping[str, Any] | None = None,
    definitions_require_superuser: bool = True,
    convert: bool = True,
    webconsole_options: Mapping[str, Any] | None = None,
) -> DriverApp:
    """Assemble the driver role.

    :param admission_store: bcs admission definitions (an in-memory store by default).
    :param proxy: the terminal app (an :class:`UpstreamProxy` by default).
    :param admission_options: extra keyword arguments for :class:`AdmissionMiddleware`
        (``total_budget``, ``address_map``, ``client`` ...).
    :param definitions_require_superuser: the definition CRUD needs a superuser
        ``bcs.user`` — put the token auth layer in front of the driver to manage
        definitions through it.
    :param convert: the source's protocol conversion to the scheduler's ``/v1``
        API (``False``: forward every request to ``{scheduler_prefix}{uri}``).
    :param webconsole_options: keyword arguments for :class:`WebconsoleRouting`
        (``port``, ``scheme``, ``ca_pem``, ``verify``, ``client_cert``).
    """
    if not cluster_id or "/" in cluster_id:
        raise ConfigError(f"bad cluster id {cluster_id!r}")
    driver_prefix = DRIVER_PATH  # the route table's (core/routes.py)
    store = admission_store if admission_store is not None else MemoryDefinitionStore()
    proxy = proxy if proxy is not None else UpstreamProxy()
    routing = SchedulerRouting(
        proxy,
        discovery=discovery,
        driver_prefix=driver_prefix,
        scheduler_prefix=scheduler_prefix,
        ca_pem=scheduler_ca_pem,
        verify=scheduler_verify,
        convert=convert,
        **({"max_body": admission_options["max_body"]} if admission_options and "max_body" in admission_options
           else {}),
    )
    def decode_for_scheduler(method: str, path: str, document: Any) -> Any:
        uri = path[len(driver_prefix):] if path.startswith(driver_prefix) else path
        return canonical(method, uri, document)

    admission = AdmissionMiddleware(routing, store=store, mode="bcs", canonical=decode_for_scheduler,
                                    **dict(admission_options or {}))
    api = AdmissionWebhookAPI(store, engine=admission.engine,
                              require_superuser=definitions_require_superuser)
    webconsole = WebconsoleRouting(proxy, driver_prefix=driver_prefix, **dict(webconsole_options or {}))
    return DriverApp(cluster_id=cluster_id, discovery=discovery, admission=admission,
                     definitions_api=api, webconsole=webconsole)


def app_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> DriverApp:
    """PasteDeploy app ``egg:bcs-middleware#driver``::

        [app:driver]
        use = egg:bcs-middleware#driver
        cluster_id = BCS-MESOS-10001
        zookeeper_hosts = zk1:2181,zk2:2181,zk3:2181
        # static_schedulers = http://10.0.0.9:8080   ; without ZooKeeper (first = master)
        scheduler_prefix = /v4/           ; for the routes the driver does not convert
        # convert = true                  ; the source's conversion to the scheduler's /v1 API
        # webconsole: {driver_prefix}webconsole/{uri}?host_ip=IP -> https://IP:8083/bcsapi/v1/consoleproxy/{uri}
        # console_port = 8083
        # console_ca_file = /etc/bcs/console-ca.pem
        # console_cert_file = /etc/bcs/driver.crt   ; with console_key_file: presented to the console
        # upstream_deny = 10.0.0.0/24              ; where neither schedulers nor consoles may be
        # admission definitions: the shared SQL store (or SQLite in data_dir), or a file (else in memory)
        database_url = postgresql://bcs@db/bcs
        # definitions_file = /etc/bcs/admission.yaml
        total_budget = 15s
    """
    config = driver_config("app:driver", local_conf)
    store = open_definitions(config)
    proxy = UpstreamProxy(transport=driver_transport(config))
    return build_driver(admission_store=store, proxy=proxy, **driver_options(config))


def driver_options(config: DriverConfig) -> dict[str, Any]:
    """The :func:`build_driver` keywords ``config`` gives besides the store and the proxy
    (reads the CA files it names; no other I/O)."""
    scheduler = config.scheduler
    if not scheduler.verify:
        log.warning("TLS verification towards the Mesos scheduler is OFF (scheduler_verify = false)")
    return {
        "cluster_id": config.cluster_id, "discovery": driver_discovery(config),
        "scheduler_prefix": scheduler.prefix, "scheduler_verify": scheduler.verify,
        "scheduler_ca_pem": _read_ca("scheduler_ca_file", scheduler.ca_file),
        "admission_options": config.admission.layer_options(),
        "definitions_require_superuser": scheduler.definitions_require_superuser, "convert": scheduler.convert,
        "webconsole_options": _console_options(config),
    }


def driver_transport(config: DriverConfig) -> PooledTransport:
    """The driver's outbound stack: webconsole hosts come from the request, so every
    connection goes through the address policy."""
    outbound = config.outbound
    policy = AddressPolicy(allow=outbound.allow, deny=outbound.deny)
    return PooledTransport(connect_timeout=outbound.connect_timeout, read_timeout=outbound.read_timeout,
                           address_policy=policy)


def driver_discovery(config: DriverConfig) -> Discovery:
    """ZooKeeper (``zookeeper_hosts``) or a fixed list (``static_schedulers``): exactly one."""
    settings = config.discovery
    if settings.zookeeper_hosts:
        from ..discovery.zookeeper import ZookeeperDiscovery

        return ZookeeperDiscovery(settings.zookeeper_hosts, root=settings.zookeeper_root,
                                  timeout=settings.zookeeper_timeout)
    return StaticDiscovery(schedulers=list(settings.static_schedulers))


def open_definitions(config: DriverConfig) -> DefinitionStore:
    """The admission definitions: the shared SQL store (or SQLite in ``data_dir``), a file, or memory."""
    database_url, data_dir = config.store.database_url, config.store.data_dir
    if database_url or data_dir:
        from ..store.definitions import SQLDefinitionStore
        from ..store.sql import open_store

        # Migrations run under a lock: every worker (and a gateway sharing the database) may call this.
        # The gateway-wide definitions and this cluster's own (managed through the gateway's
        # /bcsapi/v4/scheduler/mesos/… path by the cluster's editors): share the gateway's database.
        if data_dir and not database_url:
            from ..serving.datadir import prepare

            data_dir = prepare(data_dir)  # the gateway's data directory: created 0700, as serve does
        return SQLDefinitionStore(open_store(database_url, data_dir=data_dir, secret_key=config.store.secret_key),
                                  bcs_cluster=config.cluster_id, inherit=True)
    if config.scheduler.definitions_file:
        return load_definitions_file(config.scheduler.definitions_file)
    return MemoryDefinitionStore()


def _read_ca(key: str, path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"[app:driver] cannot read {key} {path!r}: {exc.strerror}") from None


def _console_options(config: DriverConfig) -> dict[str, Any]:
    """How the driver reaches the hosts' webconsole proxies (port, scheme, TLS)."""
    settings = config.console
    console: dict[str, Any] = {"verify": settings.verify}
    if settings.port is not None:
        console["port"] = settings.port
    if settings.scheme is not None:
        console["scheme"] = settings.scheme
    if not settings.verify:
        log.warning("TLS verification towards webconsole proxies is OFF (console_verify = false)")
    console_ca = _read_ca("console_ca_file", settings.ca_file)
    if console_ca is not None:
        console["ca_pem"] = console_ca
    if settings.cert_file and settings.key_file:
        console["client_cert"] = (settings.cert_file, settings.key_file)
    return console


def gunicorn_hooks(
    *,
    zookeeper_hosts: str,
    cluster_id: str,
    endpoint: Endpoint,
    root: str = DEFAULT_ROOT,
    timeout: float = 10.0,
) -> tuple[Any, Any]:
    """``(when_ready, on_exit)`` for a gunicorn config: register this driver once per server,
    under both ZooKeeper layouts, and deregister first on SIGTERM.

    ``gunicorn.conf.py``::

        from bcs_middleware.discovery import Endpoint
        from bcs_middleware.compose.driver import gunicorn_hooks

        when_ready, on_exit = gunicorn_hooks(
            zookeeper_hosts="zk1:2181", cluster_id="BCS-MESOS-10001",
            endpoint=Endpoint(ip="10.0.0.5", port=8443, scheme="https"))
    """
    import dataclasses

    from ..discovery.registration import driver_path, mesos_driver_path
    from ..discovery.registration import gunicorn_hooks as hooks

    if not endpoint.cluster:
        endpoint = dataclasses.replace(endpoint, cluster=cluster_id)
    # Both layouts, as bk-bcs's driver registers (bk-bcs #136): the gateways' and the Mesos cluster's own.
    return hooks(zookeeper_hosts, driver_path(cluster_id, root), endpoint, timeout=timeout,
                 also=[(mesos_driver_path(root), endpoint)])
