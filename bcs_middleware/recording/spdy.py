"""SPDY/3.1 as kubectl's ``exec``/``attach`` streams use it, decoded (pure).

moby/spdystream frames (``k8s.io/apimachinery/pkg/util/httpstream/spdy``): 8-byte headers,
control frames (``SYN_STREAM``, ``SYN_REPLY``, ``RST_STREAM``, ``HEADERS``…) and data frames
of one stream each. kubectl opens every stream itself, with a ``SYN_STREAM`` whose
``streamType`` header says which (``error``, ``stdin``, ``stdout``, ``stderr``, ``resize``:
client-go ``remotecommand/v4.go``); a data frame with ``FLAG_FIN`` ends its stream. Header
blocks are zlib-compressed with SPDY/3's dictionary, one compression context per direction
(SPDY/3 section 2.6.10.1), so every block of a direction is inflated in order to keep that
context. Data frames are parsed incrementally; a control frame larger than
:data:`MAX_CONTROL` (kubectl's are a few hundred bytes) stops the decoding of the session.
"""

from __future__ import annotations

import struct
import zlib

from .terminal import Piece, StreamName

__all__ = ["MAX_CONTROL", "SpdyDecoder"]

SYN_STREAM, SYN_REPLY, RST_STREAM, HEADERS = 1, 2, 3, 8
FLAG_FIN = 0x01
MAX_CONTROL = 1024 * 1024
_STREAM_TYPES: frozenset[str] = frozenset({"stdin", "stdout", "stderr", "resize", "error"})

# SPDY/3's header compression dictionary (moby/spdystream spdy/dictionary.go, from the SPDY/3 draft).
DICTIONARY = bytes.fromhex(
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


class _Direction:
    __slots__ = ("control", "flags", "head", "inflate", "kind", "payload", "remaining", "stream_id")

    def __init__(self) -> None:
        self.head = bytearray()
        self.remaining = 0
        self.control = False
        self.flags = 0
        self.kind = 0
        self.stream_id = 0
        self.payload = bytearray()  # a control frame's, gathered whole
        self.inflate = zlib.decompressobj(zdict=DICTIONARY)


class SpdyDecoder:
    """Both directions of one SPDY session, fed as the splice moves the bytes."""

    def __init__(self) -> None:
        self._up = _Direction()
        self._down = _Direction()
        self._types: dict[int, StreamName] = {}
        self.broken = ""  # why decoding stopped ("" while it runs)

    def feed(self, to_upstream: bool, data: bytes) -> list[Piece]:
        out: list[Piece] = []
        if self.broken:
            return out
        d = self._up if to_upstream else self._down
        at = 0
        while at < len(data):
            if len(d.head) < 8:
                take = min(8 - len(d.head), len(data) - at)
                d.head += data[at:at + take]
                at += take
                if len(d.head) < 8:
                    break
                if not self._start(d, out):
                    return out
                continue
            take = min(d.remaining, len(data) - at)
            chunk = data[at:at + take]
            at += take
            d.remaining -= take
            if d.control:
                d.payload += chunk
            elif chunk:
                name = self._types.get(d.stream_id)
                if name is not None:
                    out.append(Piece(name, chunk))
            if d.remaining == 0:
                self._finish(d, out)
        return out

    def _start(self, d: _Direction, out: list[Piece]) -> bool:
        first, second = struct.unpack(">II", d.head)
        d.control = bool(first & 0x80000000)
        d.flags, d.remaining = second >> 24, second & 0xFFFFFF
        d.stream_id = 0 if d.control else first & 0x7FFFFFFF
        d.kind = first & 0xFFFF if d.control else 0
        if d.control and d.remaining > MAX_CONTROL:
            self.broken = f"a control frame of {d.remaining} bytes"
            return False
        if d.remaining == 0:
            self._finish(d, out)
        return True

    def _finish(self, d: _Direction, out: list[Piece]) -> None:
        d.head.clear()
        if not d.control:
            name = self._types.get(d.stream_id)
            if name is not None and d.flags & FLAG_FIN:
                out.append(Piece(name, b"", end=True))
            return
        payload, d.payload = bytes(d.payload), bytearray()
        kind = d.kind
        if kind not in (SYN_STREAM, SYN_REPLY, HEADERS, RST_STREAM) or len(payload) < 4:
            return
        stream_id = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
        if kind == RST_STREAM:
            name = self._types.get(stream_id)
            if name is not None:
                out.append(Piece(name, b"", end=True))
            return
        block = payload[10:] if kind == SYN_STREAM else payload[4:]
        try:
            headers = _headers(d.inflate.decompress(block, MAX_CONTROL))
        except (zlib.error, struct.error, UnicodeDecodeError, ValueError) as exc:
            self.broken = f"a header block that does not decode ({exc})"
            return
        stream_type = headers.get("streamtype", "")
        if kind == SYN_STREAM and stream_type in _STREAM_TYPES:
            self._types[stream_id] = stream_type  # type: ignore[assignment]
        if d.flags & FLAG_FIN and stream_id in self._types:
            out.append(Piece(self._types[stream_id], b"", end=True))


def _headers(block: bytes) -> dict[str, str]:
    """A SPDY/3 name/value block (32-bit counts and lengths), names lower-cased."""
    count = struct.unpack(">I", block[:4])[0]
    at, found = 4, {}
    for _ in range(min(count, 1024)):
        size = struct.unpack(">I", block[at:at + 4])[0]
        name = block[at + 4:at + 4 + size].decode("latin-1").lower()
        at += 4 + size
        size = struct.unpack(">I", block[at:at + 4])[0]
        found[name] = block[at + 4:at + 4 + size].decode("latin-1").split("\0")[0].lower()
        at += 4 + size
    return found
