"""The sending half of a :class:`~bcs_middleware.agent_tunnel.wschannel.WebSocketChannel`.

Frames are written by one writer thread per channel from a queue (urgent control frames
overtake queued data; at most one pong waits, RFC 6455 §5.5.3); senders that wait are held
while more than ``high_water`` bytes are queued, and what is queued without waiting is bounded
by ``max_queue``. Ending the channel (the closing handshake, a flush of at most
:data:`CLOSE_FLUSH_SECONDS`, or at once) is here too, since the writer carries it out. The
socket's TLS calls are made under the channel's one I/O lock; the waiting happens outside it.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque

from .ws_opening import RECV_SIZE, ChannelError
from .wsframes import OP_BINARY, OP_PING, POLICY_VIOLATION, Frames

log = logging.getLogger("bcs_middleware.agent_tunnel.wschannel")

#: How long a closing channel's writer flushes what is queued (and waits for a peer that takes
#: nothing) before it cuts the socket.
CLOSE_FLUSH_SECONDS = 5.0


class ChannelClosed(ChannelError):
    """:meth:`WebSocketChannel.send` on a channel that has ended."""


class ChannelWriter:
    """Sending, the writer thread and ending; the state is set up by ``WebSocketChannel.__init__``."""

    _sock: socket.socket
    _frames: Frames
    _sent_close: bool
    _io_lock: threading.Lock
    _idle_timeout: float | None
    _reading: bool
    _writer_done: bool
    _released: bool
    _read_selector: selectors.BaseSelector
    high_water: int
    max_queue: int
    _cond: threading.Condition
    _queue: deque[bytes]
    _urgent: deque[bytes]
    _pong: bytes | None
    _pongs_owed: int
    _queued: int
    _writer_waiting: bool
    _senders_waiting: int
    _closing: bool
    _ended: bool
    _close_deadline: float
    close_reason: str
    broken_bound: str | None
    close_code: int | None
    bytes_sent: int

    def send(self, data: bytes, *, wait: bool = True, urgent: bool = False) -> None:
        """Queue one binary message.

        With ``wait`` (the default) return once the queue is below ``high_water``
        bytes; ``wait=False`` never blocks (for small control messages from a
        reader). ``urgent`` messages overtake the queued ones (but not each other):
        flow-control messages must not wait behind the data they are about.
        Raises :class:`ChannelClosed` once the channel is closing.
        """
        frame = self._frames.frame(OP_BINARY, data)
        with self._cond:
            if wait and not urgent:
                # Waiting before queueing (not after): however many senders there are, the queue
                # holds at most high_water bytes and one message of theirs.
                while self._queued > self.high_water and not self._closing and not self._ended:
                    self._senders_waiting += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._senders_waiting -= 1
            if self._closing or self._ended:
                raise ChannelClosed(self.close_reason or "the channel is closed")
            if self._queued + len(frame) > self.max_queue:
                self._violated_locked("send_queue", f"the peer left more than {self.max_queue} bytes unread")
                raise ChannelClosed(self.close_reason)
            self._enqueue_locked(frame, urgent=urgent)

    def ping(self) -> None:
        """Queue a ping (the peer's pong, like any byte from it, refreshes :attr:`last_received`)."""
        with self._cond:
            if self._closing or self._ended or self._sent_close:
                return
            self._enqueue_locked(self._frames.frame(OP_PING), urgent=True)

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake, flush what is queued (at most a few seconds) and end.

        Idempotent; never blocks for long. A reader in :meth:`receive` returns ``None``.
        """
        with self._cond:
            if not self.close_reason:
                self.close_reason = reason or "closed locally"
            self._close_locked(code, reason)

    def abort(self, reason: str) -> None:
        """End at once without flushing (a dead peer)."""
        self._end(reason)

    @property
    def closed(self) -> bool:
        return self._closing or self._ended

    def violated(self, bound: str, reason: str) -> None:
        """Cut the channel because the peer broke ``bound`` (one the session keeps): close code 1008,
        after what is queued (bounded) — the answer to what broke it, say."""
        with self._cond:
            self._violated_locked(bound, reason, unread=False)

    def _violated_locked(self, bound: str, reason: str, *, unread: bool = True) -> None:
        """The peer broke ``bound``: close with 1008 (the reader ends), dropping what is queued when
        it is what the peer does not read."""
        if self._closing or self._ended:
            return
        self.broken_bound = bound
        self.close_reason = reason
        if unread:
            self._queued -= sum(map(len, self._queue)) + sum(map(len, self._urgent)) + len(self._pong or b"")
            self._queue.clear()
            self._urgent.clear()
            self._pong = None
        self._close_locked(POLICY_VIOLATION, reason)

    def _close_locked(self, code: int, reason: str) -> None:
        if self._closing or self._ended:
            return
        if not self._sent_close:
            self._enqueue_locked(self._frames.close_frame(code, reason))
            self._sent_close = True
            self.close_code = code
        self._closing = True
        self._close_deadline = time.monotonic() + CLOSE_FLUSH_SECONDS
        self._cond.notify_all()

    def _enqueue_locked(self, frame: bytes, *, urgent: bool = False) -> None:
        if frame and not self._ended:
            (self._urgent if urgent else self._queue).append(frame)
            self._queued += len(frame)
            if self._writer_waiting:
                self._cond.notify_all()

    def _write_loop(self) -> None:
        selector = selectors.DefaultSelector()
        try:
            try:
                selector.register(self._sock, selectors.EVENT_WRITE)
            except (ValueError, OSError):  # its owner closed the socket before this thread began
                self._end("connection lost: the socket was closed")
                return
            while True:
                self._wait_for_frames()
                # Let the senders that are ready now queue theirs first: one TLS write for all of
                # them, not one each (under gevent each sender wakes the writer on its own).
                time.sleep(0)
                with self._cond:
                    if self._ended:
                        return
                    if not self._has_frames_locked():  # closing and flushed
                        break
                    chunks, size = self._take_batch_locked()
                if not self._send_batch(chunks, selector):
                    return
                with self._cond:
                    self._queued -= size
                    self.bytes_sent += size
                    if self._senders_waiting:
                        self._cond.notify_all()
                    if self._closing and time.monotonic() > self._close_deadline and self._has_frames_locked():
                        break  # the flush of a closing channel is bounded
            self._end(self.close_reason or "closed")
        finally:
            selector.close()
            with self._cond:
                self._writer_done = True
            self._release()

    def _has_frames_locked(self) -> bool:
        return bool(self._queue or self._urgent or self._pong is not None)

    def _wait_for_frames(self) -> None:
        """Until there is something to write, or the channel is closing or has ended."""
        with self._cond:
            while not self._has_frames_locked() and not self._closing and not self._ended:
                self._writer_waiting = True
                try:
                    self._cond.wait()
                finally:
                    self._writer_waiting = False

    def _take_batch_locked(self) -> tuple[list[bytes], int]:
        """What one write carries, and its size: the owed pong, then every urgent frame (RFC 6455
        §5.5.3: a pong answers the most recent ping, so one is kept), then queued data up to a
        few reads' worth."""
        chunks: list[bytes] = []
        size = 0
        if self._pong is not None:
            chunks.append(self._pong)
            size += len(self._pong)
            self._pong = None
            self._pongs_owed = 0
        while self._urgent:
            chunk = self._urgent.popleft()
            chunks.append(chunk)
            size += len(chunk)
        while self._queue and size < RECV_SIZE * 4:
            chunk = self._queue.popleft()
            chunks.append(chunk)
            size += len(chunk)
        return chunks, size

    def _send_batch(self, chunks: list[bytes], selector: selectors.BaseSelector) -> bool:
        """Write ``chunks`` as one; False once the channel has ended for a failure of it."""
        try:
            self._sendall(b"".join(chunks), selector)
        except TimeoutError:
            self._end("the peer took nothing within the idle timeout")
            return False
        except OSError as exc:
            self._end(f"connection lost while sending: {type(exc).__name__}")
            return False
        except Exception:
            log.exception("the WebSocket writer failed")
            self._end("internal error while sending")
            return False
        return True

    def _sendall(self, data: bytes, selector: selectors.BaseSelector) -> None:
        view = memoryview(data)
        stalls = 0
        while view:
            wait_for = selectors.EVENT_WRITE
            with self._io_lock:
                if self._ended:
                    raise ConnectionAbortedError("the channel ended")
                try:
                    sent = self._sock.send(view)
                except ssl.SSLWantReadError:
                    sent, wait_for = 0, selectors.EVENT_READ
                except (ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                    sent = 0
            if sent:
                view = view[sent:]
                stalls = 0
                continue
            # gevent's non-blocking SSL send answers 0 without saying which way TLS wants to go:
            # wait for writability, and back off should that not be what it waits for.
            stalls += 1
            if stalls > 3:
                time.sleep(0.005)
            timeout = self._idle_timeout
            if self._closing:  # a peer that takes nothing does not hold a closing channel long
                timeout = CLOSE_FLUSH_SECONDS if timeout is None else min(timeout, CLOSE_FLUSH_SECONDS)
            self._wait(selector, wait_for, timeout)

    def _wait(self, selector: selectors.BaseSelector, events: int, timeout: float | None = None) -> None:
        """Wait (outside the TLS lock) until the socket is ready for ``events``; TimeoutError after
        ``timeout`` (default: the idle timeout)."""
        fd = self._sock.fileno()
        if fd < 0:  # the socket's owner closed it under this waiter: the connection is gone
            raise ConnectionAbortedError("the socket was closed")
        key = selector.get_map().get(fd)
        if key is None:
            selector.register(self._sock, events)
        elif key.events != events:
            selector.modify(self._sock, events)
        if not selector.select(self._idle_timeout if timeout is None else timeout):
            raise TimeoutError

    def _end(self, reason: str) -> None:
        with self._cond:
            if self._ended:
                return
            self._ended = True
            self._closing = True
            if not self.close_reason:
                self.close_reason = reason
            self._queue.clear()
            self._urgent.clear()
            self._pong = None
            self._queued = 0
            self._cond.notify_all()
        with self._io_lock:
            try:
                # Wakes a reader or writer waiting on the socket; the descriptor is closed by _release
                # once neither uses it (closing it under a waiter could hand its number to another socket).
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone
        self._release()

    def _release(self) -> None:
        with self._cond:
            if not self._ended or self._reading or not self._writer_done or self._released:
                return
            self._released = True
        self._read_selector.close()
        try:
            self._sock.close()
        except OSError:
            pass
