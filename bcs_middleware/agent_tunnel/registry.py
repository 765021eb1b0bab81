"""This process's connected kube-agents, and the dial seam the upstream transport uses.

A kube-agent in tunnel mode (``bcs-middleware kube-agent --tunnel``, or the Go
``bcs-kube-agent`` in websocket mode) holds one WebSocket to one gateway worker
(:mod:`bcs_middleware.layers.agent_endpoint`). That worker keeps the agent's
:class:`~bcs_middleware.agent_tunnel.session.Session` in :class:`LocalAgents`, keyed by
cluster id, and records in the store that it holds it (``agent_placements``), so
other workers and instances can find it (the peers helper's router).

* **One agent connection per cluster in a process, the newest wins.** A second
  connection for the same cluster takes every new stream from the first: an agent
  whose network broke reconnects long before the gateway could notice its old
  connection is dead, and both connections authenticated with the same current
  register token. The older connection is closed as soon as it carries no stream
  (at once when idle), so an ``exec`` session open over it during an agent's
  rolling update is not cut; if the newer one leaves first, the older one, still
  open, serves again. Two agents kept running for one cluster therefore take
  turns; run one. At most ``max_draining`` replaced connections per cluster are
  kept draining (the oldest beyond them is closed at once): whoever holds the
  register token cannot pile up connections by reconnecting while they carry
  streams. An agent of this project holds a connection in *every* worker
  (:mod:`bcs_middleware.agent_tunnel.agent`); the endpoint refuses a second one of the
  same agent in one process (:meth:`LocalAgents.holds`), and one that races past
  that check is closed as redundant (``CLOSE_DUPLICATE``), not as replaced.
* **Placements.** Each process holding a connection records it; one placement per
  cluster names any live holder (the first to record it; others adopt it when its
  holder's heartbeat stops or it clears it on leaving).
* **The register token is re-checked** every ``check_every`` seconds for every
  held agent: a rotated or revoked token (or a deleted cluster) drops the tunnel
  within that time, wherever the revocation was made. Only the token's digest is
  kept, and one query per pass reads the current digests of every held cluster (a
  worker holding thousands of agents asks the store once, not once per agent). The
  same pass is the holder's heartbeat in the store and refreshes the per-agent
  metrics.
* **An agent that is gone** fails new requests at once with
  :class:`~bcs_middleware.core.errors.AgentUnavailable` (503, the reason named);
  streams open over it end when the session ends.

:class:`LocalOnlyDialer` is the :class:`TunnelDialer` for a single process: the
agent must be held here. The transport calls ``dial`` for upstreams whose
``tunnel`` is set (:attr:`bcs_middleware.core.environ.Upstream.tunnel`).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from ..core.cache import Cache
from ..core.errors import AgentUnavailable
from ..core.records import Holder, PlacementRecord
from ..outbound.backend import TunnelDialer
from ..outbound.stream_connection import ByteStream
from ..store.crypto import digests_equal
from ..telemetry import metrics
from .handshake import CLOSE_DUPLICATE, CLOSE_REPLACED

__all__ = ["AgentSession", "Holder", "LocalAgents", "LocalOnlyDialer", "PlacementStore", "RegisterTokens",
           "TunnelDialer"]

log = logging.getLogger(__name__)
_End = TypeVar("_End")

#: How often held agents' register tokens are re-checked (and the heartbeat written).
DEFAULT_CHECK_EVERY = 2.0
#: A placement whose heartbeat is older than this belongs to a process that died
#: without clearing it: nobody holds that agent.
PLACEMENT_STALE_AFTER = 15.0
_REPLACED = "replaced by a newer connection of the cluster's kube-agent"
_DUPLICATE = "the same kube-agent connected to this worker again"
_REVOKED = "the cluster's register token was rotated or revoked"
# Why recently departed agents left, kept a while so a 503 can say "gone" rather than "never here".
_GONE_KEPT = 600.0
#: Replaced connections of one cluster kept open while they carry streams.
MAX_DRAINING = 4


class AgentSession(Protocol):
    """What the registry needs of a tunnel session (:class:`bcs_middleware.agent_tunnel.session.Session`)."""

    @property
    def closed(self) -> bool: ...

    @property
    def streams(self) -> int: ...

    @property
    def bytes_in(self) -> int: ...

    @property
    def bytes_out(self) -> int: ...

    def open(self, proto: str, address: str, timeout: float) -> socket.socket: ...

    def open_stream(self, proto: str, address: str, timeout: float) -> ByteStream: ...

    def close(self, reason: str = "", *, code: int = 1000) -> None: ...


class PlacementStore(Protocol):
    """Where placements are recorded (:class:`~bcs_middleware.store.SQLStore` has these)."""

    def put_placement(self, cluster_id: str, holder: Holder) -> PlacementRecord: ...

    def clear_placement(self, cluster_id: str, holder_id: str) -> bool: ...

    def get_placement(self, cluster_id: str) -> PlacementRecord | None: ...

    def touch_placements(self, holder_id: str) -> int: ...

    def adopt_placements(self, cluster_ids: list[str], holder: Holder, *, stale_after: float) -> int: ...


class RegisterTokens(Protocol):
    """Where the clusters' current register tokens are (``SQLStore``)."""

    def register_token_digests(self, cluster_ids: list[str]) -> dict[str, str]: ...


