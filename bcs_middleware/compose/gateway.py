"""The gateway composition (the source system's "bcs-api" role) and its app factory.

Request flow::

    RequestContextMiddleware (request id, error style, metrics, access log)
      ├ /bcsapi/v1/websocket/connect           AgentTunnelMiddleware (kube-agent tunnels,
      │                                        authenticated by the register token)
      └ TokenAuthMiddleware                    bcs.user / bcs.agent
          └ GatewayDispatcher                  apps/dispatcher.py, by the route kind of the
                                               request's facts (core/routes.py, core/facts.py)
              ├ /healthz /readyz               health (public)
              ├ /metrics                       metrics (superusers, the metrics token)
              ├ /tunnels/clusters/{id}/…       ClusterRoutingMiddleware → [AdmissionMiddleware]
              │                                → UpstreamProxy
              ├ /bcsapi/v4/scheduler/mesos/…   MesosRoutingMiddleware (driver from discovery)
              │                                → UpstreamProxy (the driver admits), or, for
              │                                …/admissionwebhook(s): ClusterDefinitionsAPI
              ├ /bcsapi/v1/webconsole/…        the same, to the driver's /mesosdriver/v4/webconsole/…
              └ /rest/… /clusters/…            ManagementAPI (→ admission definitions API)

Everything a gateway needs is described by a :class:`~bcs_middleware.compose.config.GatewayConfig`;
the paste factory and ``bcs-middleware serve`` only differ in where the strings come from
(:mod:`bcs_middleware.compose.ini`). A gateway is made in three steps, each in its module:

1. **open** (:func:`bcs_middleware.compose.resources.open_resources`): the database (migrated,
   checked against the other instances, bootstrap users applied), certificate files, the
   outbound transport, the agent registry, discovery, the RBAC service — all I/O is here;
2. **assemble** (:func:`assemble`, here): the layers stacked over those resources, without
   any I/O — testable with fakes and no sockets;
3. **start** (:func:`bcs_middleware.compose.start.start_when_serving`): the background work
   (ZooKeeper watch, RBAC sync, the peer listener), once, when the process serves.

:func:`build_gateway` runs the three; :func:`app_factory` is its PasteDeploy face.
"""


from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..agent_tunnel.registry import LocalAgents
from ..agent_tunnel.session_state import MAX_CONCURRENT_DIALS, MAX_STREAMS
from ..apps.dispatcher import GatewayDispatcher
from ..apps.management.app import ManagementAPI
from ..apps.proxy import UpstreamProxy
from ..apps.rbac_status import RBACStatusApp
from ..audit.sink import AuditSink
from ..authn.anonymous import AnonymousAuth
from ..clusters.directory import CachedDirectory
from ..clusters.permissions import ClusterAuthorizer
from ..clusters.reader import TunnelClusterReader
from ..core.errors import ConfigError
from ..core.worker_start import at_worker_start
from ..layers.agent_endpoint import AgentTunnelMiddleware
from ..layers.auth import Authenticator, CachingAuthenticator, StoreAuthenticator, TokenAuthMiddleware
from ..layers.client_cert import ClientCertificateAuthenticator
from ..layers.discovery_cache import DiscoveryCacheMiddleware
from ..layers.kubernetes_route import ClusterRoutingMiddleware
from ..layers.limits import LimitsMiddleware
from ..layers.mesos_route import DRIVER_PATH, MesosRoutingMiddleware
from ..layers.request_context import RequestContextMiddleware
from ..layers.webconsole_route import GATEWAY_PREFIX as WEBCONSOLE_PREFIX
from ..layers.webconsole_route import WEBCONSOLE
from ..limits.settings import LimitSettings
from ..outbound.transport import Transport
from ..recording.catalog import RecordingStore
from ..store.definitions import SQLDefinitionStore
from ..store.sql import SQLStore
from ..telemetry.metrics import LIMIT_CAPACITY
from .config import GatewayConfig
from .ini import gateway_config
from .management import api_settings
from .resources import GatewayResources, open_resources
from .start import start_when_serving

log = logging.getLogger(__name__)


