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

Everything a gateway needs is described by :class:`GatewayConfig`; the paste
factory and ``bcs-middleware serve`` only differ in where the strings come from.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agent_tunnel.registry import LocalAgents, LocalOnlyDialer
from ..agent_tunnel.router import peer_routing
from ..apps.dispatcher import GatewayDispatcher
from ..apps.management.app import ManagementAPI
from ..apps.management.calls import APISettings
from ..apps.proxy import UpstreamProxy
from ..apps.rbac_status import RBACStatusApp
from ..audit.export.settings import OPTIONS as AUDIT_EXPORT_OPTIONS
from ..audit.export.settings import AuditExportSettings
from ..audit.export.settings import settings_from_options as audit_export_settings
from ..clusters.directory import CachedDirectory
from ..clusters.permissions import ClusterAuthorizer, ClusterCreators
from ..clusters.reader import TunnelClusterReader
from ..core import converters as conv
from ..core.errors import ConfigError
from ..core.quotas import Quotas, limit_value
from ..core.records import Holder
from ..discovery.base import Discovery, Endpoint
from ..discovery.static import StaticDiscovery
from ..layers.agent_endpoint import AgentTunnelMiddleware
from ..layers.auth import CachingAuthenticator, StoreAuthenticator, TokenAuthMiddleware
from ..layers.client_cert import ClientCertificateAuthenticator, parse_subject_map
from ..layers.kubernetes_route import ClusterRoutingMiddleware
from ..layers.mesos_route import DRIVER_PATH, MesosRoutingMiddleware
from ..layers.request_context import RequestContextMiddleware
from ..layers.webconsole_route import GATEWAY_PREFIX as WEBCONSOLE_PREFIX
from ..layers.webconsole_route import WEBCONSOLE
from ..outbound.addresses import AddressPolicy
from ..outbound.backend import TunnelDialer
from ..outbound.transport import PooledTransport, Transport
from ..rbac.service import build_service
from ..store.crypto import new_token, token_digest
from ..store.sql import SQLStore, open_store

log = logging.getLogger(__name__)

#: How long a leaving worker waits for its running RBAC passes (then the lease is left to expire).
RBAC_EXIT_WAIT = 1.0

PUBLIC_PATHS = ("/healthz", "/readyz", "/metrics")


@dataclass(frozen=True)
class BootstrapUser:
    """A superuser from configuration; only the token's digest is kept.

    :param token_digest: the configured token's SHA-256 (``None``: no token is configured).
    :param generate_into: without a token, the file in the data directory where this
        instance writes a new one — only when the database holds none for the user yet.
    :param source: where the token comes from, for messages (never the token).
    """

    name: str
    token_digest: str | None = field(default=None, repr=False)
    generate_into: Path | None = None
    source: str = ""


def parse_bootstrap_users(spec: Mapping[str, str], base: Path | None = None) -> list[BootstrapUser]:
    """``name = env:VAR`` | ``file:/path`` | ``sha256:HEX`` → bootstrap users.

    Token values never sit in an ini file: they come from the environment or a
    file (mode 0600), or only their digest is written. Several sources separated
    by spaces are alternatives, the first available wins — ``env:BCS_ADMIN_TOKEN
    file:admin.token`` is what ``serve`` does. A relative ``file:`` is in ``base``
    (the data directory); when it is the last choice and does not exist, the user has
    no token here and one is generated into it if the database has none
    (:func:`apply_bootstrap`).
    """
    users = []
    for name, source in spec.items():
        choices = source.split()
        user = None
        for choice in choices:
            user = _bootstrap_source(name, choice, base, last=choice is choices[-1])
            if user is not None:
                break
        if user is None:
            raise ConfigError(f"bootstrap user {name!r}: expected env:VAR, file:/path or sha256:HEX")
        users.append(user)
    return users


