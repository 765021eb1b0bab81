"""``GET /bcsapi/v1/websocket/connect`` — where kube-agents in tunnel mode connect.

The source system's tunnel server (bk-bcs ``bcs-cluster-manager/internal/tunnel``
with ``bcs-common/common/websocketDialer``), spoken as its kube-agent speaks it
(``bcs-kube-agent/app/websocket.go``): a WebSocket upgrade carrying

========================  =========================================================
header                    value
========================  =========================================================
``BCS-API-Tunnel-Module``    ``kube-agent`` or ``kubeagent`` (the Go agents)
``BCS-API-Tunnel-ClusterId`` the cluster id
``BCS-API-Tunnel-Token``     the cluster's register token
``BCS-API-Tunnel-Params``    standard base64 of JSON ``{"address", "userToken", "caCert"}``:
                          the apiserver URL as the agent reaches it (``https://``), the
                          service-account token, and base64 of the apiserver's CA PEM
                          (the shape is :mod:`.handshake`'s)
========================  =========================================================

then remotedialer framing over binary messages (:mod:`bcs_middleware.agent_tunnel.session`).

What happens, in order — nothing is stored until every check passed:

1. the headers are checked and bounded (sizes, an ``https`` address without user
   information, query or fragment, a PEM CA, a token): ``400`` naming the header;
2. the register token must be the cluster's **current** one (digest compared in
   constant time, the check the credential report uses), and the cluster a
   Kubernetes one: ``401`` otherwise, one answer for an unknown cluster, a wrong,
   old or another cluster's token (the source's tunnel server had this check
   commented out);
3. the request must be a WebSocket upgrade on a connection the server hands over
   (gunicorn over HTTP/1.1): ``400`` / ``501``; an agent that names itself
   (``BCS-Tunnel-Agent-Id``, this project's agent) and already has a connection in
   this worker gets ``409 TUNNEL_DUPLICATE`` and dials again — it holds one per
   worker, and its ``101`` says how many workers there are (``BCS-Tunnel-Workers``);
4. the credentials are stored like a credential report — encrypted, audited
   (``credentials.put`` with the old and new addresses and ``via_tunnel``) — and
   marked ``via_tunnel``: from then on the cluster's apiserver is reached through
   this agent, never directly;
5. the ``101`` is written, the connection becomes the agent's session, held in
   :class:`~bcs_middleware.agent_tunnel.registry.LocalAgents` (a newer connection for
   the same cluster replaces it) and served in this worker's greenlet or thread
   until it ends. The register token is re-checked every few seconds: rotating or
   revoking it drops the tunnel.

Whatever the agent sends is bounded (pongs, unread answers, message sizes, stream
buffers, messages for streams the gateway never opened, Connects): an agent that breaks a
bound is cut with the WebSocket close code 1008 (1009 for a message too big), logged with
the cluster id and counted in ``bcs_agent_tunnel_limit_closes{cluster,bound}`` — see
:mod:`.wschannel` and :mod:`.session` for each bound and its default.

The address the agent reports is not checked against the gateway's upstream
address policy: the gateway never connects to it, the agent does, inside its own
cluster. The session never dials anything on the gateway's side: an agent's
``Connect`` is refused, so the connection cannot reach the gateway's own API or
another cluster.

Refusals are the API's JSON errors with the source's statuses (``400`` for bad
input, ``401`` for authentication; the source wrote the error text as the body).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Iterator
from typing import Any, Protocol
from urllib.parse import urlsplit

from cryptography import x509

from ..agent_tunnel.handshake import (
    AGENT_ID_CHARS,
    CONNECT_PATH,
    HEADER_AGENT_ID,
    HEADER_CLUSTER,
    HEADER_MODULE,
    HEADER_PARAMS,
    HEADER_TOKEN,
    HEADER_WORKERS,
    MAX_AGENT_ID,
    MODULE_KUBE_AGENT,
    MODULE_KUBE_AGENT_V2,
    TunnelParams,
    TunnelParamsError,
    dial_address,
)
from ..agent_tunnel.registry import LocalAgents
from ..apps.upgrade import CloseAfter, ConnectionHandedOver, client_socket, shut_client
from ..clusters.directory import CachedDirectory
from ..core import facts as request_facts
from ..core.errors import BadRequest, BCSError, Conflict, NotImplementedByServer, Unauthorized
from ..core.http import upgrade_protocol
from ..core.records import ClusterRecord, CredentialRecord
from ..core.worker_start import serving_workers
from ..store.crypto import token_digest
from ..telemetry import metrics

log = logging.getLogger(__name__)
audit_log = logging.getLogger("bcs_middleware.audit")

#: ``kube-agent`` is what bcs-kube-agent sent to bcs-api, ``kubeagent`` what later ones send.
KUBE_AGENT_MODULES = frozenset({MODULE_KUBE_AGENT, MODULE_KUBE_AGENT_V2})

_MAX_CLUSTER_ID = 128
_MAX_TOKEN = 512
_MAX_ADDRESS = 2048
_MAX_USER_TOKEN = 16 * 1024
_MAX_CA = 32 * 1024


class AgentEndpointStore(Protocol):
    """What :class:`AgentTunnelMiddleware` needs from the store (``SQLStore`` has it): the register
    token check, the cluster's kind, and the credential report with its audit record."""

    def check_register_token(self, cluster_id: str, token: str) -> bool | None: ...

    def find_cluster(self, cluster_id: str) -> ClusterRecord | None: ...

    def report_credentials(self, cluster_id: str, *, server_addresses: list[str], cacert_pem: str, user_token: str,
                           via_tunnel: bool = False) -> tuple[tuple[str, ...] | None, CredentialRecord]: ...

    def record_audit(self, actor: str, action: str, target: str, detail: dict[str, Any] | None = None) -> None: ...


