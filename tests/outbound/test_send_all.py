"""``send_all``: what the transport and the gevent worker write with instead of ``sendall``.

It must write every byte when the kernel takes only part of a ``send()`` (a reader slower
than the writer), and a peer that stops reading must still end the write within the
socket's timeout.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from bcs_middleware.core.sockets import send_all


def test_every_byte_arrives_when_sends_are_partial() -> None:
    writer, reader = socket.socketpair()
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # many partial sends
    writer.settimeout(10)
    data = os.urandom(4 * 1024 * 1024)
    received = bytearray()

    def read() -> None:
        while len(received) < len(data):
            piece = reader.recv(7000)
            if not piece:
                return
            received.extend(piece)
            time.sleep(0.0001)  # slower than the writer

    thread = threading.Thread(target=read)
    thread.start()
    try:
        send_all(writer, data)
        thread.join(timeout=30)
        assert bytes(received) == data
    finally:
        writer.close()
        reader.close()


def test_a_peer_that_stops_reading_ends_the_write_at_the_timeout() -> None:
    writer, reader = socket.socketpair()
    writer.settimeout(0.5)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            send_all(writer, b"x" * (64 * 1024 * 1024))  # far more than the socket buffers hold
        assert time.monotonic() - started < 5
    finally:
        writer.close()
        reader.close()


def test_nothing_to_send_sends_nothing() -> None:
    class NoSend:
        def send(self, data: bytes) -> int:
            raise AssertionError("an empty write must not reach the socket (TLS refuses it)")

    send_all(NoSend(), b"")  # type: ignore[arg-type]