def build_gateway(
    config: GatewayConfig,
    *,
    store: SQLStore | None = None,
    transport: Transport | None = None,
    background: bool = True,
) -> Any:
    """Open, assemble and (with ``background``) arrange to start a gateway (module docs).

    :param store: an already open store (tests, the ``serve`` master); else opened from config.
    :param transport: the gateway's one outbound HTTP stack, shared by every layer that
        calls out — the proxy (tunnel and Mesos drivers), webhooks, the admission layer's
        cluster reads, the RBAC source and sync; a :class:`PooledTransport` from config
        (timeouts, address policy) by default. One gateway per process (each ``serve``
        worker builds its own after the fork), so one transport per process.
    :param background: start the background work when this process serves
        (:mod:`bcs_middleware.compose.start`); ``False``: never (a build only to check, tests).
    """
    from ..serving import hooks as lifecycle

    opened_here = store is None
    resources = open_resources(config, store=store, transport=transport)
    if opened_here and lifecycle.building_in_master():
        lifecycle.after_master_build(resources.store.db.dispose)
    app = assemble(config, resources)
    return start_when_serving(app, resources) if background else app


def assemble(config: GatewayConfig, resources: GatewayResources) -> RequestContextMiddleware:
    """The gateway's layers over ``resources``: the one place they are stacked; no I/O."""
    store = resources.store
    directory = CachedDirectory(store, ttl=config.clusters.cache_ttl)
    # The tunnel asks on every request (cached like the directory); the management
    # API asks the store every time, so a grant made there is usable at once.
    tunnel_access = ClusterAuthorizer(store, rbac_grants=config.rbac.grants, ttl=config.clusters.cache_ttl)
    api_access = ClusterAuthorizer(store, rbac_grants=config.rbac.grants)
    # One definitions store for admission and the definitions API: what the API writes, admission reads.
    definitions = SQLDefinitionStore(store, refresh=config.admission.refresh)
    proxy = UpstreamProxy(
        trusted_proxies=config.server.trusted_proxies,
        transport=resources.transport,
        upgrade_idle_timeout=config.clusters.upgrade_idle_timeout,
        upgrade_max_duration=config.clusters.upgrade_max_duration,
    )
    recordings = _recordings(config, store)
    tunnel, engine = _kubernetes_route(config, resources, _session_recording(config, recordings, proxy),
                                       directory, tunnel_access, definitions)
    mesos, webconsole = _mesos_routes(config, resources, proxy, directory, tunnel_access, engine)
    dispatcher = GatewayDispatcher(
        api=_management(config, resources, api_access, definitions, engine, recordings), tunnel=tunnel,
        store=store.db,
        rbac_status=RBACStatusApp(store, enabled=config.rbac.grants), mesos=mesos,
        discovery=resources.discovery, webconsole=webconsole, metrics_token=config.auth.metrics_token,
    )
    authed = _audited(config, resources.audit_sink, _authenticated(config, resources, dispatcher))
    # Outside user-token auth (and the audit of user requests): the agent authenticates
    # with its register token; its credential report is audited in the store.
    edge = AgentTunnelMiddleware(authed, store=store, agents=resources.agents, directory=directory)
    return RequestContextMiddleware(edge, access_log=config.server.access_log)


def _kubernetes_route(config: GatewayConfig, resources: GatewayResources, proxy: Any,
                      directory: CachedDirectory, access: ClusterAuthorizer,
                      definitions: SQLDefinitionStore) -> tuple[Any, Any]:
    """``/tunnels/clusters/{id}/…``: routing → [admission] → [session recording] → the proxy;
    and the admission engine."""
    from ..layers.admission import AdmissionMiddleware

    clusters = config.clusters
    if not clusters.verify:
        log.warning("TLS verification towards cluster apiservers is OFF (upstream_verify = false)")
    engine = None
    inner: Any = proxy
    if config.admission.enabled:
        admission = AdmissionMiddleware(
            proxy,
            store=definitions,
            cluster_reader=TunnelClusterReader(directory, resources.transport,
                                               tls_server_name=clusters.tls_server_name, verify=clusters.verify),
            mode="kubernetes",
            transport=resources.transport,
            **config.admission.layer_options(),
        )
        engine, inner = admission.engine, admission
    tunnel = ClusterRoutingMiddleware(_discovery_cached(inner, config.limits, resources.agents),
                                      directory=directory, access=access, rbac=config.rbac.enabled,
                                      tls_server_name=clusters.tls_server_name, verify=clusters.verify)
    return tunnel, engine


