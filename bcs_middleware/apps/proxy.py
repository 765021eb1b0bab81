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

Security: TLS to the upstream is verified by default; ``verify = false`` must
be written explicitly and is logged. No credential appears in any log line or
error message.

Example::

    from bcs_middleware.apps.proxy import UpstreamProxy
    app = UpstreamProxy(upstream="https://backend.internal:8443", ca_pem=pem)
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from ..core import environ as env
from ..core import facts as request_facts
from ..core.bodies import body_stalled, declared_length
from ..core.cache import Cache
from ..core.converters import asbool, aslist, convert_options, positive_int, seconds, text, url
from ..core.errors import (
    BadRequest,
    BCSError,
    ConfigError,
    InternalError,
    NotImplementedByServer,
    UpstreamUnreachable,
)
from ..core.http import HOP_BY_HOP, named_by_connection
from ..core.impersonation import impersonation_headers
from ..core.shapes import small_shape
from ..outbound.causes import OutboundError, as_http_error
from ..outbound.transport import PooledTransport, Response, Transport
from ..telemetry import metrics
from . import departure
from . import upgrade as upg

log = logging.getLogger(__name__)

# Never forwarded from the client, whatever else happens: framing is ours,
# Host is the upstream's, credentials are replaced, and Expect would make the
# upstream wait for a 100 we already answered.
_REQUEST_DROP = HOP_BY_HOP | {"host", "authorization", "content-length", "expect", "remote-user"}
# Identity a server behind us may believe from whoever connects to it: Kubernetes'
# impersonation and front-proxy (requestheader) headers, and the auth-proxy ones.
_IDENTITY_PREFIXES = ("impersonate-", "x-remote-", "x-auth-request-")
_PIECE = 64 * 1024
# Bodies up to this size are read before the status line goes out, so an
# upstream failing mid-body still becomes a clean 502 and the connection is
# back in the pool before the client has even seen the answer.
_PRELOAD_LIMIT = 64 * 1024


# What the request side does with a client header, decided once per header name.
_PASS, _DROP, _FORWARDED = 0, 1, 2


def _classify_header(environ_key: str) -> tuple[str, str, int]:
    """``HTTP_X_FOO`` → (``X-Foo``, ``x-foo``, what to do with it)."""
    name = environ_key[5:].replace("_", "-")
    lower = name.lower()
    if lower in _REQUEST_DROP or lower.startswith(_IDENTITY_PREFIXES):
        kind = _DROP
    elif lower.startswith("x-forwarded-") or lower == "forwarded":
        kind = _FORWARDED
    else:
        kind = _PASS
    return name.title(), lower, kind


# Long names (a client's, up to 8 KiB) are classified without being remembered.
_header_info: Cache[str, tuple[str, str, int]] = Cache(
    max_entries=512, loader=_classify_header, admit=lambda key: len(key) <= 128)


_Plan = tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str], ...]]


def _scan_headers(keys: tuple[str, ...]) -> _Plan:
    """For an environ's keys (in order): the headers to pass as ``(key, Name, lower)``, and
    the ``X-Forwarded-*``/``Forwarded`` ones as ``(key, lower)``; the rest are dropped.
    """
    passing, forwarded = [], []
    for key in keys:
        if key.startswith("HTTP_"):
            name, lower, kind = _header_info(key)
            if kind == _PASS:
                passing.append((key, name, lower))
            elif kind == _FORWARDED:
                forwarded.append((key, lower))
    return tuple(passing), tuple(forwarded)


# The scan of the whole environ (thirty-odd keys under gunicorn), once per shape.
_header_plan: Cache[tuple[str, ...], _Plan] = Cache(max_entries=256, loader=_scan_headers, admit=small_shape)


def _names_lowered(fields: tuple[tuple[str, str], ...]) -> frozenset[str]:
    """The lower-cased names of ``Upstream.set_headers`` (one tuple per user: cached)."""
    return frozenset(name.lower() for name, _ in fields)


