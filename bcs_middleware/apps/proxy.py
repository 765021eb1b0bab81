"""``UpstreamProxy`` — the terminal WSGI app that streams a request to its upstream and back.

Where it sends the request:

* to ``environ["bcs.upstream"]`` (:class:`~bcs_middleware.core.environ.Upstream`)
  when an earlier layer (cluster routing) decided it; or
* to the fixed ``upstream`` URL it was configured with, keeping the request's
  own path and query — a general reverse proxy in front of any HTTP service.

Neither → ``500`` (a configuration error), rendered like every other error.

What it does to the request:

* Hop-by-hop headers (``Connection``, ``Keep-Alive``, ``TE``, ``Trailer``,
  ``Transfer-Encoding``, ``Upgrade``, ``Proxy-*``) and every header named in
  ``Connection`` are dropped, in both directions (RFC 9110 §7.6.1).
* The client's ``Authorization`` is **never** forwarded; the upstream's own
  ``bearer_token`` is sent instead, then ``Upstream.impersonate`` as ``Impersonate-*``
  headers (:func:`~bcs_middleware.core.impersonation.impersonation_headers`), then
  ``Upstream.set_headers``.
  A client's ``Impersonate-*`` headers are always stripped (the routing layer
  refuses them outright; this is the backstop when it did not run), and so are
  identity headers an upstream may believe: ``X-Remote-*`` (kube-apiserver's
  front-proxy ``X-Remote-User``/``-Group``/``-Uid``/``-Extra-*``),
  ``X-Auth-Request-*`` and ``Remote-User``.
* ``X-Forwarded-For``/``-Proto``/``-Host`` are built from ``REMOTE_ADDR``; the
  client's own ``X-Forwarded-*``/``Forwarded`` headers are kept (and appended
  to) only when ``REMOTE_ADDR`` is one of ``trusted_proxies``.
* Bodies stream: a ``Content-Length`` body is sent with that exact length, a
  chunked one (the server sets ``wsgi.input_terminated``) is sent chunked, in
  64 KiB pieces, never read whole.

Connection upgrades (``kubectl exec``/``attach``/``port-forward``: a
request with ``Connection: upgrade`` and ``Upgrade: SPDY/3.1`` or
``websocket``) keep their ``Connection``/``Upgrade`` pair and go out on a
fresh, never pooled connection with the same credential rules; only a ``101``
answer splices the client's socket with the upstream's (needs gunicorn), any
other answer is relayed and both connections closed — see
:mod:`bcs_middleware.apps.upgrade`.

What it does with the answer: status and headers pass through (minus
hop-by-hop), redirects are **not** followed, and the body is relayed raw
(no decompression) piece by piece as it arrives, so each event of a
``watch=true`` stream reaches the client at once. Closing the returned
iterable (the client went away) closes the upstream connection instead of
returning a half-read one to the pool. While a body without a length streams
(a watch, ``logs -f``), the client socket is watched too
(:mod:`~bcs_middleware.apps.departure`): a client that leaves while the
upstream is quiet ends the stream and its upstream connection at once.

Environ: reads ``bcs.upstream`` and ``bcs.error_style``; sets nothing.

The class decides where a request goes and which path it takes; the steps are in the
modules beside it: :mod:`.proxy_request` (the headers and body that go upstream),
:mod:`.proxy_response` (the answer relayed back, sized or streamed, and :func:`end_streams`
for a graceful shutdown) and :mod:`.proxy_failure` (an unreachable upstream as the client's
answer).

Security: TLS to the upstream is verified by default; ``verify = false`` must
be written explicitly and is logged. No credential appears in any log line or
error message.

Example::

    from bcs_middleware.apps.proxy import UpstreamProxy
    app = UpstreamProxy(upstream="https://backend.internal:8443", ca_pem=pem)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from ..core import environ as env
from ..core import facts as request_facts
from ..core.converters import asbool, aslist, convert_options, positive_int, seconds, text, url
from ..core.errors import BadRequest, BCSError, ConfigError, InternalError, NotImplementedByServer
from ..outbound.causes import OutboundError
from ..outbound.transport import PooledTransport, Transport
from ..telemetry import metrics
from . import upgrade as upg
from .proxy_failure import unreachable
from .proxy_request import request_body, request_headers
from .proxy_response import end_streams, relay

# The proxy's public face: the graceful shutdown (serving's hooks) ends its streams through it.
__all__ = ["UpstreamProxy", "app_factory", "end_streams"]


class UpstreamProxy:
    """Forward the request to its upstream over pooled keep-alive connections.

    :param upstream: a fixed ``http(s)://host[:port][/prefix]`` to send every
        request to (the request's path is appended to the prefix) when no
        earlier layer set ``bcs.upstream``.
    :param ca_pem: PEM bundle the fixed upstream's certificate must chain to;
        ``None`` uses the system store.
    :param verify: ``False`` turns TLS verification off for the fixed
        upstream — only for tests and emergencies; it is logged.
    :param client_cert: ``(certfile, keyfile)`` presented to the fixed upstream.
    :param tls_server_name: name the fixed upstream's certificate is verified
        against (and sent as SNI) instead of the URL's host.
    :param trusted_proxies: IPs/CIDRs whose ``X-Forwarded-*`` headers are
        believed and extended; from anyone else they are replaced.
    :param transport: the connection layer; by default a
        :class:`~bcs_middleware.outbound.transport.PooledTransport` built from
        the timeout and pool arguments (which are ignored when one is given).
    :param connect_timeout: seconds to connect, TLS included.
    :param read_timeout: seconds to wait for the response headers.
    :param stream_idle_timeout: seconds a streamed body (no ``Content-Length``)
        may stay silent; ``None`` means forever.
    :param pool_maxsize: idle keep-alive connections kept per upstream.
    :param upgrade_idle_timeout: seconds an upgraded stream (``kubectl exec``)
        may stay silent both ways before both connections are cut; ``None``
        never. Default 1 h (kubelet's own streaming idle timeout is 4 h).
    :param upgrade_max_duration: seconds after which an upgraded stream is cut
        whatever happens; ``None`` never. Default 24 h.
    """

    def __init__(
        self,
        *,
        upstream: str | None = None,
        ca_pem: str | None = None,
        verify: bool = True,
        client_cert: tuple[str, str] | None = None,
        tls_server_name: str | None = None,
        trusted_proxies: Iterable[str] = (),
        transport: Transport | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        stream_idle_timeout: float | None = 3600.0,
        pool_maxsize: int = 32,
        upgrade_idle_timeout: float | None = upg.DEFAULT_IDLE_TIMEOUT,
        upgrade_max_duration: float | None = upg.DEFAULT_MAX_DURATION,
    ) -> None:
        self.upgrade_idle_timeout = upgrade_idle_timeout
        self.upgrade_max_duration = upgrade_max_duration
        self.transport: Transport = transport or PooledTransport(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            stream_idle_timeout=stream_idle_timeout,
            pool_maxsize=pool_maxsize,
        )
        self._fixed: tuple[str, str, str] | None = None
        if upstream is not None:
            parts = urlsplit(upstream)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"upstream must be an http(s) URL, got {upstream!r}")
            if parts.username or parts.password:
                raise ConfigError("upstream URL must not carry credentials")
            self._fixed = (
                f"{parts.scheme}://{parts.netloc}",
                parts.path.rstrip("/"),
                parts.hostname,
            )
        self._ca_pem = ca_pem
        self._verify = verify
        self._client_cert = client_cert
        self._server_name = tls_server_name
        try:
            self._trusted = tuple(
                ipaddress.ip_network(item, strict=False) for item in trusted_proxies
            )
        except ValueError as exc:
            raise ConfigError(f"trusted_proxies: {exc}") from None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        upstream: env.Upstream | None = None
        try:
            upstream = env.get_upstream(environ) or self._fixed_upstream(environ)
            # The upgrade decision is one of the request's facts (classified once, core/facts.py).
            protocol = request_facts.of(environ).upgrade
            if protocol is not None:
                return self._upgrade(environ, start_response, upstream, protocol)
            headers = request_headers(environ, upstream, self._trusted)
            body, length = request_body(environ)
            env.before_forward(environ)
            resp = self.transport.send(
                upstream, environ["REQUEST_METHOD"], headers, body, length
            )
        except OutboundError as cause:
            assert upstream is not None  # nothing is sent before the upstream is known
            return unreachable(environ, upstream, cause)(environ, start_response)
        except BCSError as exc:
            return exc(environ, start_response)

        return relay(environ, start_response, resp, upstream)

    def _upgrade(
        self, environ: dict[str, Any], start_response: Any, upstream: env.Upstream, protocol: str
    ) -> Iterable[bytes]:
        client = upg.client_socket(environ)
        open_upgrade = getattr(self.transport, "open_upgrade", None)
        if client is None or open_upgrade is None:
            metrics.UPGRADES.labels("unsupported").inc()
            return NotImplementedByServer(
                "connection upgrades (kubectl exec, attach, port-forward) need the gateway to run "
                "under gunicorn over HTTP/1.1"
            )(environ, start_response)
        try:
            body, _length = request_body(environ)
            if body is not None:
                raise BadRequest("an upgrade request may not carry a body")
            headers = request_headers(environ, upstream, self._trusted)
            headers += [("Connection", "Upgrade"), ("Upgrade", protocol)]
            env.before_forward(environ)
            resp = open_upgrade(upstream, environ["REQUEST_METHOD"], headers)
        except (OutboundError, BCSError) as failed:
            metrics.UPGRADES.labels("error").inc()
            exc = unreachable(environ, upstream, failed) if isinstance(failed, OutboundError) else failed
            upg.audit(environ, upstream, protocol, exc.status)
            return upg.CloseAfter(exc(environ, start_response), client)
        upg.audit(environ, upstream, protocol, resp.status)
        if resp.status != 101:
            # Relayed like any answer, then both connections end: the client
            # must not keep talking on a connection whose upgrade failed.
            metrics.UPGRADES.labels("refused").inc()
            return upg.CloseAfter(relay(environ, start_response, resp, upstream), client)
        sock, leftover = resp.detach()
        metrics.UPGRADES.labels("spliced").inc()
        extra = upg.end_to_end_headers(resp.headers)
        # Outer layers (request id) append to this very list; the head written
        # to the client below carries what they added.
        start_response(f"101 {resp.reason or 'Switching Protocols'}", extra)
        head = upg.response_head(f"101 {resp.reason or 'Switching Protocols'}", resp.headers, extra)
        return upg.UpgradedStream(
            client, sock, head + leftover,
            idle_timeout=self.upgrade_idle_timeout, max_duration=self.upgrade_max_duration,
            label=upstream.name or "?",
        )

    def _fixed_upstream(self, environ: dict[str, Any]) -> env.Upstream:
        if self._fixed is None:
            raise InternalError(
                "the proxy has no upstream: set 'upstream' or put a routing layer in front",
                code_name="CONFIG_ERROR",
            )
        base, prefix, host = self._fixed
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""
        if raw.startswith("/"):
            # The bytes the client sent, so encoded slashes and the like survive.
            path, _, query = raw.partition("?")
        else:
            script = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
            path = quote(script.encode("latin-1"), safe="/:@!$&'()*+,;=-._~%")
            query = environ.get("QUERY_STRING", "")
        return env.Upstream(
            base_urls=(base,),
            path=prefix + (path or "/"),
            query=query,
            ca_pem=self._ca_pem,
            server_name=self._server_name,
            verify=self._verify,
            client_cert=self._client_cert,
            name=host,
        )

def app_factory(global_conf: dict[str, Any], **local_conf: str) -> UpstreamProxy:
    """Build an :class:`UpstreamProxy` from an ini section.

    .. code-block:: ini

        [app:main]
        use = egg:bcs-middleware#upstream_proxy
        upstream = https://backend.internal:8443
        ca_file = /etc/bcs/backend-ca.pem
        # tls_server_name = kubernetes
        # client_cert = /etc/bcs/client.pem
        # client_key = /etc/bcs/client-key.pem
        # verify = false          ; explicit, logged — never in production
        connect_timeout = 5s
        read_timeout = 60s
        stream_idle_timeout = 1h
        trusted_proxies = 10.0.0.0/8 127.0.0.1
        pool_maxsize = 32
        upgrade_idle_timeout = 1h     ; kubectl exec/attach/port-forward silent both ways
        upgrade_max_duration = 24h
    """
    options = convert_options(
        "upstream_proxy",
        local_conf,
        {
            "upstream": url,
            "ca_file": text,
            "verify": asbool,
            "client_cert": text,
            "client_key": text,
            "tls_server_name": text,
            "connect_timeout": seconds,
            "read_timeout": seconds,
            "stream_idle_timeout": seconds,
            "trusted_proxies": aslist,
            "pool_maxsize": positive_int,
            "upgrade_idle_timeout": seconds,
            "upgrade_max_duration": seconds,
        },
    )
    ca_file = options.pop("ca_file", None)
    if ca_file:
        try:
            options["ca_pem"] = Path(ca_file).read_text()
        except OSError as exc:
            raise ConfigError(
                f"[upstream_proxy] cannot read ca_file {ca_file!r}: {exc.strerror}"
            ) from None
    cert, key = options.pop("client_cert", None), options.pop("client_key", None)
    if bool(cert) != bool(key):
        raise ConfigError("[upstream_proxy] client_cert and client_key go together")
    if cert and key:
        options["client_cert"] = (cert, key)
    return UpstreamProxy(**options)
