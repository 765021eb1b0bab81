"""RFC 6455 framing for an open WebSocket: binary messages, ping, pong and close.

``wsproto`` does the opening handshake (:mod:`.ws_opening`); the frames after it are
read and written here. The tunnel sends one message per request each way, and
wsproto's generator layers cost several times what this codec does for the same work,
most of it the masking (figures in bench/README.md). No extension is
ever negotiated, so the reserved bits must be clear.

What is refused, as :class:`FrameError` carrying the close code to answer with:
a frame with reserved bits, an unknown opcode, a mask where there must be none (or
none where there must be one: clients mask, servers do not), a length not in its
shortest form, a control frame that is fragmented or longer than 125 bytes, a
continuation without a start or a new message inside a fragmented one (1002); a
message whose declared size would exceed ``max_message`` (1009, before any of it
is buffered) or that comes in more than ``max_fragments`` frames (1009: empty
fragments would otherwise keep a message open for ever); a close frame with a
malformed code (1002) or a reason that is not UTF-8 (1007).
"""

from __future__ import annotations

import os
import struct

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
_DATA_OPCODES = (OP_CONTINUATION, OP_TEXT, OP_BINARY)
_CONTROL_OPCODES = (OP_CLOSE, OP_PING, OP_PONG)

#: The close code of a close frame without one (RFC 6455 §7.1.5); never sent.
NO_STATUS = 1005
#: RFC 6455 §7.4.1: "a message that violates its policy" — here, a peer that broke a bound.
POLICY_VIOLATION = 1008
#: RFC 6455 §7.4.1: "a message that is too big for it to process".
MESSAGE_TOO_BIG = 1009
#: Fragments of one message at most: Go's gorilla/websocket writes a message in frames of its
#: write buffer (4 KiB by default), 256 for a 1 MiB message.
MAX_FRAGMENTS = 4096
_MAX_CONTROL = 125


class FrameError(ValueError):
    """The peer broke the framing rules; ``code`` is the close code to answer with, ``bound`` the
    bound it broke (``message_size``, ``fragments``), if it broke one rather than a rule."""

    def __init__(self, code: int, reason: str, bound: str | None = None) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.bound = bound


