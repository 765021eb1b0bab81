"""``PooledTransport``'s response head reading and request head building, over real sockets.

The reader hands back every field as received, the end-to-end ones a proxy
relays, and the framing it needs; field names it has seen before come from a
cache, which must never change an answer.
"""

from __future__ import annotations

import random
import string

import pytest

from bcs_middleware.core.environ import Upstream
from bcs_middleware.core.errors import BadRequest
from bcs_middleware.outbound.causes import (
    ConnectError,
    OutboundError,
    RemoteProtocolError,
    TLSError,
    UnusableAddress,
    as_http_error,
)
from bcs_middleware.outbound.codec import ResponseReader, UpstreamProtocolError
from bcs_middleware.outbound.http11 import UpstreamResponse
from bcs_middleware.outbound.transport import PooledTransport

from .test_transport_timeouts import _stalling


def _send(answer: bytes) -> tuple[UpstreamResponse, bytes, int]:
    """The response, its body, and how many connections went back to the pool."""
    transport = PooledTransport(read_timeout=5)
    try:
        with _stalling(answer) as server:
            resp = transport.send(Upstream(base_urls=(server.url,), path="/x"), "GET", [], None, None)
            body = resp.read()
            resp.release_conn()
            return resp, body, len(transport._pool)
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


def test_the_same_length_twice_is_refused_too() -> None:
    # RFC 9110 §8.6 lets a recipient accept identical lengths; refusing leaves no room to disagree.
    with pytest.raises(RemoteProtocolError, match="Duplicate Content-Length"):
        _send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok")


def test_two_different_lengths_are_a_502() -> None:
    with pytest.raises(RemoteProtocolError):
        _send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 20\r\n\r\nok")


def test_transfer_encoding_fields_are_combined_before_the_chunked_only_rule() -> None:
    with pytest.raises(RemoteProtocolError, match="other than chunked"):
        _send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    _, body, idle = _send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
                             b"3\r\nabc\r\n0\r\n\r\n")
    assert body == b"abc"
    assert idle == 1


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
        with pytest.raises(RemoteProtocolError):
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


def _head(line: bytes) -> list[tuple[str, str]] | None:
    reader = ResponseReader()
    try:
        reader.feed(b"HTTP/1.1 200 OK\r\n" + line + b"\r\nContent-Length: 0\r\n\r\n")
    except UpstreamProtocolError:
        return None
    assert reader.complete
    return reader.headers[:-1]


def test_random_lines_are_read_the_same_the_second_time_or_refused_every_time() -> None:
    rng = random.Random(4)  # noqa: S311 - reproducible test data, not secrets
    alphabet = string.ascii_letters + string.digits + " \t:-_=,;\"'/\r\n\x00"
    accepted = 0
    for _ in range(3000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.choice((3, 20, 80, 300)))).encode()
        first = _head(line)
        assert _head(line) == first  # the name cache never changes an answer
        if first is None:
            continue
        accepted += 1
        ((name, value),) = first
        assert line.startswith(name.encode() + b":")
        assert value == line.split(b":", 1)[1].strip(b" \t").decode()
        assert not any(c in value for c in "\r\n\x00")
    assert accepted > 20  # some lines were well formed


@pytest.mark.parametrize("base, ca_pem, cause", [
    pytest.param("http://127.0.0.1:99999", None, UnusableAddress, id="port-out-of-range"),
    pytest.param("http://[::1", None, UnusableAddress, id="bad-ipv6-literal"),
    pytest.param("http://exa\x00mple", None, ConnectError, id="nul-in-host"),
    pytest.param("https://{server}", "not a certificate", TLSError, id="garbage-ca"),
    pytest.param("https://{server}", "caf\u00e9 \u2603", TLSError, id="non-ascii-ca"),
])
def test_foreign_errors_become_a_cause_and_a_502_never_anything_else(base: str, ca_pem: str | None,
                                                                     cause: type[OutboundError]) -> None:
    transport = PooledTransport(read_timeout=5, connect_timeout=2)
    with _stalling(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") as server:
        url = base.replace("{server}", f"127.0.0.1:{server.port}")
        with pytest.raises(cause) as caught:
            transport.send(Upstream(base_urls=(url,), path="/x", ca_pem=ca_pem), "GET", [], None, None)
        assert as_http_error(caught.value).status == 502


def test_a_header_value_outside_latin_1_is_sent_as_utf_8() -> None:
    transport = PooledTransport(read_timeout=5)
    with _stalling(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") as server:
        resp = transport.send(Upstream(base_urls=(server.url,), path="/x"), "GET",
                              [("Impersonate-User", "\u7528\u6237")], None, None)
        assert resp.status == 200
    transport.close()


@pytest.mark.parametrize("pieces", [1, 7, 64])
def test_a_head_is_refused_past_256_kib_wherever_the_reads_end(pieces: int) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-P%d: %s\r\n" % (i, b"b" * 4000) for i in range(64))
    near_limit = head + b"X-Last: " + b"c" * (256 * 1024 - len(head) - 30) + b"\r\n\r\n"
    too_large = head + b"".join(b"X-Q%d: %s\r\n" % (i, b"b" * 4000) for i in range(64)) + b"\r\n"
    for answer, refused in ((near_limit, False), (too_large, True)):
        reader = ResponseReader()
        size = -(-len(answer) // pieces)
        try:
            for start in range(0, len(answer), size):
                reader.feed(answer[start:start + size])
        except UpstreamProtocolError as exc:
            assert refused and "too large" in str(exc)
        else:
            assert not refused and reader.head_complete