def _bootstrap_source(name: str, source: str, base: Path | None, *, last: bool,
                      what: str = "bootstrap user") -> BootstrapUser | None:
    """The user from one source; ``None`` when it is absent and another may follow."""
    kind, _, value = source.partition(":")
    if kind == "env":
        token = os.environ.get(value, "").strip()
        if token:
            return BootstrapUser(name, token_digest(token), source=f"env {value}")
        if last:
            raise ConfigError(f"{what} {name!r}: environment variable {value} is not set")
        return None
    if kind == "file":
        path = Path(value)
        in_data_dir = not path.is_absolute() and base is not None
        if in_data_dir:
            path = base / path  # type: ignore[operator]
        if not path.exists():
            if not last:
                return None
            if in_data_dir:
                return BootstrapUser(name, generate_into=path, source=str(path))
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{what} {name!r}: cannot read {path}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"{what} {name!r}: {path} is empty")
        return BootstrapUser(name, token_digest(token), source=str(path))
    if kind == "sha256" and len(value) == 64:
        return BootstrapUser(name, value.lower(), source="a sha256 digest in the configuration")
    raise ConfigError(f"bootstrap user {name!r}: expected env:VAR, file:/path or sha256:HEX")


ROTATE_HINT = "bcs-middleware rotate-admin-token"
_REFUSED = {
    "conflict": "the database {db} already has another bootstrap token for this user (set by another gateway "
                "instance, or by an earlier configuration of this one), and this instance would lock out whoever "
                "holds it. Give this instance that token ({source}), or rotate it deliberately: {hint} "
                "(the old token then stops working on every instance)",
    "revoked": "the configured token ({source}) was revoked (rotated, or revoked through the API) and a restart "
               "does not bring it back: configure the current token, or set a new one: {hint}",
    "taken": "the configured token ({source}) is already another user's token: give this user a token of its own",
}
# Bootstrap users this process already said it joined (workers inherit the master's).
_joined: set[str] = set()


def apply_bootstrap(store: SQLStore, users: Iterable[BootstrapUser]) -> None:
    """Make each bootstrap user a superuser holding its configured token — never at the
    expense of another instance sharing the database.

    * A configured token the database holds already, or the first one for the user, is
      the user's bootstrap token; **another** usable one in the database refuses the start
      (a :class:`ConfigError` naming the fix): instances sharing a database bring the same
      token, and changing it is a deliberate rotation (``bcs-middleware rotate-admin-token``),
      not a side effect of a start. A token once revoked is never brought back by a start.
    * Without a configured token (``generate_into``), a user the database already holds a
      token for is **joined** as it is; only a user without one gets a new token, written
      0600 into the data directory and announced once.
    """
    for user in users:
        record = store.ensure_user(user.name, is_superuser=True)
        digest, mode, written = user.token_digest, "configured", None
        if digest is None and user.generate_into is not None:
            if store.has_bootstrap_token(user.name):
                _say_joined(user.name)
                continue
            digest, mode, written = _generate_token(user.generate_into)
        if digest is None:
            raise ConfigError(f"bootstrap user {user.name!r} has no token")
        outcome = store.claim_bootstrap_token(record.id, digest, mode=mode)  # type: ignore[arg-type]
        if outcome == "joined":  # another instance generated one first
            if written is not None:
                written[0].unlink(missing_ok=True)
            _say_joined(user.name)
        elif outcome in _REFUSED:
            raise ConfigError(f"bootstrap user {user.name!r}: " + _REFUSED[outcome].format(
                db=store.db.display_url, source=user.source, hint=ROTATE_HINT))
        elif written is not None:
            from ..serving.datadir import announce_generated_admin_token

            announce_generated_admin_token(*written)


def _generate_token(path: Path) -> tuple[str, str, tuple[Path, str] | None]:
    """A new token written into ``path``: its digest, the claim mode, and what was written.

    Another process of this server may write it first: then its token is the one."""
    from ..serving.datadir import write_secret_file

    token = new_token()
    try:
        write_secret_file(path, token)
    except FileExistsError:
        return token_digest(path.read_text().strip()), "configured", None
    except OSError as exc:
        raise ConfigError(f"cannot write the bootstrap token to {path}: {exc.strerror}") from None
    return token_digest(token), "generated", (path, token)


def _say_joined(name: str) -> None:
    if name not in _joined:
        _joined.add(name)
        log.info("bootstrap user %r: no token is configured on this instance and the database holds one "
                 "(made by another instance); using that. To replace it: %s", name, ROTATE_HINT)


