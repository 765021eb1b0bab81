"""Copying bytes both ways between two connected sockets: an upgraded connection's splice.

Used by the ``101`` answer of the Kubernetes route (:mod:`bcs_middleware.apps.upgrade`) and by
the agent tunnel's peer link (:mod:`bcs_middleware.agent_tunnel.peer_link`); it imports nothing
of the package, so both can use it without one importing the other.

One ``selectors`` loop over two non-blocking sockets and a 256 KiB buffer per direction: a side
that stops reading stops the other side being read. TLS sockets are handled with ``pending()``
(bytes OpenSSL already decrypted are invisible to ``select``) and ``SSLWantRead/WriteError``.
End of input on one side is passed on with a TCP half-close (``shutdown(SHUT_WR)``, without a TLS
``close_notify``, which Go's TLS stack reads as end of stream). Under gevent ``selectors`` and the
sockets are gevent's, so the loop waits cooperatively.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

#: kubelet's own streaming idle timeout is 4 h (``--streaming-connection-idle-timeout``).
DEFAULT_IDLE_TIMEOUT = 3600.0
DEFAULT_MAX_DURATION = 86400.0

_BUFFER = 256 * 1024
_PIECE = 64 * 1024


@dataclass(frozen=True)
class SpliceResult:
    """What a splice moved and why it ended (``closed``, ``reset``, ``idle``, ``max_duration``,
    ``tap``: its :class:`SpliceTap` cut it)."""

    to_upstream: int
    to_client: int
    ended_by: str
    seconds: float


class SpliceTap(Protocol):
    """Sees every byte a splice reads, and may hold it back (a session recorder).

    ``observe`` gets each piece as it is read, before it is sent on; ``hold`` is asked once
    per turn of the loop: ``"go"``, ``"wait"`` (read nothing for now: the tap's bounded
    buffer is full) or ``"cut"`` (end the splice). Both run on the splice's thread and
    must not block.
    """

    def observe(self, to_upstream: bool, data: bytes) -> None: ...

    def hold(self) -> Literal["go", "wait", "cut"]: ...


#: How often a splice held by its tap looks again (the tap has no descriptor to wait on).
_HELD_POLL = 0.01


class _Direction:
    __slots__ = ("buf", "dst", "eof", "held", "moved", "observe", "shut", "src")

    def __init__(self, src: socket.socket, dst: socket.socket, initial: bytes = b"",
                 observe: Callable[[bytes], None] | None = None) -> None:
        self.src = src
        self.dst = dst
        self.buf = bytearray(initial)
        self.eof = False
        self.shut = False
        self.held = False
        self.moved = 0
        self.observe = observe

    def wants_read(self) -> bool:
        return not self.eof and not self.held and len(self.buf) < _BUFFER


def _half_close(sock: socket.socket) -> None:
    # socket.socket.shutdown, not SSLSocket.shutdown: the latter drops the TLS
    # state, and the other direction still has to be read through it.
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
    except OSError:
        pass


def _read(d: _Direction, want_write: set[socket.socket]) -> bool | None:
    """Move bytes from ``d.src`` into the buffer; True on progress, None on a reset."""
    try:
        data = d.src.recv(min(_PIECE, _BUFFER - len(d.buf)))
    except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
        return False
    except ssl.SSLWantWriteError:
        want_write.add(d.src)
        return False
    except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
        data = b""
    except OSError:
        return None
    if data:
        d.buf += data
        if d.observe is not None:
            d.observe(data)
    else:
        d.eof = True
    return True


def _write(d: _Direction, want_write: set[socket.socket]) -> bool | None:
    """Move buffered bytes to ``d.dst``; True on progress, None when the peer is gone."""
    try:
        # The retried piece never shrinks while unsent, as OpenSSL requires.
        sent = d.dst.send(bytes(d.buf[:_PIECE]))
    except (ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
        want_write.add(d.dst)
        return False
    except ssl.SSLWantReadError:
        return False
    except OSError:
        return None
    if not sent:
        return False
    del d.buf[:sent]
    d.moved += sent
    return True


def _step(d: _Direction, want_write: set[socket.socket]) -> bool | None:
    """One turn of one direction: read what is ready, write what is buffered, pass an end of
    input on; True on progress, None on a reset."""
    progressed = False
    if d.wants_read():
        moved = _read(d, want_write)
        if moved is None:
            return None
        progressed = moved
    if d.buf:
        moved = _write(d, want_write)
        if moved is None:
            return None
        progressed |= moved
    if d.eof and not d.buf and not d.shut:
        _half_close(d.dst)
        d.shut = True
    return progressed


def _tls_pending(d: _Direction) -> bool:
    # Bytes OpenSSL already decrypted do not make the socket readable.
    return d.wants_read() and isinstance(d.src, ssl.SSLSocket) and d.src.pending() > 0


class _Limits:
    """When a splice is cut whatever moves: idle too long, or on for too long."""

    __slots__ = ("idle_timeout", "max_duration", "started")

    def __init__(self, started: float, idle_timeout: float | None, max_duration: float | None) -> None:
        self.started = started
        self.idle_timeout = idle_timeout
        self.max_duration = max_duration

    def ended_by(self, now: float, last: float) -> str | None:
        if self.max_duration is not None and now - self.started >= self.max_duration:
            return "max_duration"
        if self.idle_timeout is not None and now - last >= self.idle_timeout:
            return "idle"
        return None

    def wake_in(self, now: float, last: float, held: bool) -> float:
        """How long to wait for the sockets: the limits are checked now and then, and often while
        the tap holds the splice (it has no descriptor to wait on)."""
        waits = [_HELD_POLL if held else 1.0]
        if self.idle_timeout is not None:
            waits.append(last + self.idle_timeout - now)
        if self.max_duration is not None:
            waits.append(self.started + self.max_duration - now)
        return max(min(waits), 0.0)


class _Waiter:
    """The selector of a splice: each socket registered for what its directions wait for."""

    __slots__ = ("registered", "selector", "socks", "want_write")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.selector = selectors.DefaultSelector()
        self.socks = (client, upstream)
        self.registered: dict[socket.socket, int] = {}
        #: Sockets whose TLS layer must write before it can go on (``SSLWantWriteError``).
        self.want_write: set[socket.socket] = set()

    def wait(self, directions: tuple[_Direction, _Direction], timeout: float) -> None:
        wanted = dict.fromkeys(self.socks, 0)
        for d in directions:
            if d.wants_read():
                wanted[d.src] |= selectors.EVENT_READ
            if d.buf:
                wanted[d.dst] |= selectors.EVENT_WRITE
        for sock in self.want_write:
            wanted[sock] |= selectors.EVENT_WRITE
        self.want_write.clear()
        for sock, events in wanted.items():
            self._register(sock, events)
        self.selector.select(timeout)

    def _register(self, sock: socket.socket, events: int) -> None:
        registered = self.registered
        if registered.get(sock, 0) == events:
            return
        if not events:
            self.selector.unregister(sock)
            del registered[sock]
        elif sock in registered:
            self.selector.modify(sock, events)
            registered[sock] = events
        else:
            self.selector.register(sock, events)
            registered[sock] = events

    def close(self) -> None:
        self.selector.close()
        for sock in self.socks:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass


def splice(
    client: socket.socket,
    upstream: socket.socket,
    *,
    to_client: bytes = b"",
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    max_duration: float | None = DEFAULT_MAX_DURATION,
    clock: Callable[[], float] = time.monotonic,
    tap: SpliceTap | None = None,
) -> SpliceResult:
    """Copy bytes both ways between two connected sockets until both ends closed.

    :param to_client: bytes to deliver to the client first (the ``101`` head and
        whatever the upstream sent right behind it).
    :param idle_timeout: seconds without a byte moving either way before both
        connections are cut; ``None`` never.
    :param max_duration: seconds after which both are cut whatever happens.
    :param tap: sees the bytes read from either side, and may hold or cut the splice.

    Both sockets are left shut down (not closed) and non-blocking.
    """
    up = _Direction(client, upstream, observe=None if tap is None else lambda data: tap.observe(True, data))
    down = _Direction(upstream, client, to_client,
                      observe=None if tap is None else lambda data: tap.observe(False, data))
    directions = (up, down)
    client.setblocking(False)
    upstream.setblocking(False)
    waiter = _Waiter(client, upstream)
    want_write = waiter.want_write
    started = last = clock()
    limits = _Limits(started, idle_timeout, max_duration)
    try:
        while True:
            if tap is not None:
                held = tap.hold()
                if held == "cut":
                    return _result(up, down, "tap", started, clock)
                up.held = down.held = held == "wait"
            progressed = False
            for d in directions:
                moved = _step(d, want_write)
                if moved is None:
                    return _result(up, down, "reset", started, clock)
                progressed |= moved
            if up.shut and down.shut:
                return _result(up, down, "closed", started, clock)
            now = clock()
            if progressed:
                last = now
                continue  # more may be ready; a read that finds nothing costs one EAGAIN
            ended_by = limits.ended_by(now, last)
            if ended_by is not None:
                return _result(up, down, ended_by, started, clock)
            if _tls_pending(up) or _tls_pending(down):
                continue
            waiter.wait(directions, limits.wake_in(now, last, up.held))
    finally:
        waiter.close()


def _result(up: _Direction, down: _Direction, ended_by: str, started: float,
            clock: Callable[[], float]) -> SpliceResult:
    return SpliceResult(up.moved, down.moved, ended_by, clock() - started)


