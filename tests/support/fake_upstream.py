"""A small threaded HTTP(S) upstream for proxy tests, recording what it receives.

Endpoints (any method):

* ``/echo…``            — JSON of the request: method, path, query, headers, body bytes and sha256
* ``/digest``           — reads a sized or chunked body streaming; ``{"bytes", "sha256"}``
* ``/stream?lines=N&delay=S`` — chunked, one line every S seconds, each flushed (watch-like)
* ``/slow?delay=S``     — waits S seconds before answering
* ``/redirect``         — ``302`` to ``/echo``
* ``/download?bytes=N[&chunked=1]`` — N bytes, sized (or chunked)
* ``/hop``              — answers with hop-by-hop headers that a proxy must drop

``accepted`` counts TCP connections accepted; ``requests`` lists one record
per request; ``stream_ended`` holds, per ``/stream`` request, whether the
peer went away before the last line (``"aborted"``) or not (``"complete"``).
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_PIECE = 64 * 1024


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body_bytes: int = 0
    sha256: str = ""

    def header(self, name: str) -> str | None:
        values = self.header_all(name)
        return values[0] if values else None

    def header_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class _State:
    accepted: int = 0
    requests: list[Recorded] = field(default_factory=list)
    stream_ended: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stream_event: threading.Condition = field(default_factory=threading.Condition)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    state: _State
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        with self.state.lock:
            self.state.accepted += 1
        if self.tls is not None:
            sock.settimeout(10)
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError):
                sock.close()
                raise
            sock.settimeout(None)
        return sock, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that vanish (the tests make them) are not errors here


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body are separate writes: with Nagle on, the body waits for the
    # client's delayed ACK of the head (~40 ms per keep-alive request).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        record = Recorded(self.command, parts.path, parts.query, list(self.headers.items()))
        digest = hashlib.sha256()
        for piece in self._body():
            record.body_bytes += len(piece)
            digest.update(piece)
        record.sha256 = digest.hexdigest()
        with self.server.state.lock:
            self.server.state.requests.append(record)

        if parts.path.startswith("/echo") or parts.path == "/digest":
            payload: dict[str, Any] = {"bytes": record.body_bytes, "sha256": record.sha256}
            if parts.path.startswith("/echo"):
                payload.update(method=record.method, path=record.path, query=record.query,
                               headers=record.headers)
            self._json(200, payload)
        elif parts.path == "/stream":
            self._stream(int(query.get("lines", "5")), float(query.get("delay", "0.1")))
        elif parts.path == "/slow":
            time.sleep(float(query.get("delay", "5")))
            self._json(200, {"slow": True})
        elif parts.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/echo")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif parts.path == "/download":
            self._download(int(query.get("bytes", "0")), query.get("chunked") == "1")
        elif parts.path == "/hop":
            body = b"hop"
            self.send_response(200)
            self.send_header("Connection", "keep-alive, X-Hop-Secret")
            self.send_header("Keep-Alive", "timeout=30")
            self.send_header("X-Hop-Secret", "must-not-pass")
            self.send_header("Proxy-Authenticate", "Basic")
            self.send_header("Upgrade", "h2c")
            self.send_header("X-End-To-End", "kept")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"error": "no such endpoint"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _dispatch

    def _body(self) -> Any:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                left = size
                while left:
                    piece = self.rfile.read(min(_PIECE, left))
                    if not piece:
                        return
                    left -= len(piece)
                    yield piece
                self.rfile.readline(16)
        left = int(self.headers.get("Content-Length") or 0)
        while left:
            piece = self.rfile.read(min(_PIECE, left))
            if not piece:
                return
            left -= len(piece)
            yield piece

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _stream(self, lines: int, delay: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        outcome = "complete"
        try:
            for number in range(lines):
                line = json.dumps({"line": number, "sent": time.time()}).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                if number + 1 < lines:
                    time.sleep(delay)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            outcome = "aborted"
            self.close_connection = True
        state = self.server.state
        with state.stream_event:
            state.stream_ended.append(outcome)
            state.stream_event.notify_all()

    def _download(self, size: int, chunked: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(size))
        self.end_headers()
        piece = bytes(range(256)) * (_PIECE // 256)
        left = size
        while left:
            out = piece[: min(_PIECE, left)]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(out), out) if chunked else out)
            left -= len(out)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")


class FakeUpstream:
    """Serve the endpoints above on ``host`` (a free port) until ``stop()``.

    :param tls: a server-side :class:`ssl.SSLContext` to serve HTTPS.
    """

    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.state = _State()
        self._server = (_Server6 if ":" in host else _Server)((host, 0), _Handler)
        self._server.state = self.state
        self._server.tls = tls
        self.host = host
        self.port = self._server.server_address[1]
        self.scheme = "https" if tls else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def accepted(self) -> int:
        with self.state.lock:
            return self.state.accepted

    @property
    def requests(self) -> list[Recorded]:
        with self.state.lock:
            return list(self.state.requests)

    def last(self, path: str | None = None) -> Recorded:
        for record in reversed(self.requests):
            if path is None or record.path == path:
                return record
        raise LookupError(f"no request to {path}")

    def wait_stream_ended(self, count: int, timeout: float) -> list[str]:
        state = self.state
        with state.stream_event:
            state.stream_event.wait_for(lambda: len(state.stream_ended) >= count, timeout)
            return list(state.stream_ended)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeUpstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