@dataclass(frozen=True)
class GatewayConfig:
    """Everything that shapes a gateway. Paths are files on this machine."""

    database_url: str | None = None
    data_dir: Path | None = None
    secret_key: str | None = None
    bootstrap_users: tuple[BootstrapUser, ...] = ()
    token_cache_ttl: float = 5.0
    cluster_cache_ttl: float = 5.0
    public_paths: tuple[str, ...] = PUBLIC_PATHS
    gateway_ca_file: Path | None = None
    gateway_cert_file: Path | None = None
    public_url: str | None = None
    max_body: int = 1024 * 1024
    # The source system's rbac switch: impersonate non-superusers (so each cluster's RBAC
    # decides) and, with a source configured, sync grants into RBAC bindings. Off: neither.
    rbac: bool = True
    tls_server_name: str | None = None
    upstream_verify: bool = True
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    stream_idle_timeout: float = 3600.0
    trusted_proxies: tuple[str, ...] = ()
    admission: bool = True
    access_log: bool = True
    # Kubernetes audit events for tunnel requests: a file path, or "-" for stdout.
    audit_log: str | None = None
    audit_policy_file: str | None = None
    # Audit export: a webhook as kube-apiserver's, syslog, through a spool (audit/export/settings.py).
    audit_export: AuditExportSettings = field(default_factory=AuditExportSettings)
    upgrade_idle_timeout: float = 3600.0
    upgrade_max_duration: float = 86400.0
    # Permission subscription (issue 9): grants turned into RBAC bindings in every cluster.
    rbac_source_file: str | None = None
    rbac_source_url: str | None = None
    rbac_source_token_file: str | None = None
    rbac_source_ca_file: str | None = None
    rbac_interval: float = 300.0
    # Mesos clusters: drivers found in ZooKeeper, or listed here (cluster -> driver URLs).
    zookeeper_hosts: str | None = None
    zookeeper_root: str = "/bcs/services/endpoints"
    static_drivers: tuple[tuple[str, tuple[str, ...]], ...] = ()
    driver_ca_file: Path | None = None
    driver_verify: bool = True
    prefer_external: bool = True
    max_yaml: int = 1024 * 1024
    # Client-certificate authentication (the server must ask for certificates: serve --client-ca-file).
    client_cert_subjects: tuple[tuple[str, str], ...] = ()
    admission_max_body: int = 3 * 1024 * 1024
    admission_budget: float = 15.0
    # Estimated memory of the bodies admission holds at once per worker (None: its default, 128 MiB).
    admission_buffer_memory: int | None = None
    admission_buffer_wait: float = 30.0
    # A webhook failing this many times in a row is not called for the cooldown.
    admission_breaker_threshold: int = 5
    admission_breaker_cooldown: float = 30.0
    admission_refresh: float = 2.0
    webhook_address_map: tuple[tuple[str, str], ...] = ()
    # Upstream address policy (outbound/addresses.py): CIDRs on top of the built-in refusals.
    upstream_allow: tuple[str, ...] = ()
    upstream_deny: tuple[str, ...] = ()
    # Where this worker's peer listener binds and what it advertises: other workers and
    # instances forward dials to the agents it holds (agent_tunnel/peer_link.py). HOST, HOST:PORT or
    # HOST:LOW-HIGH; None (ini "off"): an agent is used only by the worker it connected to.
    peer_address: str | None = "127.0.0.1"
    # Self-service bounds: who may register clusters, and what a non-superuser may create
    # (ini cluster_creators, quota_<name>; bcs_middleware/clusters/permissions.py, core/quotas.py).
    cluster_creators: ClusterCreators = field(default_factory=ClusterCreators)
    quotas: Quotas = field(default_factory=Quotas)
    # The digest of the token a Prometheus scraper presents for /metrics (superusers need none).
    metrics_token: str | None = field(default=None, repr=False)


