"""``PooledTransport`` timeouts: an upstream that stalls never holds a worker past its bounds,
over plain and TLS connections alike."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
import trustme

from bcs_middleware.core.environ import Upstream
from bcs_middleware.outbound.causes import ReadTimeout
from bcs_middleware.outbound.transport import PooledTransport


class StallingUpstream:
    """Answers each connection with ``answer`` after reading the request head, then goes silent."""

    def __init__(self, answer: bytes, tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                piece = conn.recv(4096)
                if not piece:
                    break
                head += piece
            conn.sendall(self.answer)
            self.held.append(conn)  # kept open and silent until the test ends

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.held:
            conn.close()
        self.listener.close()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@contextlib.contextmanager
def _stalling(answer: bytes, ca: trustme.CA | None = None) -> Iterator[StallingUpstream]:
    tls = None
    if ca is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(tls)
    server = StallingUpstream(answer, tls)
    try:
        yield server
    finally:
        server.close()


def _upstream(server: StallingUpstream, ca: trustme.CA | None) -> Upstream:
    return Upstream(base_urls=(server.url,), path="/x",
                    ca_pem=ca.cert_pem.bytes().decode() if ca else None)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_no_answer_at_all_is_a_504_after_the_read_timeout(ca: trustme.CA, tls: bool) -> None:
    with _stalling(b"", ca if tls else None) as server:
        transport = PooledTransport(read_timeout=0.5)
        started = time.monotonic()
        with pytest.raises(ReadTimeout, match="no response"):
            transport.send(_upstream(server, ca if tls else None), "GET", [], None, None)
        assert 0.4 < time.monotonic() - started < 3


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_body_that_stalls_times_out_after_the_read_timeout(ca: trustme.CA, tls: bool) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    with _stalling(answer, ca if tls else None) as server:
        transport = PooledTransport(read_timeout=0.5, stream_idle_timeout=30)
        resp = transport.send(_upstream(server, ca if tls else None), "GET", [], None, None)
        assert resp.read1() == b"abc"
        started = time.monotonic()
        with pytest.raises(ReadTimeout, match="stopped sending"):
            resp.read1()
        assert 0.4 < time.monotonic() - started < 3
        resp.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_stream_without_length_gets_the_stream_idle_timeout(ca: trustme.CA, tls: bool) -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    with _stalling(answer, ca if tls else None) as server:
        transport = PooledTransport(read_timeout=0.3, stream_idle_timeout=1.2)
        resp = transport.send(_upstream(server, ca if tls else None), "GET", [], None, None)
        assert resp.read1() == b"abc"
        started = time.monotonic()
        with pytest.raises(ReadTimeout, match="stopped sending"):
            resp.read1()
        # Not the 0.3 s read timeout: a quiet watch is legitimate for longer.
        assert 1.0 < time.monotonic() - started < 4
        resp.close()


def test_an_upgraded_connection_is_handed_over_with_the_read_timeout(ca: trustme.CA) -> None:
    answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nearly"
    with _stalling(answer) as server:
        transport = PooledTransport(read_timeout=2.5)
        resp = transport.open_upgrade(_upstream(server, None), "GET",
                                      [("Connection", "Upgrade"), ("Upgrade", "x")])
        assert resp.status == 101
        sock, leftover = resp.detach()
        try:
            assert leftover == b"early"
            assert sock.gettimeout() == 2.5
        finally:
            sock.close()
