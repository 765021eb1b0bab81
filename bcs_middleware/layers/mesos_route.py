"""Mesos routing: ``/bcsapi/v4/scheduler/mesos/{uri}`` → a live mesos-driver of the cluster.

:class:`MesosRoutingMiddleware` reads the cluster from the ``BCS-ClusterID``
header, takes that cluster's live drivers from a
:class:`~bcs_middleware.discovery.Discovery` (an in-memory snapshot: no request
waits on ZooKeeper) and sets an :class:`~bcs_middleware.core.environ.Upstream` whose
``base_urls`` are all of them, rotated per request so the load spreads; the
proxy fails over along that list, once per driver, on connection errors before
any byte was sent. The path upstream is ``{driver_path}{uri}``, query kept.

``application/x-yaml`` (and ``application/yaml``, ``text/yaml``) bodies are
converted to JSON here with the safe loader, bounded by ``max_yaml`` (413
beyond), and must be a mapping or a list (400 otherwise), so drivers and
schedulers only ever see JSON. The conversion reads the document as the Go
driver would read its JSON (:func:`~bcs_middleware.core.bodies.parse_yaml`: a key twice
is a 400 naming it; :func:`bcs_middleware.scheduler.routes.canonical`: keys in the
Go tags' spelling for the routes the source's driver decodes), and the driver
gets its compact re-encoding. JSON bodies stream on as sent: the driver decodes
and judges them.

Errors are the source's bcs envelope (``bcs.error_style = "bcs"``:
``{"result": false, "code": <bk-bcs error number>, "message", "data": null}``)
with real HTTP statuses: no ``bcs.user`` → 401 (403 for a register token);
missing ``BCS-ClusterID`` → 400 (1405007); given ``access``, a user without
``view`` on the cluster (:mod:`bcs_middleware.clusters.permissions`) → the 404 of a cluster
that does not exist, before anything else is said about it; given
``cluster_types``, an id whose record is not a ``mesos`` cluster → that same 404,
whoever asks (see below); a cluster no driver
ever registered (:meth:`~bcs_middleware.discovery.Discovery.registered`) → that
same 404 (1405051, bcs-api's "mesos cluster not found"); registered drivers all
gone → 503 ``NO_LIVE_DRIVER`` (1405051); a YAML body that does not convert → 400
(1405065); an unsafe path (``..``, encoded ``/``) → 400.

Security: drivers serve the id they were started with, and a user who registers
that id as a ``k8s`` cluster (before the drivers appeared, or under another type)
holds ``edit`` on the record — so routing by ``view`` alone would hand them someone
else's Mesos cluster. Only a ``mesos`` record routes to drivers, and only superusers
register those (:func:`~bcs_middleware.clusters.permissions.reserved_cluster_id`); an id with
no record at all is reached only by whom the operator gave it to (superusers, the
permission subscription's grants), as before records existed.

Reads ``PATH_INFO``, ``RAW_URI``/``REQUEST_URI``, ``QUERY_STRING``,
``HTTP_BCS_CLUSTERID``, ``bcs.user``; sets ``bcs.error_style``, ``bcs.cluster``
(type ``mesos``) and ``bcs.upstream``; may rewrite ``wsgi.input``, ``CONTENT_TYPE``,
``CONTENT_LENGTH``. Requests outside ``prefix`` pass through untouched.

Example::

    from bcs_middleware.discovery import StaticDiscovery
    app = MesosRoutingMiddleware(UpstreamProxy(), discovery=StaticDiscovery(
        {"BCS-MESOS-10001": ["https://10.0.0.5:8443", "https://10.0.0.6:8443"]}))
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..clusters.permissions import EDIT, VIEW, ClusterAccess, cluster_not_found
from ..core import converters as conv
from ..core import environ as env
from ..core import facts as request_facts
from ..core import gojson, routes
from ..core.bodies import BufferBudget, parse_yaml, read_bounded, replace_body, yaml_node_limit
from ..core.errors import (
    BadRequest,
    BcsCode,
    BCSError,
    ConfigError,
    Forbidden,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
)
from ..core.paths import refuse_encoded_separators, safe_rest
from ..core.records import ClusterRecord
from ..discovery.base import Discovery
from ..discovery.settings import DRIVERS_OPTIONS, DiscoverySettings, drivers_discovery
from ..scheduler.routes import canonical

log = logging.getLogger(__name__)

MESOS_PREFIX = routes.MESOS_PREFIX
DRIVER_PATH = routes.DRIVER_PREFIX
_YAML_TYPES = frozenset({"application/x-yaml", "application/yaml", "text/yaml", "text/x-yaml"})


class ClusterRecords(Protocol):
    """Where the route reads a cluster's record (the gateway's cached directory has it)."""

    def lookup(self, cluster_id: str) -> tuple[ClusterRecord | None, Any]: ...


def refuse_unless_mesos(user: env.User, cluster_id: str, record: ClusterRecord | None) -> None:
    """The one rule for sending an id to drivers: its record, if any, is a ``mesos`` cluster.

    A record of another type answers the 404 of an unknown cluster; a superuser (who can
    fix it) is told why.
    """
    if record is None or record.cluster_type == "mesos":
        return
    if user.is_superuser:
        raise NotFound(f"cluster {cluster_id!r} is registered as a {record.cluster_type} cluster: "
                       "it is not routed to mesos-drivers", code_name="CLUSTER_NOT_FOUND")
    raise cluster_not_found(cluster_id)


def safe_subpath(path_info: str, prefix: str, raw_uri: str | None) -> str:
    """The percent-encoded rest of ``path_info`` after ``prefix``; 400 when it could escape."""
    refuse_encoded_separators(raw_uri)
    return safe_rest(path_info[len(prefix):].lstrip("/"))


def cluster_header(environ: Mapping[str, Any]) -> str:
    """The ``BCS-ClusterID`` header, or 400."""
    cluster_id = str(environ.get("HTTP_BCS_CLUSTERID", "")).strip()
    if not cluster_id:
        raise BadRequest("the BCS-ClusterID header is required", code_name="CLUSTER_ID_REQUIRED")
    if len(cluster_id) > 128 or not cluster_id.isprintable() or "/" in cluster_id:
        raise BadRequest("the BCS-ClusterID header is not a cluster id", code_name="BAD_CLUSTER_ID")
    return cluster_id


def yaml_body_to_json(environ: dict[str, Any], max_yaml: int, uri: str | None = None, *,
                      budget: BufferBudget | None = None) -> None:
    """Replace a YAML request body by its JSON form (bounded, safe loader); with ``uri``
    (relative to the driver prefix) the keys the source's driver matches case-insensitively
    are spelled as their tags. With ``budget`` the decoding reserves from it (429 when full)."""
    content_type = environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()
    if content_type not in _YAML_TYPES:
        return
    slot = budget.claim() if budget is not None else None
    try:
        if slot is not None:
            slot.reserve_for(environ, max_yaml)
        _convert_yaml(environ, max_yaml, uri, budget)
    finally:
        if slot is not None:
            slot.release()


def _convert_yaml(environ: dict[str, Any], max_yaml: int, uri: str | None, budget: BufferBudget | None) -> None:
    data = read_bounded(environ, max_yaml, what="a YAML body")
    max_nodes = yaml_node_limit(budget.request_limit) if budget is not None else None
    try:
        document = parse_yaml(data, what="the YAML body", max_nodes=max_nodes) if data else None
    except BadRequest as exc:  # malformed, too deep, aliases: bcs-api's "yaml convert to json" error
        exc.bcs_code = exc.bcs_code or BcsCode.API_MEDIA_TYPE_ERROR
        raise
    del data
    if not isinstance(document, dict | list):
        raise BadRequest("the YAML body must be a mapping or a list", code_name="BAD_YAML",
                         bcs_code=BcsCode.API_MEDIA_TYPE_ERROR)
    if uri is not None:
        document = canonical(environ.get("REQUEST_METHOD", "GET"), uri, document, what="the YAML body")
    replace_body(environ, gojson.dumps(document), content_type="application/json")


class MesosRoutingMiddleware:
    """Route ``{prefix}{uri}`` with ``BCS-ClusterID`` to a live driver (see module doc).

    :param app: the next layer — the :class:`~bcs_middleware.apps.proxy.UpstreamProxy`.
    :param discovery: where drivers are found (static or ZooKeeper).
    :param prefix: the gateway path prefix routed here.
    :param driver_path: the path prefix on the driver.
    :param prefer_external: use a driver's ``external_ip``/``external_port``
        when it registered both, as bcs-api did (``False``: always the inner address).
    :param max_yaml: largest YAML body converted; larger is a 413.
    :param ca_pem: PEM bundle ``https`` drivers must chain to (``None``: system store).
    :param verify: ``False`` turns TLS verification towards drivers off —
        explicit, and logged by the factory; never the default.
    :param access: who may use which cluster (the gateway passes its cached
        :class:`~bcs_middleware.clusters.permissions.ClusterAuthorizer`); ``None`` lets
        every authenticated user reach every cluster's drivers.
    :param definitions: a WSGI app serving a cluster's admission definitions
        (the route table's definition routes, :attr:`bcs_middleware.core.routes.Route.definitions`)
        instead of a driver: it gets ``bcs.cluster`` and
        the path under ``driver_path``, after this layer checked that the caller
        is a superuser or holds ``edit`` on the cluster (``view`` only: 403; less:
        the 404 of an unknown cluster). ``None``: those paths go to a driver too.
    :param cluster_types: the clusters' records: an id recorded as anything but a
        ``mesos`` cluster is never routed (:func:`refuse_unless_mesos`). ``None``: no
        records are consulted (a gateway without a store).
    """

    def __init__(
        self,
        app: Any,
        *,
        discovery: Discovery,
        prefix: str = MESOS_PREFIX,
        driver_path: str = DRIVER_PATH,
        prefer_external: bool = True,
        max_yaml: int = 1024 * 1024,
        ca_pem: str | None = None,
        verify: bool = True,
        access: ClusterAccess | None = None,
        definitions: Any = None,
        cluster_types: ClusterRecords | None = None,
    ) -> None:
        if not driver_path.startswith("/"):
            raise ValueError("driver_path must start with '/'")
        # The paths this layer owns are a route of the one table (core/routes.py), which the
        # dispatcher, the classifier and admission's exemptions read too.
        route = routes.match(prefix.rstrip("/") + "/", "GET")
        if route is None or route.kind not in ("mesos", "webconsole"):
            raise ValueError(f"prefix must be the route table's Mesos or web console prefix "
                             f"({routes.MESOS_PREFIX} or {routes.WEBCONSOLE_PREFIX}), not {prefix!r}")
        self.kind = route.kind
        if max_yaml <= 0:
            raise ValueError("max_yaml must be positive")
        self.app = app
        self.discovery = discovery
        self.prefix = prefix.rstrip("/") + "/"
        self.driver_path = driver_path.rstrip("/") + "/"
        self.prefer_external = prefer_external
        self.max_yaml = max_yaml
        # YAML decodes to several hundred bytes a value: the conversions at once are bounded too.
        self.yaml_budget = BufferBudget(max(64 << 20, 16 * max_yaml), 8 * max_yaml, 10.0, what="YAML")
        self.ca_pem = ca_pem
        self.verify = verify
        self.access = access
        self.definitions = definitions
        self.cluster_types = cluster_types
        # Round-robin start offsets: a process-wide counter is enough to spread
        # load evenly, and next() on itertools.count is atomic under the GIL.
        self._turn = itertools.count()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        route = request_facts.of(environ).route
        if route is None or route.kind != self.kind:
            return self.app(environ, start_response)
        environ[env.ERROR_STYLE] = "bcs"
        try:
            app = self.route(environ, definitions=route.definitions)
        except BCSError as exc:
            return exc(environ, start_response)
        return app(environ, start_response)

    def route(self, environ: dict[str, Any], *, definitions: bool = False) -> Any:
        """Decide where the request goes (sets the environ); the app to call next.

        :param definitions: the request is on a webhook-definition route (its facts say).
        """
        user = env.get_user(environ)
        if user is None:
            if env.get_agent(environ) is not None:
                raise Forbidden("a register token cannot be used to reach a cluster")
            raise Unauthorized("a gateway token is required")
        raw_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI")
        uri = safe_subpath(environ.get("PATH_INFO", ""), self.prefix, raw_uri)
        cluster_id = cluster_header(environ)
        if self.access is not None and not self.access.allows(user, cluster_id, VIEW):
            raise cluster_not_found(cluster_id)
        if self.cluster_types is not None:
            refuse_unless_mesos(user, cluster_id, self.cluster_types.lookup(cluster_id)[0])
        if self.definitions is not None and definitions:
            if self.access is not None:
                if self.access.require(user, cluster_id, EDIT).cluster_type != "mesos":
                    raise cluster_not_found(cluster_id)  # no Mesos cluster by that id
            elif not user.is_superuser:
                raise Forbidden("only superusers manage admission definitions here")
            yaml_body_to_json(environ, self.max_yaml, budget=self.yaml_budget)
            environ[env.CLUSTER] = env.Cluster(cluster_id, "", "mesos")
            environ["PATH_INFO"] = self.driver_path + uri
            return self.definitions
        drivers = self.discovery.drivers(cluster_id)
        if not drivers and not self.discovery.registered(cluster_id):
            raise cluster_not_found(cluster_id)
        if not drivers:
            raise ServiceUnavailable(
                f"no live mesos-driver for cluster {cluster_id!r}", code_name="NO_LIVE_DRIVER"
            )
        yaml_body_to_json(environ, self.max_yaml, uri, budget=self.yaml_budget)
        start = next(self._turn) % len(drivers)
        ordered = drivers[start:] + drivers[:start]
        environ[env.CLUSTER] = env.Cluster(cluster_id, "", "mesos")
        environ[env.UPSTREAM] = env.Upstream(
            base_urls=tuple(d.base_url(self.prefer_external) for d in ordered),
            path=self.driver_path + uri,
            query=environ.get("QUERY_STRING", ""),
            ca_pem=self.ca_pem,
            verify=self.verify,
            name=f"mesos:{cluster_id}",
        )
        return self.app

    def health(self) -> dict[str, Any]:
        """``{"discovery": "ok" | "stale"}`` for a readiness endpoint."""
        return {"discovery": "stale" if self.discovery.stale() else "ok"}


_OPTIONS: dict[str, conv.Converter] = {
    **DRIVERS_OPTIONS,
    "prefix": conv.text,
    "driver_path": conv.text,
    "prefer_external": conv.asbool,
    "max_yaml": conv.size,
    "ca_file": conv.text,
    "verify": conv.asbool,
}


def filter_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy filter ``egg:bcs-middleware#mesos_routing``::

        [filter:mesos_routing]
        use = egg:bcs-middleware#mesos_routing
        zookeeper_hosts = zk1:2181,zk2:2181,zk3:2181
        # zookeeper_root = /bcs/services/endpoints
        # or, without ZooKeeper:
        # static_drivers =
        #     BCS-MESOS-10001 = https://10.0.0.5:8443 https://10.0.0.6:8443
        ca_file = /etc/bcs/driver-ca.pem
        prefer_external = true
        max_yaml = 1MiB
        # prefix = /bcsapi/v4/scheduler/mesos/   ; or /bcsapi/v1/webconsole/ (core/routes.py's)
    """
    section = "filter:mesos_routing"
    opts = conv.convert_options(section, local_conf, _OPTIONS)
    discovery = drivers_discovery(
        DiscoverySettings.from_ini({key: opts.pop(key) for key in DRIVERS_OPTIONS if key in opts}), section=section)
    ca_file = opts.pop("ca_file", None)
    if ca_file:
        try:
            opts["ca_pem"] = Path(ca_file).read_text()
        except OSError as exc:
            raise ConfigError(f"[{section}] cannot read ca_file {ca_file!r}: {exc.strerror}") from None
    if opts.get("verify") is False:
        log.warning("TLS verification towards mesos-drivers is OFF (verify = false)")

    def make(app: Any) -> MesosRoutingMiddleware:
        try:
            return MesosRoutingMiddleware(app, discovery=discovery, **opts)
        except ValueError as exc:  # a prefix the route table does not own, a bad bound
            raise ConfigError(f"[{section}] {exc}") from None

    return make
