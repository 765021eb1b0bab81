"""What an agent sends when it opens a tunnel: the bk-bcs ``BCS-API-Tunnel-*`` headers.

The Go ``bcs-kube-agent`` in websocket mode (bk-bcs #414, ``app/websocket.go``) opens
``wss://<bke host>/bcsapi/v1/websocket/connect`` with::

    BCS-API-Tunnel-Module:    kube-agent        (newer agents for bcs-cluster-manager: kubeagent)
    BCS-API-Tunnel-Token:     <register token>
    BCS-API-Tunnel-ClusterId: <cluster id>
    BCS-API-Tunnel-Params:    base64(JSON {"address": "https://<apiserver>:<port>",
                                           "userToken": "<service-account token>",
                                           "caCert": base64(<CA PEM>)})

Both base64 layers are the standard alphabet with padding (Go's
``base64.StdEncoding``). bcs-api refused a tunnel with HTTP 401 (bad token) or 400
(malformed headers) and the error text as the body; the Go agent logs it and
retries.

This module is the one place that spells that shape, for the agent (to build it)
and the gateway (to read it, bounded).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..core.routes import AGENT_CONNECT_PATH

CONNECT_PATH = AGENT_CONNECT_PATH
HEADER_MODULE = "BCS-API-Tunnel-Module"
HEADER_TOKEN = "BCS-API-Tunnel-Token"
HEADER_CLUSTER = "BCS-API-Tunnel-ClusterId"
HEADER_PARAMS = "BCS-API-Tunnel-Params"
#: What bcs-kube-agent sent to bcs-api (``/bcsapi/v1/websocket/connect``).
MODULE_KUBE_AGENT = "kube-agent"
#: What later bcs-kube-agents send to bcs-cluster-manager; a gateway may accept both.
MODULE_KUBE_AGENT_V2 = "kubeagent"
#: A Params header longer than this is refused before decoding (a CA bundle and a token fit easily).
MAX_PARAMS = 64 * 1024
#: The WebSocket close code (private range) with which the gateway ends an agent connection that a
#: newer connection of the same cluster replaced: the agent learns that another agent serves its
#: cluster, rather than that its connection failed.
CLOSE_REPLACED = 4001

# -- this project's additions (a Go agent sends none of them and keeps one connection) ----------
#: Sent by ``bcs-middleware kube-agent --tunnel``: a random id per agent process, so that the
#: gateway tells this agent's several connections (one per gateway worker) from another agent's.
HEADER_AGENT_ID = "BCS-Tunnel-Agent-Id"
#: In the gateway's ``101``: how many workers the answering instance runs. An agent that sent
#: :data:`HEADER_AGENT_ID` holds that many connections, so every worker has the agent locally
#: instead of forwarding each request to the one worker that holds it.
HEADER_WORKERS = "BCS-Tunnel-Workers"
#: The WebSocket close code with which the gateway ends the older of two connections *of one
#: agent* in one worker (they raced): redundant, not replaced by another agent — dial again.
CLOSE_DUPLICATE = 4002
#: An agent id: what :data:`HEADER_AGENT_ID` may hold.
AGENT_ID_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_")
MAX_AGENT_ID = 64


class TunnelParamsError(ValueError):
    """A malformed ``BCS-API-Tunnel-Params`` header; the message is safe to log (it never quotes the header)."""


@dataclass(frozen=True)
class TunnelParams:
    """The agent's cluster access, as carried in ``BCS-API-Tunnel-Params``.

    :param address: the apiserver URL the agent dials for the gateway (``https://host:port``).
    :param user_token: the service-account token the gateway acts with; a secret, never logged.
    :param ca_pem: the cluster CA (PEM) the gateway verifies the apiserver with, through the tunnel.
    """

    address: str
    user_token: str = field(repr=False)
    ca_pem: str

    def encode(self) -> str:
        body = {
            "address": self.address,
            "userToken": self.user_token,
            "caCert": base64.b64encode(self.ca_pem.encode()).decode("ascii"),
        }
        return base64.b64encode(json.dumps(body).encode()).decode("ascii")

    @classmethod
    def decode(cls, header: str) -> TunnelParams:
        """Parse the header (bounded); raises :class:`TunnelParamsError`."""
        if len(header) > MAX_PARAMS:
            raise TunnelParamsError(f"{HEADER_PARAMS} is longer than {MAX_PARAMS} characters")
        try:
            body = json.loads(base64.b64decode(header, validate=True))
        except (binascii.Error, ValueError):
            raise TunnelParamsError(f"{HEADER_PARAMS} is not base64 of a JSON object") from None
        if not isinstance(body, dict):
            raise TunnelParamsError(f"{HEADER_PARAMS} is not base64 of a JSON object")
        address, token, ca_b64 = body.get("address"), body.get("userToken"), body.get("caCert")
        if not all(isinstance(v, str) and v for v in (address, token, ca_b64)):
            raise TunnelParamsError(f"{HEADER_PARAMS} needs non-empty strings address, userToken and caCert")
        assert isinstance(address, str) and isinstance(token, str) and isinstance(ca_b64, str)
        try:
            ca_pem = base64.b64decode(ca_b64, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise TunnelParamsError(f"{HEADER_PARAMS}: caCert is not base64 of a PEM certificate") from None
        if "BEGIN CERTIFICATE" not in ca_pem:
            raise TunnelParamsError(f"{HEADER_PARAMS}: caCert is not base64 of a PEM certificate")
        host_port(address)  # validates
        return cls(address, token, ca_pem)


def host_port(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``https://`` apiserver URL (IPv6 without brackets, host lower-cased).

    The Go agent formats ``https://%s:%s`` with ``KUBERNETES_SERVICE_HOST``, which leaves an
    IPv6 address unbracketed (``https://fd00::1:443``): that form is read too.
    """
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.netloc or "@" in parts.netloc:
        raise TunnelParamsError("the apiserver address must be https://host[:port]")
    netloc = parts.netloc
    if netloc.count(":") > 1 and not netloc.startswith("["):
        host, _, port_text = netloc.rpartition(":")
        netloc = f"[{host}]:{port_text}"
    try:
        bracketed = urlsplit(f"https://{netloc}")
        port = bracketed.port or 443
    except ValueError:
        raise TunnelParamsError("the apiserver address is not a URL with a valid port") from None
    if not bracketed.hostname:
        raise TunnelParamsError("the apiserver address must be https://host[:port]")
    return bracketed.hostname.lower(), port


def dial_address(url: str) -> str:
    """The ``host:port`` a remotedialer Connect names for ``url`` (``[v6]:port`` for IPv6)."""
    host, port = host_port(url)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
