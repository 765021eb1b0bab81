"""The reader of a tunnel session: each message the peer sends, and the agent end's dials.

Data goes to its stream (straight into the local socket when nothing is queued and it takes
all, else the buffer, with the flow-control decisions of :mod:`.session`); Pause and Resume
mark the stream for the pump; Error ends a stream; a Connect on the agent's end queues a dial
(up to :data:`~.session_state.MAX_CONCURRENT_DIALS` dialler threads take them in turn);
SyncConnections ends the streams the peer no longer holds. A message for a stream the gateway
never opened, or a Connect sent to it, cuts the session (:meth:`SessionState._violation`).
"""

from __future__ import annotations

import logging
import threading
import time

from .frames import Message, MessageType, iter_connection_ids
from .session_state import (
    DEFAULT_DIAL_TIMEOUT,
    MAX_CONCURRENT_DIALS,
    MAX_DIAL_TIMEOUT,
    SYNC_GRACE_SECONDS,
    SYNC_MIN_INTERVAL,
    SessionState,
    StreamState,
)

log = logging.getLogger("bcs_middleware.agent_tunnel.session")


class SessionReader(SessionState):
    """Acting on the peer's messages (:meth:`_dispatch`, called by the session's reader)."""

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
        stream = StreamState(conn_id, None)
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

    def _dial_stream(self, stream: StreamState, proto: str, address: str, timeout: float) -> None:
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
