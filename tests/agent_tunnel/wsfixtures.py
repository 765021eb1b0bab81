"""Real TLS WebSocket channels on 127.0.0.1 for the tunnel tests (a generated CA, both ends in-process)."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import trustme

from bcs_middleware.agent_tunnel.wschannel import WebSocketChannel

PATH = "/bcsapi/v1/websocket/connect"


class TLS:
    """A CA and a server certificate for 127.0.0.1."""

    def __init__(self) -> None:
        self.ca = trustme.CA()
        self.cert = self.ca.issue_cert("127.0.0.1")
        self.ca_pem = self.ca.cert_pem.bytes().decode()

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.cert.configure_cert(ctx)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_pem)
        return ctx


def read_head(sock: socket.socket, limit: int = 65536) -> tuple[bytes, bytes]:
    """The request head (through the empty line) and whatever followed it in the same reads."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the request head ended")
        data += chunk
        if len(data) > limit:
            raise ConnectionError("request head too large")
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


class WSServer:
    """A TLS listener on 127.0.0.1 whose every connection is passed to ``handler(tls_sock, head, leftover)``."""

    def __init__(self, tls: TLS, handler: Callable[[ssl.SSLSocket, bytes, bytes], None]) -> None:
        self.tls = tls
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.heads: list[bytes] = []
        self.sockets: list[socket.socket] = []
        self.accepted = 0
        self._ctx = tls.server_context()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(10)
            self.sockets.append(raw)
            sock = self._ctx.wrap_socket(raw, server_side=True)
            self.sockets.append(sock)
            head, leftover = read_head(sock)
            sock.settimeout(None)
        except (OSError, ConnectionError):
            raw.close()
            return
        self.heads.append(head)
        self.handler(sock, head, leftover)

    def close(self) -> None:
        self._stop = True
        self.listener.close()
        for sock in self.sockets:
            sock.close()


def tls_connect(tls: TLS, port: int, timeout: float = 10.0) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return tls.client_context().wrap_socket(raw, server_hostname="127.0.0.1")


@contextlib.contextmanager
def channel_pair(tls: TLS, *, max_message: int | None = None) -> Iterator[tuple[WebSocketChannel, WebSocketChannel]]:
    """(client channel, server channel) over one real TLS connection."""
    accepted: list[WebSocketChannel] = []
    ready = threading.Event()
    kwargs = {} if max_message is None else {"max_message": max_message}

    def handler(sock: ssl.SSLSocket, head: bytes, leftover: bytes) -> None:
        accepted.append(WebSocketChannel.accept(sock, head, leftover=leftover, **kwargs))
        ready.set()

    server = WSServer(tls, handler)
    try:
        client = WebSocketChannel.connect(tls_connect(tls, server.port), host=f"127.0.0.1:{server.port}",
                                          path=PATH, headers=[], timeout=10, **kwargs)
        assert ready.wait(10)
        yield client, accepted[0]
        client.close()
        accepted[0].close()
    finally:
        server.close()


class TargetServer:
    """A TCP server on 127.0.0.1 standing in for the apiserver behind an agent.

    ``mode``: ``echo`` (sends back what it receives), ``source`` (sends ``size`` bytes of
    a fixed pattern, then closes), ``sink`` (counts what it receives until end of file),
    ``hold`` (reads nothing until :meth:`release`, then acts as ``sink``).
    """

    def __init__(self, mode: str = "echo", size: int = 0) -> None:
        self.mode = mode
        self.size = size
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=2048)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = 0
        self.connections = 0
        self.ended = 0  # connections whose client closed
        self.sent = 0  # ``source`` connections that sent everything and closed their side
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            if self.mode == "source":
                for chunk in pattern_chunks(self.size):
                    sock.sendall(chunk)
                sock.shutdown(socket.SHUT_WR)
                with self._lock:
                    self.sent += 1
            if self.mode == "hold":
                self._released.wait(60)
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                with self._lock:
                    self.received += len(data)
                if self.mode == "echo":
                    sock.sendall(data)
        except OSError:
            pass
        with self._lock:
            self.ended += 1
        sock.close()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


_UNIT = b"".join(i.to_bytes(4, "big") for i in range(16384))  # 64 KiB, each 4-byte word distinct


def pattern_chunks(size: int) -> Iterator[bytes]:
    """``size`` bytes in 64 KiB chunks, each numbered: a lost, repeated or reordered chunk shows."""
    for index, offset in enumerate(range(0, size, len(_UNIT))):
        yield (index.to_bytes(4, "big") + _UNIT[4:])[: size - offset]


def pattern(size: int) -> bytes:
    return b"".join(pattern_chunks(size))


def pattern_digest(size: int) -> bytes:
    digest = hashlib.sha256()
    for chunk in pattern_chunks(size):
        digest.update(chunk)
    return digest.digest()


def dial_any(proto: str, address: str, timeout: float) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(65536, size - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")
