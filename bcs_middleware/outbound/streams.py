"""Streams to an upstream: bytes in and out with a timeout, and TLS started on any of them.

A :class:`Connection` is what the network backend (:mod:`.backend`) returns and the
HTTP/1.1 exchange (:mod:`.http11`) reads and writes: a :class:`SocketConnection` over
a socket (Python's socket timeout, which also works under gevent, where sockets wait
in its hub), or a :class:`~bcs_middleware.outbound.stream_connection.StreamConnection`
over an agent tunnel's stream in memory. :meth:`Connection.start_tls` gives the same
kind of stream with TLS inside (a wrapped socket, or TLS over memory BIOs), so TLS is
just another stream, as in httpcore's ``NetworkStream.start_tls``.

Each stream also carries what the pool keeps about it: its upstream identity
(:class:`~.identity.PoolKey`), the agent connection generation it rides, whether it
was reused and since when it is idle.
"""

from __future__ import annotations

import select
import socket
import ssl
import time

from ..core.sockets import gevent_active, send_all
from ..core.turns import wait_turn
from .identity import PoolKey

# Below glibc's mmap threshold (128 KiB): recv(n) allocates an n-byte buffer first, and a
# 256 KiB one costs an mmap/munmap pair per call (bench/README.md). Bodies are relayed in
# 64 KiB pieces anyway.
RECV = 64 * 1024
# A pooled connection idle longer than this is checked for a close by the upstream
# before reuse. Not sooner: every syscall releases the GIL, and under load a hot
# connection was in use a moment ago (a stale one is still caught by the retry of
# replayable requests).
_CHECK_AFTER_IDLE = 1.0


class Connection:
    """One connection to an upstream; ``write``/``read`` raise ``TimeoutError`` when its timeout fires."""

    __slots__ = ("generation", "idle_since", "key", "reused", "timeout")

    def __init__(self, key: PoolKey, generation: int, timeout: float | None) -> None:
        self.key = key
        # For a connection through an agent tunnel: which of the cluster's agent
        # connections it rides (see PooledTransport.retire_tunnel).
        self.generation = generation
        self.reused = False
        self.idle_since = 0.0
        self.timeout = timeout

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send and receive."""
        self.timeout = seconds

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def read(self, limit: int = RECV) -> bytes:
        """Up to ``limit`` bytes as soon as any arrive; ``b""`` at the end."""
        raise NotImplementedError

    def start_tls(self, context: ssl.SSLContext, server_name: str, timeout: float) -> Connection:
        """This stream with TLS inside, after a handshake bounded by ``timeout``.

        Raises ``ssl.SSLError`` or ``OSError`` (``TimeoutError``); the stream is then the caller's to close.
        """
        raise NotImplementedError

    def take_socket(self) -> socket.socket:
        """The socket, for a caller that takes it over (an upgraded connection)."""
        raise NotImplementedError

    def looks_closed(self) -> bool:
        """Before reuse: has the upstream closed the idle connection (or sent garbage)?"""
        raise NotImplementedError

    def interrupt(self) -> None:
        """Wake a reader blocked on this connection (from another thread): its read ends."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SocketConnection(Connection):
    """A connection over a socket (TCP, TLS over TCP, or an agent tunnel's socket pair)."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket, key: PoolKey, generation: int = 0) -> None:
        super().__init__(key, generation, sock.gettimeout())
        self.sock = sock

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send and receive, re-programming the socket only on a change.

        ``settimeout`` is an ``ioctl`` (a GIL release) even when nothing changes.
        """
        if seconds != self.timeout:
            self.timeout = seconds
            self.sock.settimeout(seconds)

    def write(self, data: bytes) -> None:
        send_all(self.sock, data)

    def read(self, limit: int = RECV) -> bytes:
        return self.sock.recv(limit)

    def start_tls(self, context: ssl.SSLContext, server_name: str, timeout: float) -> SocketConnection:
        self.set_timeout(timeout)
        tls = context.wrap_socket(self.sock, server_hostname=server_name, do_handshake_on_connect=False)
        try:
            handshake_in_turn(tls, timeout)
        except BaseException:
            tls.close()  # it holds the descriptor now, not self.sock
            raise
        return SocketConnection(tls, self.key, self.generation)

    def take_socket(self) -> socket.socket:
        return self.sock

    def looks_closed(self) -> bool:
        """After a pause: is the idle socket readable (the upstream closed it, or sent garbage)?"""
        if time.monotonic() - self.idle_since <= _CHECK_AFTER_IDLE:
            return False
        sock = self.sock
        return bool((isinstance(sock, ssl.SSLSocket) and sock.pending())
                    or select.select([sock], [], [], 0)[0])

    def interrupt(self) -> None:
        # shutdown rather than close: closing a descriptor another thread is blocked on
        # does not wake it on Linux, and the number could be reused.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def handshake_in_turn(tls: ssl.SSLSocket, timeout: float) -> None:
    """A client's TLS handshake on ``tls``, its computing in its turn of the worker's loop
    (:mod:`bcs_middleware.core.turns`); each wait within ``timeout`` seconds.

    A client's handshake computes mostly once the server has answered: the key exchange and the
    server's certificate chain checked. A gateway opening many upstream connections at once (a
    bot's watches reconnecting together, each a new upstream connection) did all of that in one
    turn of its loop, and every request in flight waited behind it at each of its switches
    (bench/README.md, "Upstream handshakes and busy users in their turn"). So under gevent: the
    hello sent, the answer awaited, then the rest in its turn, as the gevent worker does for the
    handshakes of its clients. Without gevent, one blocking handshake.
    """
    if gevent_active():
        from gevent.socket import wait_read

        tls.settimeout(0.0)
        try:
            tls.do_handshake()  # sends the hello; the answer is not there yet
        except ssl.SSLWantReadError:
            wait_read(tls.fileno(), timeout=timeout,
                      timeout_exc=TimeoutError("_ssl.c: The handshake operation timed out"))
            wait_turn()
        except ssl.SSLWantWriteError:  # a new socket takes a hello; if not, the blocking step sends it
            pass
        finally:
            tls.settimeout(timeout)
    tls.do_handshake()