@dataclass
class _Attached:
    session: AgentSession
    since: datetime
    token_digest: str | None
    label: str
    agent_id: str | None = None
    reported: tuple[int, int] = field(default=(0, 0))
    # Why it is closed once drained, if a newer connection took over.
    superseded: str = _REPLACED


class LocalAgents:
    """The agents connected to this process, by cluster id (see the module docs).

    :param holder: who this process is, as recorded in the placements.
    :param placements: where placements are recorded; ``None`` records nothing
        (a single process, tests).
    :param tokens: where the current register tokens are read for the re-checks;
        ``None`` re-checks nothing (tests).
    :param check_every: seconds between re-checks of every held agent's register
        token (and heartbeats).
    :param on_replaced: called with the cluster id when a newer connection replaces a
        held one (``PooledTransport.retire_tunnel``).
    :param max_draining: replaced connections of one cluster kept while they carry streams
        (default :data:`MAX_DRAINING`); the oldest beyond are closed.
    """

    def __init__(self, *, holder: Holder, placements: PlacementStore | None, tokens: RegisterTokens | None = None,
                 check_every: float = DEFAULT_CHECK_EVERY,
                 on_replaced: Callable[[str], None] | None = None, max_draining: int = MAX_DRAINING) -> None:
        self.holder = holder
        self.max_draining = max_draining
        # Told when a newer connection takes a cluster over: the transport then stops
        # reusing its pooled connections over the older one, so the older one drains.
        self.on_replaced = on_replaced
        self.placements = placements
        self.tokens = tokens
        self.check_every = check_every
        self._lock = threading.Lock()
        self._agents: dict[str, _Attached] = {}
        # Replaced connections still carrying streams, closed once they carry none.
        self._draining: list[tuple[str, _Attached]] = []
        self._gone: Cache[str, str] = Cache(max_entries=4096, ttl=_GONE_KEPT)
        self._keeper: threading.Thread | None = None
        self._stopped = threading.Event()

    def attach(self, cluster_id: str, session: AgentSession, *, token_digest: str | None = None,
               agent_id: str | None = None) -> None:
        """Hold ``session`` as ``cluster_id``'s agent (replacing and closing any older one).

        :param token_digest: the digest of the register token the agent opened the tunnel
            with; every ``check_every`` seconds it must still be the cluster's current one,
            or the agent is dropped (its token was rotated or revoked).
        :param agent_id: the agent's own id (``BCS-Tunnel-Agent-Id``), if it sent one: an
            older connection of the *same* agent is closed as redundant, not as replaced by
            another agent.
        """
        attached = _Attached(session, datetime.now(UTC), token_digest, metrics.cluster_label(cluster_id),
                             agent_id)
        with self._lock:
            old = self._agents.get(cluster_id)
            self._agents[cluster_id] = attached
            was_gone = self._gone.pop(cluster_id) is not None
        if old is not None:
            if agent_id is not None and old.agent_id == agent_id:
                old.superseded = _DUPLICATE
            if self.on_replaced is not None:
                self.on_replaced(cluster_id)
            surplus: list[tuple[str, _Attached]] = [(cluster_id, old)]
            if old.session.streams and not old.session.closed:
                with self._lock:
                    self._draining.append((cluster_id, old))
                    mine = [entry for entry in self._draining if entry[0] == cluster_id]
                    surplus = mine[:max(0, len(mine) - self.max_draining)]
                    for entry in surplus:
                        self._draining.remove(entry)
            for _cluster, retired in surplus:
                self._retire(cluster_id, retired, retired.superseded)
        if old is not None or was_gone:
            metrics.AGENT_RECONNECTS.labels(attached.label).inc()
        metrics.AGENTS_CONNECTED.inc()
        metrics.AGENT_CONNECTIONS.labels(attached.label).inc()
        if self.placements is not None:
            self.placements.put_placement(cluster_id, self.holder)
        self._start_keeper()
        log.info("kube-agent of cluster %s connected", cluster_id)

    def detach(self, cluster_id: str, session: AgentSession, reason: str = "disconnected") -> None:
        """Forget ``session`` if it is still ``cluster_id``'s agent here (a newer one stays)."""
        successor: tuple[str, _Attached] | None = None
        with self._lock:
            attached = self._agents.get(cluster_id)
            if attached is None or attached.session is not session:
                drained = [entry for entry in self._draining if entry[1].session is session]
                for entry in drained:
                    self._draining.remove(entry)
            else:
                drained = []
                del self._agents[cluster_id]
                # An older connection still open (replaced, not yet drained) serves again.
                successor = next((entry for entry in reversed(self._draining)
                                  if entry[0] == cluster_id and not entry[1].session.closed), None)
                if successor is not None:
                    self._draining.remove(successor)
                    self._agents[cluster_id] = successor[1]
                else:
                    self._gone.put(cluster_id, reason)
        if attached is None or attached.session is not session:
            for _cluster, old in drained:
                self._retire(cluster_id, old, reason)
            return
        self._retire(cluster_id, attached, reason)
        if successor is not None:
            log.info("kube-agent of cluster %s left (%s); its older connection serves again", cluster_id, reason)
            if self.placements is not None:
                self.placements.put_placement(cluster_id, self.holder)
            return
        if self.placements is not None:
            try:
                self.placements.clear_placement(cluster_id, self.holder.id)
            except Exception:  # the store is down: the placement's heartbeat goes stale instead
                log.warning("could not clear the placement of cluster %s", cluster_id, exc_info=True)
        log.info("kube-agent of cluster %s left: %s", cluster_id, reason)

    def _retire(self, cluster_id: str, attached: _Attached, reason: str) -> None:
        metrics.AGENTS_CONNECTED.dec()
        self._report(attached)
        if cluster_id not in self._agents:  # else the newer connection's count stands
            metrics.AGENT_STREAMS.labels(attached.label).set(0)
        if not attached.session.closed:
            # The replaced agent is told so (a close code of its own): it then waits long before
            # coming back, instead of replacing its successor in turn at once. A redundant
            # connection of the same agent has a code of its own: that agent dials again soon.
            codes = {_REPLACED: CLOSE_REPLACED, _DUPLICATE: CLOSE_DUPLICATE}
            attached.session.close(reason, code=codes.get(reason, 1000))

    def session(self, cluster_id: str) -> AgentSession | None:
        """The live session held for ``cluster_id`` (a closed one is forgotten)."""
        attached = self._agents.get(cluster_id)
        if attached is None:
            return None
        if attached.session.closed:
            self.detach(cluster_id, attached.session, "the agent connection closed")
            return None
        return attached.session

    def open_local(self, cluster_id: str, address: str, timeout: float) -> socket.socket | None:
        """A stream to ``address`` (``host:port``) through the agent held here, as a socket; ``None``
        if none is held."""
        session = self.session(cluster_id)
        return None if session is None else self._open(cluster_id, session, session.open, address, timeout)

    def open_local_stream(self, cluster_id: str, address: str, timeout: float) -> ByteStream | None:
        """As :meth:`open_local`, the stream in memory
        (:class:`~bcs_middleware.agent_tunnel.memory_stream.MemoryStream`)."""
        session = self.session(cluster_id)
        return None if session is None else self._open(cluster_id, session, session.open_stream, address, timeout)

    def _open(self, cluster_id: str, session: AgentSession, how: Callable[[str, str, float], _End], address: str,
              timeout: float) -> _End | None:
        from .session import TooManyStreams, TunnelClosed

        try:
            return how("tcp", address, timeout)
        except TooManyStreams as exc:  # busy, not gone: the connection stays
            raise AgentUnavailable(f"the kube-agent connection of cluster {cluster_id} cannot take another "
                                   f"stream now ({exc})") from None
        except TunnelClosed:
            self.detach(cluster_id, session, "the agent connection closed")
            return None

    def holds(self, cluster_id: str, agent_id: str) -> bool:
        """Does this process hold a live connection of the agent ``agent_id`` for ``cluster_id``?"""
        attached = self._agents.get(cluster_id)
        return attached is not None and attached.agent_id == agent_id and not attached.session.closed

    def connected_since(self, cluster_id: str) -> datetime | None:
        attached = self._agents.get(cluster_id)
        return attached.since if attached is not None and not attached.session.closed else None

    def gone_reason(self, cluster_id: str) -> str | None:
        """Why the agent held here for ``cluster_id`` left (kept for a while), if it did."""
        with self._lock:
            return self._gone.get(cluster_id)

    def drop(self, cluster_id: str, reason: str) -> None:
        """Close and forget ``cluster_id``'s agent (its register token was rotated, for example)."""
        attached = self._agents.get(cluster_id)
        if attached is not None:
            self.detach(cluster_id, attached.session, reason)

    def clusters(self) -> list[str]:
        with self._lock:
            return list(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    # -- the keeper: token re-checks, heartbeat, metrics ----------------------------------

    def _start_keeper(self) -> None:
        keeper = self._keeper
        if keeper is not None and keeper.is_alive():
            return
        with self._lock:
            if self._keeper is not None and self._keeper.is_alive():
                return
            self._keeper = threading.Thread(target=self._keep, name="bcs-agent-keeper", daemon=True)
            self._keeper.start()

    def _keep(self) -> None:
        while not self._stopped.wait(self.check_every):
            try:
                self.check()
            except Exception:
                log.exception("checking the connected kube-agents failed")

    def check(self) -> None:
        """One pass: drop agents no longer authorized, heartbeat, refresh metrics."""
        with self._lock:
            held = list(self._agents.items())
            draining = list(self._draining)
        current = self._current_digests([cluster_id for cluster_id, _ in (*held, *draining)])
        for cluster_id, old in draining:
            authorized = _authorized(old, current, cluster_id)
            if old.session.closed or not old.session.streams or not authorized:
                with self._lock:
                    if (cluster_id, old) in self._draining:
                        self._draining.remove((cluster_id, old))
                    else:
                        continue
                self._retire(cluster_id, old, old.superseded if authorized else _REVOKED)
        kept: list[str] = []
        for cluster_id, attached in held:
            if attached.session.closed:
                self.detach(cluster_id, attached.session, "the agent connection closed")
                continue
            if not _authorized(attached, current, cluster_id):
                self.detach(cluster_id, attached.session, _REVOKED)
                continue
            self._report(attached)
            kept.append(cluster_id)
        if kept and self.placements is not None:
            try:
                if self.placements.touch_placements(self.holder.id) < len(kept):
                    # Some held cluster's placement names another process (which holds a
                    # connection of the same agent) or none (that process's connection left
                    # and cleared it): record this one where nobody live is recorded. Only
                    # for agents still held: one just dropped (its cluster deleted and its id
                    # registered again by someone else) must leave no placement behind.
                    self.placements.adopt_placements(kept, self.holder, stale_after=PLACEMENT_STALE_AFTER)
            except Exception:
                log.warning("could not write the agent placements' heartbeat")

    def _current_digests(self, cluster_ids: list[str]) -> dict[str, str] | None:
        """The current register-token digests of ``cluster_ids`` (one read); ``None`` when the
        store does not answer — the agents are then kept, and the log says so."""
        if self.tokens is None or not cluster_ids:
            return None
        try:
            return self.tokens.register_token_digests(sorted(set(cluster_ids)))
        except Exception:
            log.warning("could not re-check the register tokens of the connected kube-agents")
            return None

    def _report(self, attached: _Attached) -> None:
        session = attached.session
        bytes_in, bytes_out = session.bytes_in, session.bytes_out
        last_in, last_out = attached.reported
        attached.reported = (bytes_in, bytes_out)
        if bytes_in > last_in:
            metrics.AGENT_BYTES.labels(attached.label, "in").inc(bytes_in - last_in)
        if bytes_out > last_out:
            metrics.AGENT_BYTES.labels(attached.label, "out").inc(bytes_out - last_out)
        metrics.AGENT_STREAMS.labels(attached.label).set(session.streams)

    def close(self, reason: str = "the gateway is shutting down") -> None:
        """Drop every agent (a worker leaving) and stop the keeper."""
        self._stopped.set()
        for cluster_id in self.clusters():
            self.drop(cluster_id, reason)
        with self._lock:
            draining, self._draining = self._draining, []
        for cluster_id, old in draining:
            self._retire(cluster_id, old, reason)


def _authorized(attached: _Attached, current: dict[str, str] | None, cluster_id: str) -> bool:
    """Is the token ``attached`` opened its tunnel with still the cluster's register token?"""
    if current is None or attached.token_digest is None:
        return True  # nothing to check against (see _current_digests)
    digest = current.get(cluster_id)
    return digest is not None and digests_equal(digest, attached.token_digest)


class LocalOnlyDialer:
    """:class:`TunnelDialer` for one process: the cluster's agent must be held by ``agents``."""

    def __init__(self, agents: LocalAgents) -> None:
        self.agents = agents

    def dial(self, cluster_id: str, host: str, port: int, timeout: float, *,
             in_memory: bool = False) -> socket.socket | ByteStream:
        shown = f"[{host}]" if ":" in host else host
        open_local = self.agents.open_local_stream if in_memory else self.agents.open_local
        end = open_local(cluster_id, f"{shown}:{port}", timeout)
        if end is None:
            raise unavailable(cluster_id, self.agents.gone_reason(cluster_id))
        return end


def unavailable(cluster_id: str, gone: str | None = None) -> AgentUnavailable:
    """The 503 for a cluster whose agent cannot be used, naming why."""
    if gone:
        return AgentUnavailable(f"the kube-agent of cluster {cluster_id} is gone ({gone}); "
                                "requests resume when it reconnects")
    return AgentUnavailable(f"the kube-agent of cluster {cluster_id} is not connected to the gateway")

