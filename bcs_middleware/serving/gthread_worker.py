"""gunicorn's threaded worker (``serve --worker-class gthread``), with its connection ends fixed.

gunicorn 27's ``workers/gthread.py`` ends a connection in two ways that hurt a gateway:

* **A connection that ended during its TLS handshake is counted twice.** ``handle()`` closes
  the socket after an ``SSL_ERROR_EOF`` (a TCP probe: a load balancer's or Kubernetes'
  ``tcpSocket`` health check, a port scan) and returns ``False``; ``finish_request()`` then
  decrements ``nr_conns`` and closes the socket again, which raises ``EBADF`` on the closed
  descriptor, and its ``except`` branch decrements ``nr_conns`` a second time. The count
  drifts down by one per probe: a stopping worker whose count reaches zero while a
  keep-alive client is still connected exits at once, and the request that client sends
  next is never answered (and ``worker_connections`` stops bounding anything).
* **The lingering close runs on the worker's main thread.** After an answer that said
  ``Connection: close``, ``finish_request()`` (main thread) half-closes the socket and reads
  until the client closes its side, for up to two seconds (RFC 9112 §9.6). Meanwhile the
  main thread accepts nothing and hands no kept-alive connection its next request: a client
  that asks ``Connection: close`` and then keeps its socket open stalls every client of the
  worker for two seconds, again and again.

:class:`GatewayThreadWorker` closes in the thread that served the connection (the lingering
read then holds that thread, as a slow client does anyway) and counts every connection once.
"""

from __future__ import annotations

import time
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from .worker_stop import StopWhileStarting

# handle()'s answer for a connection it has closed already (gracefully, in its own thread).
_CLOSED = object()


class GatewayThreadWorker(StopWhileStarting, ThreadWorker):
    """``gthread`` with each connection counted once and closed off the main thread; a stopping
    worker closes a kept-alive connection ``STOP_KEEPALIVE_LINGER`` after its last answer, at
    once if it has been idle that long (as :class:`~bcs_middleware.serving.gevent_worker.GatewayGeventWorker`)."""

    def _cap_keepalive(self, deadline: float) -> None:
        # gunicorn caps every kept-alive connection at the same deadline (now + its linger):
        # a pool's long-idle connection then holds the stop as long as one that just got an
        # answer. Each waits the linger from its own last answer. That start is recorded, not
        # read back from the keep-alive deadline: gunicorn has already shortened the deadline
        # of a connection kept alive after the SIGTERM (in the poller wake-up that noticed it),
        # and reading "deadline - keepalive" from that put its close in the past — it was
        # closed at once, under the request its client had already sent. The deque stays
        # sorted (appended in order of that start; the caps keep the order).
        linger = deadline - time.monotonic()
        for conn in self.keepalived_conns:
            conn.timeout = min(conn.timeout, deadline, conn.idle_since + linger)

    def handle(self, conn: Any) -> Any:
        result = super().handle(conn)
        if result:  # kept alive, or deferred to the poller (gunicorn's _DEFER)
            return result
        # Closed: an answer said so, the client left, the TLS handshake failed. gunicorn
        # may have closed the socket already (after an SSL EOF).
        try:
            conn.close(graceful=conn.sock.fileno() != -1)
        except OSError:
            util.close(conn.sock)
        return _CLOSED

    def finish_request(self, conn: Any, fs: Any) -> None:
        if not fs.cancelled() and fs.exception() is None and fs.result() is _CLOSED:
            self.nr_conns -= 1
            return
        conn.idle_since = time.monotonic()  # if kept alive: waiting for its next request from now
        super().finish_request(conn, fs)
