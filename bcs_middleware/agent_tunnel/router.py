"""The gateway's :class:`~bcs_middleware.outbound.backend.TunnelDialer` across workers and instances.

:class:`AgentRouter` dials a tunnelled upstream through the cluster's kube-agent
wherever it is connected:

1. held by this process (:meth:`LocalAgents.open_local`): a local stream;
2. else the cluster's placement names its holder: a pipe through the holder's peer
   listener (:class:`~bcs_middleware.agent_tunnel.peer_client.PeerClient`), over which the
   transport runs its TLS to the apiserver as over a local stream;
3. else, or when the holder cannot give a stream, :class:`AgentUnavailable` (503, the
   reason named) at once.

A placement is stale when its holder stopped writing its heartbeat
(:meth:`LocalAgents.check` touches ``seen_at`` every couple of seconds while it holds
an agent): older than ``expiry``, it is ignored and removed — the process that wrote
it was killed, or its machine is gone. A holder that answers "not here" (the agent
left it a moment ago) has its placement removed as well. Neither waits: a refused or
timed-out connection to a holder fails the dial within the peer client's connect
timeout (1 s), never a hang. Removal is conditional on the holder (a newer placement
written meanwhile stays).

Error messages name the cluster and the reason, never a holder's address (logged).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime

from ..core.errors import AgentUnavailable
from ..core.records import Holder, PlacementRecord
from ..core.worker_start import at_worker_start
from ..outbound.stream_connection import ByteStream
from ..store.crypto import SecretBox
from ..telemetry.metrics import AGENT_DIALS
from .peer_client import PeerClient
from .peer_link import PEER_KEY_PURPOSE, PeerAddress, PeerError, split_host_port
from .peer_listener import PeerListener
from .registry import PLACEMENT_STALE_AFTER, LocalAgents, PlacementStore, unavailable

__all__ = ["AgentRouter", "peer_listener_start", "peer_routing"]

log = logging.getLogger(__name__)

_REASONS = {
    "unreachable": "the gateway process holding it does not answer",
    "refused": "the gateway process holding it refused the forwarded request",
    "not_here": "it has just left the gateway process that held it",
    "unavailable": "the gateway process holding it could not open a stream over it",
}


class AgentRouter:
    """Dial through the cluster's agent: held here, else through its holder's peer listener.

    :param agents: this process's agents.
    :param placements: where holders record their agents (the store).
    :param peers: the peer-link client (this gateway's key).
    :param expiry: seconds without a heartbeat after which a placement is ignored and removed.
    """

    def __init__(self, agents: LocalAgents, placements: PlacementStore, peers: PeerClient, *,
                 expiry: float = PLACEMENT_STALE_AFTER,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.agents = agents
        self.placements = placements
        self.peers = peers
        self.expiry = expiry
        self._clock = clock

    def dial(self, cluster_id: str, host: str, port: int, timeout: float, *,
             in_memory: bool = False) -> socket.socket | ByteStream:
        """A stream to ``host:port`` from the cluster's agent: with ``in_memory``, a memory stream
        when the agent is held here (a forwarded one is always a socket)."""
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        open_local = self.agents.open_local_stream if in_memory else self.agents.open_local
        local = open_local(cluster_id, address, timeout)
        if local is not None:
            AGENT_DIALS.labels("local", "ok").inc()
            return local
        try:
            record, peer_address, fingerprint = self._holder(cluster_id)
        except AgentUnavailable:
            AGENT_DIALS.labels("none", "unavailable").inc()
            raise
        try:
            sock = self.peers.open(peer_address, fingerprint, cluster_id, address, timeout)
        except PeerError as exc:
            AGENT_DIALS.labels("forwarded", "unavailable").inc()
            log.warning("forwarding a dial for cluster %s to %s (%s) failed: %s", cluster_id, record.holder_id,
                        peer_address, exc)
            if exc.reason == "not_here":
                self._forget(cluster_id, record.holder_id)
            raise AgentUnavailable(f"the kube-agent of cluster {cluster_id} cannot be used: "
                                   f"{_REASONS.get(exc.reason, exc.reason)}") from None
        AGENT_DIALS.labels("forwarded", "ok").inc()
        log.debug("dial for cluster %s forwarded to its holder %s", cluster_id, record.holder_id)
        return sock

    def _holder(self, cluster_id: str) -> tuple[PlacementRecord, str, str]:
        """The live placement of another process holding the cluster's agent, and its peer address
        and certificate fingerprint."""
        try:
            record = self.placements.get_placement(cluster_id)
        except Exception:  # the store is down: the agent cannot be located
            log.warning("cannot read the placement of cluster %s", cluster_id, exc_info=True)
            raise AgentUnavailable(f"the kube-agent of cluster {cluster_id} cannot be located (the store "
                                   "does not answer)") from None
        if record is None:
            raise unavailable(cluster_id, self.agents.gone_reason(cluster_id))
        if record.holder_id == self.agents.holder.id:
            # We hold no agent for it, whatever the record says (a detach that could not write).
            self._forget(cluster_id, record.holder_id)
            raise unavailable(cluster_id, self.agents.gone_reason(cluster_id))
        age = (self._clock() - record.seen_at).total_seconds()
        if age > self.expiry:
            log.info("placement of cluster %s by %s is %.0f s old: its holder is gone", cluster_id,
                     record.holder_id, age)
            self._forget(cluster_id, record.holder_id)
            raise unavailable(cluster_id, "the gateway process that held it stopped")
        if not record.peer_address or not record.peer_fingerprint:
            raise AgentUnavailable(f"the kube-agent of cluster {cluster_id} is connected to a gateway process "
                                   "that accepts no forwarded requests (it runs no peer listener)")
        if _loopback(record.peer_address) and _host_of(record.holder_id) != _host_of(self.agents.holder.id):
            # Another machine's 127.0.0.1 is not that machine: the instances were not given
            # --peer-address (the default serves one instance).
            log.warning("cluster %s: its agent is held by %s on another host, which advertises the loopback "
                        "peer address %s; give every instance a --peer-address the others reach", cluster_id,
                        record.holder_id, record.peer_address)
            raise AgentUnavailable(f"the kube-agent of cluster {cluster_id} is connected to another gateway "
                                   "instance that cannot be reached from this one (peer_address is not set)")
        return record, record.peer_address, record.peer_fingerprint

    def _forget(self, cluster_id: str, holder_id: str) -> None:
        try:
            self.placements.clear_placement(cluster_id, holder_id)
        except Exception:
            log.warning("could not remove the stale placement of cluster %s", cluster_id, exc_info=True)


def _host_of(holder_id: str) -> str:
    return holder_id.rpartition("/")[0]


def _loopback(peer_address: str) -> bool:
    host = split_host_port(peer_address)[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def peer_routing(agents: LocalAgents, placements: PlacementStore, secrets: SecretBox, *, peer_address: str,
                 background: bool) -> AgentRouter:
    """The dialer of a gateway whose workers and instances reach each other's agents.

    :param secrets: the gateway's secret keys; the peer link's key is derived from them.
    :param peer_address: where this worker's peer listener binds (:class:`PeerAddress`).
    :param background: serve peers from this process: the listener starts in the gunicorn
        worker once it is initialised (:func:`bcs_middleware.core.worker_start.at_worker_start`),
        and then fills in the ``peer_*`` of ``agents``' holder, which placements record.
    """
    keys = secrets.derive(PEER_KEY_PURPOSE)
    if background:
        at_worker_start(peer_listener_start(agents, secrets, peer_address))
    else:
        PeerAddress.parse(peer_address)  # a bad address fails the build, not the start
    return AgentRouter(agents, placements, PeerClient(keys[0]))


def peer_listener_start(agents: LocalAgents, secrets: SecretBox, peer_address: str) -> Callable[[], None]:
    """What starts this process's peer listener for ``agents``: it binds ``peer_address``
    (:class:`PeerAddress`) and fills in the ``peer_*`` of ``agents``' holder, which placements record."""
    keys = secrets.derive(PEER_KEY_PURPOSE)
    address = PeerAddress.parse(peer_address)

    def start() -> None:
        listener = PeerListener(keys=keys, address=address)
        listener.start(agents)
        agents.holder = Holder(agents.holder.id, listener.advertised, listener.fingerprint)

    return start
