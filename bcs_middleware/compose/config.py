"""The typed configuration of the two compositions: one frozen dataclass per concern.

A :class:`GatewayConfig` and a :class:`DriverConfig` are made of **sections** — one field
each, holding a frozen dataclass (:class:`StoreSettings`, :class:`OutboundSettings`,
:class:`AdmissionSettings` …). The driver reuses the gateway's sections where it needs the
same thing (store, discovery, outbound, admission) and adds its own (scheduler, console).

Strings stop earlier: the ini keys users write (``admission_budget``, ``upstream_deny`` …)
are flat, and :mod:`bcs_middleware.compose.ini` maps each one onto its section and
attribute, converted. A section that has to look at more than one value (read a file, fill
in a default from the data directory) does it in a ``from_ini(values, context)`` class method
beside its fields; a section without one is built as ``Section(**values)``.

Adding a section: a frozen dataclass whose every field has a default, one field on the
config holding it (``field(default_factory=Section)``), and its ini keys in the config's key
table (:data:`bcs_middleware.compose.ini.GATEWAY_KEYS`) — nothing else changes.

Example::

    config = GatewayConfig(store=StoreSettings(database_url="sqlite://"),
                           admission=AdmissionSettings(enabled=False))
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..audit.export.settings import OPTIONS as AUDIT_EXPORT_OPTIONS
from ..audit.export.settings import AuditExportSettings
from ..audit.export.settings import settings_from_options as audit_export_settings
from ..authn.settings import IdentitySettings
from ..clusters.permissions import ClusterCreators
from ..core.errors import ConfigError
from ..core.quotas import Quotas
from ..discovery.settings import DiscoverySettings
from ..limits.settings import LimitSettings
from ..recording.settings import RecordingSettings
from .bootstrap import BootstrapUser, parse_bootstrap_users, scraper_token_digest

PUBLIC_PATHS = ("/healthz", "/readyz", "/metrics")
MiB = 1024 * 1024


@dataclass(frozen=True)
class IniContext:
    """What a section's ``from_ini`` may need besides its own values.

    :param section: the ini section being read, for messages (``app:gateway``).
    :param data_dir: the data directory, when the configuration names one.
    """

    section: str
    data_dir: Path | None = None


def existing_file(context: IniContext, key: str, value: str | None) -> Path | None:
    """``value`` as a path to a file that exists (``None`` when not set); else a :class:`ConfigError`."""
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"[{context.section}] {key}: no such file {path}")
    return path


@dataclass(frozen=True)
class StoreSettings:
    """Where the database is (gateway and driver): a URL, or SQLite in the data directory."""

    database_url: str | None = None
    data_dir: Path | None = None
    secret_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> StoreSettings:
        return cls(**{**values, "data_dir": context.data_dir})


@dataclass(frozen=True)
class ServerSettings:
    """How the gateway presents itself: its CA and certificate (for client credentials and
    kubeconfigs), its public URL, the management API's body bound, the proxies it trusts."""

    gateway_ca_file: Path | None = None
    gateway_cert_file: Path | None = None
    public_url: str | None = None
    max_body: int = MiB
    trusted_proxies: tuple[str, ...] = ()
    access_log: bool = True

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> ServerSettings:
        ca = existing_file(context, "gateway_ca_file", values.pop("gateway_ca_file", None))
        cert = existing_file(context, "gateway_cert_file", values.pop("gateway_cert_file", None))
        if context.data_dir is not None and ca is None and cert is None:
            # The CA ``serve`` and examples/gunicorn.conf.py generate in the data directory:
            # without it client_credentials and kubeconfigs would carry no CA.
            generated = context.data_dir / "tls"
            if (generated / "ca.crt").is_file() and (generated / "server.crt").is_file():
                ca, cert = generated / "ca.crt", generated / "server.crt"
        proxies = tuple(values.pop("trusted_proxies", ()))
        return cls(gateway_ca_file=ca, gateway_cert_file=cert, trusted_proxies=proxies, **values)


