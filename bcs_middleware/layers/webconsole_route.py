"""Mesos webconsole: ``{driver_prefix}webconsole/{uri}?host_ip=IP`` → the console proxy on that host.

On the gateway, bcs-api's ``/bcsapi/v1/webconsole/{uri}`` (with ``BCS-ClusterID``)
is a Mesos route like ``/bcsapi/v4/scheduler/mesos/…``: token auth, ``view`` on
the cluster, then a live driver's ``/mesosdriver/v4/webconsole/{uri}`` — the
gateway never connects to a host named by the client itself.

The source's mesos-driver (``backend/webconsole/webconsole.go``) sends
``GET``/``POST /mesosdriver/v4/webconsole/{uri}?host_ip=…`` — plain HTTP or a
WebSocket upgrade — to the bcs console proxy of the container's host,
``{host_ip}:{port}/bcsapi/v1/consoleproxy/{uri}?{query}`` (port 8083 by default,
``https``/``wss`` when TLS is configured). :class:`WebconsoleRouting` sets that
``bcs.upstream``; the :class:`~bcs_middleware.apps.proxy.UpstreamProxy`
does the rest — a WebSocket is spliced only after the console answered ``101``
(:mod:`bcs_middleware.apps.upgrade`), whatever else it answers is returned
and the connection closed.

Security: the source took ``host_ip`` as any string and connected there — a
request could make the driver reach anything on the network. Here ``host_ip``
must be an IP address literal (no names, no port, no zone), the port and
scheme are the operator's, and the connection goes through the transport's
:mod:`~bcs_middleware.outbound.addresses` policy like every upstream: the
metadata service, link-local, multicast and the driver's own listening sockets
are never reached, and ``upstream_allow``/``upstream_deny`` narrow it to the
agents' networks. Identity is the gateway's business (authenticated user with
``view`` on the cluster, as for exec); the driver, like the source, checks
``BCS-ClusterID`` (see :class:`~bcs_middleware.compose.driver.DriverApp`). Only
``GET`` and ``POST`` are routed, as in the source (405 otherwise).

Reads ``PATH_INFO``, ``RAW_URI``/``REQUEST_URI``, ``QUERY_STRING``,
``REQUEST_METHOD``; sets ``bcs.upstream``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

from ..core import environ as env
from ..core import routes
from ..core.errors import BadRequest, BCSError, MethodNotAllowed
from .mesos_route import DRIVER_PATH, safe_subpath

WEBCONSOLE = "webconsole/"
#: bcs-api's webconsole route; the gateway sends it to a driver of the ``BCS-ClusterID`` cluster.
GATEWAY_PREFIX = routes.WEBCONSOLE_PREFIX
CONSOLE_PATH = "/bcsapi/v1/consoleproxy/"
DEFAULT_PORT = 8083  # mesos_webconsole_proxy_port of the source's driver and bcs-api


def console_host(query_string: str) -> str:
    """The ``host_ip`` query parameter as a URL host (IPv6 in brackets); 400 unless an IP literal."""
    values = parse_qs(query_string, keep_blank_values=True).get("host_ip", [])
    if not values or not values[0]:
        raise BadRequest("param host_ip must not be empty", code_name="HOST_IP_REQUIRED")
    if len(values) > 1:
        raise BadRequest("param host_ip is given more than once", code_name="BAD_HOST_IP")
    try:
        address = ipaddress.ip_address(values[0])
    except ValueError:
        raise BadRequest("param host_ip must be an IP address", code_name="BAD_HOST_IP") from None
    if getattr(address, "scope_id", None):
        raise BadRequest("param host_ip may not name an interface", code_name="BAD_HOST_IP")
    return f"[{address}]" if address.version == 6 else str(address)


class WebconsoleRouting:
    """Route ``{driver_prefix}webconsole/{uri}`` to the console proxy of ``host_ip`` (see module doc).

    :param app: the upstream proxy (its transport carries the address policy).
    :param driver_prefix: the driver API prefix.
    :param port: the console proxy port on every host.
    :param scheme: ``https`` (default) or ``http`` when the console proxies run without TLS.
    :param ca_pem: PEM bundle the console proxies' certificates chain to.
    :param verify: ``False`` turns certificate checks off (explicit; the factory logs it).
    :param client_cert: ``(certfile, keyfile)`` presented to the console proxy (the source's ClientCert).
    """

    def __init__(
        self,
        app: Any,
        *,
        driver_prefix: str = DRIVER_PATH,
        port: int = DEFAULT_PORT,
        scheme: str = "https",
        ca_pem: str | None = None,
        verify: bool = True,
        client_cert: tuple[str, str] | None = None,
    ) -> None:
        if scheme not in ("http", "https"):
            raise ValueError("scheme must be http or https")
        if not 0 < port < 65536:
            raise ValueError("port must be 1-65535")
        self.app = app
        self.prefix = driver_prefix.rstrip("/") + "/" + WEBCONSOLE
        self.port = port
        self.scheme = scheme
        self.ca_pem = ca_pem
        self.verify = verify
        self.client_cert = client_cert

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        try:
            if environ.get("REQUEST_METHOD") not in ("GET", "POST"):
                raise MethodNotAllowed("the webconsole takes GET and POST", headers=[("Allow", "GET, POST")])
            uri = safe_subpath(environ.get("PATH_INFO", ""), self.prefix,
                               environ.get("RAW_URI") or environ.get("REQUEST_URI"))
            query = environ.get("QUERY_STRING", "")
            host = console_host(query)
        except BCSError as exc:
            return exc(environ, start_response)
        environ[env.UPSTREAM] = env.Upstream(
            base_urls=(f"{self.scheme}://{host}:{self.port}",),
            path=CONSOLE_PATH + uri,
            query=query,
            ca_pem=self.ca_pem,
            verify=self.verify,
            client_cert=self.client_cert,
            name="webconsole",
        )
        return self.app(environ, start_response)
