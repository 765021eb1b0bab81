"""Kubernetes' WebSocket channel protocols, every one the apiserver accepts, decoded (pure).

RFC 6455 frames, parsed incrementally so a frame of any size costs no more memory than its
header: the client's frames are masked (section 5.3), the server's are not; a message may
be fragmented (opcode 0 continues it). Control frames (close, ping, pong) carry no stream
data. Channels: 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize.

Two codecs (``k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go``, the protocol table
of the kubelet's ``cri/streaming/remotecommand/websocket.go``):

* binary — no subprotocol, ``channel.k8s.io``, ``v4.channel.k8s.io``, ``v5.channel.k8s.io``:
  the first byte of each message is the channel number, the rest the stream's bytes; ``v5``
  adds channel 255, "close the channel named by the next byte" (the client closing stdin).
* base64 — ``base64.channel.k8s.io``, ``v4.base64.channel.k8s.io`` (browser terminals): the
  first byte is the channel as an ASCII digit (``'0' + n``), the rest of the *message* is
  standard base64 (``base64.StdEncoding``), in TEXT frames from the apiserver. The apiserver
  decodes a message whole and drops one that is not valid base64; so does this decoder (a
  message is held until its end, up to :data:`MESSAGE_HOLD` characters, then decoded as it
  comes in whole quanta).

The names are matched exactly, as the apiserver's handshake matches them.
"""

from __future__ import annotations

import binascii

from .terminal import Piece, StreamName

__all__ = ["BASE64_PROTOCOLS", "BINARY_PROTOCOLS", "MESSAGE_HOLD", "ChannelDecoder", "records"]

_CHANNELS: dict[int, StreamName] = {0: "stdin", 1: "stdout", 2: "stderr", 3: "error", 4: "resize"}
_CLOSE_CHANNEL = 255

#: The subprotocols the apiserver answers exec/attach with, by codec ("" is no subprotocol).
BINARY_PROTOCOLS = frozenset({"", "channel.k8s.io", "v4.channel.k8s.io", "v5.channel.k8s.io"})
BASE64_PROTOCOLS = frozenset({"base64.channel.k8s.io", "v4.base64.channel.k8s.io"})

#: The most of one base64 message held to decode it whole (the apiserver writes what it read
#: from the pod, at most 32 KiB a message, ~43 KiB in base64); a longer one is decoded as it comes.
MESSAGE_HOLD = 64 * 1024


def records(subprotocol: str) -> bool:
    """A negotiated subprotocol this module decodes."""
    return subprotocol.strip() in BINARY_PROTOCOLS | BASE64_PROTOCOLS


class _Direction:
    """One direction's frame parser state."""

    __slots__ = ("channel", "closing", "control", "encoded", "final", "head", "mask", "masked_at", "remaining")

    def __init__(self) -> None:
        self.head = bytearray()
        self.remaining = 0
        self.mask = b""
        self.masked_at = 0
        self.control = False
        self.final = False  # the frame under way ends its message
        self.channel: int | None = None  # of the message under way; None: its first byte is next
        self.closing = False  # a v5 close-channel message: its next byte names the channel
        self.encoded = bytearray()  # base64: the message's text not decoded yet


