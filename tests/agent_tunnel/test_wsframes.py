"""The WebSocket framing after the handshake (bcs_middleware.agent_tunnel.wsframes), against wsproto.

wsproto, an independent implementation, writes and reads the other end: what one
writes the other reads back the same, whole or fragmented, at every length boundary;
and every frame the rules forbid is refused with its close code before anything of
it is kept.
"""

from __future__ import annotations

import struct

import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from bcs_middleware.agent_tunnel.wsframes import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_TEXT,
    FrameError,
    Frames,
    parse_close,
)

SIZES = [0, 1, 125, 126, 65535, 65536, 1 << 20]


def _all(frames: Frames) -> list[tuple[int, bytes]]:
    out = []
    while (event := frames.next()) is not None:
        out.append(event)
    return out


@pytest.mark.parametrize("size", SIZES)
def test_what_wsproto_writes_we_read_both_roles(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    for our_client in (True, False):
        theirs = Connection(ConnectionType.SERVER if our_client else ConnectionType.CLIENT)
        ours = Frames(client=our_client, max_message=2 << 20)
        ours.feed(theirs.send(BytesMessage(data=payload)))
        assert _all(ours) == [(OP_BINARY, payload)]


@pytest.mark.parametrize("size", SIZES)
def test_what_we_write_wsproto_reads_both_roles(size: int) -> None:
    payload = b"\xa5" * size
    for our_client in (True, False):
        ours = Frames(client=our_client, max_message=2 << 20)
        theirs = Connection(ConnectionType.SERVER if our_client else ConnectionType.CLIENT)
        theirs.receive_data(ours.frame(OP_BINARY, payload))
        data = b"".join(e.data for e in theirs.events() if isinstance(e, BytesMessage))
        assert data == payload


def test_a_fragmented_message_with_a_ping_between_fed_a_byte_at_a_time() -> None:
    theirs = Connection(ConnectionType.CLIENT)
    wire = (theirs.send(BytesMessage(data=b"first ", message_finished=False))
            + theirs.send(Ping(payload=b"p"))
            + theirs.send(BytesMessage(data=b"second", message_finished=True))
            + theirs.send(BytesMessage(data=b"next")))
    ours = Frames(client=False, max_message=1024)
    events = []
    for byte in wire:
        ours.feed(bytes([byte]))
        events += _all(ours)
    assert events == [(OP_PING, b"p"), (OP_BINARY, b"first second"), (OP_BINARY, b"next")]


def test_text_and_close_reach_the_channel_as_such() -> None:
    theirs = Connection(ConnectionType.CLIENT)
    ours = Frames(client=False, max_message=1024)
    ours.feed(theirs.send(TextMessage(data="héllo")) + theirs.send(CloseConnection(code=4001, reason="replaced")))
    (text_op, text), (close_op, close) = _all(ours)
    assert (text_op, text) == (OP_TEXT, "héllo".encode())
    assert close_op == OP_CLOSE and parse_close(close) == (4001, "replaced")


def test_our_close_frame_is_read_by_wsproto_and_its_reason_cut_at_a_character() -> None:
    ours = Frames(client=True, max_message=1024)
    frame = ours.close_frame(1000, "é" * 100)  # 200 bytes of UTF-8: cut to fit 125
    theirs = Connection(ConnectionType.SERVER)
    theirs.receive_data(frame)
    (event,) = [e for e in theirs.events() if isinstance(e, CloseConnection)]
    assert event.code == 1000 and event.reason == "é" * 61


def _server_frame(first: int, second: int, rest: bytes = b"", *, key: bytes = b"\0\0\0\0") -> bytes:
    """A frame as a client sends it (masked with ``key``), header bytes given raw."""
    return bytes((first, second | 0x80)) + rest + key


@pytest.mark.parametrize(("wire", "code"), [
    pytest.param(bytes((0xC2, 0x80)) + b"\0\0\0\0", 1002, id="reserved-bit"),
    pytest.param(bytes((0x83, 0x80)) + b"\0\0\0\0", 1002, id="unknown-opcode"),
    pytest.param(bytes((0x82, 0x05)) + b"hello", 1002, id="unmasked-from-a-client"),
    pytest.param(bytes((0x82, 0xFE)) + struct.pack("!H", 10) + b"\0" * 14, 1002, id="length-not-shortest-16"),
    pytest.param(bytes((0x82, 0xFF)) + struct.pack("!Q", 200) + b"\0" * 4, 1002, id="length-not-shortest-64"),
    pytest.param(bytes((0x82, 0xFF)) + struct.pack("!Q", 1 << 63), 1002, id="length-top-bit"),
    pytest.param(bytes((0x89, 0xFE)) + struct.pack("!H", 126) + b"\0" * 130, 1002, id="control-over-125"),
    pytest.param(bytes((0x09, 0x80)) + b"\0\0\0\0", 1002, id="fragmented-control"),
    pytest.param(bytes((0x80, 0x80)) + b"\0\0\0\0", 1002, id="continuation-without-start"),
    pytest.param(bytes((0x02, 0x80)) + b"\0\0\0\0" + bytes((0x82, 0x80)) + b"\0\0\0\0", 1002,
                 id="new-message-inside-fragmented"),
])
def test_frames_the_rules_forbid_are_refused_with_their_code(wire: bytes, code: int) -> None:
    ours = Frames(client=False, max_message=1 << 20)
    ours.feed(wire)
    with pytest.raises(FrameError) as refused:
        _all(ours)
    assert refused.value.code == code


def test_a_masked_frame_from_the_server_is_refused() -> None:
    ours = Frames(client=True, max_message=1024)
    ours.feed(bytes((0x82, 0x81)) + b"\1\2\3\4" + b"x")
    with pytest.raises(FrameError) as refused:
        ours.next()
    assert refused.value.code == 1002


def test_an_oversized_message_is_refused_from_its_header_before_its_payload_arrives() -> None:
    ours = Frames(client=False, max_message=1024)
    ours.feed(bytes((0x82, 0xFF)) + struct.pack("!Q", 1 << 40))  # a terabyte announced, nothing sent
    with pytest.raises(FrameError) as refused:
        ours.next()
    assert refused.value.code == 1009
    fragmented = Frames(client=False, max_message=1024)
    theirs = Connection(ConnectionType.CLIENT)
    fragmented.feed(theirs.send(BytesMessage(data=b"x" * 1000, message_finished=False)))
    assert fragmented.next() is None
    fragmented.feed(theirs.send(BytesMessage(data=b"x" * 100, message_finished=True)))
    with pytest.raises(FrameError) as refused:
        fragmented.next()
    assert refused.value.code == 1009


@pytest.mark.parametrize(("payload", "code"), [
    (b"\x03", 1002), (struct.pack("!H", 999), 1002), (struct.pack("!H", 1004), 1002),
    (struct.pack("!H", 1005), 1002), (struct.pack("!H", 1006), 1002), (struct.pack("!H", 1015), 1002),
    (struct.pack("!H", 2000), 1002), (struct.pack("!H", 5000), 1002), (struct.pack("!H", 1000) + b"\xff", 1007),
])
def test_malformed_close_frames_are_refused(payload: bytes, code: int) -> None:
    with pytest.raises(FrameError) as refused:
        parse_close(payload)
    assert refused.value.code == code


def test_an_empty_close_has_no_status() -> None:
    assert parse_close(b"") == (1005, "")
