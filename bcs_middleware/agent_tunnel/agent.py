"""The agent end of a tunnel: ``bcs-middleware kube-agent --tunnel``.

The agent opens HTTPS to the gateway and upgrades it to a WebSocket at
``/bcsapi/v1/websocket/connect`` with the ``BCS-API-Tunnel-*`` headers of the Go
``bcs-kube-agent`` (see :mod:`.handshake`): its register token, its cluster id,
and its apiserver's address, CA and service-account token. Over that WebSocket the
gateway sends remotedialer Connects (see :mod:`.session`); the agent dials and
pipes the bytes, so the gateway talks TLS to the apiserver end to end.

Security. The agent dials **only its own apiserver**: the address it reported
(in a cluster the ``kubernetes`` service, ``KUBERNETES_SERVICE_HOST:PORT``;
outside, the kubeconfig's server). A Connect naming anything else — another
address, another port, a ``unix`` socket — is answered with an Error and never
dialed, unlike the Go agent, which dials any TCP address the server names. The
gateway's certificate is verified (``SERVER_CERT`` or the system trust store)
unless ``--insecure-skip-verify``; no token is ever logged.

Liveness. The agent pings every ``ping_interval`` seconds and takes the gateway
as gone after ``dead_after`` seconds of silence; it reconnects with exponential
backoff (``backoff_base`` doubling up to ``backoff_max``, each delay drawn in
its upper half at random so that many agents do not reconnect in step), and
starts over from ``backoff_base`` after a connection that lasted. Every
``refresh`` seconds it gathers its cluster access again and reconnects if it
changed (a rotated token or CA reaches the gateway that way).

A connection per gateway worker. The agent names itself (``BCS-Tunnel-Agent-Id``,
a random id per process); a gateway of this project then answers its ``101`` with
``BCS-Tunnel-Workers: N``, and the agent holds ``N`` connections (``connections``
fixes the number instead, capped at :data:`MAX_CONNECTIONS`). The kernel spreads
them over the gateway's workers; one that lands on a worker already holding one of
this agent's connections is refused (``409 TUNNEL_DUPLICATE``) and dialled again
soon, so every worker ends up with the agent at hand and none forwards its requests
to another worker. A Go gateway sends no such header: one connection, as before.

Two agents for one cluster. The gateway keeps the newest connection of a cluster
and closes the older one with the close code ``CLOSE_REPLACED``. An agent so
replaced waits ``replaced_backoff`` seconds (drawn in the upper half) before it
comes back, and says in a warning that another agent serves its cluster: two
replicas would otherwise replace each other every second or two, each time
draining the other's streams. They still take turns, once a minute or so; one
replica is what to run.
"""

from __future__ import annotations

import contextlib
import logging
import random
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .handshake import (
    CLOSE_DUPLICATE,
    CLOSE_REPLACED,
    CONNECT_PATH,
    HEADER_AGENT_ID,
    HEADER_CLUSTER,
    HEADER_MODULE,
    HEADER_PARAMS,
    HEADER_TOKEN,
    HEADER_WORKERS,
    MODULE_KUBE_AGENT,
    TunnelParams,
    dial_address,
    host_port,
)
from .session import Session
from .wschannel import ChannelError, HandshakeRejected, WebSocketChannel

log = logging.getLogger("bcs_middleware.agent_tunnel.agent")

CONNECT_TIMEOUT = 10.0
#: The longest an apiserver dial may take, whatever the gateway's Connect asks.
DIAL_TIMEOUT = 15.0
#: A connection that lasted this long resets the backoff.
STABLE_AFTER = 30.0
#: How long an agent whose connection another agent of its cluster replaced waits before coming back.
REPLACED_BACKOFF = 60.0
#: The most connections an agent holds to a gateway, whatever its worker count says.
MAX_CONNECTIONS = 16
#: The first wait before dialling again after a connection landed on a worker that holds one of
#: this agent's already (doubling with each such landing in a row, up to ``backoff_max``).
DUPLICATE_BACKOFF = 0.1


class _Tries:
    """One connection slot's count of failures and of landings on a worker holding one already, in a row."""

    __slots__ = ("duplicates", "failures")

    def __init__(self) -> None:
        self.failures = 0
        self.duplicates = 0


class ConnectNotAllowed(PermissionError):
    """The gateway named an address that is not this cluster's apiserver."""


