"""The proxy refuses every malformed or ambiguous upstream answer, and keeps the legitimate edge cases working.

Behind a real gunicorn serving ``upstream_proxy``, a raw-socket upstream sends exact
bytes. A refused answer must come back as a well framed ``502`` naming the
upstream (never a ``500``, never a relayed frame the client would read
differently), and the upstream connection that carried it must be closed by the
proxy — never pooled, never used for the next request.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support.servers import ServerProcess, gunicorn

from .conftest import _env

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


class RawUpstream:
    """Answers ``GET /<case>/...`` with ``answers[case]``, byte for byte, and records each connection.

    After an answer it reads on: the next request, or the proxy closing the connection.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.answers: dict[str, bytes] = {"ok": OK}
        self.close_after: set[str] = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        #: (connection number, method, path, request body) per request, in order.
        self.seen: list[tuple[int, str, str, bytes]] = []
        self.closed_by_peer: set[int] = set()
        self.connections = 0
        self.socks: list[socket.socket] = []
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.stopping:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
                self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock, number), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        sock.settimeout(30)
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    piece = sock.recv(65536)
                    if not piece:
                        with self.lock:
                            self.closed_by_peer.add(number)
                        return
                    buf += piece
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                fields = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
                body, buf = self._body(sock, fields, buf)
                with self.lock:
                    self.seen.append((number, method, path, body))
                case = path.strip("/").split("/")[0]
                sock.sendall(self.answers.get(case, OK))
                if case in self.close_after:
                    return
        except OSError:
            with self.lock:
                self.closed_by_peer.add(number)
        finally:
            sock.close()

    @staticmethod
    def _body(sock: socket.socket, fields: dict[str, str], buf: bytes) -> tuple[bytes, bytes]:
        if "content-length" in fields:
            size = int(fields["content-length"])
            while len(buf) < size:
                buf += sock.recv(65536)
            return buf[:size], buf[size:]
        if fields.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in buf:
                    buf += sock.recv(65536)
                size_line, buf = buf.split(b"\r\n", 1)
                size = int(size_line, 16)
                while len(buf) < size + 2:
                    buf += sock.recv(65536)
                body, buf = body + buf[:size], buf[size + 2:]
                if size == 0:
                    return body, buf
        return b"", buf

    def connection_of(self, path: str) -> int:
        with self.lock:
            return next(number for number, _, seen, _ in reversed(self.seen) if seen == path)

    def requests_to(self, path: str) -> int:
        with self.lock:
            return sum(1 for _, _, seen, _ in self.seen if seen == path)

    def wait_closed(self, number: int, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if number in self.closed_by_peer:
                    return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()
        with self.lock:
            for sock in self.socks:
                try:
                    sock.close()
                except OSError:
                    pass


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def raw() -> Iterator[RawUpstream]:
    server = RawUpstream()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def raw_tls(ca: trustme.CA) -> Iterator[RawUpstream]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    server = RawUpstream(tls=ctx)
    yield server
    server.stop()


def _proxy(tmp: Path, upstream: str, extra: str = "") -> ServerProcess:
    ini = tmp / "proxy.ini"
    ini.write_text(
        "[app:main]\n"
        "use = egg:bcs-middleware#upstream_proxy\n"
        f"upstream = {upstream}\n"
        "connect_timeout = 2s\n"
        "read_timeout = 5s\n"
        "stream_idle_timeout = 5s\n" + extra
    )
    return gunicorn(str(ini), env=_env(), workers=1, threads=4)


@pytest.fixture(scope="module")
def proxy(raw: RawUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _proxy(tmp_path_factory.mktemp("codec"), raw.url)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy_tls(raw_tls: RawUpstream, ca: trustme.CA,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("codec-tls")
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    server = _proxy(tmp, raw_tls.url, f"ca_file = {tmp / 'ca.pem'}\n")
    yield server
    server.stop()


def _logged(proxy: ServerProcess, text: str, times: int = 1, timeout: float = 5.0) -> bool:
    """Whether the proxy's log holds ``text`` (the detail of a refused answer) ``times`` times."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proxy.output().count(text) >= times:
            return True
        time.sleep(0.05)
    return False


def _get(proxy: ServerProcess, path: str, method: str = "GET",
         conn: http.client.HTTPConnection | None = None) -> tuple[int, dict[str, str], bytes]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=15)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        if own:
            conn.close()


# Each answer must be refused: (id, bytes). Every one keeps its connection open
# afterwards, so only the proxy can close it.
MALFORMED = [
    ("cl-and-te", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"5\r\nhello\r\n0\r\n\r\n"),
    ("te-and-cl", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 30\r\n\r\n"
                  b"5\r\nhello\r\n0\r\n\r\n"),
    ("chunk-size-0x5", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n"),
    ("chunk-size-0_5", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0_5\r\nhello\r\n0\r\n\r\n"),
    ("chunk-size-space", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n"),
    ("chunk-size-negative", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"),
    ("chunk-without-crlf", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"),
    ("cl-plus-5", b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"),
    ("cl-list", b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello"),
    ("cl-negative", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nhello"),
    ("cl-twice-differing", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
    ("cl-twice-same", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
    ("te-gzip-chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                        b"5\r\nhello\r\n0\r\n\r\n"),
    ("te-chunked-gzip", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nhello"),
    ("te-gzip-then-chunked-fields", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n"
                                    b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    ("te-chunked-twice", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
                         b"5\r\nhello\r\n0\r\n\r\n"),
    ("te-in-http10", b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    ("status-2000", b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n"),
    ("status-non-ascii-digits", "HTTP/1.1 2\u0660\u0660 OK\r\nContent-Length: 0\r\n\r\n".encode()),
    ("status-superscript-digits", "HTTP/1.1 2²² OK\r\nContent-Length: 0\r\n\r\n".encode()),
    ("status-099", b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n"),
    ("status-600", b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n"),
    ("version-2", b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n"),
    ("reason-with-control", b"HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n"),
    ("value-with-bare-lf", b"HTTP/1.1 200 OK\r\nX-A: a\nX-Injected: 1\r\nContent-Length: 0\r\n\r\n"),
    ("value-with-bare-cr", b"HTTP/1.1 200 OK\r\nX-A: a\rX-Injected: 1\r\nContent-Length: 0\r\n\r\n"),
    ("lines-ending-in-bare-lf", b"HTTP/1.1 200 OK\nContent-Length: 0\n\n"),
    ("obs-fold", b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n"),
    ("nul-in-value", b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n"),
    ("space-before-colon", b"HTTP/1.1 200 OK\r\nX-A : a\r\nContent-Length: 0\r\n\r\n"),
    ("unsolicited-101", b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                        b"Upgrade: websocket\r\n\r\nnot http any more"),
    ("interim-with-length", b"HTTP/1.1 150 Odd\r\nContent-Length: 2\r\n\r\nxxHTTP/1.1 200 OK\r\n"
                            b"Content-Length: 0\r\n\r\n"),
    ("204-with-length", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"),
    ("204-chunked", b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("head-too-large", b"HTTP/1.1 200 OK\r\n"
                       + b"".join(b"X-P%d: %s\r\n" % (i, b"b" * 4000) for i in range(80))
                       + b"Content-Length: 0\r\n\r\n"),
]


@pytest.mark.parametrize("case, answer", [pytest.param(c, a, id=c) for c, a in MALFORMED])
def test_a_malformed_answer_is_a_well_framed_502_and_its_connection_is_discarded(
    raw: RawUpstream, proxy: ServerProcess, case: str, answer: bytes
) -> None:
    raw.answers[case] = answer
    client = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=15)
    refusals = proxy.output().count("sent a malformed answer")
    try:
        status, headers, body = _get(proxy, f"/{case}/x", conn=client)
        assert status == 502, body
        assert int(headers["content-length"]) == len(body)
        message = json.loads(body)["message"]
        # The client reads the one message every upstream failure gets; the log names the upstream.
        assert message == "cannot reach the upstream", message
        assert "X-Injected" not in json.dumps(headers) and "hello" not in message
        assert _logged(proxy, "sent a malformed answer", refusals + 1), proxy.output()
        carried = raw.connection_of(f"/{case}/x")
        assert raw.wait_closed(carried), "the proxy kept the connection of a refused answer"
        # The same client connection still works: the 502 was well framed.
        status, _, body = _get(proxy, f"/ok/after-{case}", conn=client)
        assert (status, body) == (200, b"ok")
        assert raw.connection_of(f"/ok/after-{case}") != carried
        assert raw.requests_to(f"/{case}/x") == 1  # refused, never replayed
    finally:
        client.close()


def test_a_malformed_chunked_answer_over_tls_is_refused_too(raw_tls: RawUpstream,
                                                             proxy_tls: ServerProcess) -> None:
    raw_tls.answers["smuggle"] = MALFORMED[0][1]
    status, _, body = _get(proxy_tls, "/smuggle/x")
    assert status == 502, body
    assert _logged(proxy_tls, "malformed"), proxy_tls.output()
    assert raw_tls.wait_closed(raw_tls.connection_of("/smuggle/x"))
    raw_tls.answers["unsolicited"] = dict(MALFORMED)["unsolicited-101"]
    status, _, _ = _get(proxy_tls, "/unsolicited/x")
    assert status == 502
    assert raw_tls.wait_closed(raw_tls.connection_of("/unsolicited/x"))
    assert _get(proxy_tls, "/ok/tls")[::2] == (200, b"ok")


# Legitimate answers: (id, bytes, expected status, expected body, connection reusable).
LEGITIMATE = [
    ("continue-and-early-hints", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                                 b"Link: </a.css>; rel=preload\r\n\r\n" + OK, 200, b"ok", True),
    ("interim-in-pieces", b"HTTP/1.1 102 Processing\r\n\r\n" + OK, 200, b"ok", True),
    ("no-content", b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", 204, b"", True),
    ("no-content-zero-length", b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", 204, b"", True),
    ("not-modified", b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", 304, b"", True),
    ("trailers", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
                 b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: abc\r\n\r\n", 200, b"hello world", True),
    ("close-delimited", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end", 200,
     b"until the end", False),
    ("http10-length", b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\n1.0!", 200, b"1.0!", False),
    ("obs-text-value", b"HTTP/1.1 200 OK\r\nX-Name: caf\xe9\r\nContent-Length: 2\r\n\r\nok", 200, b"ok", True),
    ("connection-close", b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 200,
     b"ok", False),
    ("bytes-after-the-answer", OK + b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsmuggl", 200, b"ok", False),
    ("garbage-after-the-answer", OK + b"garbage", 200, b"ok", False),
]


@pytest.mark.parametrize("case, answer, status, body, reusable",
                         [pytest.param(*item, id=item[0]) for item in LEGITIMATE])
def test_legitimate_edge_cases_are_relayed(raw: RawUpstream, proxy: ServerProcess, case: str,
                                           answer: bytes, status: int, body: bytes,
                                           reusable: bool) -> None:
    raw.answers[case] = answer
    if not reusable and case in ("close-delimited", "http10-length", "connection-close"):
        raw.close_after.add(case)
    got_status, headers, got_body = _get(proxy, f"/{case}/x")
    assert (got_status, got_body) == (status, body)
    assert "x-sum" not in headers  # trailer fields are dropped
    carried = raw.connection_of(f"/{case}/x")
    assert _get(proxy, f"/ok/after-{case}")[::2] == (200, b"ok")
    if reusable:
        assert raw.connection_of(f"/ok/after-{case}") == carried
    else:
        assert raw.connection_of(f"/ok/after-{case}") != carried
        if case not in raw.close_after:
            assert raw.wait_closed(carried)


def test_head_with_a_length_has_no_body_and_keeps_its_connection(raw: RawUpstream,
                                                                  proxy: ServerProcess) -> None:
    raw.answers["head"] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\n"
    status, headers, body = _get(proxy, "/head/x", method="HEAD")
    assert (status, body, headers["content-length"]) == (200, b"", "5")
    carried = raw.connection_of("/head/x")
    assert _get(proxy, "/ok/after-head")[::2] == (200, b"ok")
    assert raw.connection_of("/ok/after-head") == carried


def test_an_answer_to_head_followed_by_bytes_is_relayed_and_its_connection_discarded(
    raw: RawUpstream, proxy: ServerProcess
) -> None:
    raw.answers["head-body"] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    status, _, body = _get(proxy, "/head-body/x", method="HEAD")
    assert (status, body) == (200, b"")
    assert raw.wait_closed(raw.connection_of("/head-body/x"))


def test_expect_100_continue_uploads_reach_the_upstream(raw: RawUpstream, proxy: ServerProcess) -> None:
    raw.answers["upload"] = OK
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=15) as sock:
        sock.sendall(b"POST /upload/x HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        interim = sock.recv(4096)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(b"hello world")
        answer = b""
        while not answer.endswith(b"ok"):
            piece = sock.recv(4096)
            assert piece
            answer += piece
    assert answer.startswith(b"HTTP/1.1 200 ")
    with raw.lock:
        assert [body for _, method, path, body in raw.seen if path == "/upload/x"] == [b"hello world"]


def test_a_short_body_cut_by_the_upstream_is_a_502(raw: RawUpstream, proxy: ServerProcess) -> None:
    raw.answers["short"] = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    raw.close_after.add("short")
    broken = proxy.output().count("broke off its answer")
    status, _, body = _get(proxy, "/short/x")
    assert status == 502
    assert json.loads(body)["message"] == "cannot reach the upstream"
    assert _logged(proxy, "broke off its answer", broken + 1), proxy.output()


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_long_body_cut_by_the_upstream_aborts_the_client_response(
    raw: RawUpstream, proxy: ServerProcess, framing: str
) -> None:
    size = 300_000
    if framing == "length":
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"a" * 100_000
    else:
        answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"186a0\r\n" + b"a" * 100_000 + b"\r\n"
    case = f"cut-{framing}"
    raw.answers[case] = answer
    raw.close_after.add(case)
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=15)
    try:
        conn.request("GET", f"/{case}/x")
        resp = conn.getresponse()
        assert resp.status == 200
        with pytest.raises((http.client.IncompleteRead, ConnectionError)):
            resp.read()
    finally:
        conn.close()
