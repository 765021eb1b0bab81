"""Tunnel streams whose bytes are handed over in memory: the transport's requests.

:meth:`Session.open_stream <bcs_middleware.agent_tunnel.session.Session.open_stream>` returns a
:class:`MemoryStream`: the session's reader appends what the peer sent to the stream's buffer
and sets its ``Event``; the user's writes go to the channel as Data. The TLS to the apiserver
runs over ``ssl.SSLObject`` on top (:mod:`bcs_middleware.outbound.stream_connection`), so no
socket pair, selector wake-up or pump hand-over is on the request path. The peer's Pause holds
the writer in :meth:`MemoryStream.send` until Resume, as a socket's buffer would.
"""

from __future__ import annotations

import errno
import time

from .frames import Message, encode_data
from .session_state import CHUNK, SessionState, StreamState
from .wschannel import ChannelClosed


class MemoryStreams(SessionState):
    """The session's side of its memory streams (their users call these through :class:`MemoryStream`)."""

    def _stream_recv(self, stream: StreamState, limit: int, timeout: float | None) -> bytes:
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

    def _take_locked(self, stream: StreamState, limit: int) -> bytes:
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

    def _stream_send(self, stream: StreamState, data: bytes, timeout: float | None) -> None:
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

    def _stream_readable(self, stream: StreamState) -> bool:
        with self._lock:
            return bool(stream.out) or stream.done or self._closing

    def _stream_close(self, stream: StreamState) -> None:
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

    def __init__(self, session: MemoryStreams, stream: StreamState) -> None:
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
