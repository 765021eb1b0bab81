"""``GatewayThreadWorker``'s stop path, step by step on gunicorn's own connection objects.

The race these tests pin down needs a SIGTERM to land between two callbacks of one poller
wake-up, which a real server shows only now and then (``test_keepalive.py``'s stop test under
load); here the steps of gunicorn's stop are taken in that order on purpose.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger
from gunicorn.workers.gthread import STOP_KEEPALIVE_LINGER, TConn

from bcs_middleware.serving.gthread_worker import GatewayThreadWorker

KEEPALIVE = 5


@pytest.fixture
def worker() -> Iterator[GatewayThreadWorker]:
    cfg = Config()
    cfg.set("keepalive", KEEPALIVE)
    cfg.set("threads", 2)
    worker = GatewayThreadWorker(0, 0, [], None, 30, cfg, Logger(cfg))
    worker.poller = selectors.DefaultSelector()
    worker.method_queue.init()
    yield worker
    worker.poller.close()
    worker.method_queue.close()
    worker.tmp.close()


def _answered(worker: GatewayThreadWorker) -> tuple[TConn, socket.socket]:
    """A connection whose request was just answered with keep-alive (as ``handle`` returns it)."""
    server, client = socket.socketpair()
    conn = TConn(worker.cfg, server, ("127.0.0.1", 40000), ("127.0.0.1", 443))
    conn.init()
    worker.nr_conns += 1
    return conn, client


def _kept_alive() -> Future[object]:
    done: Future[object] = Future()
    done.set_result(True)
    return done


def _still_open(client: socket.socket) -> bool:
    """Nothing arrived on ``client``, not even the server's end of the connection."""
    client.setblocking(False)
    try:
        client.recv(1)
    except BlockingIOError:
        return True
    return False


def test_a_connection_kept_alive_as_the_stop_begins_keeps_its_linger(worker: GatewayThreadWorker) -> None:
    """SIGTERM, then (same poller wake-up) an answer's keep-alive, then the stop loop's cap:
    the connection waits STOP_KEEPALIVE_LINGER for its next request, it is not closed at once.

    gunicorn's ``finish_request`` already caps a connection kept alive while stopping at the
    linger; the cap at the start of the stop loop must not shorten it again (it did: the
    connection's idle start was read back as ``timeout - keepalive``, two seconds in the past).
    """
    conn, client = _answered(worker)
    try:
        worker.alive = False  # SIGTERM seen by the handler
        worker.finish_request(conn, _kept_alive())  # a callback of the same wake-up
        assert list(worker.keepalived_conns) == [conn]
        started = time.monotonic()
        worker._cap_keepalive(started + STOP_KEEPALIVE_LINGER)  # the stop loop begins
        worker.murder_keepalived()
        assert list(worker.keepalived_conns) == [conn], "closed at once, as the stop began"
        assert _still_open(client)
        assert conn.timeout >= started + STOP_KEEPALIVE_LINGER - 0.5
        assert worker.nr_conns == 1
    finally:
        client.close()
        conn.close()


def test_an_idle_connection_is_closed_once_it_has_waited_the_linger(worker: GatewayThreadWorker) -> None:
    """A connection idle since long before the stop is closed as the stop begins, and counted once."""
    conn, client = _answered(worker)
    try:
        worker.finish_request(conn, _kept_alive())
        conn.idle_since -= KEEPALIVE - 1  # answered KEEPALIVE - 1 seconds ago
        conn.timeout -= KEEPALIVE - 1
        worker.alive = False
        worker._cap_keepalive(time.monotonic() + STOP_KEEPALIVE_LINGER)
        worker.murder_keepalived()
        assert not worker.keepalived_conns
        assert worker.nr_conns == 0
        client.settimeout(5)
        assert client.recv(1) == b""
    finally:
        client.close()
