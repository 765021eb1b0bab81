"""Real TLS WebSocket channels on 127.0.0.1 for the tunnel tests (a generated CA, both ends in-process)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import trustme

from bcs_middleware.tunnel.wschannel import WebSocketChannel

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
