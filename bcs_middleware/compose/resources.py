"""What a gateway process holds open: the first of its three steps (open, assemble, start).

:func:`open_resources` does the gateway's I/O up front, so that :func:`~bcs_middleware.compose.
gateway.assemble` can wire objects without any:

* the database (migrated; one :class:`~bcs_middleware.store.database.Database` per URL per
  process, its engine on :class:`~bcs_middleware.core.forksafe.PerProcess`), then what every
  instance sharing it must agree on (:mod:`.instance_checks`) and the bootstrap users
  (:func:`~bcs_middleware.compose.bootstrap.apply_bootstrap`) — a refusal here is a
  :class:`ConfigError` that stops the start with one message;
* the certificate files the management API and the Mesos route hand out or verify against;
* the outbound transport (its pools on ``PerProcess``), the address policy, this process's
  agent registry and the dialer through it, Mesos discovery, and the RBAC service — built,
  **not started**: :mod:`bcs_middleware.compose.start` starts what runs in the background.

Every object here is owned by the process that opened it: ``serve`` and a gunicorn worker
open their own after the fork (the master's check build opens, checks, and lets go).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..agent_tunnel.registry import LocalAgents, LocalOnlyDialer
from ..agent_tunnel.router import peer_routing
from ..audit.sink import AuditSink
from ..core.errors import ConfigError
from ..core.records import Holder
from ..discovery.base import Discovery
from ..discovery.settings import drivers_discovery
from ..outbound.addresses import AddressPolicy
from ..outbound.backend import TunnelDialer
from ..outbound.transport import PooledTransport, Transport
from ..rbac.service import RBACService, build_service
from ..store.sql import SQLStore, open_store
from .bootstrap import apply_bootstrap
from .config import GatewayConfig, ServerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Certificates:
    """The PEM texts of the gateway's certificate files (``None``: not configured)."""

    gateway_ca: str | None = None
    gateway_cert: str | None = None
    driver_ca: str | None = None


def read_certificates(server: ServerSettings, *, driver_ca_file: Path | None = None) -> Certificates:
    """The contents of the certificate files the configuration names."""
    return Certificates(
        gateway_ca=_read_text(server.gateway_ca_file, "gateway_ca_file"),
        gateway_cert=_read_text(server.gateway_cert_file, "gateway_cert_file"),
        driver_ca=_read_text(driver_ca_file, "driver_ca_file"),
    )


@dataclass(frozen=True)
class GatewayResources:
    """Everything a gateway's wiring needs that is not a value from its configuration.

    Tests build one from fakes (an in-memory store, a scripted transport, a static discovery)
    and hand it to :func:`~bcs_middleware.compose.gateway.assemble`.

    :param store: the gateway's database (its repositories).
    :param transport: the one outbound HTTP stack every layer that calls out shares.
    :param address_policy: where no upstream may be (the transport's, and the management API's checks).
    :param agents: the kube-agent tunnels connected to this process.
    :param tunnels: how the transport dials through an agent (this process's, or a peer's).
    :param discovery: where Mesos drivers are.
    :param certificates: the certificate files' contents.
    :param rbac: the permission subscription's runner, when one is configured (started by :mod:`.start`).
    :param peer_address: where this process's peer listener binds once started (``None``: no listener).
    :param audit_sink: where audit events go — the log file and the export backends, whose spools
        and threads :mod:`.start` starts (``None``: no audit log and no export configured).
    """

    store: SQLStore
    transport: Transport
    address_policy: AddressPolicy
    agents: LocalAgents
    tunnels: TunnelDialer
    discovery: Discovery
    certificates: Certificates = Certificates()
    rbac: RBACService | None = None
    peer_address: str | None = None
    audit_sink: AuditSink | None = None


