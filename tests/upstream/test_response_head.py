"""``PooledTransport``'s one-pass response head parser and request head builder, over real sockets.

The parser hands back every field as received, the end-to-end ones a proxy
relays, and the framing it needs; lines it has seen before come from a cache,
which must never change an answer.
"""

from __future__ import annotations

import random
import string

import pytest

from bcs_middleware.environ import Upstream
from bcs_middleware.errors import BadGateway, BadRequest
from bcs_middleware.upstream.transport import (
    PooledTransport,
    UpstreamProtocolError,
    UpstreamResponse,
    _field,
    _parse_field,
)

from .test_transport_timeouts import _stalling


def _send(answer: bytes) -> tuple[UpstreamResponse, bytes, int]:
    """The response, its body, and how many connections went back to the pool."""
    transport = PooledTransport(read_timeout=5)
    try:
        with _stalling(answer) as server:
            resp = transport.send(Upstream(base_urls=(server.url,), path="/x"), "GET", [], None, None)
            body = resp.read()
            resp.release_conn()
            return resp, body, sum(len(conns) for conns in transport._idle.values())
    finally:
        transport.close()


def test_fields_in_order_and_the_relayable_ones_without_hop_by_hop() -> None:
    resp, body, _ = _send(
        b"HTTP/1.1 200 OK\r\n"
        b"Server: up\r\n"
        b"Connection: keep-alive, X-Private\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"X-Private: hop\r\n"
        b"Set-Cookie: a=1\r\n"
        b"Set-Cookie: b=2\r\n"
        b"content-length: 5\r\n"
        b"Proxy-Connection: x\r\n"
        b"Warning:   299 - \"padded\"  \r\n"
        b"\r\nhello"
    )
    assert body == b"hello"
    assert resp.headers == [
        ("Server", "up"), ("Connection", "keep-alive, X-Private"), ("Keep-Alive", "timeout=5"),
        ("X-Private", "hop"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
        ("content-length", "5"), ("Proxy-Connection", "x"), ("Warning", '299 - "padded"'),
    ]
    assert resp.end_to_end_headers == [
        ("Server", "up"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
        ("content-length", "5"), ("Warning", '299 - "padded"'),
    ]


def test_the_same_length_twice_is_accepted() -> None:
    _, body, _ = _send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok")
    assert body == b"ok"


def test_two_different_lengths_are_a_502() -> None:
    with pytest.raises(BadGateway):
        _send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 20\r\n\r\nok")


def test_transfer_encoding_fields_are_combined_and_chunked_last_wins() -> None:
    resp, body, _ = _send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 99\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert body == b"abc"  # chunked framing, not the Content-Length
    assert [v for n, v in resp.headers if n == "Transfer-Encoding"] == ["gzip", "chunked"]


@pytest.mark.parametrize("connection, pooled", [
    ("keep-alive", True), ("Keep-Alive, Close", False), ("close", False), ("closed-caption", True),
])
def test_connection_close_is_a_token_not_a_substring(connection: str, pooled: bool) -> None:
    _, _, idle = _send(f"HTTP/1.1 200 OK\r\nConnection: {connection}\r\n"
                       "Content-Length: 0\r\n\r\n".encode())
    assert idle == (1 if pooled else 0)


@pytest.mark.parametrize("line", ["Bad Header Without Colon", " Leading: space", "Trailing : space",
                                  ": no name"])
def test_a_malformed_line_is_a_502_every_time(line: str) -> None:
    for _ in range(2):  # the second time too: failures are never cached
        with pytest.raises(BadGateway):
            _send(f"HTTP/1.1 200 OK\r\n{line}\r\nContent-Length: 0\r\n\r\n".encode())


@pytest.mark.parametrize("name, value", [("X-Ok", "a\r\nX-Injected: 1"), ("X-Ok", "a\nb"),
                                         ("X-Ok", "a\rb"), ("X-Bad\r\nX-Injected", "1")])
def test_a_line_break_in_a_request_field_is_a_400_and_nothing_is_sent(name: str, value: str) -> None:
    transport = PooledTransport(read_timeout=5)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    with _stalling(answer) as server, pytest.raises(BadRequest) as info:
        transport.send(Upstream(base_urls=(server.url,), path="/x"), "GET",
                       [("X-Fine", "yes"), (name, value)], None, None)
    assert "X-Bad" in str(info.value) or "X-Ok" in str(info.value)
    assert transport.connections_opened == 0


def test_cached_and_uncached_parses_agree_on_random_lines() -> None:
    rng = random.Random(4)  # noqa: S311 - reproducible test data, not secrets
    alphabet = string.ascii_letters + string.digits + " \t:-_=,;\"'/"
    for _ in range(3000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.choice((3, 20, 80, 300))))
        try:
            expected = _parse_field(line)
        except UpstreamProtocolError:
            with pytest.raises(UpstreamProtocolError):
                _field(line)
            continue
        assert _field(line) == expected
        assert _field(line) == expected  # from the cache this time
