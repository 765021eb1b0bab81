"""remotedialer framing: byte strings worked out by hand from Go's ``message.go`` and ``binary.PutVarint``."""

from __future__ import annotations

import random

import pytest

from bcs_middleware.agent_tunnel.frames import (
    LEGACY_DEADLINE_MS,
    Message,
    MessageType,
    TunnelProtocolError,
    UnknownMessageType,
    decode,
    decode_connection_ids,
    encode,
    put_varint,
    read_varint,
)

# zig-zag: 1 -> 2 (0x02); 15000 -> 30000 = 0b1_1101010_0110000 -> B0 EA 01
CONNECT = bytes.fromhex("02 02 04 b0ea01") + b"tcp/10.0.0.1:6443"
# id 300 -> 600 = 0b100_1011000 -> D8 04; conn 5 -> 0A; Data 1 -> 02; deadline B0 EA 01
DATA = bytes.fromhex("d804 0a 02 b0ea01") + b"hi"
# Error: no deadline field
ERROR_EOF = bytes.fromhex("04 0e 06") + b"EOF"
# conn 64 -> 128 -> 80 01; Pause 6 -> 0C
PAUSE = bytes.fromhex("00 8001 0c")
RESUME = bytes.fromhex("00 8001 0e")
SYNC = bytes.fromhex("06 00 10") + (1).to_bytes(8, "little") + (2).to_bytes(8, "little")


@pytest.mark.parametrize(("value", "wire"), [
    pytest.param(0, "00", id="zero"),
    pytest.param(-1, "01", id="minus-one"),
    pytest.param(1, "02", id="one"),
    pytest.param(-64, "7f", id="minus-64"),
    pytest.param(64, "8001", id="64"),
    pytest.param(15000, "b0ea01", id="legacy-deadline"),
    pytest.param((1 << 63) - 1, "feffffffffffffffff01", id="int64-max"),
    pytest.param(-(1 << 63), "ffffffffffffffffff01", id="int64-min"),
])
def test_varints_are_gos_zigzag_putvarint(value: int, wire: str) -> None:
    assert put_varint(value).hex() == wire
    assert read_varint(bytes.fromhex(wire), 0) == (value, len(wire) // 2)


@pytest.mark.parametrize(("message", "wire"), [
    pytest.param(Message(1, 1, MessageType.CONNECT, b"tcp/10.0.0.1:6443"), CONNECT, id="connect"),
    pytest.param(Message(300, 5, MessageType.DATA, b"hi"), DATA, id="data"),
    pytest.param(Message(2, 7, MessageType.ERROR, b"EOF"), ERROR_EOF, id="error-eof"),
    pytest.param(Message(0, 64, MessageType.PAUSE), PAUSE, id="pause"),
    pytest.param(Message(0, 64, MessageType.RESUME), RESUME, id="resume"),
    pytest.param(Message(3, 0, MessageType.SYNC_CONNECTIONS, SYNC[3:]), SYNC, id="sync-connections"),
])
def test_messages_encode_and_decode_as_go(message: Message, wire: bytes) -> None:
    assert encode(message) == wire
    assert decode(wire) == message


def test_connect_helper_names_proto_and_address_and_carries_the_dial_timeout() -> None:
    message = Message.connect(9, "tcp", "10.0.0.1:6443", timeout=2.5)
    assert message.target == ("tcp", "10.0.0.1:6443")
    assert message.deadline == 2500
    wire = encode(message)
    assert wire.endswith(bytes.fromhex("12 04 8827") + b"tcp/10.0.0.1:6443")  # conn 9->18, 2500->5000
    assert decode(wire).target == ("tcp", "10.0.0.1:6443")
    assert Message.connect(1, "tcp", "a:1").deadline == LEGACY_DEADLINE_MS


def test_error_text_is_read_as_go_reads_it() -> None:
    assert decode(ERROR_EOF).is_eof
    long = decode(encode(Message.error(1, "x" * 500)))
    assert long.error_text == "x" * 100 and not long.is_eof
    assert decode(encode(Message.error(1, "dial tcp: connection refused"))).error_text == "dial tcp: connection refused"


def test_sync_connection_ids_round_trip() -> None:
    ids = [1, 2, (1 << 63) - 1]
    assert decode_connection_ids(decode(encode(Message.sync_connections(ids))).payload) == ids


def test_repr_never_shows_the_payload() -> None:
    assert "secret" not in repr(Message.data(1, b"Authorization: Bearer secret"))


@pytest.mark.parametrize(("wire", "fragment"), [
    pytest.param(b"", "truncated", id="empty"),
    pytest.param(b"\x02", "truncated", id="id-only"),
    pytest.param(b"\x02\x02", "truncated", id="no-type"),
    pytest.param(bytes.fromhex("02 02 02"), "truncated", id="data-without-deadline"),
    pytest.param(bytes.fromhex("02 02 02 80"), "truncated", id="deadline-cut"),
    pytest.param(b"\xff" * 11, "overflows", id="eleven-byte-varint"),
    pytest.param(b"\xff" * 9 + b"\x02", "overflows", id="tenth-byte-too-big"),
    pytest.param(bytes.fromhex("02 02 04 00") + b"no-slash", "proto/address", id="connect-without-slash"),
    pytest.param(bytes.fromhex("02 02 04 00") + b"tcp/" + b"a" * 263, "exceeds 266", id="connect-too-long"),
    pytest.param(bytes.fromhex("02 02 0c") + b"x", "exceeds 0", id="pause-with-payload"),
    pytest.param(bytes.fromhex("02 00 08") + b"x" * 101, "exceeds 100", id="add-client-too-long"),
    pytest.param(bytes.fromhex("02 00 10") + b"x" * 7, "8-byte", id="sync-ragged"),
])
def test_malformed_frames_raise_a_typed_error(wire: bytes, fragment: str) -> None:
    with pytest.raises(TunnelProtocolError, match=fragment):
        decode(wire)


@pytest.mark.parametrize("mtype", [0, 9, -1, 1 << 40])
def test_unknown_types_are_their_own_error(mtype: int) -> None:
    with pytest.raises(UnknownMessageType):
        decode(put_varint(1) + put_varint(1) + put_varint(mtype))


def test_varint_out_of_int64_is_refused_when_encoding() -> None:
    with pytest.raises(TunnelProtocolError):
        put_varint(1 << 63)


def test_random_bytes_never_crash_the_decoder() -> None:
    rng = random.Random(18)  # noqa: S311 - reproducible fuzzing, not a secret
    for _ in range(20_000):
        wire = rng.randbytes(rng.randrange(0, 40))
        try:
            decode(wire)
        except TunnelProtocolError:
            pass
