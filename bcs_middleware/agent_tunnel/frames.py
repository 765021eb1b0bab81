"""rancher/remotedialer's message framing, as the Go bcs-kube-agent speaks it.

One binary WebSocket message carries one :class:`Message`::

    varint(id) varint(connID) varint(type) [varint(deadline) for Data and Connect] payload

Every varint is Go's ``binary.PutVarint``: the signed value zig-zag encoded
(``0 → 0, -1 → 1, 1 → 2, …``) and then written as a little-endian base-128
``uvarint`` of at most 10 bytes. ``id`` is a per-process message counter no
receiver interprets; ``connID`` names the virtual connection (chosen by the side
that sends Connect); ``deadline`` is milliseconds — the dial timeout on Connect
for the bk-bcs fork of remotedialer (``net.DialTimeout``), ignored by current
remotedialer, which always writes 15000.

Payloads by type:

* Data — raw bytes of the connection;
* Connect — ``proto/address`` (``tcp/10.0.0.1:6443``); Go reads at most 266 bytes;
* Error — the error text, ``EOF`` for a clean end; Go reads at most 100 bytes;
* AddClient / RemoveClient — ``clientKey/sessionKey`` of a peer session;
* Pause / Resume — none (flow control of one connection);
* SyncConnections — the sender's open ``connID`` s, each 8 bytes little-endian.

:func:`decode` never trusts its input: a truncated or overlong varint, an
out-of-range type or id, or a payload over its type's bound raises
:class:`TunnelProtocolError` (whose message is safe to log; it never quotes the
payload). The whole message's size is bounded by the WebSocket channel before
it gets here.
"""

from __future__ import annotations

import enum
import itertools
import random
import struct
from collections.abc import Iterator
from typing import NamedTuple

#: What current remotedialer writes in the deadline field (15 s in milliseconds).
LEGACY_DEADLINE_MS = 15_000
#: Go reads this much of a Connect payload (``io.LimitReader(buf, 266)``).
MAX_CONNECT_PAYLOAD = 266
#: Go reads this much of an Error, AddClient or RemoveClient payload.
MAX_TEXT_PAYLOAD = 100
#: Go's ``binary.MaxVarintLen64``.
MAX_VARINT_LEN = 10

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MASK = (1 << 64) - 1


class TunnelProtocolError(ValueError):
    """A frame that does not follow the protocol; the message is safe to log."""


class MessageType(enum.IntEnum):
    DATA = 1
    CONNECT = 2
    ERROR = 3
    ADD_CLIENT = 4
    REMOVE_CLIENT = 5
    PAUSE = 6
    RESUME = 7
    SYNC_CONNECTIONS = 8


_WITH_DEADLINE = frozenset({MessageType.DATA, MessageType.CONNECT})
_PAYLOAD_BOUND = {
    MessageType.CONNECT: MAX_CONNECT_PAYLOAD,
    MessageType.ADD_CLIENT: MAX_TEXT_PAYLOAD,
    MessageType.REMOVE_CLIENT: MAX_TEXT_PAYLOAD,
    MessageType.PAUSE: 0,
    MessageType.RESUME: 0,
}


class _Ids:
    """Message ids: a counter from a random start, as Go's ``nextid``; wraps inside int64."""

    def __init__(self) -> None:
        # itertools.count's next() is atomic (one C call under the GIL, and gevent never
        # switches inside it): no lock needed.
        self._counter = itertools.count(random.getrandbits(62))

    def next(self) -> int:
        return next(self._counter) & _INT64_MAX


_ids = _Ids()


def next_id() -> int:
    return _ids.next()


class Message(NamedTuple):
    """One remotedialer message.

    :param id: the sender's message counter (informational).
    :param conn_id: the virtual connection it belongs to (0 for session-wide types).
    :param type: what it is.
    :param payload: type-specific bytes (see the module docstring).
    :param deadline: milliseconds; written for Data and Connect only.
    """

    # A NamedTuple, not a frozen dataclass: one is built per message (a third of the cost).
    id: int
    conn_id: int
    type: MessageType
    payload: bytes = b""
    deadline: int = LEGACY_DEADLINE_MS

    @classmethod
    def data(cls, conn_id: int, data: bytes) -> Message:
        return cls(next_id(), conn_id, MessageType.DATA, bytes(data))

    @classmethod
    def connect(cls, conn_id: int, proto: str, address: str, timeout: float | None = None) -> Message:
        """A Connect; ``timeout`` (seconds) travels as the deadline the bk-bcs agent dials with."""
        deadline = LEGACY_DEADLINE_MS if timeout is None else max(1, int(timeout * 1000))
        return cls(next_id(), conn_id, MessageType.CONNECT, f"{proto}/{address}".encode(), deadline)

    @classmethod
    def error(cls, conn_id: int, text: str) -> Message:
        return cls(next_id(), conn_id, MessageType.ERROR, text.encode("utf-8", "replace"))

    @classmethod
    def eof(cls, conn_id: int) -> Message:
        return cls.error(conn_id, "EOF")

    @classmethod
    def pause(cls, conn_id: int) -> Message:
        return cls(next_id(), conn_id, MessageType.PAUSE)

    @classmethod
    def resume(cls, conn_id: int) -> Message:
        return cls(next_id(), conn_id, MessageType.RESUME)

    @classmethod
    def sync_connections(cls, conn_ids: list[int]) -> Message:
        return cls(next_id(), 0, MessageType.SYNC_CONNECTIONS, encode_connection_ids(conn_ids))

    @property
    def target(self) -> tuple[str, str]:
        """``(proto, address)`` of a Connect; raises :class:`TunnelProtocolError` without a ``/``."""
        proto, sep, address = self.payload.decode("utf-8", "replace").partition("/")
        if not sep:
            raise TunnelProtocolError("connect payload is not proto/address")
        return proto, address

    @property
    def error_text(self) -> str:
        """The text of an Error as Go reads it: the first 100 bytes."""
        return self.payload[:MAX_TEXT_PAYLOAD].decode("utf-8", "replace")

    @property
    def is_eof(self) -> bool:
        return self.error_text == "EOF"

    def __repr__(self) -> str:  # payloads are connection bytes: never printed
        return f"Message(id={self.id}, conn_id={self.conn_id}, type={self.type.name}, {len(self.payload)} bytes)"


