"""The pool's own rules, with a scripted backend and no socket: failover order, the cooldown,
the replay rule, never a body sent twice, tunnel retirement and the bounds.

The backend is :class:`~bcs_middleware.outbound.backend.NetworkBackend` as the pool sees it;
the connections are real :class:`~bcs_middleware.outbound.streams.Connection` subclasses fed
canned answers, read by the real HTTP/1.1 exchange and codec.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field

import pytest

from bcs_middleware.core.environ import Upstream
from bcs_middleware.outbound.causes import (
    AgentUnreachable,
    ConnectError,
    ConnectionBroken,
    OutboundError,
    TLSError,
    UnusableAddress,
)
from bcs_middleware.outbound.identity import PoolKey
from bcs_middleware.outbound.streams import Connection
from bcs_middleware.outbound.transport import PooledTransport
from tests.support.polling import wait_until

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class ScriptedConnection(Connection):
    """Answers each request it is sent with ``answer``; ``fail`` raised by the first send instead."""

    def __init__(self, key: PoolKey, generation: int, answer: bytes, fail: BaseException | None = None) -> None:
        super().__init__(key, generation, None)
        self.answer = answer
        self.fail = fail
        self.sent: list[bytes] = []
        self.pending = 0
        self.closed = False
        self.stale = False

    def write(self, data: bytes) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append(data)
        if data.split(b"\r\n", 1)[0].endswith(b" HTTP/1.1"):
            self.pending += 1

    def read(self, limit: int = 65536) -> bytes:
        if self.pending:
            self.pending -= 1
            return self.answer
        return b""

    def start_tls(self, context: ssl.SSLContext, server_name: str, timeout: float) -> Connection:
        return self

    def take_socket(self) -> socket.socket:
        raise RuntimeError("no socket here")

    def looks_closed(self) -> bool:
        return self.stale

    def interrupt(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True


@dataclass
class ScriptedBackend:
    """Opens :class:`ScriptedConnection` s; ``refuse`` maps a host to the cause connecting to it raises."""

    answer: bytes = OK
    refuse: dict[str, OutboundError] = field(default_factory=dict)
    connects: list[str] = field(default_factory=list)
    opened: list[ScriptedConnection] = field(default_factory=list)
    #: the next connections opened fail on their first send with these, in order.
    failures: list[BaseException] = field(default_factory=list)

    def connect(self, key: PoolKey, label: str, timeout: float, *, generation: int,
                upgrade: bool) -> Connection:
        self.connects.append(key.host)
        if key.host in self.refuse:
            raise self.refuse[key.host]
        conn = ScriptedConnection(key, generation, self.answer, self.failures.pop(0) if self.failures else None)
        self.opened.append(conn)
        return conn

    def prune(self) -> None:
        pass

    def bodies(self, marker: bytes) -> int:
        """How many times a body piece containing ``marker`` left, over every connection."""
        return sum(marker in piece for conn in self.opened for piece in conn.sent)


def refused(host: str) -> ConnectError:
    return ConnectError(f"upstream t: cannot connect to {host}", stage="connect")


def get(transport: PooledTransport, *hosts: str, method: str = "GET", body: list[bytes] | None = None,
        tunnel: str | None = None) -> bytes:
    upstream = Upstream(base_urls=tuple(f"http://{host}" for host in hosts), path="/x", name="t", tunnel=tunnel)
    resp = transport.send(upstream, method, [], body, sum(map(len, body)) if body else None)
    data = resp.read()
    resp.release_conn()
    return data


def test_addresses_are_tried_in_order_and_a_failed_one_waits_out_its_cooldown() -> None:
    backend = ScriptedBackend(refuse={"a": refused("a")})
    transport = PooledTransport(backend=backend, failure_cooldown=60)
    assert get(transport, "a", "b", "c") == b"ok"
    assert backend.connects == ["a", "b"]
    transport.close()  # no idle connection: the next request connects again
    assert get(transport, "a", "b", "c") == b"ok"
    assert backend.connects == ["a", "b", "b"], "a is skipped while its cooldown runs"


def test_a_failed_address_is_tried_again_once_its_cooldown_ends() -> None:
    backend = ScriptedBackend(refuse={"a": refused("a")})
    transport = PooledTransport(backend=backend, failure_cooldown=0.2)
    get(transport, "a", "b")
    del backend.refuse["a"]

    def tries_a_first() -> bool:
        transport.close()
        backend.connects.clear()
        get(transport, "a", "b")
        return backend.connects == ["a"]

    assert wait_until(tries_a_first, 10)


def test_when_every_address_failed_recently_all_are_tried_in_order() -> None:
    backend = ScriptedBackend(refuse={"a": refused("a"), "b": refused("b")})
    transport = PooledTransport(backend=backend, failure_cooldown=60)
    with pytest.raises(ConnectError, match="cannot connect to b"):  # the last cause is raised
        get(transport, "a", "b")
    with pytest.raises(ConnectError):
        get(transport, "a", "b")
    assert backend.connects == ["a", "b", "a", "b"]


@pytest.mark.parametrize("cause", [
    pytest.param(TLSError("upstream t: the TLS certificate of a did not verify", stage="tls"), id="tls"),
    pytest.param(AgentUnreachable("the kube-agent of cluster c1 is not connected", stage="connect"), id="agent"),
])
def test_a_tls_failure_or_a_missing_agent_ends_the_failover(cause: OutboundError) -> None:
    backend = ScriptedBackend(refuse={"a": cause})
    transport = PooledTransport(backend=backend)
    with pytest.raises(type(cause)) as raised:
        get(transport, "a", "b")
    assert raised.value is cause
    assert backend.connects == ["a"]


def test_no_address_is_a_cause_not_a_crash() -> None:
    transport = PooledTransport(backend=ScriptedBackend())
    with pytest.raises(UnusableAddress, match="has no address"):
        transport.send(Upstream(base_urls=(), path="/", name="t"), "GET", [], None, None)


def test_a_get_on_a_pooled_connection_the_upstream_closed_is_replayed_once_on_a_fresh_one() -> None:
    backend = ScriptedBackend()
    transport = PooledTransport(backend=backend)
    get(transport, "a")
    first = backend.opened[0]
    first.fail = ConnectionResetError()  # closed by the upstream while idle, not yet seen
    assert get(transport, "a") == b"ok"
    assert len(backend.opened) == 2 and first.closed
    assert transport.connections_opened == 2


@pytest.mark.parametrize("method, body", [("POST", [b"payload-1"]), ("DELETE", None), ("GET", [b"payload-1"])])
def test_a_request_that_is_not_replayable_is_never_sent_twice(method: str, body: list[bytes] | None) -> None:
    backend = ScriptedBackend()
    transport = PooledTransport(backend=backend)
    get(transport, "a")
    backend.opened[0].fail = ConnectionResetError()
    with pytest.raises(ConnectionBroken, match="closed or reset the connection"):
        get(transport, "a", "b", method=method, body=body)
    assert len(backend.opened) == 1, "neither a fresh connection nor the next address"
    assert backend.connects == ["a"]


def test_a_body_is_sent_once_even_when_the_answer_then_breaks() -> None:
    backend = ScriptedBackend(answer=b"HTTP/1.1 200 OK\r\nContent-Len")  # cut off in the head
    transport = PooledTransport(backend=backend)
    with pytest.raises(ConnectionBroken):
        get(transport, "a", "b", method="POST", body=[b"payload-1", b"payload-2"])
    assert backend.bodies(b"payload-1") == 1 and backend.bodies(b"payload-2") == 1
    assert backend.connects == ["a"]


def test_a_fresh_connection_that_breaks_is_not_retried() -> None:
    backend = ScriptedBackend(failures=[ConnectionResetError()])
    transport = PooledTransport(backend=backend)
    with pytest.raises(ConnectionBroken):
        get(transport, "a")
    assert len(backend.opened) == 1


def test_a_connection_that_looks_closed_is_not_taken_from_the_pool() -> None:
    backend = ScriptedBackend()
    transport = PooledTransport(backend=backend)
    get(transport, "a")
    backend.opened[0].stale = True
    get(transport, "a")
    assert len(backend.opened) == 2 and backend.opened[0].closed


def test_a_retired_tunnel_drains_its_connections() -> None:
    backend = ScriptedBackend()
    transport = PooledTransport(backend=backend)
    get(transport, "a", tunnel="c1")
    idle = backend.opened[0]
    upstream = Upstream(base_urls=("http://a",), path="/x", name="t", tunnel="c1")
    busy_resp = transport.send(upstream, "GET", [], None, None)  # reuses the idle one
    busy = backend.opened[0]
    assert busy is idle and len(backend.opened) == 1
    get(transport, "b", tunnel="c1")  # another idle connection through the same agent
    other = backend.opened[1]
    transport.retire_tunnel("c1")
    assert other.closed, "idle connections over the old agent connection close at once"
    busy_resp.read()
    busy_resp.release_conn()
    assert busy.closed, "a busy one closes when released, never pooled again"
    get(transport, "a", tunnel="c1")
    assert len(backend.opened) == 3 and backend.opened[2].generation == 1
    get(transport, "a", tunnel="c1")
    assert len(backend.opened) == 3, "connections over the newer agent connection are pooled"


def test_idle_connections_are_bounded_per_upstream_and_in_upstreams() -> None:
    backend = ScriptedBackend()
    transport = PooledTransport(backend=backend, pool_maxsize=2, max_upstreams=3)
    upstream = Upstream(base_urls=("http://a",), path="/x", name="t")
    held = [transport.send(upstream, "GET", [], None, None) for _ in range(3)]
    for resp in held:
        resp.read()
        resp.release_conn()
    assert len(transport._pool) == 2 and sum(conn.closed for conn in backend.opened) == 1
    for host in ("b", "c", "d", "e"):
        get(transport, host)
    assert transport._pool.keys <= 3 and len(transport._pool) <= 3
    assert sum(not conn.closed for conn in backend.opened) == len(transport._pool), "evicted ones are closed"


def test_an_upgrade_never_comes_from_the_pool_nor_goes_back() -> None:
    backend = ScriptedBackend(answer=b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
    transport = PooledTransport(backend=backend)
    get(transport, "a")
    upstream = Upstream(base_urls=("http://a",), path="/x", name="t")
    resp = transport.open_upgrade(upstream, "GET", [("Connection", "Upgrade"), ("Upgrade", "websocket")])
    assert resp.status == 403 and len(backend.opened) == 2
    resp.release_conn()
    assert backend.opened[1].closed and len(transport._pool) == 1
