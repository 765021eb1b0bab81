"""An upstream connection carried by an agent tunnel's stream in memory, TLS over ``ssl.SSLObject``.

Through a cluster's kube-agent (:mod:`bcs_middleware.tunnel`) the gateway's
request bytes travel as WebSocket messages: a socket between the transport and the
tunnel would only be copied into messages again, at four system calls, a wake-up of
the tunnel's pump and two switches per exchange. So the tunnel hands the transport
a :class:`ByteStream` instead — bytes in and out, in memory, with the waits and
timeouts of a socket — and TLS to the apiserver runs over memory BIOs: what
``SSLObject`` writes goes to the stream, what the stream receives is fed to it.

Only what needs no descriptor takes this way: an upgraded connection (``exec``,
``port-forward``) is spliced to the client's socket, so the transport asks the
tunnel for a socket for those (:meth:`StreamConnection.take_socket` refuses).

The TLS rules are those of a socket: the same context per upstream identity
(:class:`~bcs_middleware.outbound.tls_contexts.TLSContexts`), the same server name
checked, and an end of the stream without TLS's close is an end of file, as
``suppress_ragged_eofs`` makes it on a socket. The handshake is bounded by the
connect timeout.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Protocol

from .identity import PoolKey
from .streams import RECV as _TAKE
from .streams import Connection


class ByteStream(Protocol):
    """One tunnel stream in memory (:class:`bcs_middleware.agent_tunnel.session.MemoryStream`)."""

    def recv(self, limit: int, timeout: float | None) -> bytes:
        """Up to ``limit`` bytes once any arrive; ``b""`` at the end; ``TimeoutError`` after ``timeout``."""
        ...

    def send(self, data: bytes, timeout: float | None) -> None:
        """Send all of ``data``; ``OSError`` once the stream has ended, ``TimeoutError`` after ``timeout``."""
        ...

    def readable(self) -> bool:
        """Would :meth:`recv` return at once (bytes or the end)?"""
        ...

    def close(self) -> None:
        """End the stream (idempotent); wakes a user blocked in another thread."""
        ...


class StreamConnection(Connection):
    """A :class:`~bcs_middleware.outbound.streams.Connection` over ``stream``; :meth:`start_tls` puts TLS inside."""

    __slots__ = ("_incoming", "_outgoing", "_stream", "_tls")

    def __init__(self, stream: ByteStream, key: PoolKey, generation: int, timeout: float | None) -> None:
        super().__init__(key, generation, timeout)
        self._stream = stream
        self._tls: ssl.SSLObject | None = None
        self._incoming: ssl.MemoryBIO | None = None
        self._outgoing: ssl.MemoryBIO | None = None

    def start_tls(self, context: ssl.SSLContext, server_name: str, timeout: float) -> StreamConnection:
        """The same stream with TLS over memory BIOs, after the handshake (within ``timeout`` seconds).

        Raises ``ssl.SSLError`` or ``OSError`` (``TimeoutError``) as a socket's handshake would;
        the stream is the caller's to close then.
        """
        conn = StreamConnection(self._stream, self.key, self.generation, timeout)
        conn._incoming, conn._outgoing = incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        conn._tls = tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                conn._flush()
                conn.timeout = deadline - time.monotonic()
                if conn.timeout <= 0:
                    raise TimeoutError("_ssl.c: The handshake operation timed out") from None
                conn._fill()
        conn._flush()
        conn.timeout = timeout
        return conn

    def write(self, data: bytes) -> None:
        if self._tls is None:
            self._stream.send(data, self.timeout)
            return
        while True:
            try:
                self._tls.write(data)  # into a memory BIO: all of it, or want-read (a renegotiation)
                break
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
        self._flush()

    def read(self, limit: int = _TAKE) -> bytes:
        if self._tls is None:
            return self._stream.recv(limit, self.timeout)
        while True:
            try:
                return self._tls.read(limit)
            except ssl.SSLWantReadError:
                self._flush()  # what TLS owes the peer first (post-handshake messages)
                self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""  # TLS's close, or the stream ended without it: end of file either way

    def take_socket(self) -> socket.socket:
        raise RuntimeError("a connection through a tunnel stream in memory has no socket")

    def looks_closed(self) -> bool:
        """Has the upstream closed the idle connection, or sent something unasked?

        Checked on every reuse (it costs no system call). TLS reads what arrived: its
        close, or bytes for us, mean the end; what TLS consumes without a byte for us (a
        late session ticket, a key update) does not.
        """
        if self._tls is None:
            return self._stream.readable()
        while self._stream.readable() and self._fill():
            pass
        try:
            return bool(self._tls.pending() or self._tls.read(1))
        except ssl.SSLWantReadError:
            return False
        except (ssl.SSLError, OSError):
            return True

    def interrupt(self) -> None:
        self._stream.close()

    def close(self) -> None:
        self._stream.close()

    def _flush(self) -> None:
        assert self._outgoing is not None
        data = self._outgoing.read()
        if data:
            self._stream.send(data, self.timeout)

    def _fill(self) -> bool:
        """Feed TLS what the stream has (waiting up to the timeout); ``False`` at its end."""
        assert self._incoming is not None
        data = self._stream.recv(_TAKE, self.timeout)
        if data:
            self._incoming.write(data)
            return True
        self._incoming.write_eof()
        return False
