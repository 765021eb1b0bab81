"""What a peer can make a WebSocketChannel hold, over real TLS on 127.0.0.1.

The channel under test is the gateway's end (``accept``); the peer is a
:class:`~tests.agent_tunnel.hostile.HostileAgent` writing raw frames and reading only
when told. Its socket buffers and the channel's are small, so that "the peer does not
read" is felt after a few KiB rather than after the kernel's megabytes.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bcs_middleware.agent_tunnel import ws_writer, wschannel
from bcs_middleware.agent_tunnel.wschannel import ChannelClosed, WebSocketChannel
from bcs_middleware.agent_tunnel.wsframes import OP_CONTINUATION, OP_PONG, FrameError, Frames
from tests.support.polling import wait_until

from .hostile import HostileAgent
from .wsfixtures import TLS, WSServer


@pytest.fixture(scope="module")
def tls() -> TLS:
    return TLS()


@contextlib.contextmanager
def hostile_pair(tls: TLS, **options: Any) -> Iterator[tuple[HostileAgent, WebSocketChannel]]:
    """(the raw peer, the channel accepted for it), both with 4 KiB socket buffers."""
    accepted: list[WebSocketChannel] = []
    ready = threading.Event()

    def handler(sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        accepted.append(WebSocketChannel.accept(sock, head, leftover=leftover, **options))
        ready.set()

    server = WSServer(tls, handler)
    peer = None
    try:
        peer = HostileAgent(server.port, tls.client_context(), {}, server_hostname="127.0.0.1")
        assert ready.wait(10)
        yield peer, accepted[0]
    finally:
        if peer is not None:
            peer.close()
        for channel in accepted:
            channel.abort("test over")
        server.close()


def _serve(channel: WebSocketChannel) -> threading.Thread:
    """The channel's reader, as a session runs it: messages are taken as they come."""
    def read() -> None:
        while channel.receive() is not None:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def test_a_peer_that_pings_and_never_reads_holds_one_pong_and_is_cut(tls: TLS) -> None:
    with hostile_pair(tls) as (peer, channel):
        reader = _serve(channel)
        ping = peer.ping()
        pong = len(Frames(client=False, max_message=1024).frame(OP_PONG, b"p" * 125))
        most = 0
        pings = 0
        deadline = time.monotonic() + 30
        # One ping at a time, so that the writer keeps up as long as the socket takes the pongs:
        # what is bounded here is what waits once it takes no more.
        while not channel.closed and time.monotonic() < deadline:
            try:
                peer.send(ping)
            except OSError:
                break
            pings += 1
            most = max(most, channel._queued)
            time.sleep(0.0005)
        reader.join(10)
        assert channel.broken_bound == "pongs", channel.close_reason
        assert channel.close_code == 1008
        assert channel.bytes_sent >= pong, "cut before the socket was full: the burst rule, not the bound"
        # At most one pong being written and one waiting, whatever the number of pings.
        assert most <= 2 * pong, most
        assert pings > wschannel.MAX_PONGS_OWED


def test_a_burst_of_pings_read_at_once_is_cut(tls: TLS) -> None:
    with hostile_pair(tls, max_pongs_owed=4) as (peer, channel):
        reader = _serve(channel)
        peer.send(peer.ping() * 64)
        reader.join(10)
        assert channel.broken_bound == "pongs"


def test_answers_a_peer_leaves_unread_are_bounded_then_it_is_cut(tls: TLS) -> None:
    with hostile_pair(tls, high_water=16 * 1024, max_queue=64 * 1024) as (_peer, channel):
        _serve(channel)
        # A sender that waits is held, never cut: it is the peer's pace.
        released: list[str] = []

        def send_waiting() -> None:
            try:
                for _ in range(1000):
                    channel.send(b"d" * 4096)
            except ChannelClosed as exc:
                released.append(str(exc))

        held = threading.Thread(target=send_waiting, daemon=True)
        held.start()
        assert wait_until(lambda: channel._senders_waiting == 1)
        assert channel.broken_bound is None
        assert channel._queued <= channel.high_water + 4096 + 64
        # What is queued without waiting (a reader's answers) takes it to max_queue, then cuts it.
        with pytest.raises(ChannelClosed):
            for _ in range(1000):
                channel.send(b"e" * 1000, wait=False)
                assert channel._queued <= channel.max_queue
        assert channel.broken_bound == "send_queue"
        assert channel.close_code == 1008
        assert "unread" in channel.close_reason
        held.join(10)
        assert released and "unread" in released[0]  # the waiting sender was released


def test_a_cut_channel_whose_peer_takes_nothing_ends_within_the_flush_time(
    tls: TLS, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ws_writer, "CLOSE_FLUSH_SECONDS", 0.5)
    with hostile_pair(tls, high_water=16 * 1024, max_queue=64 * 1024) as (peer, channel):
        _serve(channel)
        with pytest.raises(ChannelClosed):
            for _ in range(1000):
                channel.send(b"e" * 1000, wait=False)
        cut = time.monotonic()
        assert wait_until(lambda: channel._ended, 10)
        assert time.monotonic() - cut < 5
        received = peer.drain(10)
        assert received.eof


def test_a_peer_that_reads_after_being_cut_gets_the_close_code(tls: TLS) -> None:
    with hostile_pair(tls, high_water=16 * 1024, max_queue=64 * 1024) as (peer, channel):
        _serve(channel)
        with pytest.raises(ChannelClosed):
            for _ in range(1000):
                channel.send(b"e" * 1000, wait=False)
        received = peer.drain(10)
        assert received.eof
        assert received.close_code == 1008


def test_empty_fragments_cost_nothing_and_end_at_the_fragment_limit() -> None:
    client = Frames(client=True, max_message=1 << 20)
    ours = Frames(client=False, max_message=1 << 20, max_fragments=100)
    start = client.frame(0x2, b"x")
    ours.feed(bytes((start[0] & 0x7F,)) + start[1:])
    empty = client.frame(OP_CONTINUATION, b"")
    for _ in range(98):
        ours.feed(bytes((empty[0] & 0x7F,)) + empty[1:])
    assert ours.next() is None
    ours.feed(bytes((empty[0] & 0x7F,)) + empty[1:])
    with pytest.raises(FrameError) as refused:
        ours.next()
    assert (refused.value.code, refused.value.bound) == (1009, "fragments")


def test_a_message_in_many_fragments_under_the_limit_is_whole() -> None:
    client = Frames(client=True, max_message=1 << 20)
    ours = Frames(client=False, max_message=1 << 20, max_fragments=100)
    pieces = [bytes([i]) * 1000 for i in range(100)]
    for i, piece in enumerate(pieces):
        frame = client.frame(0x2 if i == 0 else OP_CONTINUATION, piece)
        ours.feed(frame if i == len(pieces) - 1 else bytes((frame[0] & 0x7F,)) + frame[1:])
    assert ours.next() == (0x2, b"".join(pieces))
