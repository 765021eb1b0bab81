"""A stand-in for the bcs console proxy on a Mesos agent (``/bcsapi/v1/consoleproxy/...``), over TLS.

Plain requests get ``200`` JSON describing what arrived. A WebSocket upgrade
(RFC 6455 handshake) is answered ``101`` and every frame is echoed back with an
``echo:`` prefix — unless the path contains ``/refuse``, which answers ``403``
JSON and then waits to see whether anything more arrives (a spliced connection
would deliver the client's next bytes). ``seen`` holds each request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.websocket import frame, read_frame

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    after_refusal: bytes | None = None
    frames: list[bytes] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are separate writes: with Nagle on, the body waits for the
    # client's delayed ACK of the head (~40 ms per keep-alive request).
    disable_nagle_algorithm = True
    server: _Server
    timeout = 20

    def log_message(self, *args: Any) -> None:
        pass

    def _record(self) -> Seen:
        seen = Seen(self.command, self.path, {k: v for k, v in self.headers.items()})
        with self.server.lock:
            self.server.seen.append(seen)
        return seen

    def do_GET(self) -> None:
        seen = self._record()
        if self.headers.get("Upgrade", "").lower() != "websocket":
            self._json(200, {"console": self.server.name, "path": self.path})
            return
        if "/refuse" in self.path:
            self._json(403, {"message": "console refused"})
            self.connection.settimeout(3)
            try:
                seen.after_refusal = self.rfile.read1(1)
            except OSError:
                seen.after_refusal = None
            self.close_connection = True
            return
        key = (self.headers["Sec-WebSocket-Key"] + _GUID).encode()
        accept = base64.b64encode(hashlib.sha1(key, usedforsecurity=False).digest())  # RFC 6455 §4.2.2
        self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        self.wfile.flush()
        while True:
            opcode, payload = read_frame(self.rfile)
            if opcode is None or opcode == 0x8:
                break
            seen.frames.append(payload)
            self.wfile.write(frame(opcode, b"echo:" + self.server.name.encode() + b":" + payload))
            self.wfile.flush()
        self.close_connection = True

    def do_POST(self) -> None:
        self._record()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self._json(200, {"console": self.server.name, "path": self.path, "body": body.decode()})

    def _json(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], name: str, context: ssl.SSLContext) -> None:
        super().__init__(address, _Handler)
        self.name = name
        self.context = context
        self.seen: list[Seen] = []
        self.lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        sock.settimeout(10)
        return self.context.wrap_socket(sock, server_side=True), addr


class FakeConsole:
    """``FakeConsole("c1", cert, host="127.0.0.1", port=0)``: a TLS console proxy; ``stop()`` when done."""

    def __init__(self, name: str, cert: Any, *, host: str = "127.0.0.1", port: int = 0) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self.server = _Server((host, port), name, context)
        self.host, self.port = host, self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def seen(self) -> list[Seen]:
        with self.server.lock:
            return list(self.server.seen)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
