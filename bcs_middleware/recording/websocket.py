"""Kubernetes' WebSocket channel protocols (``channel.k8s.io``, ``v4``/``v5.channel.k8s.io``) decoded (pure).

RFC 6455 frames, parsed incrementally so a frame of any size costs no more memory than its
header: the client's frames are masked (section 5.3), the server's are not; a message may
be fragmented (opcode 0 continues it). The first byte of each binary message names its
channel (``k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go``): 0 stdin, 1 stdout,
2 stderr, 3 error, 4 resize; ``v5`` adds 255, "close the channel named by the next byte"
(``remotecommand`` ``v5``: the client closing stdin). Control frames (close, ping, pong) carry
no stream data. The ``base64`` variants are not decoded (kubectl does not use them).
"""

from __future__ import annotations

from .terminal import Piece, StreamName

__all__ = ["ChannelDecoder", "records"]

_CHANNELS: dict[int, StreamName] = {0: "stdin", 1: "stdout", 2: "stderr", 3: "error", 4: "resize"}
_CLOSE_CHANNEL = 255


def records(subprotocol: str) -> bool:
    """A negotiated subprotocol this module decodes (binary channel framing)."""
    name = subprotocol.strip().lower()
    return name in ("channel.k8s.io", "v4.channel.k8s.io", "v5.channel.k8s.io") or \
        (name.endswith(".channel.k8s.io") and "base64" not in name)


class _Direction:
    """One direction's frame parser state."""

    __slots__ = ("channel", "closing", "control", "head", "mask", "masked_at", "remaining")

    def __init__(self) -> None:
        self.head = bytearray()
        self.remaining = 0
        self.mask = b""
        self.masked_at = 0
        self.control = False
        self.channel: int | None = None  # of the message under way; None: its first byte is next
        self.closing = False  # a v5 close-channel message: its next byte names the channel


class ChannelDecoder:
    """Both directions of one WebSocket session, fed as the splice moves the bytes."""

    def __init__(self) -> None:
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
            self._payload(d, chunk, out)
        return out

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
        if not d.control and opcode != 0x0:
            d.channel = None  # a new message
            d.closing = False
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