def mask(payload: bytes, key: bytes) -> bytes:
    """XOR ``payload`` with the 4-byte ``key`` repeated (masking and unmasking are the same)."""
    size = len(payload)
    if not size:
        return payload
    keys = (key * (size // 4 + 1))[:size]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(keys, "little")).to_bytes(size, "little")


class Frames:
    """The frames of one open WebSocket, for the ``client`` or the server end.

    :meth:`feed` what the peer sent, then call :meth:`next` until it answers
    ``None``; :meth:`frame` builds what to send.
    """

    def __init__(self, *, client: bool, max_message: int, max_fragments: int = MAX_FRAGMENTS) -> None:
        self.client = client
        self.max_message = max_message
        self.max_fragments = max_fragments
        self._buffer = bytearray()
        # A fragmented message so far, joined as it comes: its memory is its size, whatever the
        # number of (empty) fragments.
        self._fragments: bytearray | None = None
        self._fragments_count = 0
        self._fragments_opcode = OP_BINARY

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next(self) -> tuple[int, bytes] | None:
        """The next whole message or control frame as ``(opcode, payload)``, or ``None`` for more bytes.

        A message is ``OP_BINARY`` or ``OP_TEXT`` with its fragments joined; a control
        frame is ``OP_PING``, ``OP_PONG`` or ``OP_CLOSE`` (see :func:`parse_close`).
        Raises :class:`FrameError`.
        """
        buffer = self._buffer
        while True:
            head = self._head(buffer)
            if head is None:
                return None
            first, offset, length = head
            key = b""
            if not self.client:  # RFC 6455 §5.3: a client masks every frame, a server none
                key = bytes(buffer[offset:offset + 4])
                offset += 4
            end = offset + length
            if len(buffer) < end:
                return None
            payload = bytes(buffer[offset:end])
            del buffer[:end]
            if key:
                payload = mask(payload, key)
            opcode = first & 0x0F
            if opcode >= OP_CLOSE:
                return opcode, payload
            if first & 0x80 and opcode and self._fragments is None:  # a whole message in one frame
                return opcode, payload
            message = self._assemble(first & 0x80, opcode, payload)
            if message is not None:
                return message

    def _head(self, buffer: bytearray) -> tuple[int, int, int] | None:
        """The frame head at the start of ``buffer`` checked against the rules and bounds (see the
        module docs): ``(first byte, offset of the masking key or payload, payload length)``, or
        ``None`` until the whole head is there."""
        available = len(buffer)
        if available < 2:
            return None
        first, second = buffer[0], buffer[1]
        opcode = first & 0x0F
        length = second & 0x7F
        if first & 0x70:
            raise FrameError(1002, "reserved bits set without an extension")
        if opcode not in _DATA_OPCODES and opcode not in _CONTROL_OPCODES:
            raise FrameError(1002, f"unknown opcode {opcode}")
        if bool(second & 0x80) == self.client:
            raise FrameError(1002, "a masked frame from the server" if self.client
                             else "an unmasked frame from the client")
        offset = 2
        # RFC 6455 §5.2: 126 and 127 announce a 16- and a 64-bit length, "the minimal number of
        # bytes MUST be used", and the 64-bit one has its most significant bit clear.
        if length == 126:
            if available < 4:
                return None
            length = int.from_bytes(buffer[2:4], "big")
            offset = 4
            if length < 126:
                raise FrameError(1002, "a length not in its shortest form")
        elif length == 127:
            if available < 10:
                return None
            length = int.from_bytes(buffer[2:10], "big")
            offset = 10
            if length < 1 << 16 or length >> 63:
                raise FrameError(1002, "a length not in its shortest form, or over 63 bits")
        if opcode >= OP_CLOSE:
            # RFC 6455 §5.5: control frames are never fragmented and carry at most 125 bytes.
            if not first & 0x80 or length > _MAX_CONTROL:
                raise FrameError(1002, "a control frame fragmented or over 125 bytes")
        elif length + (len(self._fragments) if self._fragments is not None else 0) > self.max_message:
            # Refused on the declared size, before any of the payload is buffered.
            raise FrameError(MESSAGE_TOO_BIG, f"a message over {self.max_message} bytes", "message_size")
        return first, offset, length

    def _assemble(self, fin: int, opcode: int, payload: bytes) -> tuple[int, bytes] | None:
        """A data frame's part in its message (RFC 6455 §5.4): the whole message once its last
        fragment is in, else ``None``."""
        if opcode == OP_CONTINUATION:
            if self._fragments is None:
                raise FrameError(1002, "a continuation frame without a message to continue")
            self._fragments += payload
            self._fragments_count += 1
            if not fin:
                if self._fragments_count >= self.max_fragments:
                    raise FrameError(MESSAGE_TOO_BIG, f"a message in more than {self.max_fragments} fragments",
                                     "fragments")
                return None
            message = bytes(self._fragments)
            opcode = self._fragments_opcode
            self._fragments = None
            return opcode, message
        if self._fragments is not None:
            raise FrameError(1002, "a new message inside a fragmented one")
        if fin:
            return opcode, payload
        self._fragments = bytearray(payload)
        self._fragments_count = 1
        self._fragments_opcode = opcode
        return None

    def frame(self, opcode: int, payload: bytes = b"") -> bytes:
        """One whole frame (FIN set) carrying ``payload``, masked when this is the client."""
        size = len(payload)
        mask_bit = 0x80 if self.client else 0
        if size < 126:
            head = bytes((0x80 | opcode, mask_bit | size))
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, mask_bit | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, mask_bit | 127, size)
        if not self.client:
            return head + payload
        key = os.urandom(4)  # unpredictable, as RFC 6455 §5.3 requires
        return b"".join((head, key, mask(payload, key)))

    def close_frame(self, code: int, reason: str = "") -> bytes:
        """A close frame with ``code`` and as much of ``reason`` as fits (whole UTF-8 characters)."""
        text = reason.encode("utf-8")[:_MAX_CONTROL - 2].decode("utf-8", "ignore").encode("utf-8")
        return self.frame(OP_CLOSE, struct.pack("!H", code) + text)


def parse_close(payload: bytes) -> tuple[int, str]:
    """``(code, reason)`` of a close frame's payload; :class:`FrameError` if malformed."""
    if not payload:
        return NO_STATUS, ""
    if len(payload) == 1:
        raise FrameError(1002, "a close frame with a one-byte code")
    code = int.from_bytes(payload[:2], "big")
    if not (1000 <= code <= 1003 or 1007 <= code <= 1011 or 3000 <= code <= 4999):
        raise FrameError(1002, f"a close frame with the invalid code {code}")
    try:
        reason = payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError(1007, "a close reason that is not UTF-8") from None
    return code, reason
