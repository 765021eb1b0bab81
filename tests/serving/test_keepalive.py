"""Busy keep-alive connections to a real ``bcs-middleware serve`` (HTTPS, one worker).

Eight clients send requests back to back, each on its own keep-alive connection, for
longer than every timeout of the server (``--keepalive``, ``--header-timeout`` and
``--body-idle-timeout`` shortened so the test stays short). Every request must get a
complete answer and no connection may be closed while a request is on it: a server ends
a kept-alive connection only between requests, and says so (``Connection: close``) when
it decides while answering. Once the clients go quiet, their connections are closed
after ``--keepalive`` seconds of idleness, not before. A stop (SIGTERM) under the same
load answers every request, the ones after the stop with ``Connection: close``.

``bench/keepalive_soak.py`` runs the same load for minutes at the default timeouts.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway import ADMIN, Gateway, served_gateway
from tests.support.keepalive import Load
from tests.support.polling import wait_until

CLIENTS = 8
KEEPALIVE = 3
#: Longer than every server timeout below, twice the keep-alive one (summed over a
#: connection's waits, it closed busy connections about KEEPALIVE seconds into their life).
BUSY_SECONDS = 8.0
SERVER_ARGS = ["--keepalive", str(KEEPALIVE), "--header-timeout", "2", "--body-idle-timeout", "2",
               "--no-access-log"]


def _closed_at(sock: socket.socket, limit: float) -> float | None:
    """When the server closed ``sock`` (monotonic), reading nothing before; ``None``: still open after ``limit``."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except (ConnectionResetError, ssl.SSLError):
            return time.monotonic()
        assert data == b"", f"the server sent {data[:200]!r} on an idle connection"
        return time.monotonic()
    return None


def _served(worker_class: str, data: Path) -> Iterator[Gateway]:
    with served_gateway(data, args=["--worker-class", worker_class, *SERVER_ARGS], workers=1) as gw:
        yield gw
    output = gw.server.output()
    assert "Traceback" not in output and ADMIN not in output


@pytest.fixture(scope="module", params=["gevent", "gthread"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One server per worker class for the tests that leave it running as they found it."""
    yield from _served(request.param, tmp_path_factory.mktemp("keepalive"))


@pytest.fixture(params=["gevent", "gthread"])
def stopped_gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gateway]:
    """A server of its own, for a test that stops it."""
    yield from _served(request.param, tmp_path)


def test_busy_keep_alive_connections_are_answered_and_closed_only_when_idle(gateway: Gateway) -> None:
    load = Load(gateway, BUSY_SECONDS)
    try:
        runs = load.join(BUSY_SECONDS + 60)
        failures = [f"client {run.number}: {run.failure}" for run in runs if run.failure]
        assert not failures, failures
        assert not [run.number for run in runs if run.told_close_after], "a busy connection was ended"
        # Real load, each client busy throughout: not a few requests and a long idle wait.
        assert min(run.answered for run in runs) >= 10, [run.answered for run in runs]

        # Every registration answered 201 happened, and nothing else did: a client knows.
        status, body = gateway.call("GET", "/rest/clusters/")
        assert status == 200
        listed = {cluster["id"] for cluster in json.loads(body) if cluster["id"].startswith("BCS-K8S-KA")}
        assert listed == load.created()

        # Quiet now: each connection is closed after --keepalive seconds of idleness, not before.
        for run in runs:
            assert run.conn is not None and run.conn.sock is not None
            closed = _closed_at(run.conn.sock, KEEPALIVE + 10 - (time.monotonic() - run.last_answer))
            assert closed is not None, f"client {run.number}: the idle connection was never closed"
            idle = closed - run.last_answer
            assert idle >= KEEPALIVE - 0.5, f"client {run.number}: closed after {idle:.1f}s idle"
    finally:
        load.close()


def test_a_stop_under_load_ends_connections_only_between_requests(stopped_gateway: Gateway) -> None:
    """SIGTERM while every client registers clusters back to back: each connection ends with an
    answer saying ``Connection: close``, or closed while idle between requests.

    A connection is idle when the server has not read the next request: a registration whose
    client saw the connection close must not exist. (On a quiet machine every client gets its
    ``Connection: close`` answer: its next request follows its answer within milliseconds, well
    within the 2 s a stopping worker waits for it. Under heavy load a client may take longer,
    and its connection is then closed as idle.)
    """
    from bcs_middleware.store.sql import open_store

    # TCP health checks first (connect, close before TLS): each must count as one connection
    # that ended, however the worker counts them.
    for _ in range(CLIENTS):
        socket.create_connection(("127.0.0.1", stopped_gateway.server.port), timeout=10).close()
    load = Load(stopped_gateway, 120, kinds=("post",))
    try:
        # Every connection busy, then SIGTERM to the master (as an init system stops it).
        assert wait_until(lambda: all(run.answered >= 3 or run.failure for run in load.runs), 30)
        started = time.monotonic()
        stopped_gateway.server.signal(signal.SIGTERM)
        assert stopped_gateway.server.proc.wait(30) == 0
        took = time.monotonic() - started
        runs = load.join(30)
    finally:
        load.close()
    wrong = [f"client {run.number}: {run.failure}" for run in runs if run.failure and run.unanswered is None]
    assert not wrong, wrong
    # Closed while idle means idle for the 2 s a stopping worker waits after an answer (less a
    # margin for a client descheduled between its clock and its send), not closed at once.
    early = [f"client {run.number}: {run.failure}, {run.unanswered_after:.2f}s after its previous answer"
             for run in runs if run.unanswered_after is not None and run.unanswered_after < 1.5]
    assert not early, early
    store = open_store(data_dir=stopped_gateway.data)
    try:
        # A request the server read was answered: nothing unanswered was applied.
        applied = [run.unanswered for run in runs if run.unanswered and store.find_cluster(run.unanswered)]
        assert not applied, f"registered without an answer: {applied}"
        assert {cluster.id for cluster in store.list_clusters() if cluster.id.startswith("BCS-K8S-KA")} \
            == load.created()
    finally:
        store.db.dispose()
    told = [run.number for run in runs if run.told_close_after]
    assert told, "no connection was told Connection: close"
    assert took < 8, f"the server took {took:.1f}s to stop"


def test_clients_that_hold_a_closed_connection_open_stall_no_one(gateway: Gateway) -> None:
    """Clients ask ``Connection: close`` and never close their side: the server's lingering close
    (RFC 9112 §9.6) waits for each of them, but nobody else waits meanwhile."""
    context = ssl.create_default_context(cafile=gateway.ca_file)
    holders = []
    try:
        for _ in range(10):
            sock = context.wrap_socket(socket.create_connection(("127.0.0.1", gateway.server.port), timeout=10),
                                       server_hostname="localhost")
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            holders.append(sock)
        # Each holder got its answer, and stays connected without reading further.
        for sock in holders:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        slowest = 0.0
        for _ in range(5):
            started = time.monotonic()
            status, _ = gateway.call("GET", "/healthz", token="")
            slowest = max(slowest, time.monotonic() - started)
            assert status == 200
        assert slowest < 1.0, f"a request took {slowest:.1f}s while closed connections were held open"
    finally:
        for sock in holders:
            sock.close()
