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

from tests.support.websocket import frame as ws_frame
from tests.support.websocket import read_frame

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01

# SPDY/3's header compression dictionary (moby/spdystream spdy/dictionary.go, from the SPDY/3 draft).
_DICTIONARY = bytes.fromhex(
    "000000076f7074696f6e73000000046865616400000004706f7374000000037075740000000664656c65746500000005"
    "7472616365000000066163636570740000000e6163636570742d636861727365740000000f6163636570742d656e636f"
    "64696e670000000f6163636570742d6c616e67756167650000000d6163636570742d72616e6765730000000361676500"
    "000005616c6c6f770000000d617574686f72697a6174696f6e0000000d63616368652d636f6e74726f6c0000000a636f"
    "6e6e656374696f6e0000000c636f6e74656e742d6261736500000010636f6e74656e742d656e636f64696e6700000010"
    "636f6e74656e742d6c616e67756167650000000e636f6e74656e742d6c656e67746800000010636f6e74656e742d6c6f"
    "636174696f6e0000000b636f6e74656e742d6d64350000000d636f6e74656e742d72616e67650000000c636f6e74656e"
    "742d74797065000000046461746500000004657461670000000665787065637400000007657870697265730000000466"
    "726f6d00000004686f73740000000869662d6d617463680000001169662d6d6f6469666965642d73696e63650000000d"
    "69662d6e6f6e652d6d617463680000000869662d72616e67650000001369662d756e6d6f6469666965642d73696e6365"
    "0000000d6c6173742d6d6f646966696564000000086c6f636174696f6e0000000c6d61782d666f727761726473000000"
    "06707261676d610000001270726f78792d61757468656e7469636174650000001370726f78792d617574686f72697a61"
    "74696f6e0000000572616e676500000007726566657265720000000b72657472792d6166746572000000067365727665"
    "7200000002746500000007747261696c6572000000117472616e736665722d656e636f64696e67000000077570677261"
    "64650000000a757365722d6167656e74000000047661727900000003766961000000077761726e696e67000000107777"
    "772d61757468656e746963617465000000066d6574686f64000000036765740000000673746174757300000006323030"
    "204f4b0000000776657273696f6e00000008485454502f312e310000000375726c000000067075626c69630000000a73"
    "65742d636f6f6b69650000000a6b6565702d616c697665000000066f726967696e313030313031323031323032323035"
    "323036333030333032333033333034333035333036333037343032343035343036343037343038343039343130343131"
    "343132343133343134343135343136343137353032353034353035323033204e6f6e2d417574686f7269746174697665"
    "20496e666f726d6174696f6e323034204e6f20436f6e74656e74333031204d6f766564205065726d616e656e746c7934"
    "303020426164205265717565737434303120556e617574686f72697a656434303320466f7262696464656e343034204e"
    "6f7420466f756e6435303020496e7465726e616c20536572766572204572726f72353031204e6f7420496d706c656d65"
    "6e746564353033205365727669636520556e617661696c61626c654a616e20466562204d617220417072204d6179204a"
    "756e204a756c204175672053657074204f6374204e6f76204465632030303a30303a3030204d6f6e2c205475652c2057"
    "65642c205468752c204672692c205361742c2053756e2c20474d546368756e6b65642c746578742f68746d6c2c696d61"
    "67652f706e672c696d6167652f6a70672c696d6167652f6769662c6170706c69636174696f6e2f786d6c2c6170706c69"
    "636174696f6e2f7868746d6c2b786d6c2c746578742f706c61696e2c746578742f6a6176617363726970742c7075626c"
    "6963707269766174656d61782d6167653d677a69702c6465666c6174652c73646368636861727365743d7574662d3863"
    "6861727365743d69736f2d383835392d312c7574662d2c2a2c656e713d302e"
)


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
        self._inflate = zlib.decompressobj(zdict=_DICTIONARY)
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, zdict=_DICTIONARY)

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