_lower_names: Cache[tuple[tuple[str, str], ...], frozenset[str]] = Cache(max_entries=256, loader=_names_lowered)


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
            headers = self._request_headers(environ, upstream)
            body, length = _request_body(environ)
            resp = self.transport.send(
                upstream, environ["REQUEST_METHOD"], headers, body, length
            )
        except OutboundError as cause:
            assert upstream is not None  # nothing is sent before the upstream is known
            return _unreachable(environ, upstream, cause)(environ, start_response)
        except BCSError as exc:
            return exc(environ, start_response)

        return self._relay(environ, start_response, resp, upstream)

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
            body, _length = _request_body(environ)
            if body is not None:
                raise BadRequest("an upgrade request may not carry a body")
            headers = self._request_headers(environ, upstream)
            headers += [("Connection", "Upgrade"), ("Upgrade", protocol)]
            resp = open_upgrade(upstream, environ["REQUEST_METHOD"], headers)
        except (OutboundError, BCSError) as failed:
            metrics.UPGRADES.labels("error").inc()
            exc = _unreachable(environ, upstream, failed) if isinstance(failed, OutboundError) else failed
            upg.audit(environ, upstream, protocol, exc.status)
            return upg.CloseAfter(exc(environ, start_response), client)
        upg.audit(environ, upstream, protocol, resp.status)
        if resp.status != 101:
            # Relayed like any answer, then both connections end: the client
            # must not keep talking on a connection whose upgrade failed.
            metrics.UPGRADES.labels("refused").inc()
            return upg.CloseAfter(self._relay(environ, start_response, resp, upstream), client)
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

    def _relay(
        self, environ: dict[str, Any], start_response: Any, resp: Response, upstream: env.Upstream
    ) -> Iterable[bytes]:
        # The transport has dropped the hop-by-hop fields (and those Connection names).
        out_headers = resp.end_to_end_headers
        remaining = resp.length_remaining
        if remaining is not None and remaining <= _PRELOAD_LIMIT:
            try:
                data = resp.read()
            except OutboundError as broken:  # broke off, stalled or broke the framing
                resp.close()
                resp.release_conn()
                return _unreachable(environ, upstream, broken)(environ, start_response)
            resp.release_conn()
            start_response(f"{resp.status} {resp.reason}", out_headers)
            return [data]
        start_response(f"{resp.status} {resp.reason}", out_headers)
        return _StreamedBody(resp, upstream.name, upg.client_socket(environ))

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

    def _request_headers(
        self, environ: dict[str, Any], upstream: env.Upstream
    ) -> list[tuple[str, str]]:
        remote = environ.get("REMOTE_ADDR", "")
        passing, forwarded = _header_plan(tuple(environ))
        connection = environ.get("HTTP_CONNECTION")
        # Fields the client's Connection names (beyond the hop-by-hop set) and the ones
        # the upstream sets itself are not passed; usually there are none of either.
        skip = named_by_connection(connection) if connection else frozenset()
        if upstream.set_headers:
            skip = skip | _lower_names(upstream.set_headers)
        if skip:
            headers = [(name, environ[key]) for key, name, lower in passing if lower not in skip]
        else:
            headers = [(name, environ[key]) for key, name, _ in passing]
        forwarded_for = forwarded_proto = forwarded_host = None
        if forwarded and self._trusted and self._is_trusted(remote):
            for key, lower in forwarded:
                if lower in skip:
                    continue
                value = environ[key]
                if lower == "x-forwarded-for":
                    forwarded_for = value
                elif lower == "x-forwarded-proto":
                    forwarded_proto = value
                elif lower == "x-forwarded-host":
                    forwarded_host = value
                else:
                    headers.append((_header_info(key)[0], value))
        content_type = environ.get("CONTENT_TYPE")
        if content_type:
            headers.append(("Content-Type", content_type))
        if remote:
            headers.append(
                ("X-Forwarded-For", f"{forwarded_for}, {remote}" if forwarded_for else remote)
            )
        proto = forwarded_proto or environ.get("wsgi.url_scheme", "http")
        headers.append(("X-Forwarded-Proto", proto))
        host = forwarded_host or environ.get("HTTP_HOST")
        if host:
            headers.append(("X-Forwarded-Host", host))
        if upstream.bearer_token:
            headers.append(("Authorization", f"Bearer {upstream.bearer_token}"))
        if upstream.impersonate is not None:
            headers.extend(impersonation_headers(upstream.impersonate))
        headers.extend(upstream.set_headers)
        return headers

    def _is_trusted(self, remote: str) -> bool:
        try:
            address = ipaddress.ip_address(remote)
        except ValueError:
            return False
        return any(address in network for network in self._trusted)


def _request_body(environ: dict[str, Any]) -> tuple[Iterable[bytes] | None, int | None]:
    stream = environ["wsgi.input"]
    length = declared_length(environ)
    if length is not None:
        return (_sized_body(stream, length) if length else None), length
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        if not environ.get("wsgi.input_terminated"):
            # Without the server marking the end of the input we could only
            # guess where the body ends; refuse rather than hang or truncate.
            raise BCSError(
                "this server cannot stream chunked request bodies; send Content-Length",
                status=411,
                code_name="LENGTH_REQUIRED",
            )
        return _chunked_body(stream), None
    return None, None


def _sized_body(stream: Any, remaining: int) -> Iterator[bytes]:
    while remaining > 0:
        try:
            piece = stream.read(min(_PIECE, remaining))
        except TimeoutError:
            raise body_stalled() from None
        # Servers raise their own types when the client breaks off its body.
        except Exception:
            raise BadRequest("the request body ended before its Content-Length") from None
        if not piece:
            raise BadRequest("the request body ended before its Content-Length")
        remaining -= len(piece)
        yield piece