def _management(config: GatewayConfig, resources: GatewayResources, access: ClusterAuthorizer,
                definitions: SQLDefinitionStore, engine: Any, recordings: RecordingStore) -> ManagementAPI:
    """``/rest/…``: the management API, and the admission definitions API behind it."""
    from ..apps.admission_api import AdmissionWebhookAPI
    from ..recording.reader import StoreReader

    quotas = config.self_service.quotas
    settings = api_settings(config.server, config.self_service, resources.certificates,
                            address_policy=resources.address_policy)
    return ManagementAPI(
        resources.store, settings=settings, access=access,
        fallback=AdmissionWebhookAPI(definitions, engine=engine, require_superuser=True, cluster_access=access,
                                     address_policy=resources.address_policy, transport=resources.transport,
                                     quotas=quotas),
        # An id that drivers serve is registered by superusers only.
        drivers=resources.discovery,
        recordings=StoreReader(recordings, timeout=config.recording.stall_timeout),
    )


def _recordings(config: GatewayConfig, store: SQLStore) -> RecordingStore:
    """Where recorded sessions live (listed and served even while no cluster records)."""
    from ..recording.directory import DirectoryStore
    from ..store.recordings import RecordingRepository

    if config.recording.store == "database":
        return RecordingRepository(store.db)
    if config.store.data_dir is None and config.recording.directory is None:
        # No place for files: an instance without a data directory keeps them in the database.
        return RecordingRepository(store.db)
    return DirectoryStore(recording_directory(config))


def _session_recording(config: GatewayConfig, recordings: RecordingStore, proxy: Any) -> Any:
    """The proxy behind the session recording layer when any cluster's policy records, or when
    sessions are audited (the layer reads an unrecorded session's exit status); else the proxy
    (and the recorder's writer, for retention alone)."""
    from ..recording.recorder import SessionRecorder

    recorder = SessionRecorder(recordings, config.recording)
    if not config.recording.enabled and not (config.audit.log or config.audit.exports):
        # Nothing to record or observe. Recordings made before (the policy turned off since) are
        # still kept by the rules, and sessions a dead worker left are still ended: the writer
        # runs idle, a retention pass per interval. (Held by this registration: no layer holds it.)
        at_worker_start(recorder.start)
        return proxy
    from ..layers.session_recording import SessionRecordingMiddleware

    return SessionRecordingMiddleware(proxy, recorder=recorder)


def recording_directory(config: GatewayConfig) -> Path:
    """Where the directory store keeps recordings: ``recording_dir``, relative to the data directory."""
    directory = config.recording.directory or Path("recordings")
    if not directory.is_absolute():
        if config.store.data_dir is None:
            raise ConfigError("recording_dir must be an absolute path when the gateway has no data_dir")
        directory = Path(config.store.data_dir) / directory
    return directory


def _mesos_routes(config: GatewayConfig, resources: GatewayResources, proxy: UpstreamProxy,
                  directory: CachedDirectory, access: ClusterAuthorizer, engine: Any) -> tuple[Any, Any]:
    """``/bcsapi/v4/scheduler/mesos/…`` and bcs-api's webconsole: a live driver of the cluster."""
    from ..apps.admission_api import ClusterDefinitionsAPI

    mesos_settings, store, refresh = config.mesos, resources.store, config.admission.refresh
    if not mesos_settings.driver_verify:
        log.warning("TLS verification towards mesos-drivers is OFF (driver_verify = false)")
    common: dict[str, Any] = {
        "discovery": resources.discovery, "prefer_external": mesos_settings.prefer_external,
        "max_yaml": mesos_settings.max_yaml, "ca_pem": resources.certificates.driver_ca,
        "verify": mesos_settings.driver_verify, "access": access,
        # A record of another type never reaches drivers (whoever registered it).
        "cluster_types": directory,
    }
    mesos = MesosRoutingMiddleware(
        proxy,
        # A Mesos cluster's admission definitions are served here, for its editors, and
        # reach its drivers through the database they share with the gateway.
        definitions=ClusterDefinitionsAPI(
            lambda cluster_id: SQLDefinitionStore(store, refresh=refresh, bcs_cluster=cluster_id),
            engine=engine, quotas=config.self_service.quotas,
        ),
        **common,
    )
    # bcs-api's webconsole: the same Mesos route (auth, view, a live driver), to the driver's webconsole.
    webconsole = MesosRoutingMiddleware(proxy, prefix=WEBCONSOLE_PREFIX, driver_path=DRIVER_PATH + WEBCONSOLE,
                                        **common)
    return mesos, webconsole