def _header(environ: dict[str, Any], name: str) -> str:
    return str(environ.get("HTTP_" + name.upper().replace("-", "_"), "")).strip()


class AgentTunnelMiddleware:
    """Serve :data:`CONNECT_PATH` (see the module docs); every other request goes to ``app``.

    Mounted outside user-token authentication: the agent authenticates with its
    cluster's register token, in its own header.

    :param app: the rest of the gateway.
    :param store: where register tokens are checked and credentials stored (:class:`AgentEndpointStore`).
    :param agents: this process's connected agents.
    :param directory: this process's cluster cache, told when credentials change here
        (so the tunnel is used at once rather than after the cache's ttl).
    :param session_options: keyword arguments for each
        :class:`~bcs_middleware.agent_tunnel.session.Session` (window, ping interval, its bounds ...).
    :param channel_options: keyword arguments for each agent's
        :class:`~bcs_middleware.agent_tunnel.wschannel.WebSocketChannel` (its bounds: ``max_message``,
        ``max_queue``, ``max_pongs_owed``, ``high_water``).
    """

    def __init__(self, app: Any, *, store: AgentEndpointStore, agents: LocalAgents,
                 directory: CachedDirectory | None = None,
                 session_options: dict[str, Any] | None = None,
                 channel_options: dict[str, Any] | None = None) -> None:
        self.app = app
        self.store = store
        self.agents = agents
        self.directory = directory
        self.session_options = dict(session_options or {})
        self.channel_options = dict(channel_options or {})

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if request_facts.of(environ).kind != "agent_connect":  # CONNECT_PATH, exactly
            return self.app(environ, start_response)
        try:
            return self._connect(environ, start_response)
        except BCSError as exc:
            client = client_socket(environ)
            answer = exc(environ, start_response)
            # Refused before the upgrade: the connection ends with the answer.
            return CloseAfter(answer, client) if client is not None else answer

    def _connect(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "GET":
            raise BadRequest("the tunnel is opened with GET and a WebSocket upgrade", code_name="BAD_TUNNEL_REQUEST")
        module = _header(environ, HEADER_MODULE)
        cluster_id = _header(environ, HEADER_CLUSTER)
        token = _header(environ, HEADER_TOKEN)
        if not module:
            raise BadRequest(f"{HEADER_MODULE} is required", code_name="BAD_TUNNEL_REQUEST")
        if module not in KUBE_AGENT_MODULES:
            raise BadRequest(f"{HEADER_MODULE}: only kube-agents open tunnels here", code_name="BAD_TUNNEL_REQUEST")
        if not cluster_id or len(cluster_id) > _MAX_CLUSTER_ID or not cluster_id.isprintable():
            raise BadRequest(f"{HEADER_CLUSTER} is required (at most {_MAX_CLUSTER_ID} characters)",
                             code_name="BAD_TUNNEL_REQUEST")
        if not token or len(token) > _MAX_TOKEN:
            raise Unauthorized("failed authentication: a register token is required")
        params = parse_params(_header(environ, HEADER_PARAMS))
        agent_id = _header(environ, HEADER_AGENT_ID) or None
        if agent_id is not None and (len(agent_id) > MAX_AGENT_ID or not set(agent_id) <= AGENT_ID_CHARS):
            raise BadRequest(f"{HEADER_AGENT_ID} must be at most {MAX_AGENT_ID} letters, digits, '-' or '_'",
                             code_name="BAD_TUNNEL_REQUEST")
        # The current register token of this very cluster, compared in constant time.
        if self.store.check_register_token(cluster_id, token) is not True:
            raise Unauthorized("failed authentication")
        cluster = self.store.find_cluster(cluster_id)
        if cluster is None or cluster.cluster_type != "k8s":
            raise Unauthorized("failed authentication")
        if upgrade_protocol(environ) != "websocket" or not environ.get("HTTP_SEC_WEBSOCKET_KEY"):
            raise BadRequest("the tunnel needs a WebSocket upgrade", code_name="BAD_TUNNEL_REQUEST")
        if environ.get("HTTP_SEC_WEBSOCKET_VERSION", "").strip() != "13":
            raise BadRequest("Sec-WebSocket-Version must be 13", code_name="BAD_TUNNEL_REQUEST")
        client = client_socket(environ)
        if client is None:
            raise NotImplementedByServer("agent tunnels need the gateway to run under gunicorn over HTTP/1.1")
        if agent_id is not None and self.agents.holds(cluster_id, agent_id):
            # The agent holds a connection per worker; this one landed where it has one already.
            # Refused before anything is stored: it dials again and lands elsewhere.
            raise Conflict("this gateway worker already holds a tunnel of this kube-agent; dial again",
                           code_name="TUNNEL_DUPLICATE")
        previous, _record = self.store.report_credentials(
            cluster_id, server_addresses=[params.address], cacert_pem=params.ca_pem, user_token=params.user_token,
            via_tunnel=True)
        # Addresses only: the CA and the service-account token never enter the audit trail.
        self.store.record_audit(
            f"cluster-agent:{cluster_id}", "credentials.put", f"cluster:{cluster_id}",
            {"old_server_addresses": list(previous) if previous is not None else None,
             "server_addresses": [params.address], "via_tunnel": True},
        )
        if self.directory is not None:
            self.directory.forget(cluster_id)
        head = request_head(environ)
        start_response("101 Switching Protocols", [])
        return _AgentConnection(self, client, head, cluster_id, token, agent_id)

    def serve(self, client: socket.socket, head: bytes, cluster_id: str, token: str,
              agent_id: str | None = None) -> None:
        """Answer the handshake and serve the agent's session until it ends."""
        from ..agent_tunnel.session import Session
        from ..agent_tunnel.wschannel import WebSocketChannel

        # The worker's per-read timeout is for HTTP bodies: the session has its own
        # liveness (pings, and an agent silent too long is dead).
        client.settimeout(None)
        workers = serving_workers()
        # An agent that identifies itself holds a connection per worker (see HEADER_WORKERS).
        extra = [(HEADER_WORKERS, str(workers))] if agent_id is not None and workers else []
        channel = WebSocketChannel.accept(client, head, extra_headers=extra, **self.channel_options)
        session = Session(channel, name=f"agent:{cluster_id}", **self.session_options)

        self.agents.attach(cluster_id, session, token_digest=token_digest(token), agent_id=agent_id)
        reason = "the agent disconnected"
        try:
            session.serve()
        except Exception:
            reason = "the agent connection failed"
            log.exception("the tunnel session of cluster %s failed", cluster_id)
        finally:
            if session.broken_bound is not None:
                reason = f"cut: {session.close_reason}"
            self.agents.detach(cluster_id, session, reason)
            if not session.closed:
                session.close(reason)
            if session.broken_bound is not None:
                metrics.AGENT_LIMIT_CLOSES.labels(metrics.cluster_label(cluster_id), session.broken_bound).inc()


class _AgentConnection:
    """The ``101`` body: iterating it runs the session, then hands the connection over."""

    def __init__(self, endpoint: AgentTunnelMiddleware, client: socket.socket, head: bytes,
                 cluster_id: str, token: str, agent_id: str | None) -> None:
        self._endpoint = endpoint
        self._client: socket.socket | None = client
        self._head = head
        self._cluster_id = cluster_id
        self._token = token
        self._agent_id = agent_id

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        client, self._client = self._client, None
        if client is not None:
            try:
                self._endpoint.serve(client, self._head, self._cluster_id, self._token, self._agent_id)
            except OSError as exc:
                log.info("tunnel of cluster %s ended: %s", self._cluster_id, exc.strerror or exc)
            finally:
                shut_client(client)
        raise ConnectionHandedOver()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            shut_client(client)


def parse_params(value: str) -> TunnelParams:
    """``BCS-API-Tunnel-Params`` (:mod:`.handshake` reads the wire format), bounded further:
    an ``https://host[:port]`` address without user information, query or fragment, a
    printable service-account token, a CA that parses as PEM certificates. ``400`` naming
    what is wrong, never quoting it."""
    if not value:
        raise _bad_params("is required")
    try:
        params = TunnelParams.decode(value)
    except TunnelParamsError as exc:
        text = str(exc)
        raise _bad_params(text.removeprefix(HEADER_PARAMS).lstrip(": ") or "is malformed") from None
    except RecursionError:  # JSON nested deeper than the parser goes
        raise _bad_params("is not base64 of a JSON object") from None
    address, user_token, ca_pem = params.address, params.user_token, params.ca_pem
    parts = urlsplit(address)
    if (len(address) > _MAX_ADDRESS or parts.username or parts.password or parts.query or parts.fragment
            or "@" in parts.netloc):
        raise _bad_params("address: must be an https://host[:port] URL")
    if len(user_token) > _MAX_USER_TOKEN or not user_token.isprintable() or " " in user_token:
        raise _bad_params("userToken: must be a service-account token")
    if len(ca_pem) > _MAX_CA:
        raise _bad_params(f"caCert: longer than {_MAX_CA} bytes")
    try:
        certs = x509.load_pem_x509_certificates(ca_pem.encode())
    except ValueError:
        certs = []
    if not certs:
        raise _bad_params("caCert: must be base64 of a PEM certificate")
    # Stored in one canonical form (the Go agent writes IPv6 unbracketed, `https://fd00::1:443`),
    # so every reader of server_addresses parses it as a URL.
    return TunnelParams(f"https://{dial_address(address)}", user_token, ca_pem)


def _bad_params(what: str) -> BadRequest:
    return BadRequest(f"{HEADER_PARAMS} {what}", code_name="BAD_TUNNEL_PARAMS")


def request_head(environ: dict[str, Any]) -> bytes:
    """The HTTP/1.1 request head the client sent, rebuilt from the WSGI environ (for the handshake)."""
    target = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
    lines = [f"{environ.get('REQUEST_METHOD', 'GET')} {target} HTTP/1.1"]
    for key, value in environ.items():
        if key.startswith("HTTP_") and isinstance(value, str):
            name = "-".join(part.capitalize() for part in key[5:].split("_"))
            lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


__all__ = ["CONNECT_PATH", "AgentEndpointStore", "AgentTunnelMiddleware", "parse_params", "request_head"]
