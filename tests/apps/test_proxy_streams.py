"""Departed and slow clients cost nothing: a real ``bcs-middleware serve`` over TLS.

* a quiet watch whose client leaves (FIN or reset) frees its upstream connection at
  once, under both worker classes;
* half-sent request heads, stalled bodies, silent connections after the TLS handshake
  and handshakes that never complete are closed on time, and ``/healthz`` and
  authenticated requests keep answering meanwhile;
* beyond ``--worker-connections`` a client is told ``503`` with ``Retry-After``.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import ADMIN, SA_TOKEN, Gateway, register_cluster, served_gateway
from tests.support.polling import seconds_until

CLUSTER = "BCS-K8S-STREAMS"
WATCH = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/quiet/configmaps?watch=true"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


def _registered(gw: Gateway, api: FakeAPIServer) -> Gateway:
    register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
    return gw


@pytest.fixture(scope="module", params=["gevent", "gthread"])
def gateway(request: pytest.FixtureRequest, apiserver: FakeAPIServer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    args = ["--worker-class", request.param, "--no-access-log"]
    with served_gateway(tmp_path_factory.mktemp(f"streams-{request.param}"), args=args) as gw:
        yield _registered(gw, apiserver)
    assert "Traceback" not in gw.server.output()


@pytest.fixture(scope="module")
def strict(apiserver: FakeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The default worker with short limits, so that the test sees them fire."""
    args = ["--header-timeout", "1", "--body-idle-timeout", "1", "--keepalive", "2", "--no-access-log"]
    with served_gateway(tmp_path_factory.mktemp("streams-strict"), args=args) as gw:
        yield _registered(gw, apiserver)
    # Slow clients are routine: cut quietly, never an unhandled error.
    assert "Traceback" not in gw.server.output()


def _tls(gw: Gateway, *, timeout: float = 10.0) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=gw.ca_file)
    raw = socket.create_connection(("127.0.0.1", gw.server.port), timeout=timeout)
    return context.wrap_socket(raw, server_hostname="localhost")


def _open_watch(gw: Gateway, api: FakeAPIServer) -> ssl.SSLSocket:
    before = api.open_watches
    sock = _tls(gw)
    sock.sendall(f"GET {WATCH} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        piece = sock.recv(4096)
        assert piece, head
        head += piece
    assert head.startswith(b"HTTP/1.1 200"), head
    seconds_until(lambda: api.open_watches > before, 10, "the watch did not reach the apiserver")
    return sock


@pytest.mark.parametrize("how", ["close", "reset"])
def test_departed_quiet_watch_frees_its_upstream(gateway: Gateway, apiserver: FakeAPIServer, how: str) -> None:
    sock = _open_watch(gateway, apiserver)
    before = apiserver.open_watches
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    # Nothing is written to the watch meanwhile: only watching the client socket tells.
    took = seconds_until(lambda: apiserver.open_watches < before, 2.0,
                     "the upstream watch stayed open after its client left")
    assert took < 2.0


def test_several_departures_and_a_survivor(gateway: Gateway, apiserver: FakeAPIServer) -> None:
    """Leaving clients end their own streams only: the one that stays still gets events."""
    stay = _open_watch(gateway, apiserver)
    leaving = [_open_watch(gateway, apiserver) for _ in range(5)]
    before = apiserver.open_watches
    for sock in leaving:
        sock.close()
    seconds_until(lambda: apiserver.open_watches <= before - 5, 2.0, "departed watches stayed open")
    apiserver.emit("ADDED", {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "still-here", "namespace": "quiet"}}, store=False)
    stay.settimeout(5)
    seen = b""
    while b"still-here" not in seen:
        piece = stay.recv(65536)
        assert piece, "the remaining watch was ended too"
        seen += piece
    stay.close()


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closes ``sock`` (reads whatever it answers first)."""
    return _answer_and_close(sock, seconds)[0]


def _answer_and_close(sock: socket.socket, seconds: float) -> tuple[float, bytes]:
    sock.settimeout(seconds + 5)
    started = time.monotonic()
    data = b""
    try:
        while piece := sock.recv(65536):
            data += piece
    except (ConnectionResetError, ssl.SSLError):
        pass
    took = time.monotonic() - started
    assert took < seconds, f"the connection was held {took:.1f}s"
    return took, data


def _healthz_ms(gw: Gateway) -> float:
    started = time.monotonic()
    sock = _tls(gw, timeout=5)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    sock.close()
    assert data.startswith(b"HTTP/1.1 200"), data
    return (time.monotonic() - started) * 1000


def test_slow_clients_are_cut_and_do_not_block_healthz(strict: Gateway, apiserver: FakeAPIServer) -> None:
    """Half-sent heads, silent TLS connections, TCP connections that never start the handshake,
    and a stalled body: each is cut after its limit; meanwhile everyone else is served at once."""
    half_heads, silent, handshakes = [], [], []
    for _ in range(100):
        sock = _tls(strict)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        half_heads.append(sock)
        silent.append(_tls(strict))  # handshake done, then nothing
        handshakes.append(socket.create_connection(("127.0.0.1", strict.server.port)))  # never says hello
    body = _tls(strict)
    body.sendall(f"POST /rest/users/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n"
                 "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"user".encode())
    try:
        # Answered at once while 301 slow connections are open.
        assert max(_healthz_ms(strict) for _ in range(5)) < 1000
        status, _body = strict.call("GET", f"/tunnels/clusters/{CLUSTER}/version")
        assert status == 200
        # Each kind is closed once its limit (1 s) has passed, not held.
        for sock in (half_heads[0], silent[0], handshakes[0]):
            _closed_within(sock, 3.0)
        # A stalled body is answered 408 (not an internal error), then the connection ends.
        _took, answer = _answer_and_close(body, 3.0)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"REQUEST_TIMEOUT" in answer
    finally:
        for sock in half_heads + silent + handshakes + [body]:
            sock.close()


def test_idle_keep_alive_connection_is_closed(strict: Gateway) -> None:
    sock = _tls(strict)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b'"ok"' not in data:
        piece = sock.recv(65536)
        assert piece, data
        data += piece
    took = _closed_within(sock, 5.0)  # --keepalive 2
    assert took >= 1.0, "closed before the keep-alive time"
    sock.close()


def test_connection_limit_answers_503_with_retry_after(tmp_path: Path) -> None:
    args = ["--workers", "1", "--worker-connections", "8", "--no-access-log"]
    with served_gateway(tmp_path, args=args, workers=1) as gw:
        held = [_tls(gw) for _ in range(8)]
        try:
            time.sleep(0.2)  # the worker counts each of the eight after its handshake: nothing visible to poll
            sock = _tls(gw)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            started = time.monotonic()
            while time.monotonic() - started < 5:
                try:
                    piece = sock.recv(65536)
                except (ssl.SSLError, ConnectionResetError):
                    break
                if not piece:
                    break
                data += piece
            sock.close()
            assert data.startswith(b"HTTP/1.1 503"), data
            assert b"\r\nRetry-After: 1\r\n" in data
        finally:
            for sock in held:
                sock.close()
        # With the slots free again, requests are served.
        seconds_until(lambda: gw.call("GET", "/healthz")[0] == 200, 5, "not served after the limit")
