"""What the peer of a Session can make it hold or do, over a real TLS WebSocket on 127.0.0.1.

One end is the Session under test (the gateway's, or the agent's with a dialer); the
other a bare channel the test writes remotedialer messages to by hand — a peer that
ignores Pause, names streams that were never opened, floods Connects or syncs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bcs_middleware.agent_tunnel import session_reader
from bcs_middleware.agent_tunnel.frames import Message, MessageType, decode, encode
from bcs_middleware.agent_tunnel.session import CHUNK, MAX_CONCURRENT_DIALS, MemoryStream, Session
from bcs_middleware.agent_tunnel.wschannel import WebSocketChannel
from tests.support.polling import wait_until

from .wsfixtures import TLS, TargetServer, channel_pair


@pytest.fixture(scope="module")
def tls() -> TLS:
    return TLS()


@contextlib.contextmanager
def against(tls: TLS, **options: Any) -> Iterator[tuple[Session, WebSocketChannel]]:
    """(the session under test, served; the bare channel of its peer)."""
    with channel_pair(tls) as (raw, server):
        raw.set_idle_timeout(10)
        under_test = Session(server, name="under-test", **options)
        serving = threading.Thread(target=under_test.serve, daemon=True)
        serving.start()
        try:
            yield under_test, raw
        finally:
            under_test.close("test over")
            serving.join(10)


def read_messages(raw: WebSocketChannel, *, until: Any = None, timeout: float = 5.0) -> list[Message]:
    """What the session sent, until ``until(message)`` is true, the channel ends or ``timeout``."""
    messages: list[Message] = []
    got: list[bytes | None] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reader = threading.Thread(target=lambda: got.append(raw.receive()), daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        if reader.is_alive() or not got or got[-1] is None:
            break
        message = decode(got[-1])  # type: ignore[arg-type]
        messages.append(message)
        if until is not None and until(message):
            break
    return messages


# -- the gateway's end: streams are its own ------------------------------------------------------


@pytest.mark.parametrize("message", [
    pytest.param(lambda: Message.data(1000, b"x"), id="data"),
    pytest.param(lambda: Message.pause(1000), id="pause"),
    pytest.param(lambda: Message.resume(1000), id="resume"),
    pytest.param(lambda: Message.eof(1000), id="error"),
    pytest.param(lambda: Message.data(0, b"x"), id="data-stream-0"),
    pytest.param(lambda: Message.data(-5, b"x"), id="data-negative-stream"),
])
def test_a_message_for_a_stream_the_gateway_never_opened_cuts_the_peer(tls: TLS, message: Any) -> None:
    with against(tls) as (gw, raw):
        stream = gw.open_stream("tcp", "10.0.0.1:6443", 5)
        raw.send(encode(Message.data(stream.conn_id, b"fine")))
        assert stream.recv(100, 5) == b"fine"
        raw.send(encode(message()))
        assert wait_until(lambda: gw.closed, 5)
        assert gw.broken_bound == "unknown_stream"
        assert "never opened" in gw.close_reason
        read_messages(raw)
        assert raw.peer_close_code == 1008


def test_data_for_a_stream_that_ended_is_dropped_without_an_answer(tls: TLS) -> None:
    with against(tls) as (gw, raw):
        stream = gw.open_stream("tcp", "10.0.0.1:6443", 5)
        stream.close()  # the gateway ends it: the peer is told (EOF)
        for _ in range(100):  # what the peer had in flight, and then some
            raw.send(encode(Message.data(stream.conn_id, b"late")))
            raw.send(encode(Message.pause(stream.conn_id)))
        second = gw.open_stream("tcp", "10.0.0.1:6443", 5)
        sent = read_messages(raw, until=lambda m: m.conn_id == second.conn_id)
        kinds = [(m.conn_id, m.type) for m in sent]
        assert kinds == [(stream.conn_id, MessageType.CONNECT), (stream.conn_id, MessageType.ERROR),
                         (second.conn_id, MessageType.CONNECT)], kinds
        assert not gw.closed and gw.broken_bound is None


def test_a_connect_to_the_gateway_is_answered_and_cuts(tls: TLS) -> None:
    with against(tls) as (gw, raw):
        raw.send(encode(Message.connect(7, "tcp", "127.0.0.1:22")))
        sent = read_messages(raw)
        assert [(m.conn_id, m.type, m.error_text) for m in sent] == [(7, MessageType.ERROR, "connect not allowed")]
        assert raw.peer_close_code == 1008
        assert gw.broken_bound == "connect"


def test_a_malformed_message_cuts_with_1008(tls: TLS) -> None:
    with against(tls) as (gw, raw):
        raw.send(b"\x02\x02\x04" + b"x" * 300)  # a Connect payload over Go's 266 bytes
        read_messages(raw)
        assert raw.peer_close_code == 1008
        assert gw.broken_bound == "protocol" and "protocol error" in gw.close_reason


def _fill(raw: WebSocketChannel, conn_id: int, size: int) -> None:
    for offset in range(0, size, CHUNK):
        raw.send(encode(Message.data(conn_id, b"z" * min(CHUNK, size - offset))))


def test_all_streams_together_are_paused_at_the_buffer_limit(tls: TLS) -> None:
    """Eight streams nobody reads, each sent half a window: no stream is over its own window,
    but together they are over the session's limit, so each further one is paused."""
    window = 128 * 1024
    with against(tls, window=window, buffer_limit=2 * window, overflow=64 * window) as (gw, raw):
        streams = [gw.open_stream("tcp", "10.0.0.1:6443", 5) for _ in range(8)]
        for stream in streams:
            _fill(raw, stream.conn_id, window // 2)
        sent = read_messages(raw, until=lambda m: m.type is MessageType.PAUSE and m.conn_id == streams[-1].conn_id)
        paused = {m.conn_id for m in sent if m.type is MessageType.PAUSE}
        # The first four fit within the limit; each one after it is paused as its data arrives.
        assert paused == {s.conn_id for s in streams[4:]}, paused
        # A paused stream whose reader takes its bytes is resumed (it is not held for the others).
        assert len(streams[5].recv(window, 5)) == window // 2
        sent = read_messages(raw, until=lambda m: m.type is MessageType.RESUME)
        assert [(m.conn_id, m.type) for m in sent][-1] == (streams[5].conn_id, MessageType.RESUME)
        assert not gw.closed


def test_a_peer_ignoring_pause_over_many_streams_is_held_to_the_limit_plus_overflow(tls: TLS) -> None:
    window = 128 * 1024
    limit, overflow = 4 * window, 2 * window
    with against(tls, window=window, buffer_limit=limit, overflow=overflow) as (gw, raw):
        streams = [gw.open_stream("tcp", "10.0.0.1:6443", 5) for _ in range(16)]
        most = 0
        for stream in streams:  # each within its own window, Pause or not
            _fill(raw, stream.conn_id, window - CHUNK)
            raw.send(encode(Message.data(streams[0].conn_id, b"")))  # a marker: the ones before are read
            assert wait_until(lambda: raw._queued == 0, 5)
            most = max(most, gw._buffered)
        read_messages(raw, timeout=1)
        assert most <= limit + overflow, most
        assert gw._buffered <= limit + overflow
        reset = [s for s in streams if _ended(s)]
        assert reset, "no stream was reset"
        assert not gw.closed  # refused per stream, the session lives


def _ended(stream: MemoryStream) -> bool:
    try:
        while stream.recv(1 << 20, 0.01):
            pass
    except TimeoutError:
        return False
    return True


def test_sync_is_acted_on_at_most_once_a_second(tls: TLS, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_reader, "SYNC_GRACE_SECONDS", 0.0)
    with against(tls) as (gw, raw):
        stream = gw.open_stream("tcp", "10.0.0.1:6443", 5)
        raw.send(encode(Message.sync_connections([stream.conn_id, *range(10_000, 110_000)])))
        raw.send(encode(Message.sync_connections([])))  # too soon after the first: ignored
        raw.send(encode(Message.data(stream.conn_id, b"alive")))
        assert stream.recv(100, 5) == b"alive"
        assert gw.streams == 1
        time.sleep(1.1)  # the rule under test is about time: the next sync is past the interval
        raw.send(encode(Message.sync_connections([])))
        assert stream.recv(100, 5) == b""  # ended: the peer no longer has it
        assert gw.streams == 0


# -- the agent's end: Connects from a gateway ----------------------------------------------------


def test_a_connect_flood_dials_in_a_bounded_number_of_threads(tls: TLS) -> None:
    release = threading.Event()
    target = TargetServer("echo")
    dialled: list[str] = []

    def slow_dial(proto: str, address: str, timeout: float) -> socket.socket:
        dialled.append(address)
        release.wait(30)
        host, _, port = target.address.rpartition(":")
        return socket.create_connection((host, int(port)), timeout=timeout)

    try:
        before = threading.active_count()
        with against(tls, dial=slow_dial, max_streams=600) as (agent, raw):
            for conn_id in range(1, 701):
                raw.send(encode(Message.connect(conn_id, "tcp", target.address)))
            refused = read_messages(raw, until=lambda m: m.conn_id == 700)
            assert {m.conn_id for m in refused if m.type is MessageType.ERROR} == set(range(601, 701))
            assert wait_until(lambda: len(dialled) == MAX_CONCURRENT_DIALS, 10)
            assert agent.streams == 600
            assert threading.active_count() - before <= MAX_CONCURRENT_DIALS + 8
            release.set()
            assert wait_until(lambda: target.connections == 600, 30)
            raw.send(encode(Message.data(600, b"echo me")))
            echoed = read_messages(raw, until=lambda m: m.type is MessageType.DATA)
            assert echoed[-1].payload == b"echo me"
    finally:
        release.set()
        target.close()


def test_a_second_connect_for_an_open_stream_cuts_the_gateway(tls: TLS) -> None:
    target = TargetServer("echo")
    try:
        def dial(proto: str, address: str, timeout: float) -> socket.socket:
            return socket.create_connection(("127.0.0.1", int(target.address.rpartition(":")[2])), timeout=timeout)

        with against(tls, dial=dial) as (agent, raw):
            raw.send(encode(Message.connect(3, "tcp", target.address)))
            raw.send(encode(Message.connect(3, "tcp", target.address)))
            read_messages(raw)
            assert raw.peer_close_code == 1008
            assert agent.broken_bound == "protocol"
    finally:
        target.close()
