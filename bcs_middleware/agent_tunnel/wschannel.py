"""A WebSocket message channel over one connected (TLS) socket, built on ``wsproto``.

The agent tunnel exchanges binary messages (one remotedialer frame each, see
:mod:`~bcs_middleware.agent_tunnel.frames`) over a WebSocket. :class:`WebSocketChannel`
is that and nothing more: the opening handshake (client :meth:`~WebSocketChannel.connect`
or server :meth:`~WebSocketChannel.accept`, done by :mod:`.ws_opening` on ``wsproto``), binary
messages each way, pings and the closing handshake; :mod:`.wsframes` does the RFC 6455 framing.
This module owns the socket.

Concurrency. One reader calls :meth:`~WebSocketChannel.receive`; any number of
threads or greenlets call :meth:`~WebSocketChannel.send`. Frames are written by one
writer thread per channel from a queue, so

* a reader never blocks on a write: the answers the channel owes the peer
  (pongs, the closing frame) and the messages sent with ``wait=False`` (the
  session's Pause/Resume/Error) are queued without waiting. Two peers whose
  readers both waited to write into full TCP buffers would deadlock each other.
* :meth:`~WebSocketChannel.send` applies back-pressure: it queues once the queue
  holds at most ``high_water`` bytes, so a fast producer is held at the speed of
  the connection and the queue stays bounded.

An SSL object must not be used by two threads at once (OpenSSL's rule; breaking
it loses bytes under load), so the socket is non-blocking and every TLS call is
made under one lock, while the waiting for readiness happens outside it. Only the
standard library's ``socket``, ``selectors`` and ``threading`` are used (gevent
patches them), so the channel works the same under threads and under gevent; no
loop polls.

Bounds — what the peer can make this end hold, and what happens when it tries for more:

* a received message larger than ``max_message``, or in more than
  :data:`~.wsframes.MAX_FRAGMENTS` fragments, closes the channel (1009); a text message
  closes it (1003: remotedialer speaks binary only);
* **pongs**: one at most waits to be sent — RFC 6455 §5.5.3 lets a pong answer only the
  latest ping — and a peer that sends more than ``max_pongs_owed`` pings while that
  pong cannot leave (it does not read) is cut (1008);
* **the send queue**: what is queued without waiting (the answers and flow-control
  messages a reader owes the peer, ``send(wait=False)``) may take the queue to
  ``max_queue`` bytes; a peer that leaves more unread is cut (1008), the queue dropped;
* a peer silent for ``idle_timeout`` seconds (see :meth:`~WebSocketChannel.set_idle_timeout`),
  or that takes nothing for as long while there is something to send, is taken as gone.

A channel cut for a bound says which in :attr:`~WebSocketChannel.broken_bound`.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Sequence

from .ws_opening import RECV_SIZE, client_handshake, server_handshake
from .ws_opening import ChannelError as ChannelError  # the channel's errors, with the opening's
from .ws_opening import HandshakeRejected as HandshakeRejected
from .ws_writer import ChannelClosed as ChannelClosed
from .ws_writer import ChannelWriter
from .wsframes import (
    MESSAGE_TOO_BIG,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameError,
    Frames,
    parse_close,
)

log = logging.getLogger("bcs_middleware.agent_tunnel.wschannel")

MAX_MESSAGE = 1 << 20
HIGH_WATER = 512 * 1024
#: Bytes the send queue may hold at most (see the module docstring): the senders that wait
#: keep it under ``high_water`` plus a message; the rest is what is queued without waiting — a
#: session's Connect, Pause, Resume and end of each of its (at most 10,000) streams, ~3.3 MB.
MAX_QUEUE = 8 * 1024 * 1024
#: Pings a peer may send while the pong of an earlier one still waits to be sent.
MAX_PONGS_OWED = 32
#: The reader lets the others run after this many bytes read without waiting (see :meth:`WebSocketChannel.receive`).
YIELD_EVERY = 64 * 1024
_ENDED = object()


class WebSocketChannel(ChannelWriter):
    """Binary WebSocket messages over ``sock``; build one with :meth:`connect` or :meth:`accept`.

    :param sock: the connected socket (plain or TLS), after the handshake.
    :param client: this is the end that opened the connection (it masks what it sends).
    :param max_message: the largest message :meth:`receive` accepts.
    :param high_water: :meth:`send` waits while more than this many bytes are queued.
    :param max_queue: the most bytes queued at once; a message queued without waiting that
        would go beyond it cuts the channel (the peer does not read).
    :param max_pongs_owed: pings the peer may send while a pong waits; one more cuts the channel.
    """

    def __init__(self, sock: socket.socket, *, client: bool, max_message: int = MAX_MESSAGE,
                 high_water: int = HIGH_WATER, max_queue: int = MAX_QUEUE,
                 max_pongs_owed: int = MAX_PONGS_OWED) -> None:
        if max_queue <= high_water:
            raise ValueError("max_queue must be above high_water")
        self._sock = sock
        self._frames = Frames(client=client, max_message=max_message)
        self._sent_close = False  # our close frame is queued: nothing may follow it
        self._io_lock = threading.Lock()  # one TLS call at a time
        self._idle_timeout: float | None = None
        self._reading = False
        self._writer_done = False
        self._released = False
        self._read_selector = selectors.DefaultSelector()
        sock.settimeout(0.0)
        self.max_message = max_message
        self.high_water = high_water
        self.max_queue = max_queue
        self.max_pongs_owed = max_pongs_owed
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[bytes] = deque()
        self._urgent: deque[bytes] = deque()  # control frames that overtake queued data, in their own order
        self._pong: bytes | None = None  # the one pong waiting to be sent
        self._pongs_owed = 0  # pings received while it waited
        self._queued = 0  # bytes queued or being written
        # Who waits on _cond: a notify under gevent costs a switch into the hub even with nobody
        # waiting, and there would be one per message.
        self._writer_waiting = False
        self._senders_waiting = 0
        self._closing = False  # no more messages may be queued
        self._ended = False  # the socket is shut: nothing more goes either way
        self._close_deadline = 0.0
        self.close_reason = ""
        #: The server's ``101`` headers (names lower-cased), on a channel :meth:`connect` opened.
        self.handshake_headers: dict[str, str] = {}
        #: The code of the peer's close frame, once it sent one.
        self.peer_close_code: int | None = None
        #: The bound the peer broke (``pongs``, ``send_queue``, ``message_size``, ``fragments``), or
        #: ``protocol`` for a broken framing rule, when that is why the channel was cut.
        self.broken_bound: str | None = None
        #: The close code this end sent, once it sent one.
        self.close_code: int | None = None
        self.last_received = time.monotonic()
        self.bytes_received = 0
        self._unyielded = 0
        self.bytes_sent = 0
        self._writer = threading.Thread(target=self._write_loop, name="bcs-ws-writer", daemon=True)
        self._writer.start()

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def connect(cls, sock: socket.socket, *, host: str, path: str, headers: Sequence[tuple[str, str]],
                timeout: float, max_message: int = MAX_MESSAGE) -> WebSocketChannel:
        """Do the client handshake on ``sock`` (:func:`.ws_opening.client_handshake`, whose
        errors it raises) and return the open channel."""
        answer = client_handshake(sock, host=host, path=path, headers=headers, timeout=timeout)
        channel = cls(sock, client=True, max_message=max_message)
        channel.handshake_headers = answer
        return channel

    @classmethod
    def accept(cls, sock: socket.socket, request_head: bytes, *, leftover: bytes = b"",
               max_message: int = MAX_MESSAGE,
               extra_headers: Sequence[tuple[str, str]] = (), **options: int) -> WebSocketChannel:
        """Answer the client's upgrade request ``request_head`` with 101 on ``sock``.

        :param request_head: the raw HTTP/1.1 request head the client sent, ending in
            an empty line (the gateway rebuilds it from the WSGI environ after it has
            authenticated the request).
        :param leftover: bytes the client sent after the head and the server already
            read (the start of the WebSocket stream).
        :param extra_headers: headers to add to the ``101``.
        :param options: the channel's other bounds (``high_water``, ``max_queue``, ``max_pongs_owed``).

        Raises :class:`ChannelError` if the head is not a valid WebSocket upgrade
        request; nothing has been written to ``sock`` then.
        """
        server_handshake(sock, request_head, extra_headers)
        channel = cls(sock, client=False, max_message=max_message, **options)
        if leftover:
            channel._frames.feed(leftover)
        return channel

    # -- receiving -------------------------------------------------------------------------

    def set_idle_timeout(self, seconds: float | None) -> None:
        """Take the peer as gone after ``seconds`` without a byte from it (the peer's pings count).

        Writes that make no progress for as long fail the same way.
        """
        self._idle_timeout = seconds

    def receive(self) -> bytes | None:
        """The next binary message; ``None`` once the channel has ended (then see :attr:`close_reason`).

        Only one reader may call this at a time.
        """
        with self._cond:
            self._reading = True
        try:
            while True:
                with self._cond:
                    # Cut for a bound (by a sender, or the session): nothing more of the peer is read.
                    outcome = _ENDED if self.broken_bound is not None else self._next_event()
                if outcome is _ENDED:
                    return None
                if isinstance(outcome, bytes):
                    return outcome
                if self._ended:
                    return None
                try:
                    data = self._recv()
                except TimeoutError:
                    self._end("the peer sent nothing within the idle timeout")
                    return None
                except OSError as exc:
                    self._end(f"connection lost: {type(exc).__name__}")
                    return None
                if not data:
                    self._end("the peer closed the connection")
                    return None
                self.last_received = time.monotonic()
                self.bytes_received += len(data)
                self._unyielded += len(data)
                if self._unyielded >= YIELD_EVERY:
                    # Under gevent a read that finds data never switches: a peer sending faster than
                    # this reader decodes would keep the writer (and the Pause it must send), the
                    # session's pump and every other request of the worker from running. sleep(0)
                    # lets them run (gevent), or hands the GIL over (threads).
                    self._unyielded = 0
                    time.sleep(0)
                self._frames.feed(data)
        finally:
            with self._cond:
                self._reading = False
            self._release()

    def _recv(self) -> bytes:
        while True:
            with self._io_lock:
                if self._ended:
                    return b""
                try:
                    return self._sock.recv(RECV_SIZE)
                except ssl.SSLWantWriteError:
                    wait_for = selectors.EVENT_WRITE
                except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                    wait_for = selectors.EVENT_READ
            self._wait(self._read_selector, wait_for)

    def _next_event(self) -> bytes | object | None:
        """Process the frames received: a complete message, ``_ENDED``, or ``None`` (need more bytes)."""
        frames = self._frames
        while True:
            try:
                event = frames.next()
                if event is None:
                    return None
                opcode, payload = event
                if opcode == OP_BINARY:
                    return payload
                if opcode == OP_PING:
                    if not self._sent_close and not self._answer_ping_locked(frames.frame(OP_PONG, payload)):
                        return _ENDED
                elif opcode == OP_PONG:
                    pass  # last_received is already fresh
                elif opcode == OP_TEXT:
                    self._close_locked(1003, "binary messages only")
                    self.close_reason = "the peer sent a text message"
                    return _ENDED
                elif opcode == OP_CLOSE:
                    code, reason = parse_close(payload)
                    if not self._sent_close:  # answer with the same code (none: an empty close)
                        self._enqueue_locked(frames.frame(OP_CLOSE, payload[:2]))
                        self._sent_close = True
                    self._closing = True
                    self.peer_close_code = code
                    if not self.close_reason:
                        said = f": {reason}" if reason else ""
                        self.close_reason = f"the peer closed the WebSocket ({code}{said})"
                    self._cond.notify_all()
                    return _ENDED
            except FrameError as exc:
                if not self.close_reason:
                    self.close_reason = (f"the peer sent {exc.reason}" if exc.code == MESSAGE_TOO_BIG
                                         else f"the peer broke the WebSocket framing: {exc.reason}")
                self.broken_bound = exc.bound or "protocol"
                self._close_locked(exc.code, "message too big" if exc.code == MESSAGE_TOO_BIG else "protocol error")
                return _ENDED

    def _answer_ping_locked(self, pong: bytes) -> bool:
        """Hold ``pong`` as the one to send (replacing a waiting one); ``False`` if the peer owes too many."""
        if self._pong is not None:
            # RFC 6455 §5.5.3: a pong for the latest ping only is enough.
            self._pongs_owed += 1
            if self._pongs_owed > self.max_pongs_owed:
                self._violated_locked("pongs", f"the peer sent {self._pongs_owed} pings without reading the pongs")
                return False
            self._queued -= len(self._pong)
        self._pong = pong
        self._queued += len(pong)
        if self._writer_waiting:
            self._cond.notify_all()
        return True