class ChannelDecoder:
    """Both directions of one WebSocket session, fed as the splice moves the bytes.

    :param subprotocol: the one the apiserver's ``101`` named (``Sec-WebSocket-Protocol``;
        ``""`` when none): it decides the codec. One :func:`records` refuses is decoded as binary.
    """

    def __init__(self, subprotocol: str = "") -> None:
        self._base64 = subprotocol.strip() in BASE64_PROTOCOLS
        self._up = _Direction()
        self._down = _Direction()

    def feed(self, to_upstream: bool, data: bytes) -> list[Piece]:
        d = self._up if to_upstream else self._down
        out: list[Piece] = []
        at = 0
        while at < len(data):
            if d.remaining == 0:
                at = self._header(d, data, at)
                if at < 0:
                    break
                if d.remaining == 0:
                    self._frame_end(d, out)
                continue
            take = min(d.remaining, len(data) - at)
            chunk = data[at:at + take]
            at += take
            d.remaining -= take
            if d.control:
                continue
            if d.mask:
                chunk = _unmask(chunk, d.mask, d.masked_at)
                d.masked_at += take
            if self._base64:
                self._encoded_payload(d, chunk, out)
            else:
                self._payload(d, chunk, out)
            if d.remaining == 0:
                self._frame_end(d, out)
        return out

    def _frame_end(self, d: _Direction, out: list[Piece]) -> None:
        if self._base64 and d.final and not d.control:
            self._decode(d, out, whole=True)

    @staticmethod
    def _encoded_payload(d: _Direction, chunk: bytes, out: list[Piece]) -> None:
        if not chunk:
            return
        if d.channel is None:
            d.channel = chunk[0] - ord("0")  # conn.go: channel = data[0] - '0'
            chunk = chunk[1:]
        if _CHANNELS.get(d.channel) is None:
            return  # a channel the apiserver ignores: nothing to keep of it
        d.encoded += chunk.replace(b"\r", b"").replace(b"\n", b"")  # Go's decoder skips line breaks
        if len(d.encoded) > MESSAGE_HOLD:  # decoded as it comes from now on, in whole quanta
            ChannelDecoder._decode(d, out, whole=False)

    @staticmethod
    def _decode(d: _Direction, out: list[Piece], *, whole: bool) -> None:
        """Decode what is held: at the message's end all of it, else its whole quanta so far."""
        name = _CHANNELS.get(d.channel) if d.channel is not None else None
        size = len(d.encoded) if whole else len(d.encoded) - len(d.encoded) % 4
        text, d.encoded = bytes(d.encoded[:size]), d.encoded[size:]
        if name is None or d.channel == -1 or not text:
            return
        try:
            data = binascii.a2b_base64(text, strict_mode=True)
        except binascii.Error:
            # The apiserver drops a message that is not valid base64 (conn.go DataFromSocket).
            d.channel = -1
            d.encoded.clear()
            return
        if data:
            out.append(Piece(name, data))

    @staticmethod
    def _header(d: _Direction, data: bytes, at: int) -> int:
        """Parse (the rest of) a frame header from ``at``; where the payload starts, -1: need more."""
        needed = 2
        while True:
            if len(d.head) < needed:
                take = min(needed - len(d.head), len(data) - at)
                d.head += data[at:at + take]
                at += take
                if len(d.head) < needed:
                    return -1
            b1 = d.head[1]
            length = b1 & 0x7F
            ext = 2 + (2 if length == 126 else 8 if length == 127 else 0)
            needed = ext + (4 if b1 & 0x80 else 0)
            if len(d.head) >= needed:
                break
        opcode = d.head[0] & 0x0F
        if length == 126:
            length = int.from_bytes(d.head[2:4], "big")
        elif length == 127:
            length = int.from_bytes(d.head[2:10], "big")
        d.mask = bytes(d.head[ext:ext + 4]) if b1 & 0x80 else b""
        d.masked_at = 0
        d.control = opcode >= 0x8
        if not d.control:
            d.final = bool(d.head[0] & 0x80)
        if not d.control and opcode != 0x0:
            d.channel = None  # a new message
            d.closing = False
            d.encoded.clear()
        d.head.clear()
        d.remaining = length
        return at

    @staticmethod
    def _payload(d: _Direction, chunk: bytes, out: list[Piece]) -> None:
        if not chunk:
            return
        if d.channel is None:
            d.channel = chunk[0]
            chunk = chunk[1:]
            if d.channel == _CLOSE_CHANNEL:
                d.closing = True
        if d.closing:
            if chunk:
                name = _CHANNELS.get(chunk[0])
                if name is not None:
                    out.append(Piece(name, b"", end=True))
                d.closing = False
                d.channel = -1  # the rest of this message means nothing
            return
        name = _CHANNELS.get(d.channel)
        if name is not None and chunk:
            out.append(Piece(name, chunk))


def _unmask(chunk: bytes, mask: bytes, offset: int) -> bytes:
    # XOR with the key repeated from where the frame's payload is (RFC 6455 5.3), as one integer.
    size = len(chunk)
    start = offset % 4
    key = (mask[start:] + mask * (size // 4 + 2))[:size]
    return (int.from_bytes(chunk, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")
