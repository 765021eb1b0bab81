"""Many virtual TCP streams over one WebSocket channel: remotedialer's session, on both ends.

The **gateway** end opens streams two ways, both sending a Connect:

* :meth:`Session.open_stream` returns a :class:`MemoryStream`, whose bytes are
  handed between its user and the session in memory: the reader appends what the
  peer sent and wakes the user; the user's writes go to the channel as Data. The
  transport's requests take this way (TLS to the apiserver over ``ssl.SSLObject``,
  :mod:`bcs_middleware.outbound.stream_connection`): per request it saves the
  socket pair's four system calls, the pump's wake-up and two switches
  (:mod:`.memory_stream`; figures in bench/README.md).
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
  once per read lets them go out together (bench/README.md);
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

Where each part lives: the state, its bounds and the primitives on it in
:mod:`.session_state`; the reader's handling of each message (and the agent's dials) in
:mod:`.session_reader`; the pump in :mod:`.session_pump`; memory streams in
:mod:`.memory_stream`. :class:`Session` puts them together and owns the reader loop.
"""

from __future__ import annotations

import logging
import socket
import threading

from .frames import Message, TunnelProtocolError, UnknownMessageType, decode
from .memory_stream import MemoryStream, MemoryStreams
from .session_pump import SocketPump
from .session_reader import SessionReader
from .session_state import (
    BUFFER_LIMIT,
    CHUNK,
    MAX_CONCURRENT_DIALS,
    MAX_STREAMS,
    OVERFLOW,
    Dial,
    StreamState,
    TooManyStreams,
    TunnelClosed,
)
from .wschannel import WebSocketChannel

__all__ = ["CHUNK", "MAX_CONCURRENT_DIALS", "Dial", "MemoryStream", "Session", "TooManyStreams", "TunnelClosed"]

log = logging.getLogger("bcs_middleware.agent_tunnel.session")


class Session(SessionReader, SocketPump, MemoryStreams):
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
        super().__init__(channel, dial=dial, window=window, ping_interval=ping_interval, dead_after=dead_after,
                         name=name, overflow=overflow, buffer_limit=buffer_limit, max_streams=max_streams)
        self._pump_thread = threading.Thread(target=self._pump, name=f"bcs-tunnel-pump-{name}", daemon=True)
        self._pump_thread.start()

    def open(self, proto: str, address: str, timeout: float) -> socket.socket:
        """A connected socket whose bytes travel to ``proto/address`` as seen from the agent.

        Returns at once (like remotedialer, the peer's dial result is not awaited): a
        refused or failed dial reaches the caller as end of file on the socket.
        Raises :class:`TunnelClosed` when the session has ended.
        """
        local, caller = socket.socketpair()
        local.setblocking(False)
        stream = StreamState(next(self._ids), local)
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
        # An Event, not a Condition: setting it with nobody waiting costs next to nothing under gevent.
        stream = StreamState(next(self._ids), None, threading.Event())
        self._connect(stream, proto, address, timeout)
        return MemoryStream(self, stream)

    def _connect(self, stream: StreamState, proto: str, address: str, timeout: float) -> None:
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
