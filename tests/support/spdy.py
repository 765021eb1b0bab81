"""The server side of SPDY/3.1 as kubectl's streams use it, for the fake apiserver's upgrades.

kubectl runs ``exec``/``attach`` (before 1.30, or with websockets turned off) and
``port-forward`` (before 1.31 directly; since then as SPDY frames inside WebSocket binary
messages, subprotocol ``SPDY/3.1+portforward.k8s.io``) over SPDY/3.1 as moby/spdystream
frames it: control frames (``SYN_STREAM``, ``SYN_REPLY``, ``RST_STREAM``, ``PING``,
``GOAWAY``, …) and data frames, the header blocks zlib-compressed with SPDY/3's
dictionary, one compression stream per direction. spdystream ignores flow control
(``WINDOW_UPDATE``), and so does this.

:func:`serve_remotecommand` plays the kubelet for ``exec``/``attach`` (protocol
``v4.channel.k8s.io``, no tty): it echoes stdin to stdout, or prints the command's words,
then ends with success. :func:`serve_portforward` plays a pod port that echoes every byte.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bcs_middleware.recording.spdy import DICTIONARY
from tests.support.websocket import frame as ws_frame
from tests.support.websocket import read_frame

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01


@dataclass
class Frame:
    """One SPDY frame: ``control`` with ``kind`` (a control type), else data of ``stream_id``."""

    control: bool
    kind: int
    flags: int
    stream_id: int
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


class SpdyConnection:
    """Frames over a byte stream given as ``read(n)`` (at most n bytes, b"" at the end) and ``write``."""

    def __init__(self, read: Callable[[int], bytes], write: Callable[[bytes], Any]) -> None:
        self._read = read
        self._write = write
        self._buffer = bytearray()
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, zdict=DICTIONARY)

    def _exactly(self, n: int) -> bytes | None:
        while len(self._buffer) < n:
            piece = self._read(65536)
            if not piece:
                return None
            self._buffer += piece
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def read_frame(self) -> Frame | None:
        """The next frame; ``None`` at the end of the connection."""
        head = self._exactly(8)
        if head is None:
            return None
        first, second = struct.unpack(">II", head)
        flags, length = second >> 24, second & 0xFFFFFF
        payload = self._exactly(length) if length else b""
        if payload is None:
            return None
        if not first & 0x80000000:
            return Frame(False, 0, flags, first & 0x7FFFFFFF, payload)
        kind = first & 0xFFFF
        stream_id = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF if len(payload) >= 4 else 0
        parsed = Frame(True, kind, flags, stream_id, payload)
        if kind in (SYN_STREAM, SYN_REPLY, HEADERS):
            block = payload[10:] if kind == SYN_STREAM else payload[4:]
            parsed.headers = self._headers(self._inflate.decompress(block))
        return parsed

    @staticmethod
    def _headers(block: bytes) -> dict[str, str]:
        count = struct.unpack(">I", block[:4])[0]
        at, out = 4, {}
        for _ in range(count):
            size = struct.unpack(">I", block[at:at + 4])[0]
            name = block[at + 4:at + 4 + size].decode()
            at += 4 + size
            size = struct.unpack(">I", block[at:at + 4])[0]
            out[name] = block[at + 4:at + 4 + size].decode()
            at += 4 + size
        return out

    def _control(self, kind: int, flags: int, payload: bytes) -> None:
        self._write(struct.pack(">HHI", 0x8003, kind, flags << 24 | len(payload)) + payload)

    def reply(self, stream_id: int, headers: dict[str, str] | None = None) -> None:
        block = struct.pack(">I", len(headers or {}))
        for name, value in (headers or {}).items():
            block += struct.pack(">I", len(name)) + name.encode() + struct.pack(">I", len(value)) + value.encode()
        compressed = self._deflate.compress(block) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
        self._control(SYN_REPLY, 0, struct.pack(">I", stream_id) + compressed)

    def data(self, stream_id: int, payload: bytes = b"", *, fin: bool = False) -> None:
        for at in range(0, max(len(payload), 1), 0xFFFFFF):
            piece = payload[at:at + 0xFFFFFF]
            last = at + 0xFFFFFF >= len(payload)
            self._write(struct.pack(">II", stream_id, (FLAG_FIN if fin and last else 0) << 24 | len(piece)) + piece)

    def pong(self, ping: Frame) -> None:
        self._control(PING, 0, ping.payload[:4])


def over_socket(sock: socket.socket, rfile: Any, wfile: Any) -> SpdyConnection:
    """SPDY right on the upgraded connection (``Upgrade: SPDY/3.1``)."""
    sock.settimeout(30)

    def write(data: bytes) -> None:
        wfile.write(data)
        wfile.flush()

    return SpdyConnection(rfile.read1, write)


def over_websocket(sock: socket.socket, rfile: Any, wfile: Any) -> SpdyConnection:
    """SPDY inside WebSocket binary messages (kubectl's ``SPDY/3.1+portforward.k8s.io`` tunnelling)."""
    sock.settimeout(30)

    def read(_n: int) -> bytes:
        while True:
            opcode, data = read_frame(rfile)
            if opcode is None or opcode == 0x8:
                return b""
            if opcode == 0x9:
                wfile.write(ws_frame(0xA, data))
                continue
            if opcode in (0x0, 0x2) and data:
                return data

    def write(data: bytes) -> None:
        wfile.write(ws_frame(0x2, data))
        wfile.flush()

    return SpdyConnection(read, write)


def serve_remotecommand(conn: SpdyConnection, params: dict[str, str], command: list[str]) -> None:
    """The kubelet's side of ``exec``/``attach`` (v4, no tty): echo stdin, or print ``command``."""
    wanted = {"error"} | {name for name in ("stdin", "stdout", "stderr") if params.get(name) in ("true", "1")}
    streams: dict[str, int] = {}
    finished = False

    def finish() -> None:
        for name in ("stdout", "stderr", "error"):  # an empty error stream is success (v4)
            if name in streams:
                conn.data(streams[name], fin=True)

    while (got := conn.read_frame()) is not None:
        if got.control and got.kind == SYN_STREAM:
            streams[got.headers.get("streamtype", "")] = got.stream_id
            conn.reply(got.stream_id)
            if set(streams) >= wanted and "stdin" not in wanted and not finished:
                conn.data(streams["stdout"], (" ".join(command) + "\n").encode())
                finish()
                finished = True
        elif got.control and got.kind == PING:
            conn.pong(got)
        elif got.control and got.kind == GOAWAY:
            return
        elif not got.control and got.stream_id == streams.get("stdin"):
            if got.payload:
                conn.data(streams["stdout"], got.payload)
            if got.fin and not finished:
                finish()
                finished = True


def serve_portforward(conn: SpdyConnection, seen: list[dict[str, str]] | None = None) -> None:
    """A pod port that echoes: each ``data`` stream gets its own bytes back, then both its streams end."""
    data_streams: dict[int, str] = {}  # stream id -> request id
    error_streams: dict[str, int] = {}  # request id -> stream id
    while (got := conn.read_frame()) is not None:
        if got.control and got.kind == SYN_STREAM:
            if seen is not None:
                seen.append(got.headers)
            request = got.headers.get("requestid", "")
            if got.headers.get("streamtype") == "data":
                data_streams[got.stream_id] = request
            else:
                error_streams[request] = got.stream_id
            conn.reply(got.stream_id)
        elif got.control and got.kind == PING:
            conn.pong(got)
        elif got.control and got.kind == GOAWAY:
            return
        elif not got.control and got.stream_id in data_streams:
            if got.payload:
                conn.data(got.stream_id, got.payload)
            if got.fin:
                conn.data(got.stream_id, fin=True)
                request = data_streams.pop(got.stream_id)
                if request in error_streams:
                    conn.data(error_streams.pop(request), fin=True)
