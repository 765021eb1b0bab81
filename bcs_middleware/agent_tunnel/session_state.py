"""What a tunnel session holds, and the primitives every part of it uses under its lock.

:class:`SessionState` is the base of :class:`~bcs_middleware.agent_tunnel.session.Session`: its
streams and their buffers, the flow-control accounting (bytes held per stream, past the
windows, in all), the dirty set and wake-up of the socket pump, and closing. The parts that
act on it are each a module: the reader of the peer's messages (:mod:`.session_reader`), the
socket pump (:mod:`.session_pump`) and the memory streams (:mod:`.memory_stream`); the bounds
are explained in :mod:`.session`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable

from .frames import Message, encode
from .wschannel import ChannelClosed, WebSocketChannel
from .wsframes import POLICY_VIOLATION

log = logging.getLogger("bcs_middleware.agent_tunnel.session")

#: Bytes read from a local socket per Data message (Go's ``io.Copy`` buffer size).
CHUNK = 32 * 1024
#: Bytes all streams of a session may hold past their windows together (see :mod:`.session`).
OVERFLOW = 32 * 1024 * 1024
#: Bytes all streams of a session may hold before every stream the peer sends to is paused.
BUFFER_LIMIT = 16 * 1024 * 1024
MAX_STREAMS = 10_000
MAX_CONCURRENT_DIALS = 64
#: Dial timeout on the agent when the Connect's deadline is absent or absurd (Go's default).
DEFAULT_DIAL_TIMEOUT = 15.0
MAX_DIAL_TIMEOUT = 60.0
#: A SyncConnections message does not close streams younger than this (their Connect may be in flight).
SYNC_GRACE_SECONDS = 30.0
#: SyncConnections messages closer together than this are ignored (remotedialer sends one a minute).
SYNC_MIN_INTERVAL = 1.0

Dial = Callable[[str, str, float], socket.socket]


class TunnelClosed(ConnectionError):
    """The session cannot carry a new stream (it ended: the agent is gone); the message is safe to log."""


class TooManyStreams(TunnelClosed):
    """The session carries :data:`MAX_STREAMS` streams already."""


class StreamState:
    """One stream as the session holds it (both ends, socket or memory)."""

    __slots__ = ("conn_id", "done", "error", "mask", "opened", "out", "peer_paused", "sent_pause", "sock", "wake")

    def __init__(self, conn_id: int, sock: socket.socket | None,
                 wake: threading.Event | None = None) -> None:
        self.conn_id = conn_id
        self.sock = sock  # None while the agent dials, and for a MemoryStream
        self.wake = wake  # a MemoryStream's: notified when it has news (data, end, Resume)
        self.out = bytearray()  # from the peer, not yet written to sock
        self.peer_paused = False  # the peer sent Pause: do not read sock
        self.sent_pause = False  # we sent Pause and owe a Resume
        self.done = False  # the peer ended the stream: deliver out, then close
        self.error = ""
        self.mask = 0  # selector events registered for sock
        self.opened = time.monotonic()


class SessionState:
    """The state of one session and the primitives on it (see the module docstring); the
    parameters are :class:`~bcs_middleware.agent_tunnel.session.Session`'s."""

    def __init__(self, channel: WebSocketChannel, *, dial: Dial | None = None, window: int = 256 * 1024,
                 ping_interval: float = 30.0, dead_after: float = 90.0, name: str = "",
                 overflow: int = OVERFLOW, buffer_limit: int = BUFFER_LIMIT, max_streams: int = MAX_STREAMS) -> None:
        if window < CHUNK:
            raise ValueError(f"window must be at least {CHUNK} bytes")
        if buffer_limit < window:
            raise ValueError("buffer_limit must be at least one window")
        self.channel = channel
        self.name = name
        self.window = window
        self.resume_at = window // 4
        self.overflow = overflow
        self.buffer_limit = buffer_limit
        self._excess = 0  # bytes held past their windows, all streams together
        self._buffered = 0  # bytes held, all streams together
        self.max_streams = max_streams
        #: The bound or rule the peer broke, when that is why the session ended (see the module docstring).
        self.broken_bound: str | None = None
        self.ping_interval = ping_interval
        self.dead_after = dead_after
        self.bytes_in = 0
        self.bytes_out = 0
        self.close_reason = ""
        self._dial = dial
        # Connects waiting for a dialler, and how many dialler threads run.
        self._pending_dials: collections.deque[tuple[StreamState, str, str, float]] = collections.deque()
        self._dialers = 0
        self._next_sync = 0.0
        self._lock = threading.Lock()
        self._streams: dict[int, StreamState] = {}
        self._highest_id = 0  # the gateway's end: the last stream id it gave out
        # Streams that ended lately: the peer's Data still in flight for them is dropped quietly
        # rather than answered one Error per message.
        self._ended_ids: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._dirty: set[StreamState] = set()
        self._closing = False
        self._ids = itertools.count(1)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._woken = False
        self._pump_done = threading.Event()
        channel.set_idle_timeout(dead_after)

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def streams(self) -> int:
        return len(self._streams)

    def close(self, reason: str = "", *, code: int = 1000) -> None:
        """End the session: every stream's local socket is shut at once, then the channel closes
        with the WebSocket close ``code`` and ``reason``."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self.close_reason = reason or "closed"
            streams = list(self._streams.values())
            for stream in streams:
                if stream.wake is not None:
                    stream.wake.set()
        for stream in streams:
            _shut(stream.sock)
        self.channel.close(code, reason[:100])
        self._wake()

    def _violation(self, bound: str, reason: str) -> None:
        """The peer broke ``bound``: cut the channel (1008) and end the session."""
        with self._lock:
            if self.broken_bound is None:
                self.broken_bound = bound
        self.channel.violated(bound, reason)
        self.close(reason, code=POLICY_VIOLATION)

    def _send(self, message: Message, *, quiet: bool = False, urgent: bool = False, wait: bool = False) -> None:
        """Queue ``message``; raises :class:`TunnelClosed` unless ``quiet`` (then a closed channel is ignored)."""
        try:
            self.channel.send(encode(message), wait=wait, urgent=urgent)
        except ChannelClosed as exc:
            if not quiet:
                raise TunnelClosed(self.close_reason or str(exc)) from None

    def _mark(self, stream: StreamState) -> None:
        with self._lock:
            if stream.wake is not None:  # a MemoryStream: its user does the work, not the pump
                stream.wake.set()
                return
            self._dirty.add(stream)
        self._wake()

    def _wake(self) -> None:
        if self._woken:
            return
        self._woken = True
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the pump is gone, or already has a wake-up byte pending

    def _end_stream(self, conn_id: int, error: str) -> bool:
        """The peer ended ``conn_id``: deliver what is buffered, then close (in the pump); ``False``
        if there is no such stream."""
        with self._lock:
            stream = self._streams.get(conn_id)
            if stream is None:
                return False
            stream.done = True
            stream.error = error
        self._mark(stream)
        return True

    def _past_window(self, buffered: int) -> int:
        return buffered - self.window if buffered > self.window else 0

    def _drop_buffer_locked(self, stream: StreamState) -> None:
        self._excess -= self._past_window(len(stream.out))
        self._buffered -= len(stream.out)
        stream.out.clear()

    def _forget_locked(self, stream: StreamState) -> None:
        self._drop_buffer_locked(stream)  # what the peer sent while it was dialled, say
        if self._streams.get(stream.conn_id) is stream:
            del self._streams[stream.conn_id]
            self._ended_ids[stream.conn_id] = None
            if len(self._ended_ids) > 1024:
                self._ended_ids.popitem(last=False)


def _finish_socket(sock: socket.socket) -> None:
    """End of file for the local side, then close; unread bytes are dropped first, as closing a
    socket pair over them would turn the end of file into a reset."""
    try:
        sock.shutdown(socket.SHUT_WR)
        for _ in range(64):
            if not sock.recv(65536):
                break
    except OSError:
        pass  # nothing more to read, or the other side is gone
    _close(sock)


def _shut(sock: socket.socket | None) -> None:
    """End of file for whoever holds the other end, without freeing the descriptor under the pump."""
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more


def _close(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.close()
    except OSError:
        pass