def _read_text(path: Path | None, key: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _discovery(config: GatewayConfig) -> Discovery:
    if config.zookeeper_hosts:
        if config.static_drivers:
            raise ConfigError("set zookeeper_hosts or static_drivers, not both")
        from ..discovery.zookeeper import ZookeeperDiscovery

        return ZookeeperDiscovery(config.zookeeper_hosts, root=config.zookeeper_root)
    return StaticDiscovery(
        {cluster: [Endpoint.from_url(u, cluster=cluster) for u in urls] for cluster, urls in config.static_drivers}
    )


def build_gateway(
    config: GatewayConfig,
    *,
    store: SQLStore | None = None,
    transport: Transport | None = None,
    background: bool | None = None,
) -> RequestContextMiddleware:
    """Assemble the gateway from a config (the one place the layers are stacked).

    :param store: an already open store (tests, the ``serve`` master); else opened from config.
    :param transport: the gateway's one outbound HTTP stack, shared by every layer that
        calls out — the proxy (tunnel and Mesos drivers), webhooks, the admission layer's
        cluster reads, the RBAC source and sync; a :class:`PooledTransport` from config
        (timeouts, address policy) by default. One gateway per process (each ``serve``
        worker builds its own after the fork), so one transport per process.
    :param background: start background work (the RBAC sync) in this process. The
        server's master builds the app once without (to migrate and check the
        configuration: ``False``, or by default while
        :func:`~bcs_middleware.serving.hooks.building_in_master`) and every worker builds its
        own with it; only the worker holding the store's lease reconciles.
    """
    from ..apps.admission_api import AdmissionWebhookAPI, ClusterDefinitionsAPI
    from ..layers.admission import AdmissionMiddleware
    from ..serving import hooks as lifecycle
    from ..store.definitions import SQLDefinitionStore
    from .instance_checks import check_gateway_ca, check_secret_key

    if background is None:
        background = not lifecycle.building_in_master()
    if store is None:
        store = open_store(config.database_url, data_dir=config.data_dir, secret_key=config.secret_key)
        if lifecycle.building_in_master():
            lifecycle.after_master_build(store.db.dispose)
    if store.db.secrets.locked:
        raise ConfigError("the gateway needs a secret key: set secret_key, env BCS_SECRET_KEY, or data_dir")
    # What every instance sharing the database must agree on (instance_checks), before anything else.
    check_secret_key(store)
    ca_pem = _read_text(config.gateway_ca_file, "gateway_ca_file")
    check_gateway_ca(store, ca_pem, source=str(config.gateway_ca_file))
    apply_bootstrap(store, config.bootstrap_users)
    address_policy = AddressPolicy(allow=config.upstream_allow, deny=config.upstream_deny)
    # This process's kube-agent tunnels; clusters they report for are dialled through them.
    agents = LocalAgents(holder=Holder(f"{socket.gethostname()}/{os.getpid()}"), placements=store, tokens=store)
    if background:
        # A worker leaving closes its agents' connections and clears their placements, so the
        # agents reconnect (to another worker) at once and nobody is sent to a dead holder.
        atexit.register(agents.close)
    # Other workers and instances reach this worker's agents through its peer listener.
    tunnels: TunnelDialer = LocalOnlyDialer(agents) if config.peer_address is None else peer_routing(
        agents, store, store.db.secrets, peer_address=config.peer_address, background=background)
    if transport is None:
        transport = PooledTransport(
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            stream_idle_timeout=config.stream_idle_timeout,
            address_policy=address_policy,
            tunnels=tunnels,
        )
    if isinstance(transport, PooledTransport):
        agents.on_replaced = transport.retire_tunnel
    if not config.upstream_verify:
        log.warning("TLS verification towards cluster apiservers is OFF (upstream_verify = false)")
    directory = CachedDirectory(store, ttl=config.cluster_cache_ttl)
    # The subscription's grants give view only where the gateway runs the subscription.
    rbac_grants = config.rbac and bool(config.rbac_source_file or config.rbac_source_url)
    # The tunnel asks on every request (cached like the directory); the management
    # API asks the store every time, so a grant made there is usable at once.
    tunnel_access = ClusterAuthorizer(store, rbac_grants=rbac_grants, ttl=config.cluster_cache_ttl)
    api_access = ClusterAuthorizer(store, rbac_grants=rbac_grants)
    definitions = SQLDefinitionStore(store, refresh=config.admission_refresh)

    proxy = UpstreamProxy(
        trusted_proxies=config.trusted_proxies,
        transport=transport,
        upgrade_idle_timeout=config.upgrade_idle_timeout,
        upgrade_max_duration=config.upgrade_max_duration,
    )
    engine = None
    inner: Any = proxy
    if config.admission:
        admission = AdmissionMiddleware(
            proxy,
            store=definitions,
            cluster_reader=TunnelClusterReader(
                directory, transport, tls_server_name=config.tls_server_name, verify=config.upstream_verify
            ),
            mode="kubernetes",
            max_body=config.admission_max_body,
            total_budget=config.admission_budget,
            buffer_memory=config.admission_buffer_memory,
            buffer_wait=config.admission_buffer_wait,
            breaker_threshold=config.admission_breaker_threshold,
            breaker_cooldown=config.admission_breaker_cooldown,
            address_map=dict(config.webhook_address_map),
            transport=transport,
        )
        engine, inner = admission.engine, admission
    tunnel: Any = ClusterRoutingMiddleware(
        inner,
        directory=directory,
        access=tunnel_access,
        rbac=config.rbac,
        tls_server_name=config.tls_server_name,
        verify=config.upstream_verify,
    )
    cert_text = _read_text(config.gateway_cert_file, "gateway_cert_file")
    cert_pem = cert_text.encode() if cert_text is not None else None
    discovery = _discovery(config)
    if background and hasattr(discovery, "start"):
        discovery.start()  # watch ZooKeeper from the start, not from the first request
    api = ManagementAPI(
        store,
        settings=APISettings(
            gateway_ca_pem=ca_pem, gateway_cert_pem=cert_pem, public_url=config.public_url, max_body=config.max_body,
            address_policy=address_policy, quotas=config.quotas, cluster_creators=config.cluster_creators,
        ),
        access=api_access,
        fallback=AdmissionWebhookAPI(definitions, engine=engine, require_superuser=True, cluster_access=api_access,
                                     address_policy=address_policy, transport=transport, quotas=config.quotas),
        # An id that drivers serve is registered by superusers only.
        drivers=discovery,
    )
    if not config.driver_verify:
        log.warning("TLS verification towards mesos-drivers is OFF (driver_verify = false)")
    mesos = MesosRoutingMiddleware(
        proxy,
        discovery=discovery,
        prefer_external=config.prefer_external,
        max_yaml=config.max_yaml,
        ca_pem=_read_text(config.driver_ca_file, "driver_ca_file"),
        verify=config.driver_verify,
        access=tunnel_access,
        # A record of another type never reaches drivers (whoever registered it).
        cluster_types=directory,
        # A Mesos cluster's admission definitions are served here, for its editors, and
        # reach its drivers through the database they share with the gateway.
        definitions=ClusterDefinitionsAPI(
            lambda cluster_id: SQLDefinitionStore(store, refresh=config.admission_refresh, bcs_cluster=cluster_id),
            engine=engine, quotas=config.quotas,
        ),
    )
    # bcs-api's webconsole: the same Mesos route (auth, view, a live driver), to the driver's webconsole.
    webconsole = MesosRoutingMiddleware(
        proxy,
        discovery=discovery,
        prefix=WEBCONSOLE_PREFIX,
        driver_path=DRIVER_PATH + WEBCONSOLE,
        prefer_external=config.prefer_external,
        max_yaml=config.max_yaml,
        ca_pem=mesos.ca_pem,
        verify=config.driver_verify,
        access=tunnel_access,
        cluster_types=directory,
    )
    rbac_status = RBACStatusApp(store, enabled=rbac_grants)
    if rbac_grants:
        service = build_service(
            store,
            source_file=config.rbac_source_file,
            source_url=config.rbac_source_url,
            source_token_file=config.rbac_source_token_file,
            source_ca_file=config.rbac_source_ca_file,
            interval=config.rbac_interval,
            tls_server_name=config.tls_server_name,
            verify=config.upstream_verify,
            address_policy=address_policy,
            transport=transport,
        )
        if background:
            service.start()
            # gunicorn workers leave through sys.exit: hand the lease over at once, unless a pass
            # is still running after RBAC_EXIT_WAIT (a cluster that does not answer): then the
            # lease expires by itself and the stop is not held up.
            atexit.register(service.stop, RBAC_EXIT_WAIT)
    dispatcher = GatewayDispatcher(
        api=api, tunnel=tunnel, store=store.db, rbac_status=rbac_status, mesos=mesos, discovery=discovery,
        webconsole=webconsole, metrics_token=config.metrics_token,
    )
    authenticator = CachingAuthenticator(StoreAuthenticator(store), ttl=config.token_cache_ttl)
    peer = (
        ClientCertificateAuthenticator(dict(config.client_cert_subjects), store.find_user)
        if config.client_cert_subjects
        else None
    )
    authed: Any = TokenAuthMiddleware(
        dispatcher, authenticator=authenticator, public_paths=config.public_paths, peer_authenticator=peer,
        public_routes=("agent_report",),
    )
    sink = _audit_sink(config, transport, address_policy, background=bool(background))
    if sink is not None:
        from ..audit.policy import DEFAULT_POLICY, load_policy
        from ..layers.audit import AuditMiddleware

        # Outside token auth: a tunnel request refused for its token is audited too.
        policy = load_policy(config.audit_policy_file) if config.audit_policy_file else DEFAULT_POLICY
        authed = AuditMiddleware(authed, sink=sink, policy=policy)
    elif config.audit_policy_file:
        raise ConfigError("audit_policy_file needs audit_log or an audit export (audit_webhook_config_file, "
                          "audit_syslog_url)")
    # Outside user-token auth (and the audit of user requests): the agent authenticates
    # with its register token; its credential report is audited in the store.
    edge: Any = AgentTunnelMiddleware(authed, store=store, agents=agents, directory=directory)
    return RequestContextMiddleware(edge, access_log=config.access_log)


def _audit_sink(config: GatewayConfig, transport: Transport, address_policy: AddressPolicy, *,
                background: bool) -> Any:
    """The audit log and exporters the configuration asks for, ``None`` when it asks for none.

    A worker starts its exporters' spools and threads once it serves (the master that only
    checks the configuration starts nothing)."""
    from ..audit.export.assemble import build_exporters
    from ..audit.sink import AuditSink
    from ..core.worker_start import at_worker_start

    exporters = build_exporters(config.audit_export, data_dir=config.data_dir, transport=transport,
                                address_policy=address_policy)
    if not config.audit_log and not exporters:
        return None
    sink = AuditSink.open(config.audit_log, exporters=exporters)
    if exporters and background:
        at_worker_start(sink.start)
    return sink


_OPTIONS: dict[str, conv.Converter] = {
    "database_url": conv.text,
    "data_dir": conv.text,
    "secret_key": conv.text,
    "bootstrap_users": conv.mapping,
    "token_cache_ttl": conv.seconds,
    "cluster_cache_ttl": conv.seconds,
    "public_paths": conv.aslist,
    "gateway_ca_file": conv.text,
    "gateway_cert_file": conv.text,
    "public_url": conv.url,
    "max_body": conv.size,
    "rbac": conv.asbool,
    "tls_server_name": conv.text,
    "upstream_verify": conv.asbool,
    "connect_timeout": conv.seconds,
    "read_timeout": conv.seconds,
    "stream_idle_timeout": conv.seconds,
    "trusted_proxies": conv.aslist,
    "admission": conv.asbool,
    "access_log": conv.asbool,
    "audit_log": conv.text,
    "audit_policy_file": conv.text,
    "upgrade_idle_timeout": conv.seconds,
    "upgrade_max_duration": conv.seconds,
    "rbac_source_file": conv.text,
    "rbac_source_url": conv.url,
    "rbac_source_token_file": conv.text,
    "rbac_source_ca_file": conv.text,
    "rbac_interval": conv.seconds,
    "zookeeper_hosts": conv.text,
    "zookeeper_root": conv.text,
    "static_drivers": conv.mapping,
    "driver_ca_file": conv.text,
    "driver_verify": conv.asbool,
    "prefer_external": conv.asbool,
    "max_yaml": conv.size,
    "client_cert_subjects": parse_subject_map,
    "admission_max_body": conv.size,
    "admission_budget": conv.seconds,
    "admission_buffer_memory": conv.size,
    "admission_buffer_wait": conv.seconds,
    "admission_breaker_threshold": conv.positive_int,
    "admission_breaker_cooldown": conv.seconds,
    "admission_refresh": conv.seconds,
    "webhook_address_map": conv.mapping,
    "upstream_allow": conv.networks,
    "upstream_deny": conv.networks,
    "peer_address": lambda value: None if value.strip().lower() in ("off", "none") else value.strip(),
    "cluster_creators": ClusterCreators.parse,
    **{f"quota_{name}": limit_value for name in Quotas.names()},
    "metrics_token": conv.text,
    **AUDIT_EXPORT_OPTIONS,
}


def config_from_options(section: str, local_conf: Mapping[str, Any]) -> GatewayConfig:
    opts = conv.convert_options(section, local_conf, _OPTIONS)
    for key in ("gateway_ca_file", "gateway_cert_file", "peer_address"):
        if opts.get(key) == "":
            del opts[key]  # an empty [DEFAULT] value an entry point did not fill in
    if not opts.get("database_url") and not opts.get("data_dir"):
        raise ConfigError(f"[{section}] needs database_url or data_dir")
    paths = {
        k: Path(opts[k]) for k in ("data_dir", "gateway_ca_file", "gateway_cert_file", "driver_ca_file") if opts.get(k)
    }
    for key in ("gateway_ca_file", "gateway_cert_file", "driver_ca_file"):
        if key in paths and not paths[key].is_file():
            raise ConfigError(f"[{section}] {key}: no such file {paths[key]}")
    data_dir = paths.get("data_dir")
    if data_dir is not None and not {"gateway_ca_file", "gateway_cert_file"} & paths.keys():
        # The CA ``serve`` and examples/gunicorn.conf.py generate in the data directory:
        # without it client_credentials and kubeconfigs would carry no CA.
        generated = data_dir / "tls"
        if (generated / "ca.crt").is_file() and (generated / "server.crt").is_file():
            paths["gateway_ca_file"] = generated / "ca.crt"
            paths.setdefault("gateway_cert_file", generated / "server.crt")
    values: dict[str, Any] = {**opts, **paths}
    values["bootstrap_users"] = tuple(parse_bootstrap_users(opts.get("bootstrap_users", {}), data_dir))
    # The scraper's token: env:VAR, file:/path or sha256:HEX; by default env BCS_METRICS_TOKEN, if set.
    metrics_source = opts.get("metrics_token") or (
        "env:BCS_METRICS_TOKEN" if os.environ.get("BCS_METRICS_TOKEN") else "")
    values["metrics_token"] = _metrics_token(metrics_source, data_dir) if metrics_source else None
    for key in ("public_paths", "trusted_proxies", "upstream_allow", "upstream_deny"):
        if key in values:
            values[key] = tuple(values[key])
    if "static_drivers" in values:
        values["static_drivers"] = tuple(
            (cluster, tuple(conv.aslist(urls))) for cluster, urls in values["static_drivers"].items()
        )
    if "client_cert_subjects" in values:
        values["client_cert_subjects"] = tuple(values["client_cert_subjects"].items())
    if "webhook_address_map" in values:
        values["webhook_address_map"] = tuple(values["webhook_address_map"].items())
    quotas = {key.removeprefix("quota_"): values.pop(key) for key in list(values) if key.startswith("quota_")}
    values["quotas"] = Quotas(**quotas)
    export = {key: values.pop(key) for key in list(values) if key in AUDIT_EXPORT_OPTIONS}
    values["audit_export"] = audit_export_settings(export, section=section, base=data_dir)
    return GatewayConfig(**values)


def _metrics_token(source: str, data_dir: Path | None) -> str:
    """The digest of the scraper token ``source`` names (``env:``, ``file:`` or ``sha256:``)."""
    found = _bootstrap_source("metrics_token", source, data_dir, last=True, what="the scraper token")
    if found is None or found.token_digest is None:
        raise ConfigError(f"the scraper token 'metrics_token': cannot read {source.partition(':')[2]}")
    return found.token_digest


def app_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> RequestContextMiddleware:
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
