"""WebSocketChannel over real TLS sockets on 127.0.0.1 (both ends in-process)."""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from typing import Any

import pytest

from bcs_middleware.agent_tunnel.wschannel import ChannelClosed, ChannelError, HandshakeRejected, WebSocketChannel
from tests.support.polling import wait_until
from tests.support.websocket import frame

from .wsfixtures import PATH, TLS, WSServer, channel_pair, tls_connect


@pytest.fixture(scope="module")
def tls() -> TLS:
    return TLS()


def test_binary_messages_travel_both_ways(tls: TLS) -> None:
    with channel_pair(tls) as (client, server):
        client.send(b"\x00hello")
        assert server.receive() == b"\x00hello"
        big = bytes(range(256)) * 2000
        server.send(big)
        assert client.receive() == big
        client.send(b"")
        assert server.receive() == b""


def test_client_sends_the_extra_headers_and_path(tls: TLS) -> None:
    heads: list[bytes] = []

    def handler(sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        heads.append(head)
        WebSocketChannel.accept(sock, head, leftover=leftover).close()

    server = WSServer(tls, handler)
    try:
        channel = WebSocketChannel.connect(
            tls_connect(tls, server.port), host=f"127.0.0.1:{server.port}", path=PATH,
            headers=[("BCS-API-Tunnel-Module", "kube-agent"), ("BCS-API-Tunnel-ClusterId", "BCS-K8S-1")], timeout=5)
        channel.set_idle_timeout(10)
        assert channel.receive() is None
    finally:
        server.close()
    head = heads[0].decode()
    assert head.startswith(f"GET {PATH} HTTP/1.1\r\n")
    assert "BCS-API-Tunnel-Module: kube-agent\r\n" in head
    assert "BCS-API-Tunnel-ClusterId: BCS-K8S-1\r\n" in head


def test_a_refused_upgrade_reports_status_and_body(tls: TLS) -> None:
    def handler(sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        body = b'{"code_name":"unauthorized","message":"bad register token"}'
        sock.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.close()

    server = WSServer(tls, handler)
    sock = tls_connect(tls, server.port)
    try:
        with pytest.raises(HandshakeRejected) as info:
            WebSocketChannel.connect(sock, host="127.0.0.1", path=PATH, headers=[], timeout=5)
    finally:
        sock.close()
        server.close()
    assert info.value.status == 401
    assert b"bad register token" in info.value.body


def test_a_silent_server_fails_the_handshake_within_the_timeout(tls: TLS) -> None:
    hold = threading.Event()
    server = WSServer(tls, lambda sock, head, leftover: hold.wait(10))
    sock = tls_connect(tls, server.port)
    try:
        started = time.monotonic()
        with pytest.raises(ChannelError, match="no WebSocket handshake answer"):
            WebSocketChannel.connect(sock, host="127.0.0.1", path=PATH, headers=[], timeout=0.5)
        assert time.monotonic() - started < 3
    finally:
        sock.close()
        hold.set()
        server.close()


def test_accept_refuses_a_head_that_is_not_an_upgrade(tls: TLS) -> None:
    # any connected socket will do: nothing is written on refusal
    with channel_pair(tls) as (client, _server), pytest.raises(ChannelError):
        WebSocketChannel.accept(client._sock, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_an_oversized_message_closes_the_channel(tls: TLS) -> None:
    with channel_pair(tls, max_message=1024) as (client, server):
        client.send(b"x" * 2048)
        assert server.receive() is None
        assert "over 1024 bytes" in server.close_reason
        assert client.receive() is None


def test_a_text_message_closes_the_channel(tls: TLS) -> None:
    with channel_pair(tls) as (client, server):
        with client._cond:
            from wsproto.frame_protocol import FrameProtocol

            # a text frame as another implementation writes it
            client._enqueue_locked(FrameProtocol(client=True, extensions=[]).send_data("hello"))
        assert server.receive() is None
        assert "text message" in server.close_reason


def test_a_frame_breaking_the_rules_closes_the_channel_with_1002(tls: TLS) -> None:
    with channel_pair(tls) as (client, server):
        with client._cond:
            client._enqueue_locked(bytes((0xC2, 0x80)) + b"\0\0\0\0")  # a reserved bit, no extension
        assert server.receive() is None
        assert "framing" in server.close_reason
        assert client.receive() is None
        assert client.peer_close_code == 1002


def test_pings_are_answered_and_refresh_last_received(tls: TLS) -> None:
    with channel_pair(tls) as (client, server):
        received: list[bytes | None] = []
        reader = threading.Thread(target=lambda: received.append(server.receive()), daemon=True)
        reader.start()
        before = client.last_received
        time.sleep(0.05)  # a clock step, so that a later last_received is a larger one
        client.ping()
        # the client's own reader sees the pong
        client_reader = threading.Thread(target=client.receive, daemon=True)
        client_reader.start()
        assert wait_until(lambda: client.last_received > before, 5)
        client.send(b"done")
        reader.join(5)
        assert received == [b"done"]


def test_close_ends_the_peer_reader_and_refuses_sends(tls: TLS) -> None:
    with channel_pair(tls) as (client, server):
        result: list[bytes | None] = []
        reader = threading.Thread(target=lambda: result.append(server.receive()), daemon=True)
        reader.start()
        client.close(1000, "bye")
        reader.join(5)
        assert result == [None]
        assert "1000" in server.close_reason
        with pytest.raises(ChannelClosed):
            client.send(b"late")


def test_a_socket_closed_between_a_read_and_its_wait_ends_the_channel(tls: TLS) -> None:
    # The socket's owner may close it while the reader is between a read that wanted more and its
    # wait for readability (seen in CI: a stand-in gateway stopping under its agent's session).
    with channel_pair(tls) as (_client, server):
        sock = server._sock

        def racing_recv(_size: int) -> bytes:
            sock.close()
            raise ssl.SSLWantReadError()

        sock.recv = racing_recv  # type: ignore[method-assign]
        assert server.receive() is None
        assert "connection lost" in server.close_reason


def test_a_socket_closed_before_the_writer_starts_ends_the_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen in CI: the writer thread registering a socket its owner had closed meanwhile died with
    # "ValueError: Invalid file descriptor: -1", and the channel never ended. The selector here
    # answers the writer's registration as it answers for a closed socket.
    class ClosedUnderTheWriter(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
        def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
            if events == selectors.EVENT_WRITE:
                raise ValueError("Invalid file descriptor: -1")
            return super().register(fileobj, events, data)

    ours, peer = socket.socketpair()
    try:
        monkeypatch.setattr(selectors, "DefaultSelector", ClosedUnderTheWriter)
        channel = WebSocketChannel(ours, client=True)
        channel.set_idle_timeout(5)  # without the fix: ended only by the idle timeout, not as lost
        assert channel.receive() is None
        assert "connection lost" in channel.close_reason
    finally:
        ours.close()
        peer.close()


def test_an_idle_peer_is_taken_as_gone(tls: TLS) -> None:
    with channel_pair(tls) as (client, _server):
        client.set_idle_timeout(0.3)
        started = time.monotonic()
        assert client.receive() is None
        assert time.monotonic() - started < 3
        assert "idle" in client.close_reason


def test_messages_in_the_same_read_as_the_handshake_answer_are_kept(tls: TLS) -> None:
    def handler(sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection

        ws = WSConnection(ConnectionType.SERVER)
        ws.receive_data(head)
        list(ws.events())
        sock.sendall(ws.send(AcceptConnection()) + frame(0x2, b"early"))

    server = WSServer(tls, handler)
    try:
        channel = WebSocketChannel.connect(tls_connect(tls, server.port), host="127.0.0.1", path=PATH, headers=[],
                                           timeout=5)
        channel.set_idle_timeout(10)
        assert channel.receive() == b"early"
        channel.close()
    finally:
        server.close()


def test_send_holds_a_fast_producer_at_the_speed_of_the_peer(tls: TLS) -> None:
    with channel_pair(tls) as (client, server):
        client.high_water = 64 * 1024
        chunk = b"x" * 32 * 1024
        sent = 0
        stop = time.monotonic() + 0.5

        def produce() -> None:
            nonlocal sent
            while time.monotonic() < stop:
                client.send(chunk)
                sent += len(chunk)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        time.sleep(0.8)  # the sleep is the test: a producer sending for this long, nobody reading
        # nobody reads the server end: the queue never grew past high water + one message
        assert client._queued <= client.high_water + len(chunk) + 64
        received = 0
        while received < sent or producer.is_alive():
            message = server.receive()
            assert message is not None
            received += len(message)
        producer.join(5)
        assert received == sent
