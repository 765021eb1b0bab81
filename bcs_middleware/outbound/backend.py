"""The network backend: the one place a stream to an upstream is opened (TCP or an agent tunnel, then TLS).

httpcore's ``NetworkBackend.connect_tcp()`` returns a stream, and TLS is started on that
stream; so here. :class:`NetworkBackend` is what the pool (:mod:`.transport`) needs;
:class:`DirectOrTunnel` is the real one:

* **direct**: TCP through the address policy (:mod:`.addresses`), which resolves and
  checks every address and connects only to an allowed one;
* **through an agent tunnel** (an upstream whose ``tunnel`` names a cluster): a stream
  from the cluster's kube-agent connection (:class:`TunnelDialer`, implemented by
  :mod:`bcs_middleware.agent_tunnel.registry` and :mod:`~bcs_middleware.agent_tunnel.router`).
  In memory (:class:`~.stream_connection.StreamConnection`: no socket between us and the
  tunnel) unless the connection may be upgraded — a spliced upgrade needs a descriptor —
  or the agent is held by another process. The address policy does not apply to that hop:
  the agent dials only its own apiserver.

Then, for ``https``, TLS with the identity's context (:mod:`.tls_contexts`) and server
name, bounded by the connect timeout. Failures leave as causes (:mod:`.causes`) at stage
``connect`` or ``tls``; no agent is :class:`~.causes.AgentUnreachable`.
"""

from __future__ import annotations

import socket
from typing import Protocol

from ..core.errors import AgentUnavailable
from .addresses import AddressPolicy
from .causes import AgentUnreachable, map_exceptions
from .identity import PoolKey
from .stream_connection import ByteStream, StreamConnection
from .streams import Connection, SocketConnection
from .tls_contexts import TLSContexts


class TunnelDialer(Protocol):
    """Opens a stream to a cluster's apiserver through its kube-agent (:mod:`bcs_middleware.agent_tunnel.registry`)."""

    def dial(self, cluster_id: str, host: str, port: int, timeout: float, *,
             in_memory: bool = False) -> socket.socket | ByteStream:
        """A stream to ``host:port`` through the cluster's agent: a connected socket, or with
        ``in_memory`` a :class:`ByteStream` where the dialer can give one (a socket where not).

        :raises AgentUnavailable: no agent connection can carry it (the reason named).
        """
        ...


class NetworkBackend(Protocol):
    """Opens connections for the pool; a test gives one without sockets."""

    def connect(self, key: PoolKey, label: str, timeout: float, *, generation: int, upgrade: bool) -> Connection:
        """A connected stream to ``key`` (TLS done for ``https``), bounded by ``timeout``.

        :param generation: the agent connection generation the stream is counted against.
        :param upgrade: the connection may be upgraded: it must have a socket.
        :raises OutboundError: the cause, at stage ``connect`` or ``tls``.
        """
        ...

    def prune(self) -> None:
        """Drop state unused for a while (called by the pool's sweep)."""
        ...


class DirectOrTunnel:
    """The real backend: TCP under the address policy, or an agent tunnel's stream; then TLS.

    :param tls: the table of client TLS contexts (shared with the pool for its bounds).
    :param tunnels: how upstreams with a ``tunnel`` are dialled; without it such upstreams
        are :class:`~.causes.AgentUnreachable`.
    """

    def __init__(self, address_policy: AddressPolicy, tls: TLSContexts, tunnels: TunnelDialer | None) -> None:
        self.address_policy = address_policy
        self.tls = tls
        self.tunnels = tunnels

    def connect(self, key: PoolKey, label: str, timeout: float, *, generation: int, upgrade: bool) -> Connection:
        conn = self._open(key, label, timeout, generation, upgrade)
        if key.scheme != "https":
            return conn
        try:
            with map_exceptions("tls", label, key.host):
                return conn.start_tls(self.tls.context(key, label), key.server_name or key.host, timeout)
        except BaseException:
            conn.close()
            raise

    def _open(self, key: PoolKey, label: str, timeout: float, generation: int, upgrade: bool) -> Connection:
        with map_exceptions("connect", label, key.host):
            if key.tunnel is None:
                # AddressRefused, a cause already, passes through.
                sock = self.address_policy.connect(key.host, key.port, timeout, label=label)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return SocketConnection(sock, key, generation)
            if self.tunnels is None:
                raise AgentUnreachable(f"upstream {label}: this gateway does not serve agent tunnels",
                                       stage="connect")
            try:
                end = self.tunnels.dial(key.tunnel, key.host, key.port, timeout, in_memory=not upgrade)
            except AgentUnavailable as exc:
                raise AgentUnreachable(exc.message, stage="connect") from None
            if isinstance(end, socket.socket):
                return SocketConnection(end, key, generation)
            return StreamConnection(end, key, generation, timeout)

    def prune(self) -> None:
        self.tls.prune()
