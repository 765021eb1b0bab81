"""The stream decoders and the asciicast encoder, fed the way a splice feeds them: any split."""

from __future__ import annotations

import base64
import json
import os
import struct
import zlib

import pytest

from bcs_middleware.recording import asciicast
from bcs_middleware.recording.cast import CastEncoder
from bcs_middleware.recording.spdy import DICTIONARY, SpdyDecoder
from bcs_middleware.recording.terminal import exit_code_of
from bcs_middleware.recording.websocket import MESSAGE_HOLD, ChannelDecoder, records
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


@pytest.mark.parametrize("protocol", ["", "channel.k8s.io", "base64.channel.k8s.io", "v4.channel.k8s.io",
                                      "v4.base64.channel.k8s.io", "v5.channel.k8s.io"])
def test_every_subprotocol_the_apiserver_answers_exec_with_is_recorded(protocol: str) -> None:
    assert records(protocol)


@pytest.mark.parametrize("protocol", ["v6.channel.k8s.io", "V4.Channel.K8s.io", "v5.base64.channel.k8s.io", "tty"])
def test_a_subprotocol_the_apiserver_does_not_accept_is_not_guessed_at(protocol: str) -> None:
    # wsstream's handshake matches names exactly: anything else is no framing the recorder may assume.
    assert not records(protocol)


def b64_message(channel: int, data: bytes) -> bytes:
    return bytes([ord("0") + channel]) + base64.b64encode(data)


@pytest.mark.parametrize("step", [1, 2, 5, 4096])
def test_base64_channels_survive_any_split(step: int) -> None:
    # conn.go's base64 codec: TEXT frames, '0'+channel, then standard base64 of the data.
    check = "\u2713".encode()
    down = (frame(0x1, b"1") + frame(0x1, b64_message(1, b"hello " + check)) + bytes([0x89, 0x01]) + b"x"
            + frame(0x1, b64_message(2, b"err")) + frame(0x1, b64_message(3, b'{"status":"Success"}')))
    up = masked(0x1, b64_message(4, b'{"Width":90,"Height":20}')) + masked(0x1, b64_message(0, b"ls\r"))
    decoder = ChannelDecoder("v4.base64.channel.k8s.io")
    pieces = feed_split(decoder, False, down, step) + feed_split(decoder, True, up, step)
    joined: dict[str, bytes] = {}
    for piece in pieces:
        joined[piece.stream] = joined.get(piece.stream, b"") + piece.data
    assert joined == {"stdout": b"hello " + check, "stderr": b"err", "error": b'{"status":"Success"}',
                      "resize": b'{"Width":90,"Height":20}', "stdin": b"ls\r"}


def test_a_fragmented_base64_message_is_decoded_whole() -> None:
    # The quanta do not line up with the fragments: the message, not the frame, is the base64 text.
    encoded = base64.b64encode(b"split across fragments")
    data = masked(0x1, b"0" + encoded[:5], fin=False) + masked(0x0, encoded[5:11], fin=False) \
        + masked(0x0, encoded[11:])
    pieces = feed_split(ChannelDecoder("base64.channel.k8s.io"), True, data, 3)
    assert b"".join(p.data for p in pieces if p.stream == "stdin") == b"split across fragments"


def test_a_base64_message_the_apiserver_drops_is_not_recorded() -> None:
    # DataFromSocket: a message that is not valid base64 reaches no channel, not even its valid start.
    bad = masked(0x1, b"0" + base64.b64encode(b"looks fine") + b"!!!!")
    unpadded = masked(0x1, b"0" + base64.b64encode(b"abcd")[:-1])
    good = masked(0x1, b64_message(0, b"next"))
    pieces = ChannelDecoder("v4.base64.channel.k8s.io").feed(True, bad + unpadded + good)
    assert [(p.stream, p.data) for p in pieces] == [("stdin", b"next")]


def test_line_breaks_in_base64_are_skipped_as_go_skips_them() -> None:
    encoded = base64.encodebytes(b"x" * 100)  # a line break every 76 characters
    pieces = ChannelDecoder("base64.channel.k8s.io").feed(False, frame(0x1, b"1" + encoded))
    assert b"".join(p.data for p in pieces) == b"x" * 100


def test_a_base64_message_longer_than_the_hold_is_decoded_as_it_comes() -> None:
    data = os.urandom(MESSAGE_HOLD)  # ~87 KiB of base64: more than is held
    message = frame(0x1, b64_message(1, data))
    decoder = ChannelDecoder("v4.base64.channel.k8s.io")
    cut = MESSAGE_HOLD + 100  # past the hold, well before the end
    first = decoder.feed(False, message[:cut])
    assert sum(len(p.data) for p in first) >= MESSAGE_HOLD // 4 * 3 - 3  # not held to the end
    rest = decoder.feed(False, message[cut:])
    assert b"".join(p.data for p in first + rest) == data


def test_binary_channel_protocols_do_not_decode_base64() -> None:
    pieces = ChannelDecoder("v5.channel.k8s.io").feed(False, frame(0x2, b"\x01" + base64.b64encode(b"raw")))
    assert b"".join(p.data for p in pieces) == base64.b64encode(b"raw")


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


def test_the_cast_of_a_base64_session_holds_what_the_pod_sent() -> None:
    encoder = CastEncoder("websocket", started=100.0, timestamp=1_700_000_000, subprotocol="v4.base64.channel.k8s.io")
    text = encoder.encode([(100.1, True, masked(0x1, b64_message(4, b'{"Width":120,"Height":40}'))),
                           (100.2, False, frame(0x1, b64_message(1, "caf\u00e9 ".encode()))),
                           (100.3, True, masked(0x1, b64_message(0, b"secret\r"))),
                           (100.4, False, frame(0x1, b64_message(3, json.dumps(FAILURE).encode())))])
    text += encoder.finish(101.0)
    header, events = asciicast.parse(text.splitlines(keepends=True))
    listed = list(events)
    assert (header.width, header.height) == (120, 40)
    assert [(e.code, e.data) for e in listed] == [("r", "120x40"), ("o", "caf\u00e9 ")]
    assert "secret" not in text and encoder.exit_code == 7