def put_varint(value: int) -> bytes:
    """Go's ``binary.PutVarint``: zig-zag, then base-128 little-endian."""
    if -64 <= value < 64:
        return _ONE_BYTE[value]  # connection ids, types: most varints
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise TunnelProtocolError("varint out of int64 range")
    return _put_varint(value)


def _put_varint(value: int) -> bytes:
    zigzag = ((value << 1) ^ (value >> 63)) & _UINT64_MASK
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


_ONE_BYTE = {value: _put_varint(value) for value in range(-64, 64)}
_LEGACY_DEADLINE = put_varint(LEGACY_DEADLINE_MS)
# Type and deadline of a Data message: the same bytes in every one.
_DATA_TAIL = put_varint(MessageType.DATA) + _LEGACY_DEADLINE


def read_varint(frame: bytes | bytearray | memoryview, offset: int) -> tuple[int, int]:
    """Go's ``binary.ReadVarint`` at ``offset``: ``(value, next offset)``."""
    result = 0
    shift = 0
    for byte in frame[offset:offset + MAX_VARINT_LEN]:
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            # Go: the 10th byte may only carry the top bit of a uint64.
            if shift == 63 and byte > 1:
                raise TunnelProtocolError("varint overflows 64 bits")
            return (result >> 1) ^ -(result & 1), offset + shift // 7 + 1
        shift += 7
    if shift < 7 * MAX_VARINT_LEN:
        raise TunnelProtocolError("truncated varint")
    raise TunnelProtocolError("varint overflows 64 bits")


def encode(message: Message) -> bytes:
    """The bytes of one binary WebSocket message, as Go's ``message.Bytes()``."""
    head = put_varint(message.id) + put_varint(message.conn_id) + put_varint(int(message.type))
    if message.type in _WITH_DEADLINE:
        head += _LEGACY_DEADLINE if message.deadline == LEGACY_DEADLINE_MS else put_varint(message.deadline)
    return head + message.payload


def encode_data(conn_id: int, data: bytes) -> bytes:
    """``encode(Message.data(conn_id, data))`` without building the message (one per request each way)."""
    return b"".join((put_varint(next_id()), put_varint(conn_id), _DATA_TAIL, data))


def decode(frame: bytes | bytearray | memoryview) -> Message:
    """The :class:`Message` in one binary WebSocket message; :class:`TunnelProtocolError` if malformed.

    An unknown type is an error here; callers that want Go's leniency (unknown
    types are ignored) catch :class:`UnknownMessageType`.
    """
    msg_id, offset = read_varint(frame, 0)
    conn_id, offset = read_varint(frame, offset)
    raw_type, offset = read_varint(frame, offset)
    mtype = _TYPES.get(raw_type)
    if mtype is None:
        raise UnknownMessageType(f"unknown message type {raw_type}")
    if mtype is MessageType.DATA:
        deadline, offset = read_varint(frame, offset)
        return Message(msg_id, conn_id, mtype, bytes(frame[offset:]), deadline)
    deadline = LEGACY_DEADLINE_MS
    if mtype in _WITH_DEADLINE:
        deadline, offset = read_varint(frame, offset)
    payload = bytes(frame[offset:])
    bound = _PAYLOAD_BOUND.get(mtype)
    if bound is not None and len(payload) > bound:
        raise TunnelProtocolError(f"{mtype.name} payload of {len(payload)} bytes exceeds {bound}")
    if mtype is MessageType.CONNECT and b"/" not in payload:
        raise TunnelProtocolError("connect payload is not proto/address")
    if mtype is MessageType.SYNC_CONNECTIONS and len(payload) % 8:
        raise TunnelProtocolError("sync payload is not a whole number of 8-byte ids")
    return Message(msg_id, conn_id, mtype, payload, deadline)


_TYPES = {int(mtype): mtype for mtype in MessageType}


class UnknownMessageType(TunnelProtocolError):
    """A well-formed header naming a type this side does not know (Go ignores those)."""


def encode_connection_ids(conn_ids: list[int]) -> bytes:
    return b"".join(struct.pack("<q", conn_id) for conn_id in conn_ids)


def iter_connection_ids(payload: bytes) -> Iterator[int]:
    """The ids of a SyncConnections payload, one at a time (a message may list 131072)."""
    if len(payload) % 8:
        raise TunnelProtocolError("sync payload is not a whole number of 8-byte ids")
    return (value for (value,) in struct.iter_unpack("<q", payload))


def decode_connection_ids(payload: bytes) -> list[int]:
    return list(iter_connection_ids(payload))