@dataclass(frozen=True)
class GatewayTarget:
    """Where the tunnel goes: the gateway's base URL (``https://host[:port][/prefix]``)."""

    host: str
    port: int
    path: str

    @classmethod
    def from_url(cls, url: str) -> GatewayTarget:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("the gateway address must be https://host[:port]")
        return cls(parts.hostname, parts.port or 443, parts.path.rstrip("/") + CONNECT_PATH)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 443 else f"{host}:{self.port}"


def apiserver_dialer(params: TunnelParams) -> Callable[[str, str, float], socket.socket]:
    """A session ``dial`` that reaches ``params.address`` and nothing else."""
    allowed = dial_address(params.address)
    host, port = host_port(params.address)

    def dial(proto: str, address: str, timeout: float) -> socket.socket:
        if proto != "tcp" or address.lower() != allowed:
            raise ConnectNotAllowed("connect not allowed: this agent reaches only its own cluster's apiserver")
        sock = socket.create_connection((host, port), timeout=min(timeout, DIAL_TIMEOUT))
        # The agent relays TLS records as they come (as Go, whose sockets have no Nagle delay).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    return dial


class TunnelAgent:
    """Keeps the tunnel to the gateway up (see the module docstring).

    :param gateway_url: ``https://`` base URL of the gateway.
    :param cluster_id: the cluster this agent serves.
    :param register_token: the cluster's register token ("" with a client certificate).
    :param gather: returns the current :class:`TunnelParams` (raises to retry later).
    :param context: TLS client context verifying the gateway.
    :param replaced_backoff: seconds (drawn in the upper half) to wait after the gateway closed
        the connection because another agent of the cluster connected since.
    :param connections: how many connections to hold; ``None``: as many as the gateway's
        ``101`` says it runs workers (one if it does not say), at most :data:`MAX_CONNECTIONS`.
    """

    def __init__(self, *, gateway_url: str, cluster_id: str, register_token: str,
                 gather: Callable[[], TunnelParams], context: ssl.SSLContext,
                 connect_timeout: float = CONNECT_TIMEOUT, ping_interval: float = 10.0, dead_after: float = 45.0,
                 backoff_base: float = 1.0, backoff_max: float = 60.0, refresh: float = 300.0,
                 module: str = MODULE_KUBE_AGENT, replaced_backoff: float = REPLACED_BACKOFF,
                 connections: int | None = None) -> None:
        if connections is not None and not 1 <= connections <= MAX_CONNECTIONS:
            raise ValueError(f"connections must be between 1 and {MAX_CONNECTIONS}")
        self.target = GatewayTarget.from_url(gateway_url)
        self.cluster_id = cluster_id
        self.register_token = register_token
        self.gather = gather
        self.context = context
        self.connect_timeout = connect_timeout
        self.ping_interval = ping_interval
        self.dead_after = dead_after
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.refresh = refresh
        self.module = module
        self.replaced_backoff = replaced_backoff
        self.fixed_connections = connections
        #: This process's id at the gateway: its connections are told apart from another agent's.
        self.agent_id = secrets.token_hex(16)
        self.replaced = 0  # connections the gateway closed because another agent replaced them
        self.connections = 0  # tunnels opened so far
        self.duplicates = 0  # connections refused because they landed on a worker holding one already
        self.wanted = connections or 1  # connections to hold now
        self.session: Session | None = None  # the newest
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()
        self._slots: dict[int, threading.Thread] = {}  # the extra connections' loops, by number
        self._dialling: set[socket.socket] = set()  # connections to the gateway not yet sessions
        self._stop = threading.Event()

    @property
    def sessions(self) -> list[Session]:
        """The open sessions (one per gateway worker that holds this agent)."""
        with self._lock:
            return [session for session in self._sessions if not session.closed]

    @property
    def stopping(self) -> bool:
        """:meth:`stop` was called."""
        return self._stop.is_set()

    def stop(self) -> None:
        """End every connection (the gateway learns at once) and every loop; returns at once."""
        self._stop.set()
        with self._lock:
            sessions = list(self._sessions)
            dialling = list(self._dialling)
        for session in sessions:
            session.close("agent stopping")
        for sock in dialling:  # a gateway slow to answer its TLS or WebSocket handshake
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        """Connect, serve, reconnect with backoff — until :meth:`stop` (extra connections, if the
        gateway wants them, run in threads of their own)."""
        try:
            self._run_slot(0)
        finally:
            self.stop()
            with self._lock:
                slots = list(self._slots.values())
            for slot in slots:
                slot.join(10)

    def _want(self, workers: str | None) -> None:
        """Hold as many connections as the gateway runs workers (unless fixed), starting the missing."""
        if self.fixed_connections is None and workers is not None:
            try:
                self.wanted = max(1, min(int(workers), MAX_CONNECTIONS))
            except ValueError:
                log.warning("the gateway sent a malformed %s header; holding one connection", HEADER_WORKERS)
                self.wanted = 1
        with self._lock:
            for number in range(1, self.wanted):
                if number not in self._slots and not self._stop.is_set():
                    slot = threading.Thread(target=self._run_slot, args=(number,),
                                            name=f"bcs-tunnel-agent-{number}", daemon=True)
                    self._slots[number] = slot
                    slot.start()

    def _run_slot(self, slot: int) -> None:
        """One connection's loop: connect, serve, reconnect with backoff."""
        tries = _Tries()
        while not self._stop.is_set():
            if slot >= self.wanted:  # the gateway runs fewer workers now: this connection is not wanted
                with self._lock:
                    self._slots.pop(slot, None)
                return
            delay = self._attempt(slot, tries)
            if delay:
                self._stop.wait(delay)

    def _attempt(self, slot: int, tries: _Tries) -> float:
        """Gather, connect and serve once; how long to wait before the next attempt."""
        started = time.monotonic()
        try:
            params = self.gather()
        except Exception as exc:  # the gatherer's own error type; it retries like a failed connect
            tries.failures += 1
            log.error("cannot gather the cluster access: %s", exc)
            return self.backoff(tries.failures)
        try:
            session = self.connect(params)
        except HandshakeRejected as exc:
            if exc.status != 409:
                tries.failures += 1
                self._log_failure(exc)
                return self._failed(tries)
            # Landed on a worker that holds one of ours already: dial again, soon.
            tries.duplicates += 1
            self.duplicates += 1
            log.debug("connection %d landed on a gateway worker that holds another; dialling again", slot)
            return self.backoff(tries.duplicates, DUPLICATE_BACKOFF)
        except (ChannelError, OSError, ValueError) as exc:
            tries.failures += 1
            self._log_failure(exc)
            return self._failed(tries)
        tries.duplicates = 0
        with self._lock:
            self.connections += 1
        log.info("tunnel to %s:%d open for cluster %s%s", self.target.host, self.target.port, self.cluster_id,
                 f" (connection {slot + 1})" if slot else "")
        self._want(session.channel.handshake_headers.get(HEADER_WORKERS.lower()))
        return self._hold(session, params, started, tries)

    def _hold(self, session: Session, params: TunnelParams, started: float, tries: _Tries) -> float:
        """Serve an open session until it ends; the wait before the next attempt, as :meth:`_attempt`."""
        try:
            reason = self._serve(session, params)
        finally:
            with self._lock:
                self._sessions.discard(session)
        code = session.channel.peer_close_code
        if code == CLOSE_REPLACED and not self._stop.is_set():
            self.replaced += 1
            tries.failures = 0
            delay = self.replaced_backoff * random.uniform(0.5, 1.0)  # noqa: S311 - jitter
            log.warning("another kube-agent of cluster %s connected to the gateway and replaced this one: "
                        "two agents serve one cluster and take turns (run one replica); reconnecting in "
                        "%.0fs", self.cluster_id, delay)
            return delay
        if code == CLOSE_DUPLICATE and not self._stop.is_set():
            tries.duplicates += 1
            return self.backoff(tries.duplicates, DUPLICATE_BACKOFF)
        log.warning("tunnel closed: %s", reason)
        tries.failures = 0 if time.monotonic() - started > STABLE_AFTER else tries.failures + 1
        if reason == "cluster access changed":  # dial again at once, with the new access
            tries.failures = 0
            return 0.0
        return self._failed(tries)

    def _failed(self, tries: _Tries) -> float:
        """The backoff before dialling again after ``tries.failures`` failures (none when stopping)."""
        if self._stop.is_set():
            return 0.0
        delay = self.backoff(tries.failures)
        log.info("reconnecting in %.1fs", delay)
        return delay

    def backoff(self, failures: int, base: float | None = None) -> float:
        """Exponential from ``base`` (default ``backoff_base``), capped, with jitter in the upper half:
        ``failures`` = consecutive failures so far."""
        if failures <= 0:
            return 0.0
        ceiling = min(self.backoff_max, (base or self.backoff_base) * 2.0 ** min(failures - 1, 30))
        return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret

    def connect(self, params: TunnelParams) -> Session:
        """Open the WebSocket and return the (not yet served) session; raises on failure."""
        raw = socket.create_connection((self.target.host, self.target.port), timeout=self.connect_timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock: socket.socket = raw
        try:
            # The handshake apart from the wrapping: stop() shuts this socket down (the TLS
            # socket takes the raw one's descriptor when it is made).
            sock = self.context.wrap_socket(raw, server_hostname=self.target.host, do_handshake_on_connect=False)
            with self._lock:
                self._dialling.add(sock)
            if self._stop.is_set():  # stop() ran before it could see this connection
                raise OSError("the agent is stopping")
            sock.do_handshake()
            headers = [(HEADER_MODULE, self.module), (HEADER_CLUSTER, self.cluster_id),
                       (HEADER_PARAMS, params.encode()), (HEADER_AGENT_ID, self.agent_id)]
            if self.register_token:
                headers.insert(1, (HEADER_TOKEN, self.register_token))
            channel = WebSocketChannel.connect(sock, host=self.target.host_header, path=self.target.path,
                                               headers=headers, timeout=self.connect_timeout)
        except BaseException:
            with self._lock:
                self._dialling.discard(sock)
            sock.close()
            raise
        with self._lock:
            self._dialling.discard(sock)
        session = Session(channel, dial=apiserver_dialer(params), ping_interval=self.ping_interval,
                          dead_after=self.dead_after, name=self.cluster_id)
        with self._lock:
            self._sessions.add(session)
            self.session = session
        if self._stop.is_set():
            session.close("agent stopping")
        return session

    def _serve(self, session: Session, params: TunnelParams) -> str:
        serving = threading.Thread(target=session.serve, name="bcs-tunnel-agent-reader", daemon=True)
        serving.start()
        while serving.is_alive() and not self._stop.is_set():
            serving.join(self.refresh)
            if not serving.is_alive() or self._stop.is_set():
                break
            try:
                current = self.gather()
            except Exception as exc:  # the gatherer's own error type: keep the tunnel, try again later
                log.warning("cannot gather the cluster access again (keeping the tunnel): %s", exc)
                continue
            if current != params:
                session.close("cluster access changed")
                serving.join(10)
                return "cluster access changed"
        if self._stop.is_set():
            session.close("agent stopping")
        serving.join(10)
        return session.close_reason or "closed"

    def _log_failure(self, exc: BaseException) -> None:
        if isinstance(exc, HandshakeRejected):
            detail = exc.body[:300].decode("utf-8", "replace").strip()
            log.error("the gateway refused the tunnel (HTTP %d)%s", exc.status, f": {detail}" if detail else "")
        elif isinstance(exc, ssl.SSLCertVerificationError):
            log.error("the gateway's certificate did not verify (SERVER_CERT): %s", exc.verify_message)
        elif isinstance(exc, ssl.SSLError):
            log.error("TLS with the gateway failed: %s", exc.reason or type(exc).__name__)
        elif isinstance(exc, OSError | ChannelError):
            log.error("cannot reach the gateway at %s:%d: %s", self.target.host, self.target.port,
                      exc if isinstance(exc, ChannelError) else type(exc).__name__)
        else:
            log.error("cannot open the tunnel: %s", exc)


def client_context(*, server_cert: str | None, insecure: bool,
                   client_cert: tuple[str, str] | None = None) -> ssl.SSLContext:
    """TLS to the gateway: verified against ``server_cert`` (PEM text or a path), else the system store."""
    if insecure:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif server_cert:
        pem = server_cert if "BEGIN CERTIFICATE" in server_cert else Path(server_cert).read_text()
        context = ssl.create_default_context(cadata=pem)
    else:
        context = ssl.create_default_context()
    if client_cert is not None:
        context.load_cert_chain(*client_cert)
    return context
