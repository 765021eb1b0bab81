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

from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

# handle()'s answer for a connection it has closed already (gracefully, in its own thread).
_CLOSED = object()


class GatewayThreadWorker(ThreadWorker):
    """``gthread`` with each connection counted once and closed off the main thread."""

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
        super().finish_request(conn, fs)