@dataclass(frozen=True)
class AuthSettings:
    """Who a request is: bootstrap superusers, the token cache, public paths, client certificates
    (the server must ask for them: ``serve --client-ca-file``), the metrics scraper's token."""

    bootstrap_users: tuple[BootstrapUser, ...] = ()
    token_cache_ttl: float = 5.0
    public_paths: tuple[str, ...] = PUBLIC_PATHS
    client_cert_subjects: tuple[tuple[str, str], ...] = ()
    # The digest of the token a Prometheus scraper presents for /metrics (superusers need none).
    metrics_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> AuthSettings:
        users = tuple(parse_bootstrap_users(values.pop("bootstrap_users", {}), context.data_dir))
        # The scraper's token: env:VAR, file:/path or sha256:HEX; by default env BCS_METRICS_TOKEN, if set.
        metrics_source = values.pop("metrics_token", None) or (
            "env:BCS_METRICS_TOKEN" if os.environ.get("BCS_METRICS_TOKEN") else "")
        metrics = scraper_token_digest(metrics_source, context.data_dir) if metrics_source else None
        if "public_paths" in values:
            values["public_paths"] = tuple(values["public_paths"])
        subjects = tuple(values.pop("client_cert_subjects", {}).items())
        return cls(bootstrap_users=users, metrics_token=metrics, client_cert_subjects=subjects, **values)


