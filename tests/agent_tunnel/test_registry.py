"""The dial seam: upstreams with ``tunnel`` set go through a TunnelDialer, then TLS as usual.

The dialer here is a stand-in for an agent: it connects to the fake apiserver itself
(on loopback, which the transport's address policy refuses), so what is checked is
the seam — the policy is not consulted for the tunnel hop, TLS still verifies the
reported CA and name, pool keys never mix tunnelled and direct connections, and no
agent is a 503 naming the reason.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from bcs_middleware.agent_tunnel.registry import LocalAgents, LocalOnlyDialer
from bcs_middleware.agent_tunnel.session import Session
from bcs_middleware.clusters.directory import upstream_for
from bcs_middleware.core.environ import Upstream
from bcs_middleware.core.records import CredentialRecord, Holder, PlacementRecord
from bcs_middleware.outbound.addresses import AddressPolicy
from bcs_middleware.outbound.causes import AddressRefused, AgentUnreachable, TLSError, as_http_error
from bcs_middleware.outbound.stream_connection import StreamConnection
from bcs_middleware.outbound.streams import SocketConnection
from bcs_middleware.outbound.transport import PooledTransport
from bcs_middleware.store.crypto import token_digest
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN
from tests.support.polling import wait_until

from .wsfixtures import TLS, channel_pair, dial_any

DENY_LOOPBACK = AddressPolicy(deny=("127.0.0.0/8",))


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


class DirectDialer:
    """Stands in for an agent: dials the address itself and counts the dials."""

    def __init__(self) -> None:
        self.dials: list[tuple[str, str, int]] = []

    def dial(self, cluster_id: str, host: str, port: int, timeout: float, *,
             in_memory: bool = False) -> socket.socket:
        self.dials.append((cluster_id, host, port))
        return socket.create_connection((host, port), timeout=timeout)


class FakeSession:
    """A session whose streams are socketpairs relayed to the fake apiserver (what Session.open returns)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.closed = False
        self.full = False
        self.streams = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.close_reason = ""

    def open(self, proto: str, address: str, timeout: float) -> socket.socket:
        from bcs_middleware.agent_tunnel.session import TooManyStreams, TunnelClosed

        if self.closed:
            raise TunnelClosed("closed")
        if self.full:
            raise TooManyStreams("the tunnel carries 10000 streams already")
        assert proto == "tcp"
        ours, theirs = socket.socketpair()
        upstream = socket.create_connection(self.target, timeout=timeout)
        for a, b in ((theirs, upstream), (upstream, theirs)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()
        self.streams += 1
        return ours

    def open_stream(self, proto: str, address: str, timeout: float) -> SocketStream:
        return SocketStream(self.open(proto, address, timeout))

    def close(self, reason: str = "", *, code: int = 1000) -> None:
        self.closed = True
        self.close_reason = reason


class SocketStream:
    """A ByteStream over one end of FakeSession's relay (the stand-in for Session.open_stream)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, limit: int, timeout: float | None) -> bytes:
        self.sock.settimeout(timeout)
        return self.sock.recv(limit)

    def send(self, data: bytes, timeout: float | None) -> None:
        self.sock.settimeout(timeout)
        self.sock.sendall(data)

    def readable(self) -> bool:
        return bool(select.select([self.sock], [], [], 0)[0])

    def close(self) -> None:
        self.sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def _upstream(apiserver: FakeAPIServer, tunnel: str | None) -> Upstream:
    creds = CredentialRecord("c1", (apiserver.url,), apiserver.ca_pem, SA_TOKEN, via_tunnel=tunnel is not None)
    return upstream_for(creds, path="/version")


def test_upstream_for_sets_the_tunnel_from_the_credentials(apiserver: FakeAPIServer) -> None:
    assert _upstream(apiserver, "c1").tunnel == "c1"
    assert _upstream(apiserver, None).tunnel is None


def test_a_tunnelled_upstream_is_dialled_through_the_tunnel_and_verified(apiserver: FakeAPIServer) -> None:
    dialer = DirectDialer()
    transport = PooledTransport(address_policy=DENY_LOOPBACK, tunnels=dialer)
    try:
        resp = transport.send(_upstream(apiserver, "c1"), "GET", [("Authorization", f"Bearer {SA_TOKEN}")],
                              None, None)
        assert resp.status == 200, resp.read()
        resp.read()
        resp.release_conn()
        assert dialer.dials == [("c1", "127.0.0.1", apiserver.port)]
        # The same address directly: refused by the policy, and never given the tunnel's connection.
        with pytest.raises(AddressRefused) as refused:
            transport.send(_upstream(apiserver, None), "GET", [], None, None)
        assert as_http_error(refused.value).status == 502
        assert len(dialer.dials) == 1
    finally:
        transport.close()


def test_tls_through_the_tunnel_still_verifies_the_reported_ca(apiserver: FakeAPIServer) -> None:
    with FakeAPIServer(token=SA_TOKEN) as other:  # another CA
        creds = CredentialRecord("c1", (apiserver.url,), other.ca_pem, SA_TOKEN, via_tunnel=True)
        transport = PooledTransport(address_policy=DENY_LOOPBACK, tunnels=DirectDialer())
        with pytest.raises(TLSError) as failed:
            transport.send(upstream_for(creds, path="/version"), "GET", [], None, None)
        assert as_http_error(failed.value).code_name == "UPSTREAM_TLS_ERROR"


class RecordingDialer(LocalOnlyDialer):
    """The real local dialer, recording whether the transport asked for a memory stream."""

    def __init__(self, agents: LocalAgents) -> None:
        super().__init__(agents)
        self.asked: list[bool] = []

    def dial(self, cluster_id: str, host: str, port: int, timeout: float, *,
             in_memory: bool = False) -> socket.socket | object:
        self.asked.append(in_memory)
        return super().dial(cluster_id, host, port, timeout, in_memory=in_memory)


@contextlib.contextmanager
def real_tunnel() -> Iterator[tuple[PooledTransport, RecordingDialer, Session]]:
    """A transport whose cluster c1 is reached through a real session (agent end in this process)."""
    with channel_pair(TLS()) as (client, server):
        agent_end = Session(client, dial=dial_any, name="agent")
        gateway_end = Session(server, name="gw")
        threads = [threading.Thread(target=s.serve, daemon=True) for s in (agent_end, gateway_end)]
        for thread in threads:
            thread.start()
        agents = LocalAgents(holder=Holder("test/1"), placements=None)
        agents.attach("c1", gateway_end)
        dialer = RecordingDialer(agents)
        transport = PooledTransport(address_policy=DENY_LOOPBACK, tunnels=dialer)
        try:
            yield transport, dialer, gateway_end
        finally:
            transport.close()
            gateway_end.close("test over")
            agent_end.close("test over")
            for thread in threads:
                thread.join(10)


def _get(transport: PooledTransport, upstream: Upstream) -> bytes:
    resp = transport.send(upstream, "GET", [("Authorization", f"Bearer {SA_TOKEN}")], None, None)
    assert resp.status == 200
    body = resp.read()
    resp.release_conn()
    return body


def test_requests_ride_a_memory_stream_with_verified_tls_kept_alive(apiserver: FakeAPIServer) -> None:
    with real_tunnel() as (transport, dialer, session):
        upstream = _upstream(apiserver, "c1")
        for _ in range(5):
            assert b"gitVersion" in _get(transport, upstream)
        # One stream for all five: the connection goes back to the pool and is found open.
        assert transport.connections_opened == 1 and dialer.asked == [True]
        pooled = transport._pool.get(transport._pool._idle.held_keys()[0])
        assert isinstance(pooled, StreamConnection)
        transport._pool.put(pooled)
        assert session.streams == 1


def test_tls_over_a_memory_stream_verifies_the_ca_and_the_name(apiserver: FakeAPIServer) -> None:
    with FakeAPIServer(token=SA_TOKEN) as other, \
            FakeAPIServer(token=SA_TOKEN, cert_hosts=("not-this-address.example",)) as misnamed, \
            real_tunnel() as (transport, _dialer, session):
        wrong_ca = CredentialRecord("c1", (apiserver.url,), other.ca_pem, SA_TOKEN, via_tunnel=True)
        wrong_name = CredentialRecord("c1", (misnamed.url,), misnamed.ca_pem, SA_TOKEN, via_tunnel=True)
        for creds in (wrong_ca, wrong_name):
            with pytest.raises(TLSError) as failed:
                transport.send(upstream_for(creds, path="/version"), "GET", [], None, None)
            assert as_http_error(failed.value).code_name == "UPSTREAM_TLS_ERROR"
        assert wait_until(lambda: session.streams == 0, 5)  # the failed streams were ended, not left open


def test_a_memory_stream_the_apiserver_closed_is_not_reused(apiserver: FakeAPIServer) -> None:
    with real_tunnel() as (transport, _dialer, _session):
        upstream = _upstream(apiserver, "c1")
        _get(transport, upstream)
        apiserver.drop_connections()
        # Nothing visible here says when the apiserver's close has reached the pooled stream (the
        # session's stream count stays: polling it timed out), so the sleep gives it the time.
        time.sleep(0.3)
        assert b"gitVersion" in _get(transport, upstream)  # a fresh stream, no error
        assert transport.connections_opened == 2


def test_an_upgrade_asks_the_tunnel_for_a_socket(apiserver: FakeAPIServer) -> None:
    with real_tunnel() as (transport, dialer, _session):
        resp = transport.open_upgrade(_upstream(apiserver, "c1"), "GET",
                                      [("Connection", "Upgrade"), ("Upgrade", "websocket")])
        assert dialer.asked == [False]
        assert isinstance(resp._conn, SocketConnection)
        resp.close()


def test_without_a_dialer_or_an_agent_the_answer_is_503_naming_the_reason(apiserver: FakeAPIServer) -> None:
    with pytest.raises(AgentUnreachable):
        PooledTransport(tunnels=None).send(_upstream(apiserver, "c1"), "GET", [], None, None)
    agents = LocalAgents(holder=Holder("test/1"), placements=None)
    transport = PooledTransport(address_policy=DENY_LOOPBACK, tunnels=LocalOnlyDialer(agents))
    with pytest.raises(AgentUnreachable) as missing:
        transport.send(_upstream(apiserver, "c1"), "GET", [], None, None)
    assert as_http_error(missing.value).status == 503
    assert "c1 is not connected" in missing.value.message

    session = FakeSession(("127.0.0.1", apiserver.port))
    agents.attach("c1", session)
    resp = transport.send(_upstream(apiserver, "c1"), "GET", [("Authorization", f"Bearer {SA_TOKEN}")], None, None)
    assert resp.status == 200
    resp.close()
    transport.close()
    assert agents.connected_since("c1") is not None

    agents.detach("c1", session, "the agent disconnected")
    assert session.closed
    with pytest.raises(AgentUnreachable) as gone:
        transport.send(_upstream(apiserver, "c1"), "GET", [], None, None)
    assert "gone (the agent disconnected)" in gone.value.message


def test_an_agent_connection_at_its_stream_limit_answers_503_and_stays(apiserver: FakeAPIServer) -> None:
    agents = LocalAgents(holder=Holder("test/1"), placements=None)
    transport = PooledTransport(address_policy=DENY_LOOPBACK, tunnels=LocalOnlyDialer(agents))
    session = FakeSession(("127.0.0.1", apiserver.port))
    agents.attach("c1", session)
    session.full = True
    with pytest.raises(AgentUnreachable) as busy:
        transport.send(_upstream(apiserver, "c1"), "GET", [], None, None)
    assert as_http_error(busy.value).status == 503 and "cannot take another stream" in busy.value.message
    assert agents.session("c1") is session and not session.closed  # busy is not gone
    session.full = False
    resp = transport.send(_upstream(apiserver, "c1"), "GET", [("Authorization", f"Bearer {SA_TOKEN}")], None, None)
    assert resp.status == 200
    resp.close()
    transport.close()


def test_a_newer_agent_replaces_the_older_one() -> None:
    placements = RecordingPlacements()
    agents = LocalAgents(holder=Holder("test/1"), placements=placements)
    first, second = FakeSession(("127.0.0.1", 1)), FakeSession(("127.0.0.1", 1))
    agents.attach("c1", first)
    agents.attach("c1", second)
    assert first.closed and "replaced" in first.close_reason
    assert agents.session("c1") is second
    agents.detach("c1", first)  # the old connection's serve() returning must not drop the new one
    assert agents.session("c1") is second
    assert placements.placed == {"c1": "test/1"}
    agents.detach("c1", second)
    assert placements.placed == {}


def test_a_racing_second_connection_of_the_same_agent_closes_the_first_as_redundant() -> None:
    from bcs_middleware.agent_tunnel.handshake import CLOSE_DUPLICATE, CLOSE_REPLACED

    codes: list[int] = []

    class Recording(FakeSession):
        def close(self, reason: str = "", *, code: int = 1000) -> None:
            codes.append(code)
            super().close(reason, code=code)

    agents = LocalAgents(holder=Holder("test/1"), placements=None, check_every=3600)
    first, second, other = (Recording(("127.0.0.1", 1)) for _ in range(3))
    agents.attach("c1", first, agent_id="a1")
    assert agents.holds("c1", "a1") and not agents.holds("c1", "a2")
    agents.attach("c1", second, agent_id="a1")
    assert codes == [CLOSE_DUPLICATE]  # the same agent: dial again, not "another agent"
    agents.attach("c1", other, agent_id="a2")
    assert codes == [CLOSE_DUPLICATE, CLOSE_REPLACED]
    assert agents.holds("c1", "a2") and not agents.holds("c1", "a1")


def test_a_worker_holding_an_agent_adopts_the_placement_another_worker_left() -> None:
    """Two workers hold connections of one agent: the placement names either, never none for long."""
    placements = RecordingPlacements()
    worker_a = LocalAgents(holder=Holder("test/1"), placements=placements, check_every=3600)
    worker_b = LocalAgents(holder=Holder("test/2"), placements=placements, check_every=3600)
    in_a, in_b = FakeSession(("127.0.0.1", 1)), FakeSession(("127.0.0.1", 1))
    worker_b.attach("c1", in_b, agent_id="a1")
    worker_a.attach("c1", in_a, agent_id="a1")
    assert placements.placed == {"c1": "test/1"}
    worker_b.check()
    assert placements.placed == {"c1": "test/1"}  # a live holder's placement stays
    worker_a.detach("c1", in_a, "the worker restarted")
    assert placements.placed == {}
    worker_b.check()  # its next heartbeat
    assert placements.placed == {"c1": "test/2"}


def test_a_replaced_agent_carrying_streams_is_closed_once_they_end() -> None:
    """An exec session open over the old connection during the agent's rolling update is not cut."""
    agents = LocalAgents(holder=Holder("test/1"), placements=None, check_every=3600)
    first, second = FakeSession(("127.0.0.1", 1)), FakeSession(("127.0.0.1", 1))
    first.streams = 1
    agents.attach("c1", first)
    agents.attach("c1", second)
    assert not first.closed and agents.session("c1") is second
    agents.check()
    assert not first.closed
    first.streams = 0
    agents.check()
    assert first.closed and "replaced" in first.close_reason
    assert not second.closed


def test_replaced_connections_kept_draining_are_bounded_per_cluster() -> None:
    """Whoever holds a register token reconnects again and again, a stream open on each connection:
    at most ``max_draining`` older ones stay; the oldest beyond are closed at once."""
    agents = LocalAgents(holder=Holder("test/1"), placements=None, check_every=3600, max_draining=2)
    other = FakeSession(("127.0.0.1", 1))
    other.streams = 1
    agents.attach("c2", other)
    sessions = []
    for _ in range(6):
        session = FakeSession(("127.0.0.1", 1))
        session.streams = 1  # a watch open on it
        agents.attach("c1", session)
        sessions.append(session)
    *older, newest = sessions
    assert agents.session("c1") is newest
    assert [s.closed for s in older] == [True, True, True, False, False]
    assert all("replaced" in s.close_reason for s in older[:3])
    agents.attach("c2", FakeSession(("127.0.0.1", 1)))  # another cluster's draining is its own
    assert not other.closed
    assert not any(s.closed for s in older[3:])


def test_when_the_newer_agent_leaves_the_older_open_one_serves_again() -> None:
    placements = RecordingPlacements()
    agents = LocalAgents(holder=Holder("test/1"), placements=placements, check_every=3600)
    first, second = FakeSession(("127.0.0.1", 1)), FakeSession(("127.0.0.1", 1))
    first.streams = 1  # pooled keep-alive connections, say
    agents.attach("c1", first)
    agents.attach("c1", second)
    agents.detach("c1", second, "the agent disconnected")
    assert agents.session("c1") is first and not first.closed
    assert placements.placed == {"c1": "test/1"}


class CountingTokens:
    """Register tokens by cluster; counts the store reads."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens
        self.reads = 0

    def register_token_digests(self, cluster_ids: list[str]) -> dict[str, str]:
        self.reads += 1
        return {cid: token_digest(self.tokens[cid]) for cid in cluster_ids if cid in self.tokens}


def test_an_agent_no_longer_authorized_is_dropped_by_the_check() -> None:
    tokens = CountingTokens({"c1": "first-token"})
    agents = LocalAgents(holder=Holder("test/1"), placements=None, tokens=tokens, check_every=3600)
    session = FakeSession(("127.0.0.1", 1))
    agents.attach("c1", session, token_digest=token_digest("first-token"))
    agents.check()
    assert not session.closed
    tokens.tokens["c1"] = "rotated-token"
    agents.check()
    assert session.closed and "register token" in session.close_reason
    assert agents.session("c1") is None
    assert "register token" in (agents.gone_reason("c1") or "")


def test_a_revoked_token_drops_the_agent_and_an_unreadable_store_keeps_it() -> None:
    tokens = CountingTokens({"c1": "t1", "c2": "t2"})
    agents = LocalAgents(holder=Holder("test/1"), placements=None, tokens=tokens, check_every=3600)
    first, second = FakeSession(("127.0.0.1", 1)), FakeSession(("127.0.0.1", 1))
    agents.attach("c1", first, token_digest=token_digest("t1"))
    agents.attach("c2", second, token_digest=token_digest("t2"))

    def down(cluster_ids: list[str]) -> dict[str, str]:
        raise OSError("the database does not answer")

    tokens.register_token_digests = down  # type: ignore[method-assign]
    agents.check()
    assert not first.closed and not second.closed
    del tokens.register_token_digests
    del tokens.tokens["c2"]  # revoked
    agents.check()
    assert not first.closed and second.closed


def test_one_store_read_per_pass_however_many_agents() -> None:
    tokens = CountingTokens({f"c{i}": f"t{i}" for i in range(300)})
    agents = LocalAgents(holder=Holder("test/1"), placements=None, tokens=tokens, check_every=3600)
    for i in range(300):
        agents.attach(f"c{i}", FakeSession(("127.0.0.1", 1)), token_digest=token_digest(f"t{i}"))
    agents.check()
    assert tokens.reads == 1
    assert all(not agents.session(f"c{i}").closed for i in range(300))  # type: ignore[union-attr]


class RecordingPlacements:
    def __init__(self) -> None:
        self.placed: dict[str, str] = {}

    def put_placement(self, cluster_id: str, holder: Holder) -> PlacementRecord:
        self.placed[cluster_id] = holder.id
        now = datetime.now(UTC)
        return PlacementRecord(cluster_id, holder.id, None, None, now, now)

    def clear_placement(self, cluster_id: str, holder_id: str) -> bool:
        if self.placed.get(cluster_id) == holder_id:
            del self.placed[cluster_id]
            return True
        return False

    def get_placement(self, cluster_id: str) -> PlacementRecord | None:
        holder = self.placed.get(cluster_id)
        now = datetime.now(UTC)
        return PlacementRecord(cluster_id, holder, None, None, now, now) if holder else None

    def touch_placements(self, holder_id: str) -> int:
        return sum(1 for h in self.placed.values() if h == holder_id)

    def adopt_placements(self, cluster_ids: list[str], holder: Holder, *, stale_after: float) -> int:
        missing = [cluster_id for cluster_id in cluster_ids if cluster_id not in self.placed]
        for cluster_id in missing:
            self.placed[cluster_id] = holder.id
        return len(missing)
