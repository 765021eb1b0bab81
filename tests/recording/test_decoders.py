"""The stream decoders and the asciicast encoder, fed the way a splice feeds them: any split."""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest

from bcs_middleware.recording import asciicast
from bcs_middleware.recording.cast import CastEncoder
from bcs_middleware.recording.spdy import DICTIONARY, SpdyDecoder
from bcs_middleware.recording.terminal import exit_code_of
from bcs_middleware.recording.websocket import ChannelDecoder, records
from tests.support.websocket import frame


def masked(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """A client's frame (RFC 6455 5.3: masked)."""
    key = os.urandom(4)
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    size = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 65536:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    return head + key + body


def feed_split(decoder: ChannelDecoder | SpdyDecoder, to_upstream: bool, data: bytes, step: int) -> list:
    out = []
    for at in range(0, len(data), step):
        out += decoder.feed(to_upstream, data[at:at + step])
    return out


@pytest.mark.parametrize("step", [1, 3, 7, 4096])
def test_websocket_channels_survive_any_split(step: int) -> None:
    stream = (frame(0x2, b"\x01hello ") + bytes([0x89, 0x02]) + b"hi"  # a ping between messages
              + frame(0x2, b"\x02err") + frame(0x2, b"\x03" + json.dumps({"status": "Success"}).encode()))
    pieces = feed_split(ChannelDecoder(), False, stream, step)
    joined: dict[str, bytes] = {}
    for piece in pieces:
        joined[piece.stream] = joined.get(piece.stream, b"") + piece.data
    assert joined == {"stdout": b"hello ", "stderr": b"err", "error": b'{"status": "Success"}'}


def test_websocket_client_frames_are_unmasked_and_fragments_joined() -> None:
    decoder = ChannelDecoder()
    data = (masked(0x2, b"\x00typed ", fin=False) + masked(0x0, b"more")
            + masked(0x2, b'\x04{"Width":90,"Height":20}') + masked(0x2, b"\xff\x00"))
    pieces = feed_split(decoder, True, data, 5)
    assert b"".join(p.data for p in pieces if p.stream == "stdin") == b"typed more"
    assert b"".join(p.data for p in pieces if p.stream == "resize") == b'{"Width":90,"Height":20}'
    assert [p.stream for p in pieces if p.end] == ["stdin"]  # v5: the client closed stdin


def test_websocket_subprotocols_recorded() -> None:
    assert records("v5.channel.k8s.io") and records("v4.channel.k8s.io") and records("channel.k8s.io")
    assert not records("base64.channel.k8s.io") and not records("v4.base64.channel.k8s.io")


def _headers_block(headers: dict[str, str]) -> bytes:
    block = struct.pack(">I", len(headers))
    for name, value in headers.items():
        block += struct.pack(">I", len(name)) + name.encode() + struct.pack(">I", len(value)) + value.encode()
    return block


def test_spdy_streams_are_named_by_their_syn_stream() -> None:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, zdict=DICTIONARY)

    def syn(stream_id: int, kind: str) -> bytes:
        block = deflate.compress(_headers_block({"streamType": kind})) + deflate.flush(zlib.Z_SYNC_FLUSH)
        payload = struct.pack(">IIBB", stream_id, 0, 0, 0) + block
        return struct.pack(">HHI", 0x8003, 1, len(payload)) + payload

    def data(stream_id: int, payload: bytes, fin: bool = False) -> bytes:
        return struct.pack(">II", stream_id, (1 << 24 if fin else 0) | len(payload)) + payload

    decoder = SpdyDecoder()
    up = syn(1, "error") + syn(3, "stdin") + syn(5, "stdout") + syn(7, "resize") + data(3, b"ls\r") \
        + data(7, b'{"Width":80,"Height":24}\n')
    down = data(5, b"file\r\n") + data(1, json.dumps(FAILURE).encode(), fin=True)
    pieces = feed_split(decoder, True, up, 3) + feed_split(decoder, False, down, 2)
    assert decoder.broken == ""
    assert b"".join(p.data for p in pieces if p.stream == "stdin") == b"ls\r"
    assert b"".join(p.data for p in pieces if p.stream == "stdout") == b"file\r\n"
    assert exit_code_of(b"".join(p.data for p in pieces if p.stream == "error")) == 7


FAILURE = {"status": "Failure", "reason": "NonZeroExitCode",
           "details": {"causes": [{"reason": "ExitCode", "message": "7"}]}}


def test_a_character_cut_across_frames_is_one_character_and_stdin_stays_out() -> None:
    encoder = CastEncoder("websocket", started=100.0, timestamp=1_700_000_000)
    check = "\u2713".encode()
    text = encoder.encode([(100.1, True, masked(0x2, b'\x04{"Width":120,"Height":40}')),
                           (100.2, False, frame(0x2, b"\x01ok " + check[:1])),
                           (100.3, False, frame(0x2, b"\x01" + check[1:])),
                           (100.4, True, masked(0x2, b"\x00secret\r"))])
    text += encoder.finish(101.0)
    header, events = asciicast.parse(text.splitlines(keepends=True))
    listed = list(events)
    assert (header.width, header.height) == (120, 40)
    assert "".join(e.data for e in listed if e.code == "o") == "ok \u2713"
    assert [e.code for e in listed] == ["r", "o", "o"] and "secret" not in text
    assert [round(e.time, 3) for e in listed] == [0.1, 0.2, 0.3]


def test_exit_codes_as_the_kubelet_reports_them() -> None:
    assert exit_code_of(b'{"metadata":{},"status":"Success"}') == 0
    assert exit_code_of(json.dumps(FAILURE).encode()) == 7
    assert exit_code_of(b'{"status":"Failure","reason":"InternalError","message":"boom"}') is None
    assert exit_code_of(b"not json") is None