def open_resources(config: GatewayConfig, *, store: SQLStore | None = None,
                   transport: Transport | None = None) -> GatewayResources:
    """Open what ``config`` describes (see the module docs).

    :param store: an already open store (tests, the ``serve`` master's check); else opened from config.
    :param transport: an outbound stack to use instead of a :class:`PooledTransport` from config.
    """
    if store is None:
        store = open_store(config.store.database_url, data_dir=config.store.data_dir,
                           secret_key=config.store.secret_key)
    clients = config.limits.clients
    store.db.size_pool(clients.database_connections, clients.database_overflow)
    certificates = read_certificates(config.server, driver_ca_file=config.mesos.driver_ca_file)
    prepare_database(store, config, certificates)
    policy = AddressPolicy(allow=config.outbound.allow, deny=config.outbound.deny)
    # This process's kube-agent tunnels; clusters they report for are dialled through them.
    agents = LocalAgents(holder=process_holder(), placements=store, tokens=store)
    peer_address = config.agent_tunnel.peer_address
    # Other workers and instances reach this worker's agents through its peer listener.
    tunnels: TunnelDialer = LocalOnlyDialer(agents) if peer_address is None else peer_routing(
        agents, store, store.db.secrets, peer_address=peer_address, background=False)
    if transport is None:
        transport = PooledTransport(
            connect_timeout=config.outbound.connect_timeout, read_timeout=config.outbound.read_timeout,
            stream_idle_timeout=config.outbound.stream_idle_timeout, address_policy=policy, tunnels=tunnels,
            pool_maxsize=config.limits.clients.upstream_idle_per_cluster,
            max_upstreams=config.limits.clients.upstream_identities)
    if isinstance(transport, PooledTransport):
        agents.on_replaced = transport.retire_tunnel
    return GatewayResources(
        store=store, transport=transport, address_policy=policy, agents=agents, tunnels=tunnels,
        discovery=drivers_discovery(config.discovery), certificates=certificates,
        rbac=_rbac_service(config, store, transport, policy), peer_address=peer_address,
        audit_sink=_audit_sink(config, transport, policy),
    )


def _audit_sink(config: GatewayConfig, transport: Transport, policy: AddressPolicy) -> AuditSink | None:
    """The audit log and the exporters the configuration asks for (not started), ``None`` for neither."""
    from ..audit.export.assemble import build_exporters

    exporters = build_exporters(config.audit.export, data_dir=config.store.data_dir, transport=transport,
                                address_policy=policy)
    if not config.audit.log and not exporters:
        return None
    return AuditSink.open(config.audit.log, exporters=exporters)


def process_holder() -> Holder:
    """Who this process is in the agents' placements: host and process id."""
    return Holder(f"{socket.gethostname()}/{os.getpid()}")


def prepare_database(store: SQLStore, config: GatewayConfig, certificates: Certificates) -> None:
    """What must hold in the database before this gateway serves: a usable secret key, the
    same key and CA as every instance sharing it, the bootstrap users (idempotent)."""
    from .instance_checks import check_gateway_ca, check_secret_key

    if store.db.secrets.locked:
        raise ConfigError("the gateway needs a secret key: set secret_key, env BCS_SECRET_KEY, or data_dir")
    # What every instance sharing the database must agree on (instance_checks), before anything else.
    check_secret_key(store)
    check_gateway_ca(store, certificates.gateway_ca, source=str(config.server.gateway_ca_file))
    apply_bootstrap(store, config.auth.bootstrap_users)


def _rbac_service(config: GatewayConfig, store: SQLStore, transport: Transport,
                  policy: AddressPolicy) -> RBACService | None:
    """The permission subscription's runner, when this gateway runs one (not started)."""
    rbac = config.rbac
    if not rbac.grants:
        return None
    return build_service(
        store, source_file=rbac.source_file, source_url=rbac.source_url, source_token_file=rbac.source_token_file,
        source_ca_file=rbac.source_ca_file, interval=rbac.interval, tls_server_name=config.clusters.tls_server_name,
        verify=config.clusters.verify, address_policy=policy, transport=transport,
        max_workers=config.limits.clients.rbac_sync_workers,
    )


def _read_text(path: Path | None, key: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key} {path}: {getattr(exc, 'strerror', None) or exc}") from None
