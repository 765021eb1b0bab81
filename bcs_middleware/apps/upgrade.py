"""Connection upgrades — ``kubectl exec``, ``attach`` and ``port-forward`` — under gunicorn.

WSGI has no notion of a connection changing protocol, so
:class:`~bcs_middleware.apps.proxy.UpstreamProxy` hands such requests to
this module, which works with what gunicorn offers: the client socket in
``environ["gunicorn.socket"]``.

The sequence (the CVE-2018-1002105 lesson: never splice before the upstream
has agreed):

1. A request that :func:`bcs_middleware.core.http.upgrade_protocol` calls an
   upgrade — ``Connection: upgrade`` and ``Upgrade: SPDY/3.1`` or ``websocket``, the
   same answer the admission layer got (kubectl's ``v4``/``v5.channel.k8s.io``
   subprotocols ride in ``Sec-WebSocket-Protocol``, kept like
   ``X-Stream-Protocol-Version``) — is authenticated, routed and impersonated like
   any other request.
2. It is sent on a **fresh** upstream connection
   (:meth:`~bcs_middleware.outbound.transport.PooledTransport.open_upgrade`),
   never pooled, never reused.
3. Only a ``101 Switching Protocols`` answer makes the gateway take the client
   socket: it writes the ``101`` head itself and copies bytes both ways
   (:func:`bcs_middleware.core.splice.splice`) until either side closes or a limit fires. Any other answer
   goes back as an ordinary response and both connections are closed after it.

How gunicorn lets go of the socket (sync, gthread and gevent workers alike, read
from gunicorn 27's ``workers/sync.py``, ``workers/gthread.py``,
``workers/base_async.py`` and ``http/wsgi.py``): after the application returns, the worker writes the
response head if it has not yet (``Response.close``) and may keep the
connection for another request. Neither may happen after a splice. The
iterable returned for an upgrade therefore ends its iteration by raising
:class:`ConnectionHandedOver`, a ``BrokenPipeError`` (``EPIPE``): both workers
re-raise an ``OSError`` from the application without writing anything, log
``EPIPE`` at debug level, and close the connection — which is exactly "the
connection is gone". The access log still records ``101`` (gthread), because
``start_response`` was called with it. The client socket is only ever
``shutdown()`` here, never ``close()``\\ d: its file descriptor belongs to
gunicorn, and closing it could make gunicorn close a newer connection that
reused the number. For a refused upgrade the client socket is shut down once
the worker has written the whole answer (the iterable's ``close()``), because
a WSGI application may not send ``Connection: close`` itself (PEP 3333
forbids hop-by-hop headers) and gunicorn would otherwise keep the connection.

Without ``gunicorn.socket`` (another WSGI server, or HTTP/2, where the socket
carries other streams) the answer is a ``501`` Kubernetes ``Status`` before
anything is sent upstream — never a hang.

Limits: ``idle_timeout`` (no byte in either direction; default 1 h — kubelet's
own streaming idle timeout is 4 h, ``--streaming-connection-idle-timeout``) and
``max_duration`` (default 24 h). The splice runs in the worker's thread with one
``selectors`` loop over two non-blocking sockets and a 256 KiB buffer per
direction: a side that stops reading stops the other side being read. TLS
sockets are handled with ``pending()`` (bytes OpenSSL already decrypted are
invisible to ``select``) and ``SSLWantRead/WriteError``. End of input on one side
is passed on with a TCP half-close (``shutdown(SHUT_WR)``, without a TLS
``close_notify``, which Go's TLS stack reads as end of stream). Under the gevent
worker (``bcs-middleware serve``'s default) ``selectors`` and the sockets are
gevent's, so the loop waits cooperatively and a splice costs a greenlet; under
gthread it holds a thread. Under the sync worker a splice, like any long
request, is bounded by gunicorn's ``timeout``.

Bytes the client sent after its request head *before* the ``101`` (no
kubectl does: both SPDY and websocket clients wait for the answer) sit in
gunicorn's parser buffer and are lost.

Audit: each upgrade is logged on ``bcs_middleware.audit`` with user, cluster,
namespace, pod, subresource, container and command (or ports) and the
upstream's status — never a credential, and every value a client chose escaped.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
from collections.abc import Iterable, Iterator
from typing import Any

from ..core import environ as env
from ..core import facts as request_facts
from ..core import requestinfo
from ..core.http import HOP_BY_HOP
from ..core.paths import encode_path
from ..core.printable import escape
from ..core.splice import DEFAULT_IDLE_TIMEOUT as DEFAULT_IDLE_TIMEOUT  # the upgrade's own defaults too
from ..core.splice import DEFAULT_MAX_DURATION as DEFAULT_MAX_DURATION
from ..core.splice import SpliceResult, SpliceTap, splice
from ..telemetry import metrics

log = logging.getLogger(__name__)
audit_log = logging.getLogger("bcs_middleware.audit")

# The upstream's 101 headers an application does not get: the hop-by-hop ones (its
# Connection and Upgrade go into the head by response_head) and a length, meaningless
# on a connection that stops being HTTP.
_NOT_FOR_APP_101 = HOP_BY_HOP | {"content-length"}


def client_socket(environ: dict[str, Any]) -> socket.socket | None:
    """The client connection when the server hands it over (gunicorn over HTTP/1.x)."""
    sock = environ.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return None
    if not environ.get("SERVER_PROTOCOL", "HTTP/1.1").startswith("HTTP/1."):
        return None  # HTTP/2: the socket carries other streams too
    if environ.get("HTTP_VERSION") == "2":
        return None
    return sock


class ConnectionHandedOver(BrokenPipeError):
    """Raised into the server once a splice has ended: the connection is gone, write nothing."""

    def __init__(self) -> None:
        super().__init__(errno.EPIPE, "the connection was upgraded and the stream has ended")


def response_head(status_line: str, upstream_headers: list[tuple[str, str]],
                  extra: list[tuple[str, str]]) -> bytes:
    """The ``101`` head written to the client: upstream's Connection/Upgrade, then ``extra``."""
    lines = [f"HTTP/1.1 {status_line}\r\n"]
    for name, value in upstream_headers:
        if name.lower() in ("connection", "upgrade"):
            lines.append(f"{name}: {value}\r\n")
    for name, value in extra:
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def end_to_end_headers(upstream_headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream's ``101`` headers an application may pass to ``start_response``."""
    return [(n, v) for n, v in upstream_headers if n.lower() not in _NOT_FOR_APP_101]


class UpgradedStream:
    """The WSGI body of a ``101``: iterating it runs the splice, then raises :class:`ConnectionHandedOver`.

    ``close()`` frees the upstream socket (and cuts the client) even when the
    server never iterated. A layer may set :attr:`tap` before the iteration to see
    every byte the splice moves (the session recorder, :mod:`bcs_middleware.layers.session_recording`).
    """

    def __init__(self, client: socket.socket, upstream: socket.socket, to_client: bytes, *,
                 idle_timeout: float | None, max_duration: float | None, label: str) -> None:
        self._client = client
        self._upstream: socket.socket | None = upstream
        self._to_client = to_client
        self._idle = idle_timeout
        self._max = max_duration
        self._label = label
        self.result: SpliceResult | None = None
        self.tap: SpliceTap | None = None

    @property
    def upstream_first(self) -> bytes:
        """What the upstream sent right behind its ``101`` head (already the stream's bytes)."""
        head_end = self._to_client.find(b"\r\n\r\n")
        return self._to_client[head_end + 4:] if head_end >= 0 else b""

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        upstream = self._upstream
        if upstream is None:
            raise ConnectionHandedOver()
        metrics.OPEN_UPGRADES.inc()
        try:
            self.result = splice(self._client, upstream, to_client=self._to_client,
                                 idle_timeout=self._idle, max_duration=self._max, tap=self.tap)
        finally:
            metrics.OPEN_UPGRADES.dec()
            self.close()
        log.info("upgraded stream to %s ended (%s) after %.1fs: %d bytes up, %d down",
                 self._label, self.result.ended_by, self.result.seconds,
                 self.result.to_upstream, self.result.to_client)
        raise ConnectionHandedOver()

    def close(self) -> None:
        upstream, self._upstream = self._upstream, None
        if upstream is None:
            return
        try:
            upstream.close()
        except OSError:
            pass
        shut_client(self._client)


def shut_client(sock: socket.socket) -> None:
    """End the client connection without closing its descriptor (gunicorn owns it)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class CloseAfter:
    """Wrap a refused upgrade's answer: once the server has sent it all, cut the client."""

    def __init__(self, body: Iterable[bytes], client: socket.socket) -> None:
        self._body = body
        self._client = client

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            shut_client(self._client)


def audit(environ: dict[str, Any], upstream: env.Upstream, protocol: str, status: int) -> None:
    """Log who opened which stream to which object; never a credential, no raw client text.

    The object is the request's one classification (:func:`bcs_middleware.core.facts.of`,
    the connect options as admitted when admission ran); every value a client chose is
    escaped, so a newline or an ESC in a path or a command forges no line and drives no
    terminal.
    """
    user = env.get_user(environ)
    cluster = env.get_cluster(environ)
    detail: dict[str, Any] = {"protocol": protocol.lower(), "status": status}
    info = request_facts.of(environ).info
    if info.connect:
        action = f"tunnel.{info.connect_subresource}"
        target = f"{info.namespace}/{info.name}" if info.namespace else info.name
        detail.update(namespace=info.namespace, resource=info.resource, subresource=info.connect_subresource)
        detail["pod" if info.resource == "pods" else "name"] = info.name
    else:
        action, target = "tunnel.upgrade", encode_path(info.path)
    query = requestinfo.parse_query(upstream.query)
    for key in ("container", "command", "port", "ports"):
        if key in query:
            values = query[key]
            detail[key] = values if key != "container" else values[0]
    if cluster is not None:
        detail["cluster"] = cluster.id
    audit_log.info(
        "audit actor=%s action=%s target=%s detail=%s",
        escape(user.name) if user else "-", action, escape(target), escape(json.dumps(detail, sort_keys=True)),
    )
