"""The socket pump of a tunnel session: the streams that have a local socket.

One selector loop over every such stream's local socket (an upgraded ``exec`` spliced to its
client, a stream forwarded to a peer, the agent's dialled connections): it reads what the local
side sends and forwards it as Data, writes what the peer sent (sending Resume once a paused
stream is taken down to a quarter of its window), ends streams, and pings the peer. Memory
streams never come here (:mod:`.memory_stream`).
"""

from __future__ import annotations

import errno
import logging
import selectors
import time

from .frames import Message, encode_data
from .session_state import CHUNK, SessionState, StreamState, _close, _finish_socket
from .wschannel import ChannelClosed

log = logging.getLogger("bcs_middleware.agent_tunnel.session")


class SocketPump(SessionState):
    """The pump's loop (:meth:`_pump`, run in its own thread) and its steps."""

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

    def _flush(self, stream: StreamState) -> None:
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

    def _forward(self, stream: StreamState) -> None:
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

    def _local_failed(self, stream: StreamState, exc: OSError) -> None:
        if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ESHUTDOWN):
            self._finish(stream, "EOF")
        else:
            self._finish(stream, type(exc).__name__)

    def _finish(self, stream: StreamState, error: str) -> None:
        """The local side ended the stream: tell the peer (unless it ended it) and drop it."""
        with self._lock:
            told = stream.done
            stream.done = True
            self._drop_buffer_locked(stream)
        if not told:
            self._send(Message.error(stream.conn_id, error), quiet=True)
        self._mark(stream)

    def _settle(self, selector: selectors.BaseSelector, stream: StreamState) -> None:
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