def _authenticated(config: GatewayConfig, resources: GatewayResources, app: Any) -> TokenAuthMiddleware:
    """Token auth (gateway tokens, cached; JWTs of the configured identity providers), and client
    certificates when subjects are mapped."""
    auth, store = config.auth, resources.store
    authenticator: Authenticator = CachingAuthenticator(StoreAuthenticator(store), ttl=auth.token_cache_ttl)
    anonymous: AnonymousAuth | None = None
    if config.identity.authentication_config is not None or config.identity.superuser_groups:
        # Imported only when configured: the JWT and CEL libraries cost a worker seconds to load.
        from ..layers.jwt_auth import sign_in

        configured = sign_in(authenticator, config.identity, resources.transport)
        authenticator, anonymous = configured.authenticator, configured.anonymous
        if anonymous is not None and anonymous.enabled and not config.rbac.enabled:
            raise ConfigError("authentication config: anonymous cannot be enabled while rbac is off "
                              "(an anonymous request would reach a cluster with the gateway's own credential)")
    peer = (ClientCertificateAuthenticator(dict(auth.client_cert_subjects), store.find_user)
            if auth.client_cert_subjects else None)
    return TokenAuthMiddleware(
        _limited(app, config.limits),
        authenticator=authenticator,
        public_paths=auth.public_paths, peer_authenticator=peer, public_routes=("agent_report",),
        anonymous=anonymous,
    )


def _limited(app: Any, limits: LimitSettings) -> Any:
    """The per-user limits around what authenticated requests reach (layers/limits.py), and
    the bounds of the gateway's own clients shown as metrics (``bcs_limits_capacity``)."""
    clients = limits.clients
    for bound, value in (("upstream_idle_per_cluster", clients.upstream_idle_per_cluster),
                         ("upstream_identities", clients.upstream_identities),
                         ("rbac_sync_workers", clients.rbac_sync_workers),
                         ("database_connections", clients.database_connections),
                         ("database_overflow", clients.database_overflow),
                         ("agent_concurrent_dials", MAX_CONCURRENT_DIALS), ("agent_streams", MAX_STREAMS)):
        LIMIT_CAPACITY.labels(bound).set(value)
    return LimitsMiddleware(app, settings=limits) if limits.enabled else app


def _discovery_cached(app: Any, limits: LimitSettings, agents: LocalAgents) -> Any:
    """The per-cluster discovery cache in front of admission and the proxy (layers/discovery_cache.py);
    a cluster's documents are dropped when a newer agent connection replaces the one held here."""
    if not limits.discovery_cache.enabled:
        return app
    cache = DiscoveryCacheMiddleware(app, settings=limits.discovery_cache)
    retire = agents.on_replaced

    def replaced(cluster_id: str) -> None:
        cache.forget_cluster(cluster_id)
        if retire is not None:
            retire(cluster_id)

    agents.on_replaced = replaced
    return cache


def _audited(config: GatewayConfig, sink: AuditSink | None, app: Any) -> Any:
    """Kubernetes audit events, outside token auth: a tunnel request refused for its token is audited too."""
    if sink is None:
        return app
    from ..audit.policy import DEFAULT_POLICY, load_policy
    from ..layers.audit import AuditMiddleware

    policy = load_policy(config.audit.policy_file) if config.audit.policy_file else DEFAULT_POLICY
    return AuditMiddleware(app, sink=sink, policy=policy)


def config_from_options(section: str, local_conf: Mapping[str, Any]) -> GatewayConfig:
    """The gateway's configuration from the ini ``section``'s strings (:func:`.ini.gateway_config`)."""
    return gateway_config(section, local_conf)


def app_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> Any:
    """PasteDeploy app ``egg:bcs-middleware#gateway`` (secrets key from env ``BCS_SECRET_KEY``)::

        [app:main]
        use = egg:bcs-middleware#gateway
        database_url = postgresql://bcs@db.internal/bcs
        bootstrap_users =
            admin = file:/etc/bcs/admin.token
        gateway_ca_file = /etc/bcs/tls/ca.crt
        gateway_cert_file = /etc/bcs/tls/server.crt
        rbac = true
        tls_server_name = kubernetes
        # who may register clusters (everyone | superusers | user:NAME group:NAME ...) and
        # what a non-superuser may create (a number, or unlimited; see bcs_middleware/core/quotas.py)
        cluster_creators = everyone
        quota_clusters_per_user = 50
        quota_tokens_per_user = 20
        quota_webhook_configurations_per_cluster = 20
        quota_permissions_per_cluster = 200
    """
    return build_gateway(config_from_options("app:gateway", local_conf))