@dataclass(frozen=True)
class OutboundSettings:
    """The one outbound HTTP stack (gateway and driver): timeouts and the address policy's
    CIDRs on top of its built-in refusals (:mod:`bcs_middleware.outbound.addresses`)."""

    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    stream_idle_timeout: float = 3600.0
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> OutboundSettings:
        for key in ("allow", "deny"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


@dataclass(frozen=True)
class ClusterSettings:
    """The Kubernetes route's clusters: how their apiservers are verified, how long a cluster's
    record is cached, and how long an upgraded stream (exec, attach, port-forward) may live."""

    tls_server_name: str | None = None
    verify: bool = True
    cache_ttl: float = 5.0
    upgrade_idle_timeout: float = 3600.0
    upgrade_max_duration: float = 86400.0


@dataclass(frozen=True)
class AdmissionSettings:
    """Admission interception (gateway and driver): bounds, budget, breaker, definition refresh."""

    enabled: bool = True
    max_body: int = 3 * MiB
    budget: float = 15.0
    default_timeout: float = 10.0
    # Estimated memory of the bodies admission holds at once per worker (None: its default, 128 MiB).
    buffer_memory: int | None = None
    buffer_wait: float = 30.0
    # A webhook failing this many times in a row is not called for the cooldown.
    breaker_threshold: int = 5
    breaker_cooldown: float = 30.0
    refresh: float = 2.0
    address_map: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> AdmissionSettings:
        if "address_map" in values:
            values["address_map"] = tuple(values["address_map"].items())
        return cls(**values)

    def layer_options(self) -> dict[str, Any]:
        """The :class:`~bcs_middleware.layers.admission.AdmissionMiddleware` keywords these settings give."""
        return {"max_body": self.max_body, "total_budget": self.budget, "default_timeout": self.default_timeout,
                "buffer_memory": self.buffer_memory, "buffer_wait": self.buffer_wait,
                "breaker_threshold": self.breaker_threshold, "breaker_cooldown": self.breaker_cooldown,
                "address_map": dict(self.address_map)}


@dataclass(frozen=True)
class RBACSettings:
    """The source system's rbac switch: impersonate non-superusers (so each cluster's RBAC
    decides) and, with a source configured, sync grants into RBAC bindings (issue 9). Off: neither."""

    enabled: bool = True
    source_file: str | None = None
    source_url: str | None = None
    source_token_file: str | None = None
    source_ca_file: str | None = None
    interval: float = 300.0

    @property
    def grants(self) -> bool:
        """Whether the subscription runs here — its grants give view only where it does."""
        return self.enabled and bool(self.source_file or self.source_url)


@dataclass(frozen=True)
class MesosSettings:
    """The gateway's Mesos route: how drivers are verified and addressed, the YAML body bound."""

    driver_ca_file: Path | None = None
    driver_verify: bool = True
    prefer_external: bool = True
    max_yaml: int = MiB

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> MesosSettings:
        ca = existing_file(context, "driver_ca_file", values.pop("driver_ca_file", None))
        return cls(driver_ca_file=ca, **values)


@dataclass(frozen=True)
class AgentTunnelSettings:
    """Where this worker's peer listener binds and what it advertises: other workers and
    instances forward dials to the agents it holds (agent_tunnel/peer_link.py). HOST, HOST:PORT
    or HOST:LOW-HIGH; ``None`` (ini ``off``): an agent is used only by the worker it connected to."""

    peer_address: str | None = "127.0.0.1"


@dataclass(frozen=True)
class AuditSettings:
    """Kubernetes audit events for tunnel requests: the log (a file path, or ``-`` for stdout), a
    policy file, and the export backends (a webhook as kube-apiserver's, syslog; each through a
    spool — :mod:`bcs_middleware.audit.export`)."""

    log: str | None = None
    policy_file: str | None = None
    export: AuditExportSettings = field(default_factory=AuditExportSettings)

    def __post_init__(self) -> None:
        if self.policy_file and not self.log and not self.exports:
            raise ConfigError("audit_policy_file needs audit_log or an audit export (audit_webhook_config_file, "
                              "audit_syslog_url)")

    @property
    def exports(self) -> bool:
        return self.export.webhook is not None or self.export.syslog is not None

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> AuditSettings:
        # The export keys (audit_webhook_*, audit_syslog_*, audit_spool_*) are read by the
        # export settings themselves: relative paths are in the data directory.
        export = {key: values.pop(key) for key in list(values) if key in AUDIT_EXPORT_OPTIONS}
        return cls(export=audit_export_settings(export, section=context.section, base=context.data_dir), **values)


@dataclass(frozen=True)
class SelfServiceSettings:
    """Self-service bounds: who may register clusters, and what a non-superuser may create
    (ini ``cluster_creators``, ``quota_<name>``; clusters/permissions.py, core/quotas.py)."""

    cluster_creators: ClusterCreators = field(default_factory=ClusterCreators)
    quotas: Quotas = field(default_factory=Quotas)

    @classmethod
    def from_ini(cls, values: dict[str, Any], context: IniContext) -> SelfServiceSettings:
        quotas = {key.removeprefix("quota_"): values.pop(key) for key in list(values) if key.startswith("quota_")}
        return cls(quotas=Quotas(**quotas), **values)


@dataclass(frozen=True)
class GatewayConfig:
    """Everything that shapes a gateway, one section per concern (see the module docs)."""

    store: StoreSettings = field(default_factory=StoreSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    outbound: OutboundSettings = field(default_factory=OutboundSettings)
    clusters: ClusterSettings = field(default_factory=ClusterSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    rbac: RBACSettings = field(default_factory=RBACSettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    mesos: MesosSettings = field(default_factory=MesosSettings)
    agent_tunnel: AgentTunnelSettings = field(default_factory=AgentTunnelSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    self_service: SelfServiceSettings = field(default_factory=SelfServiceSettings)
    # exec/attach session recording (issue 28): the policy per cluster, the store, retention.
    recording: RecordingSettings = field(default_factory=RecordingSettings)
    # Per-user limits, fair queuing, the discovery cache and the bounds of the gateway's own
    # clients (ini limits_config: a YAML file; bcs_middleware/limits/settings.py). On by default.
    limits: LimitSettings = field(default_factory=LimitSettings)
    # Sign-in with identity providers (issue 27): kube-apiserver's AuthenticationConfiguration
    # file and the groups whose members are superusers (bcs_middleware/authn/).
    identity: IdentitySettings = field(default_factory=IdentitySettings)


@dataclass(frozen=True)
class ManagementConfig:
    """The management API served on its own (paste app ``management_api``): the gateway's store,
    server and self-service sections, read from the same ini keys."""

    store: StoreSettings = field(default_factory=StoreSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    self_service: SelfServiceSettings = field(default_factory=SelfServiceSettings)


@dataclass(frozen=True)
class SchedulerSettings:
    """The driver's scheduler route: path prefix, TLS towards the scheduler, the protocol
    conversion, and who manages admission definitions through the driver."""

    prefix: str = "/v4/"
    ca_file: str | None = None
    verify: bool = True
    convert: bool = True
    definitions_file: str | None = None
    definitions_require_superuser: bool = True


@dataclass(frozen=True)
class ConsoleSettings:
    """How the driver reaches the hosts' webconsole proxies (port, scheme, TLS, a client certificate)."""

    port: int | None = None
    scheme: str | None = None
    ca_file: str | None = None
    verify: bool = True
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True)
class DriverConfig:
    """Everything that shapes a mesos-driver; the store, discovery, outbound and admission
    sections are the gateway's (see the module docs)."""

    cluster_id: str = ""
    store: StoreSettings = field(default_factory=StoreSettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    outbound: OutboundSettings = field(default_factory=OutboundSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)


def section_types(config_type: type[Any]) -> Mapping[str, type[Any]]:
    """The section classes of a config class, by field name (from a default instance)."""
    default = config_type()
    return {name: type(value) for name, value in vars(default).items() if hasattr(value, "__dataclass_fields__")}
