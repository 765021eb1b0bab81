"""The gunicorn worker the gateway runs on by default: gevent, with slow clients bounded.

Long-lived connections (watches, ``logs -f``, exec sessions, informers) are most of what
a gateway holds. Under gunicorn's ``gthread`` worker each one holds a thread; under
``gevent`` each is a greenlet and costs a few kilobytes, so one worker holds thousands.
Every layer stays plain WSGI: the worker monkey-patches ``socket``, ``ssl``, ``select``,
``selectors``, ``threading`` and ``time`` before the application is loaded, and what
blocks becomes a switch to another greenlet.

gunicorn's own gevent worker (27.x, ``workers/ggevent.py`` and ``base_async.py``) leaves
a connection's beginning unbounded: the TLS handshake runs before any timeout, the first
request head is bounded only by ``keepalive`` (and not at all when it is 0), a request
body may stall forever, and at ``worker_connections`` it stops accepting, so new
clients queue silently in the kernel. :class:`GatewayGeventWorker` adds:

* ``header_timeout`` (default 10 s): the TLS handshake and the first request head must
  complete within it — a client that connects and says nothing, or half a head, is
  closed; later heads on a kept-alive connection within ``keepalive``;
* ``body_idle_timeout`` (default 60 s): no read or write on the client connection may
  stall longer (a half-sent body; also a client that stops reading its answer);
* TLS handshakes in their turn (:mod:`bcs_middleware.core.turns`): one starts per turn of
  the worker's loop, after the work already in, once the client's hello is there — a client
  reconnecting in a loop cannot make a request on an established connection wait behind a
  burst of handshakes;
* ``worker_connections`` as a limit, not a queue: beyond it a connection is answered
  ``503`` with ``Retry-After`` and closed (a little room above the limit is kept for
  those answers);
* a stop that ends connections only between requests: a kept-alive connection is closed
  :data:`STOP_KEEPALIVE_LINGER` after its last answer (at once if idle that long), a request
  arriving meanwhile is answered with ``Connection: close``; running requests finish
  within ``graceful_timeout``.

:func:`gevent_worker` makes a subclass with other values (``bcs-middleware serve``'s
options, or ``examples/gunicorn.conf.py``).
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import gevent
import gevent.ssl
from gevent import Timeout
from gevent.pool import Pool
from gevent.server import StreamServer
from gevent.socket import wait_read
from gunicorn.sock import ssl_context
from gunicorn.workers.base_async import AsyncWorker
from gunicorn.workers.ggevent import GeventWorker

from ..core.sockets import send_all
from ..core.turns import wait_turn
from ..pki.reload import ServerContext, reloading_context
from .worker_stop import StopWhileStarting

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_IDLE_TIMEOUT = 60.0
DEFAULT_RETRY_AFTER = 1
# Time given to a refused connection to finish its handshake and take its 503.
_REFUSAL_TIME = 2.0
#: How long after its last answer a stopping worker keeps a connection open, for the next
#: request a busy client may be sending already (gunicorn's gthread: ``STOP_KEEPALIVE_LINGER``).
#: A connection idle longer is closed at once: for a request sent at an arbitrary moment the
#: race with the close is the same whenever the close happens.
STOP_KEEPALIVE_LINGER = 2.0


def _refusal(retry_after: int) -> bytes:
    body = json.dumps({
        "code_name": "SERVER_BUSY",
        "message": "the gateway holds as many connections as it may; retry shortly",
    }).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        f"Retry-After: {retry_after}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class ClientTLSSocket(gevent.ssl.SSLSocket):
    """A client's TLS connection whose ``sendall`` writes through ``send()``
    (:func:`~bcs_middleware.core.sockets.send_all`).

    gunicorn writes every response head and body piece with ``sendall``; gevent's asks the
    kernel for the send buffer's size (a ``getsockopt`` call) and slices the data in Python
    on every call, where one TLS ``send()`` writes a head or a 64 KiB piece whole.
    """

    def sendall(self, data: Any, flags: int = 0) -> None:
        if flags:
            super().sendall(data, flags)
        else:
            send_all(self, data)


class GatewayGeventWorker(StopWhileStarting, GeventWorker):
    """gunicorn's gevent worker with a head timeout, a body idle timeout and a hard connection limit."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_idle_timeout: float | None = DEFAULT_BODY_IDLE_TIMEOUT
    retry_after: int = DEFAULT_RETRY_AFTER

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: connections served at once; more are answered 503.
        self.connection_limit: int = self.cfg.worker_connections
        # The pool also holds the connections being refused (briefly each).
        self.worker_connections = self.connection_limit + max(16, self.connection_limit // 8)
        self.active = 0
        self._ssl: ServerContext | None = None
        self._refusal = _refusal(self.retry_after)
        # Per connection (by greenlet): the wait for its request heads.
        self._conns: dict[int, _HeadWait] = {}

    def run(self) -> None:
        # GeventWorker.run, except that TLS is done in handle() under the head timeout
        # (gevent's server would handshake first, unbounded) and the pool is larger
        # than the limit so that clients beyond it get an answer instead of a queue.
        if self.cfg.is_ssl:
            # The one reloading context (pki/reload.py): a renewed certificate is served from
            # the next connection on, as under the gthread worker.
            self._ssl = reloading_context(self.cfg, lambda: ssl_context(self.cfg))
            self._ssl.use_socket_class(ClientTLSSocket)
        servers = []
        for s in self.sockets:
            s.setblocking(1)
            server = StreamServer(s, handle=self._handle_from(s), spawn=Pool(self.worker_connections))
            if self.cfg.workers > 1:
                server.max_accept = 1
            server.start()
            servers.append(server)

        while self.alive:
            self.notify()
            # A stop (SIGTERM sets alive) is seen within this, not gunicorn's second.
            gevent.sleep(0.2)

        for server in servers:
            server.close()  # stop accepting
        # Connections between requests end STOP_KEEPALIVE_LINGER after their last answer; a
        # request that arrives meanwhile is answered with "Connection: close" (gunicorn's
        # handle_request, once the worker is not alive). Running requests finish until
        # graceful_timeout (open streams were ended on SIGTERM).
        for wait in list(self._conns.values()):
            wait.shorten(STOP_KEEPALIVE_LINGER)
        started = time.monotonic()
        while time.monotonic() - started <= self.cfg.graceful_timeout:
            if all(server.pool.free_count() == server.pool.size for server in servers):
                return
            self.notify()
            gevent.sleep(0.2)
        self.log.warning("Worker graceful timeout (pid:%s)", self.pid)
        for server in servers:
            server.stop(timeout=1)

    def _handle_from(self, listener: Any) -> Any:
        def handle(client: Any, addr: Any) -> None:
            self.handle(listener, client, addr)

        return handle

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        if self.active >= self.connection_limit:
            self._refuse(client)
            return
        self.active += 1
        me = id(gevent.getcurrent())
        try:
            if self._ssl is not None:
                client = self._handshake(client)
                if client is None:
                    return
            client.settimeout(self.body_idle_timeout)
            wait = self._conns[me] = _HeadWait(client, self.header_timeout, self.cfg.keepalive,
                                               self.body_idle_timeout)
            if not self.alive:  # handshaken while the worker stops
                wait.shorten(STOP_KEEPALIVE_LINGER)
            try:
                AsyncWorker.handle(self, listener, client, addr)
            finally:
                wait.close()
        finally:
            self._conns.pop(me, None)
            self.active -= 1

    def _handshake(self, client: Any) -> Any:
        assert self._ssl is not None
        tls = self._ssl.wrap_socket(client, server_side=True, do_handshake_on_connect=False,
                                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs)
        try:
            with Timeout(self.header_timeout):
                # The client's hello first, so that what takes the turn is the computing
                # (after the work already in: core/turns.py), not a wait for the client.
                wait_read(tls.fileno())
                wait_turn()
                tls.do_handshake()
        except (Timeout, OSError):  # ssl.SSLError is an OSError
            _close(tls)
            return None
        return tls

    def timeout_ctx(self) -> Any:
        # AsyncWorker reads every request head under this: the first within the head
        # timeout (counted from the end of the handshake), later ones within keepalive.
        wait = self._conns.get(id(gevent.getcurrent()))
        return Timeout(self.header_timeout, False) if wait is None else wait

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        try:
            return super().handle_request(listener_name, req, sock, addr)
        except TimeoutError:
            # The body idle timeout while writing: the client stopped reading its answer.
            # A slow client, not a server error: close the connection quietly.
            raise StopIteration() from None

    def _refuse(self, client: Any) -> None:
        """Answer 503 (Retry-After) and close; bounded in time whatever the client does."""
        try:
            with Timeout(_REFUSAL_TIME, False):
                if self._ssl is not None:
                    client = self._ssl.wrap_socket(client, server_side=True, do_handshake_on_connect=False)
                    client.do_handshake()
                client.sendall(self._refusal)
                # Read what the client sent before closing: closing with unread input
                # sends a reset, which may destroy the answer before it is read.
                socket.socket.shutdown(client, socket.SHUT_WR)
                for _ in range(16):
                    if not client.recv(65536):
                        break
        except OSError:
            pass
        finally:
            _close(client)


class _HeadWait:
    """The wait for each request head on one connection (a context manager used once per head).

    The first head must arrive within ``first`` seconds (counted from the end of the TLS
    handshake), later ones within ``later`` (keepalive); otherwise the connection is closed
    quietly. The socket's own timeout (the body idle timeout) is lifted meanwhile: it would
    fire first when it is the shorter one, as an error instead of a quiet close.

    Every wait gets a timer of its own. A gevent timer stopped and started again does not
    start over under the default libev loop: libev's ``ev_timer_stop`` keeps the time that
    was left and ``ev_timer_start`` counts down from it, and gevent's ``start()`` does not
    reset it (gevent issue #1890). One timer reused for every head of a connection summed
    the waits, and a busy keep-alive connection was closed ``keepalive`` seconds of waiting
    into its life, with its next request unanswered.
    """

    __slots__ = ("_conn", "_idle", "_later", "_seconds", "_since", "_sock", "_timeout")

    def __init__(self, sock: Any, first: float, later: float, idle: float | None) -> None:
        self._sock = sock
        self._idle = idle
        self._seconds = first
        self._later = later
        self._conn = gevent.getcurrent()
        #: the wait in progress (``None`` while a request is being served), and since when
        self._timeout: _HeadTimeout | None = None
        self._since = 0.0

    def __enter__(self) -> None:
        self._sock.settimeout(None)
        self._since = time.monotonic()
        self._start(self._seconds)

    def __exit__(self, typ: Any, value: Any, tb: Any) -> bool:
        timeout, self._timeout = self._timeout, None
        if timeout is None:  # pragma: no cover - __enter__ always sets one
            return False
        timeout.close()
        self._sock.settimeout(self._idle)
        self._seconds = self._later  # the first head is in: keepalive from now on
        return value is timeout  # our own timeout: swallowed, the connection ends quietly

    def _start(self, seconds: float) -> None:
        timeout = _HeadTimeout(seconds, self._conn)
        timeout.start()
        self._timeout = timeout

    def shorten(self, seconds: float) -> None:
        """Wait at most ``seconds`` for a head, counted from the end of the previous answer (a
        stopping worker): a connection idle that long already is closed at once."""
        self._seconds = min(self._seconds, seconds)
        self._later = min(self._later, seconds)
        current = self._timeout
        if current is not None:
            left = max(seconds - (time.monotonic() - self._since), 0.001)
            if current.seconds > left:
                current.close()
                self._start(left)

    def close(self) -> None:
        if self._timeout is not None:
            self._timeout.close()
            self._timeout = None


class _HeadTimeout(Timeout):
    """A head wait's timeout, raised in its connection's greenlet whichever greenlet starts it
    (:meth:`_HeadWait.shorten` runs in the worker's main greenlet)."""

    def __init__(self, seconds: float, conn: Any) -> None:
        super().__init__(seconds, False)
        self._conn = conn

    def _on_expiration(self, prev_greenlet: Any, ex: Any) -> None:
        # gevent's hook for subclasses; runs in the hub, like the default throw.
        self._conn.throw(ex)


def _close(sock: Any) -> None:
    try:
        sock.close()
    except OSError:
        pass


def gevent_worker(*, header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                  body_idle_timeout: float | None = DEFAULT_BODY_IDLE_TIMEOUT,
                  retry_after: int = DEFAULT_RETRY_AFTER) -> type[GatewayGeventWorker]:
    """A :class:`GatewayGeventWorker` with these limits, for gunicorn's ``worker_class``."""
    return type("GatewayGeventWorker", (GatewayGeventWorker,), {
        "header_timeout": header_timeout,
        "body_idle_timeout": body_idle_timeout,
        "retry_after": retry_after,
        "__module__": __name__,
    })
