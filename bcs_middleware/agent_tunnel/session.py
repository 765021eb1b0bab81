"""Many virtual TCP streams over one WebSocket channel: remotedialer's session, on both ends.

The **gateway** end opens streams two ways, both sending a Connect:

* :meth:`Session.open_stream` returns a :class:`MemoryStream`, whose bytes are
  handed between its user and the session in memory: the reader appends what the
  peer sent and wakes the user; the user's writes go to the channel as Data. The
  transport's requests take this way (TLS to the apiserver over ``ssl.SSLObject``,
  :mod:`bcs_middleware.outbound.stream_connection`): per request it saves the
  socket pair's four system calls, the pump's wake-up and two switches (with the
  frames' fast path, 271-293 -> 243-264 µs of gateway CPU per request:
  bench/README.md, session 9).
* :meth:`Session.open` returns one end of a ``socket.socketpair()`` and the pump
  carries the bytes of the other end, for users that need a descriptor (an
  upgraded ``exec`` spliced to the client, a stream forwarded to a peer).

The **agent** end is given a ``dial`` callable: on a Connect it dials (or refuses)
and pipes the dialed socket as the pump does.

Threads. Whatever the number of streams, a session runs

* a **reader** (the caller of :meth:`Session.serve`): decodes each message and
  hands its bytes to the stream — straight into its local socket when nothing is
  queued for it and the socket takes them all at once (a non-blocking send), else
  to the stream's buffer for the pump (or for a memory stream's user, whom it
  wakes); it never waits on a socket nor for the channel. It does not yield between
  messages (the channel yields every 64 KiB it reads): woken one message at a time,
  the users' next requests each left in a TLS write of their own, where yielding
  once per read lets them go out together (bench/README.md, session 9);
* a **pump**: one selector loop over every stream's local socket — reads what the
  local side sends and forwards it as Data, writes what the peer sent, and pings;
* the channel's writer (see :mod:`.wschannel`); and on the agent, up to
  :data:`MAX_CONCURRENT_DIALS` dialler threads that take the Connects in turn (a flood
  of Connects queues, one stream each, within ``max_streams``).

Flow control is remotedialer's Pause/Resume, per stream. When a stream's buffer
of bytes from the peer (not yet taken by the local side) exceeds ``window``, the
session sends Pause for it, and Resume once the local side has taken it down to a
quarter of the window; a Pause from the peer stops reading that stream's local
socket until Resume, which holds the local writer through its own socket buffer
(a memory stream's :meth:`MemoryStream.send` waits for the Resume itself).
A slow consumer so holds only its own stream; the reader keeps reading for the
others. What a stream buffers past its window is what was in flight when the
Pause left — bounded by the connection's TCP buffers, shared by all streams. So
the session counts the bytes its streams hold past their windows together: when
that total exceeds ``overflow``, the peer is ignoring Pause (bk-bcs's fork of
remotedialer predates it) and the stream the data is for is reset with an Error.
Besides, when all streams together hold more than ``buffer_limit`` bytes, every
stream the peer sends to is paused at once, whatever its own window; and beyond
``buffer_limit + overflow`` the stream the data is for is reset. Memory per session
so stays below ``buffer_limit + overflow`` however many streams there are, and per
stream below ``window + overflow``.

What else the peer can send is bounded too (the channel bounds pongs, unread answers and
message sizes: :mod:`.wschannel`). A peer that breaks a rule the session enforces is
**cut** — the channel closes with 1008 (:data:`~.wsframes.POLICY_VIOLATION`), the reason
naming the rule, :attr:`Session.broken_bound` saying which — rather than answered:

* ``unknown_stream`` — on the gateway's end, a message for a stream the gateway never
  opened (its ids are its own counter; the Go agent only ever names those). Messages for
  a stream that has ended are dropped without an answer: the peer was told when it ended;
* ``connect`` — a Connect sent to the gateway's end, which opens nothing for a peer (as
  remotedialer's server, which ends the session on a Connect it does not allow);
* ``protocol`` — a malformed message, or a second Connect for a stream (the agent's end).

SyncConnections is acted on at most once per :data:`SYNC_MIN_INTERVAL` seconds, and only
the ids of streams this end holds are kept from it.

End of a stream, as remotedialer: an Error message ends it in both directions
(``EOF`` is the clean end); the bytes received before it are still delivered to
the local side, then its socket is closed (the reader sees end of file). The local
side closing (end of file) or failing sends ``Error(EOF)`` or the error's name.
There is no half-close: remotedialer peers close both directions on Error.

When the channel ends (the peer closed it, went silent for ``dead_after`` seconds,
or :meth:`Session.close`), every stream's local socket is shut at once, so a
caller blocked on one gets end of file immediately; a memory stream's user is woken
to the same end.
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from .frames import (
    Message,
    MessageType,
    TunnelProtocolError,
    UnknownMessageType,
    decode,
    encode,
    encode_data,
    iter_connection_ids,
)
from .wschannel import ChannelClosed, WebSocketChannel
from .wsframes import POLICY_VIOLATION

log = logging.getLogger("bcs_middleware.agent_tunnel.session")

#: Bytes read from a local socket per Data message (Go's ``io.Copy`` buffer size).
CHUNK = 32 * 1024
#: Bytes all streams of a session may hold past their windows together (see the module docstring).
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


class _Stream:
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


class Session:
    """One remotedialer session over ``channel`` (see the module docstring).

    :param channel: the open WebSocket channel; the session owns it from now on.
    :param dial: the agent's dialer, ``(proto, address, timeout) -> connected socket``;
        it raises (any ``Exception``; its text goes back to the gateway) to refuse.
        ``None`` on the gateway, which refuses every Connect.
    :param window: bytes buffered per stream before the session sends Pause.
    :param ping_interval: seconds between WebSocket pings.
    :param dead_after: seconds without a byte from the peer after which it is gone.
    :param name: for log lines (e.g. the cluster id); never a secret.
    :param overflow: bytes the streams may hold past their windows (and past ``buffer_limit``)
        together before the stream data arrives for is reset (default :data:`OVERFLOW`).
    :param buffer_limit: bytes all streams may hold before each one the peer sends to is
        paused (default :data:`BUFFER_LIMIT`).
    :param max_streams: streams open at once (default :data:`MAX_STREAMS`); on the agent's
        end, Connects beyond it are refused with an Error.

    Read by metrics: :attr:`closed`, :attr:`streams`, :attr:`bytes_in` (stream bytes
    received from the peer), :attr:`bytes_out` (stream bytes sent to it),
    :attr:`broken_bound` (the bound or rule the peer broke, if that ended the session).
    """

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
        self._pending_dials: collections.deque[tuple[_Stream, str, str, float]] = collections.deque()
        self._dialers = 0
        self._next_sync = 0.0
        self._lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._highest_id = 0  # the gateway's end: the last stream id it gave out
        # Streams that ended lately: the peer's Data still in flight for them is dropped quietly
        # rather than answered one Error per message.
        self._ended_ids: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._dirty: set[_Stream] = set()
        self._closing = False
        self._ids = itertools.count(1)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._woken = False
        self._pump_done = threading.Event()
        channel.set_idle_timeout(dead_after)
        self._pump_thread = threading.Thread(target=self._pump, name=f"bcs-tunnel-pump-{name}", daemon=True)
        self._pump_thread.start()

    # -- public ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def streams(self) -> int:
        return len(self._streams)

    def open(self, proto: str, address: str, timeout: float) -> socket.socket:
        """A connected socket whose bytes travel to ``proto/address`` as seen from the agent.

        Returns at once (like remotedialer, the peer's dial result is not awaited): a
        refused or failed dial reaches the caller as end of file on the socket.
        Raises :class:`TunnelClosed` when the session has ended.
        """
        local, caller = socket.socketpair()
        local.setblocking(False)
        stream = _Stream(next(self._ids), local)
        try:
            self._connect(stream, proto, address, timeout)
        except TunnelClosed:
            local.close()
            caller.close()
            raise
        self._mark(stream)
        return caller

    def open_stream(self, proto: str, address: str, timeout: float) -> MemoryStream:
        """As :meth:`open`, but the stream's bytes are exchanged in memory (see the module docstring)."""
        # An Event, not a Condition: set under gevent costs ~0.05 µs, a Condition's notify ~2.
        stream = _Stream(next(self._ids), None, threading.Event())
        self._connect(stream, proto, address, timeout)
        return MemoryStream(self, stream)

    def _connect(self, stream: _Stream, proto: str, address: str, timeout: float) -> None:
        """Register a new stream and send its Connect; :class:`TunnelClosed` (registering nothing) if not."""
        with self._lock:
            if self._closing:
                raise TunnelClosed(self.close_reason or "the tunnel is closed")
            if len(self._streams) >= self.max_streams:
                raise TooManyStreams(f"the tunnel carries {self.max_streams} streams already")
            self._streams[stream.conn_id] = stream
            self._highest_id = max(self._highest_id, stream.conn_id)
        try:
            # Queued without waiting (an opener is never held here; the dial has its own timeouts):
            # at most max_streams Connects, which the channel's max_queue leaves room for.
            self._send(Message.connect(stream.conn_id, proto, address, timeout))
        except TunnelClosed:
            with self._lock:
                self._streams.pop(stream.conn_id, None)
            raise

    def serve(self) -> None:
        """Read the channel until it ends, then end every stream. Blocks; call it once."""
        reason = "the peer closed the tunnel"
        try:
            while True:
                frame = self.channel.receive()
                if frame is None:
                    reason = self.channel.close_reason or reason
                    break
                try:
                    message = decode(frame)
                except UnknownMessageType:
                    continue  # remotedialer ignores the types it does not know
                except TunnelProtocolError as exc:
                    self._violation("protocol", f"protocol error: {exc}")
                else:
                    self._dispatch(message)
                if self._closing:
                    reason = self.close_reason
                    break
        finally:
            self.close(reason)
            bound = self.broken_bound or self.channel.broken_bound
            if bound is not None:
                self.broken_bound = bound
                log.warning("tunnel %s: %s; the connection is cut (WebSocket close %s)", self.name,
                            self.channel.close_reason or reason, self.channel.close_code)
            self._pump_done.wait(5.0)

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

    # -- the reader ------------------------------------------------------------------------

    def _dispatch(self, message: Message) -> None:
        mtype = message.type
        if mtype is MessageType.DATA:
            self._on_data(message)
        elif mtype is MessageType.CONNECT:
            self._on_connect(message)
        elif mtype is MessageType.ERROR:
            if not self._end_stream(message.conn_id, message.error_text):
                self._unknown_stream(message)
        elif mtype in (MessageType.PAUSE, MessageType.RESUME):
            with self._lock:
                stream = self._streams.get(message.conn_id)
                if stream is not None:
                    stream.peer_paused = mtype is MessageType.PAUSE
            if stream is None:
                self._unknown_stream(message)
                return
            self._mark(stream)
        elif mtype is MessageType.SYNC_CONNECTIONS:
            self._on_sync(message.payload)
        # AddClient/RemoveClient are about peering between remotedialer servers: not ours.

    def _on_data(self, message: Message) -> None:
        overflowed = False
        with self._lock:
            stream = self._streams.get(message.conn_id)
            if stream is not None and not stream.done:
                payload = message.payload
                self.bytes_in += len(payload)
                if not stream.out and stream.sock is not None:
                    # Nothing queued for the local side: hand it over now, without waking the pump.
                    try:
                        sent = stream.sock.send(payload)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
                    except OSError:
                        sent = 0  # the pump's flush meets the same error and ends the stream
                    if sent == len(payload):
                        return
                    payload = payload[sent:]
                before = len(stream.out)
                stream.out += payload
                buffered = len(stream.out)
                self._buffered += len(payload)
                self._excess += self._past_window(buffered) - self._past_window(before)
                if self._excess > self.overflow or self._buffered > self.buffer_limit + self.overflow:
                    overflowed = True
                    self._drop_buffer_locked(stream)
                elif (buffered > self.window or self._buffered > self.buffer_limit) and not stream.sent_pause:
                    # Decided and queued under the lock, so a Resume from the pump cannot overtake it.
                    stream.sent_pause = True
                    self._send(Message.pause(stream.conn_id), quiet=True, urgent=True)
                if stream.wake is not None:
                    stream.wake.set()
                    if not overflowed:
                        return
        if stream is None:
            if self._unknown_stream(message):
                # As remotedialer: tell the peer, which then ends its side.
                self._send(Message.error(message.conn_id, f"connection not found {message.conn_id}"), quiet=True)
            return
        if overflowed:
            log.warning("tunnel %s: streams hold more than %d bytes past their windows or the session's "
                        "buffer limit (the peer ignores Pause); resetting stream %d", self.name, self.overflow,
                        stream.conn_id)
            self._send(Message.error(stream.conn_id, "buffer overflow"), quiet=True)
            self._end_stream(stream.conn_id, "buffer overflow")
            return
        if not stream.done:
            self._mark(stream)

    def _unknown_stream(self, message: Message) -> bool:
        """A message for a stream this end does not hold: cuts a peer naming a stream the gateway
        never opened; ``True`` when an answer is owed (Data for a stream the agent's end does not
        know and has not ended lately)."""
        conn_id = message.conn_id
        if self._dial is None:  # the gateway's end: stream ids are its own
            if not 0 < conn_id <= self._highest_id:
                self._violation("unknown_stream", f"the peer sent {message.type.name} for stream {conn_id}, "
                                "which the gateway never opened")
            return False  # one that ended: the peer was told then
        if message.type is not MessageType.DATA:
            return False
        with self._lock:
            return conn_id not in self._ended_ids

    def _on_connect(self, message: Message) -> None:
        conn_id = message.conn_id
        if self._dial is None:
            self._send(Message.error(conn_id, "connect not allowed"), quiet=True)
            self._violation("connect", "the peer sent a Connect: the gateway opens no connection for a peer")
            return
        proto, address = message.target
        stream = _Stream(conn_id, None)
        deadline = message.deadline / 1000.0
        timeout = deadline if 0 < deadline <= MAX_DIAL_TIMEOUT else DEFAULT_DIAL_TIMEOUT
        with self._lock:
            duplicate = conn_id in self._streams
            refuse = len(self._streams) >= self.max_streams
            start = False
            if not duplicate and not refuse:
                self._streams[conn_id] = stream
                self._pending_dials.append((stream, proto, address, timeout))
                start = self._dialers < MAX_CONCURRENT_DIALS
                self._dialers += start
        if duplicate:
            self._violation("protocol", f"the peer sent a second Connect for stream {conn_id}")
        elif refuse:
            self._send(Message.error(conn_id, "too many connections"), quiet=True)
        elif start:
            threading.Thread(target=self._dial_loop, name=f"bcs-tunnel-dial-{self.name}", daemon=True).start()

    def _dial_loop(self) -> None:
        """A dialler thread: dial the pending Connects in turn, until none is left."""
        while True:
            with self._lock:
                if not self._pending_dials or self._closing:
                    self._dialers -= 1
                    return
                pending = self._pending_dials.popleft()
            self._dial_stream(*pending)

    def _dial_stream(self, stream: _Stream, proto: str, address: str, timeout: float) -> None:
        assert self._dial is not None
        try:
            sock = self._dial(proto, address, timeout)
        except Exception as exc:  # the dialer's refusal or failure, whatever its type, goes to the peer
            text = str(exc) or type(exc).__name__
            # The address is the peer's text: quoted, so that it cannot forge a line.
            log.info("tunnel %s: stream %d to %r refused or failed: %s", self.name, stream.conn_id,
                     f"{proto}/{address}", text)
            with self._lock:
                self._forget_locked(stream)
            self._send(Message.error(stream.conn_id, text), quiet=True)
            return
        sock.setblocking(False)
        with self._lock:
            if self._closing or stream.done or self._streams.get(stream.conn_id) is not stream:
                keep = False
            else:
                keep = True
                stream.sock = sock
        if not keep:
            with self._lock:
                self._forget_locked(stream)
            sock.close()
            return
        self._mark(stream)

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

    def _on_sync(self, payload: bytes) -> None:
        now = time.monotonic()
        if now < self._next_sync:
            return
        self._next_sync = now + SYNC_MIN_INTERVAL
        cutoff = now - SYNC_GRACE_SECONDS
        with self._lock:
            held = {s.conn_id for s in self._streams.values() if s.opened < cutoff}
        if not held:
            return
        # Only the ids this end holds are kept: the peer may list as many as a message holds.
        live = {conn_id for conn_id in iter_connection_ids(payload) if conn_id in held}
        for conn_id in held - live:
            self._end_stream(conn_id, "sync from peer")

    # -- sending ---------------------------------------------------------------------------

    def _send(self, message: Message, *, quiet: bool = False, urgent: bool = False, wait: bool = False) -> None:
        """Queue ``message``; raises :class:`TunnelClosed` unless ``quiet`` (then a closed channel is ignored)."""
        try:
            self.channel.send(encode(message), wait=wait, urgent=urgent)
        except ChannelClosed as exc:
            if not quiet:
                raise TunnelClosed(self.close_reason or str(exc)) from None

    # -- the pump --------------------------------------------------------------------------

    def _mark(self, stream: _Stream) -> None:
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

    def _pump(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        next_ping = time.monotonic() + self.ping_interval
        try:
            while not self._closing:
                ready = selector.select(max(0.0, next_ping - time.monotonic()))
                if self._closing:
                    break
                for key, events in ready:
                    stream = key.data
                    if stream is None:
                        self._drain_wake()
                        continue
                    if events & selectors.EVENT_WRITE:
                        self._flush(stream)
                    if events & selectors.EVENT_READ and not self._closing:
                        self._forward(stream)
                    self._settle(selector, stream)
                with self._lock:
                    dirty, self._dirty = self._dirty, set()
                for stream in dirty:
                    if self._closing:
                        break
                    self._flush(stream)
                    self._settle(selector, stream)
                if time.monotonic() >= next_ping:
                    self.channel.ping()
                    next_ping = time.monotonic() + self.ping_interval
        except Exception:
            log.exception("tunnel %s: the pump failed; closing the tunnel", self.name)
            self.close("internal error")
        finally:
            selector.close()
            with self._lock:
                streams = list(self._streams.values())
                self._streams.clear()
                self._dirty.clear()
            for stream in streams:
                _close(stream.sock)
            self._wake_r.close()
            self._wake_w.close()
            self._pump_done.set()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        # Only now: a wake-up after this point sends a new byte, and the dirty set is read after it.
        self._woken = False

    def _flush(self, stream: _Stream) -> None:
        """Write what the peer sent into the local socket, as much as it takes now."""
        with self._lock:
            if stream.sock is None or not stream.out:
                return
            try:
                sent = stream.sock.send(stream.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                gone: OSError | None = exc
            else:
                gone = None
                before = len(stream.out)
                del stream.out[:sent]
                self._buffered -= sent
                self._excess += self._past_window(len(stream.out)) - self._past_window(before)
                if stream.sent_pause and len(stream.out) <= self.resume_at and not stream.done:
                    stream.sent_pause = False
                    self._send(Message.resume(stream.conn_id), quiet=True, urgent=True)
        if gone is not None:
            self._local_failed(stream, gone)

    def _forward(self, stream: _Stream) -> None:
        """Read what the local side sent and send it to the peer (waits while the channel is full)."""
        sock = stream.sock
        if sock is None or stream.done:
            return
        try:
            data = sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._local_failed(stream, exc)
            return
        if not data:
            self._finish(stream, "EOF")
            return
        try:
            self.channel.send(encode_data(stream.conn_id, data))
        except ChannelClosed:
            return
        self.bytes_out += len(data)

    def _local_failed(self, stream: _Stream, exc: OSError) -> None:
        if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ESHUTDOWN):
            self._finish(stream, "EOF")
        else:
            self._finish(stream, type(exc).__name__)

    def _finish(self, stream: _Stream, error: str) -> None:
        """The local side ended the stream: tell the peer (unless it ended it) and drop it."""
        with self._lock:
            told = stream.done
            stream.done = True
            self._drop_buffer_locked(stream)
        if not told:
            self._send(Message.error(stream.conn_id, error), quiet=True)
        self._mark(stream)

    # -- memory streams (their users call these) --------------------------------------------

    def _stream_recv(self, stream: _Stream, limit: int, timeout: float | None) -> bytes:
        wake = stream.wake
        assert wake is not None
        deadline = None
        while True:
            with self._lock:
                if stream.out:
                    return self._take_locked(stream, limit)
                if stream.done or self._closing:
                    self._forget_locked(stream)
                    return b""
                wake.clear()  # under the lock: news from now on sets it again
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            if not wake.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                with self._lock:
                    if not stream.out and not stream.done and not self._closing:
                        raise TimeoutError("timed out")

    def _take_locked(self, stream: _Stream, limit: int) -> bytes:
        """Up to ``limit`` of what the peer sent for a memory stream; a Resume once it is taken down."""
        before = len(stream.out)
        if before <= limit:
            data = bytes(stream.out)
            stream.out.clear()
        else:
            data = bytes(stream.out[:limit])
            del stream.out[:limit]
        self._buffered -= len(data)
        self._excess += self._past_window(len(stream.out)) - self._past_window(before)
        if stream.sent_pause and len(stream.out) <= self.resume_at and not stream.done:
            stream.sent_pause = False
            self._send(Message.resume(stream.conn_id), quiet=True, urgent=True)
        return data

    def _stream_send(self, stream: _Stream, data: bytes, timeout: float | None) -> None:
        wake = stream.wake
        assert wake is not None
        deadline = None
        view = memoryview(data)
        while view:
            # The peer's Pause holds the writer here, as it holds a socket's in its buffer.
            while True:
                with self._lock:
                    if stream.done or self._closing:
                        raise BrokenPipeError(errno.EPIPE, "the tunnel stream has ended")
                    if not stream.peer_paused:
                        break
                    wake.clear()
                if deadline is None and timeout is not None:
                    deadline = time.monotonic() + timeout
                if not wake.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                    with self._lock:
                        if stream.peer_paused and not stream.done and not self._closing:
                            raise TimeoutError("timed out")
            piece = bytes(view[:CHUNK])
            try:
                self.channel.send(encode_data(stream.conn_id, piece))
            except ChannelClosed:
                raise BrokenPipeError(errno.EPIPE, "the tunnel has ended") from None
            self.bytes_out += len(piece)
            view = view[CHUNK:]

    def _stream_readable(self, stream: _Stream) -> bool:
        with self._lock:
            return bool(stream.out) or stream.done or self._closing

    def _stream_close(self, stream: _Stream) -> None:
        with self._lock:
            told = stream.done
            stream.done = True
            self._drop_buffer_locked(stream)
            known = self._streams.get(stream.conn_id) is stream
            self._forget_locked(stream)
            if stream.wake is not None:
                stream.wake.set()  # a user blocked in recv or send (an interrupt) returns
        if known and not told:
            self._send(Message.eof(stream.conn_id), quiet=True)

    def _past_window(self, buffered: int) -> int:
        return buffered - self.window if buffered > self.window else 0

    def _drop_buffer_locked(self, stream: _Stream) -> None:
        self._excess -= self._past_window(len(stream.out))
        self._buffered -= len(stream.out)
        stream.out.clear()

    def _forget_locked(self, stream: _Stream) -> None:
        self._drop_buffer_locked(stream)  # what the peer sent while it was dialled, say
        if self._streams.get(stream.conn_id) is stream:
            del self._streams[stream.conn_id]
            self._ended_ids[stream.conn_id] = None
            if len(self._ended_ids) > 1024:
                self._ended_ids.popitem(last=False)

    def _settle(self, selector: selectors.BaseSelector, stream: _Stream) -> None:
        """Register what the stream waits for now, or drop it once it is over."""
        with self._lock:
            sock = stream.sock
            finished = stream.done and not stream.out
            if finished:
                self._forget_locked(stream)
            mask = 0
            if not finished and sock is not None:
                if stream.out:
                    mask |= selectors.EVENT_WRITE
                if not stream.peer_paused and not stream.done:
                    mask |= selectors.EVENT_READ
        if sock is None:
            return
        if mask != stream.mask:
            if stream.mask and mask:
                selector.modify(sock, mask, stream)
            elif mask:
                selector.register(sock, mask, stream)
            else:
                selector.unregister(sock)
            stream.mask = mask
        if finished:
            stream.sock = None
            _finish_socket(sock)


class MemoryStream:
    """One stream of a :class:`Session` whose bytes are exchanged in memory (:meth:`Session.open_stream`).

    Like a connected socket with a timeout: :meth:`recv` returns what the peer sent
    (``b""`` once the stream has ended), :meth:`send` writes (``BrokenPipeError`` once it
    has ended). Waiting for the peer's bytes or for its Resume raises ``TimeoutError``
    after ``timeout`` seconds; a full channel holds :meth:`send` as it holds every sender
    (bounded by the channel's idle timeout). :meth:`close` ends the stream (the peer gets
    EOF) and wakes a user blocked in another thread.
    """

    __slots__ = ("_session", "_stream")

    def __init__(self, session: Session, stream: _Stream) -> None:
        self._session = session
        self._stream = stream

    @property
    def conn_id(self) -> int:
        return self._stream.conn_id

    def recv(self, limit: int, timeout: float | None) -> bytes:
        return self._session._stream_recv(self._stream, limit, timeout)

    def send(self, data: bytes, timeout: float | None) -> None:
        self._session._stream_send(self._stream, data, timeout)

    def readable(self) -> bool:
        """Would :meth:`recv` return at once (bytes, or the end)?"""
        return self._session._stream_readable(self._stream)

    def close(self) -> None:
        """End the stream; idempotent."""
        self._session._stream_close(self._stream)


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