def _chunked_body(stream: Any) -> Iterator[bytes]:
    while True:
        try:
            piece = stream.read(_PIECE)
        except TimeoutError:
            raise body_stalled() from None
        except Exception:
            raise BadRequest("the chunked request body is malformed or was cut off") from None
        if not piece:
            return
        yield piece


def _unreachable(environ: dict[str, Any], upstream: env.Upstream, cause: OutboundError) -> BCSError:
    """The one place a cause becomes the client's answer: counted, logged, and the detail for superusers only.

    The status is :func:`~bcs_middleware.outbound.causes.as_http_error`'s (504 for a timeout,
    503 without an agent, else 502), the metric label the cause's own.
    """
    metrics.UPSTREAM_ERRORS.labels(metrics.upstream_label(upstream.name or "?"), cause.label).inc()
    exc = as_http_error(cause)
    if exc.status not in (502, 504):
        return exc  # no agent (503): its reason names the cluster, never an address
    log.warning("upstream %s unreachable (request %s): %s", upstream.name or "?",
                environ.get(env.REQUEST_ID, "-"), exc.message)
    cluster = env.get_cluster(environ)
    if cluster is not None and cluster.cluster_type == "k8s":
        return UpstreamUnreachable(exc, "cannot reach the cluster's apiserver")
    return UpstreamUnreachable(exc)


class _UpstreamBrokeOff(Exception):
    """Raised into the server so it aborts the client connection instead of ending it cleanly."""


_open_streams: set[_StreamedBody] = set()
_open_lock = threading.Lock()


def end_streams() -> int:
    """End every open streamed response of this process cleanly; returns how many.

    For a graceful shutdown (SIGTERM): a watch or ``logs -f`` would otherwise run
    until the server's graceful timeout and then be cut. Ending it sends the final
    chunk, so the client sees a finished response (kubectl simply re-watches,
    against another instance). Sized responses are left to finish on their own.
    """
    # No lock: this runs in a SIGTERM handler, which may interrupt a holder of _open_lock
    # (itself, on a second SIGTERM) and must never wait (under gevent it runs in the hub,
    # where waiting raises). tuple() copies the set in one step under the GIL.
    streams = [s for s in tuple(_open_streams) if s.endable]
    for stream in streams:
        stream.end()
    return len(streams)


class _StreamedBody:
    """The response body, relayed piece by piece; ``close()`` frees the upstream connection.

    While it streams, the client socket (when the server hands it over) is watched
    (:mod:`~bcs_middleware.apps.departure`): a client that leaves during a quiet
    watch ends the stream at once instead of at the next event or the idle timeout.
    """

    def __init__(self, resp: Response, label: str, client: Any = None) -> None:
        self._resp = resp
        self._label = label
        self._client = client
        self._watch: departure.Watch | None = None
        self._complete = False
        self._closed = False
        self._ending = False
        self._departed = False
        # Only a body without a length can end early and still look complete to the client.
        self.endable = resp.length_remaining is None
        with _open_lock:
            _open_streams.add(self)
        metrics.OPEN_STREAMS.inc()

    def end(self) -> None:
        self._ending = True
        self._interrupt()

    def _interrupt(self) -> None:
        interrupt = getattr(self._resp, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def _client_left(self) -> None:
        self._departed = True
        metrics.STREAMS_DEPARTED.inc()
        self._interrupt()

    def __iter__(self) -> Iterator[bytes]:
        # An empty first piece makes the server send the status line and headers
        # now: a quiet watch must still tell its client the request was accepted.
        yield b""
        read1 = self._resp.read1
        if self._client is not None and not self._closed:
            try:
                self._watch = departure.watch(self._client, self._client_left)
            except (OSError, ValueError):  # the client is already gone (a closed descriptor)
                self._departed = True
                return
        try:
            while True:
                # read1 returns what has arrived (up to one chunk) instead of
                # waiting to fill the buffer: each watch event goes out at once.
                piece = read1(_PIECE)
                if not piece:
                    break
                yield piece
        except OutboundError as cause:
            if self._ending or self._departed:
                # Shutting down: end the response cleanly (the connection is not reused).
                # The client left: nobody reads what follows.
                return
            metrics.UPSTREAM_ERRORS.labels(metrics.upstream_label(self._label or "?"), cause.label).inc()
            log.info("upstream %s: response body broke off (%s)", self._label, cause.label)
            # Ending normally would send the last chunk and make a truncated
            # body look complete; an exception makes the server drop the client.
            raise _UpstreamBrokeOff(f"upstream {self._label} broke off its answer") from None
        finally:
            self._stop_watching()
        self._complete = True
        # Pooled now, not in close(): the server writes the last chunk between the two, and a
        # client that sends its next request at once must find the connection in the pool.
        self._resp.release_conn()

    def _stop_watching(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_watching()
        with _open_lock:
            _open_streams.discard(self)
        metrics.OPEN_STREAMS.dec()
        if not self._complete or self._ending or self._departed:
            # Half-read: the connection is mid-message and must never be reused.
            self._resp.close()
        self._resp.release_conn()


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
