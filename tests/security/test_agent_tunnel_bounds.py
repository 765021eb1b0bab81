"""Attacks on the gateway's memory through an agent tunnel, through a real ``serve``.

Any user may create a cluster, and so hold its register token and connect an "agent" of
their own. Such an agent — here :class:`~tests.agent_tunnel.hostile.HostileAgent`, raw
frames over real TLS — floods every kind of message and never reads its socket. The
gateway worker's RSS (``/proc/<worker>/status``) must stay within a generous bound, and
the connection must be closed with the documented code (1008: a bound was broken; 1009:
a message too big) within a bounded time, logged with the cluster id and counted in
``bcs_agent_tunnel_limit_closes``.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator

import pytest

from bcs_middleware.agent_tunnel.frames import Message, MessageType
from bcs_middleware.agent_tunnel.wsframes import OP_CONTINUATION
from tests.agent_tunnel.conftest import DENY_LOOPBACK, create_cluster, tunnel_headers, tunnel_params
from tests.agent_tunnel.hostile import Flood, HostileAgent, reset_peak, vm_bytes, worker_pid
from tests.support.fake_apiserver import FakeAPIServer
from tests.support.gateway import SA_TOKEN, Gateway, served_gateway
from tests.support.polling import wait_until

MiB = 1024 * 1024
#: What the worker may grow by while one hostile agent does its worst (it grew by ~128 MiB
#: in a few seconds of pings before the bounds).
GROWTH_BOUND = 32 * MiB
#: How long a flood may go on before the gateway must have cut it.
FLOOD_SECONDS = 20.0
FLOOD_BYTES = 2048 * MiB


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(token=SA_TOKEN) as api:
        yield api


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with served_gateway(tmp_path_factory.mktemp("gateway"), args=DENY_LOOPBACK, workers=1) as gw:
        yield gw


@pytest.fixture(scope="module")
def worker(gateway: Gateway) -> int:
    return worker_pid(gateway.server.proc.pid)


_clusters = iter(range(1, 1000))


@pytest.fixture
def hostile(gateway: Gateway, apiserver: FakeAPIServer) -> Iterator[tuple[str, HostileAgent]]:
    """A new cluster (as its creator would make it) and a hostile agent connected for it."""
    cluster = f"BCS-K8S-HOSTILE{next(_clusters):03d}"
    token = create_cluster(gateway, cluster)
    params = tunnel_params(address=apiserver.url, ca_pem=apiserver.ca_pem)
    agent = HostileAgent(gateway.server.port, ssl.create_default_context(cafile=gateway.ca_file),
                         tunnel_headers(cluster, token, params))
    try:
        assert agent.status == 101, agent.head
        # The gateway holds it: a cluster whose tunnel is connected.
        assert wait_until(lambda: gateway.json("GET", f"/rest/clusters/{cluster}")["agent"]["tunnel_connected"], 10)
        yield cluster, agent
    finally:
        agent.close()


def measured_flood(agent: HostileAgent, worker: int, blob: bytes, what: str, *, seconds: float = FLOOD_SECONDS,
                   max_bytes: int = FLOOD_BYTES) -> Flood:
    """:meth:`HostileAgent.flood` with ``blob``; the worker's RSS may grow by :data:`GROWTH_BOUND` at most."""
    before = vm_bytes(worker, "VmRSS")
    reset_peak(worker)
    flood = agent.flood(blob, seconds=seconds, max_bytes=max_bytes)
    grew = vm_bytes(worker, "VmHWM") - before
    print(f"\n{what}, never read: {flood.sent / MiB:.1f} MiB sent in {flood.seconds:.1f} s; "
          f"worker RSS grew by {grew / MiB:.1f} MiB (peak)")
    assert grew < GROWTH_BOUND
    return flood


def limit_closes(gateway: Gateway, cluster: str, bound: str) -> float:
    status, body = gateway.call("GET", "/metrics")
    assert status == 200, body
    pattern = (r'^bcs_agent_tunnel_limit_closes_total\{(?=[^}]*bound="' + re.escape(bound) + '")(?=[^}]*cluster="'
               + re.escape(cluster) + r'")[^}]*\} (\S+)$')
    found = re.search(pattern, body.decode(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def assert_disconnected(gateway: Gateway, cluster: str, agent: HostileAgent, *, code: int, bound: str) -> None:
    received = agent.drain()
    assert received.eof, "the gateway did not end the connection"
    assert received.close_code == code, (received.close_code, received.close_reason)
    assert wait_until(lambda: f"tunnel agent:{cluster}: " in gateway.server.output(), 10)
    assert wait_until(lambda: limit_closes(gateway, cluster, bound) == 1.0, 10)
    assert not gateway.json("GET", f"/rest/clusters/{cluster}")["agent"]["tunnel_connected"]
    # A request for the cluster says why its agent is gone.
    status, body = gateway.call("GET", f"/tunnels/clusters/{cluster}/version")
    assert status == 503 and b"gone (cut: " in body, body


@pytest.mark.parametrize("payload", [b"", b"p" * 125], ids=["empty", "125-bytes"])
def test_an_agent_that_pings_and_never_reads_is_cut_with_bounded_memory(
    gateway: Gateway, hostile: tuple[str, HostileAgent], worker: int, payload: bytes,
) -> None:
    cluster, agent = hostile
    flood = measured_flood(agent, worker, agent.ping(payload) * 512, f"pings of {len(payload)} bytes")
    assert flood.cut or flood.stalled, "the gateway took the whole flood"
    assert_disconnected(gateway, cluster, agent, code=1008, bound="pongs")


def test_data_for_streams_the_gateway_never_opened_disconnects(
    gateway: Gateway, hostile: tuple[str, HostileAgent], worker: int,
) -> None:
    cluster, agent = hostile
    blob = b"".join(agent.message(Message.data(1000 + i, b"x")) for i in range(512))
    measured_flood(agent, worker, blob, "data for unknown streams")
    assert_disconnected(gateway, cluster, agent, code=1008, bound="unknown_stream")


def test_connects_from_an_agent_disconnect(gateway: Gateway, hostile: tuple[str, HostileAgent], worker: int) -> None:
    cluster, agent = hostile
    blob = b"".join(agent.message(Message.connect(i + 1, "tcp", f"127.0.0.1:{gateway.server.port}"))
                    for i in range(256))
    measured_flood(agent, worker, blob, "Connects")
    assert_disconnected(gateway, cluster, agent, code=1008, bound="connect")


@pytest.mark.parametrize("kind", [MessageType.PAUSE, MessageType.RESUME, MessageType.ERROR], ids=lambda k: k.name)
def test_stream_messages_for_streams_never_opened_disconnect(
    gateway: Gateway, hostile: tuple[str, HostileAgent], worker: int, kind: MessageType,
) -> None:
    cluster, agent = hostile
    message = {MessageType.PAUSE: Message.pause, MessageType.RESUME: Message.resume,
               MessageType.ERROR: Message.eof}[kind]
    measured_flood(agent, worker, b"".join(agent.message(message(5000 + i)) for i in range(512)), kind.name)
    assert_disconnected(gateway, cluster, agent, code=1008, bound="unknown_stream")


def test_a_sync_flood_never_read_holds_bounded_memory(hostile: tuple[str, HostileAgent], worker: int) -> None:
    """SyncConnections listing 100,000 streams, again and again: legal, acted on once a second,
    and only the ids of streams the gateway holds (none) kept from it."""
    _cluster, agent = hostile
    sync = agent.message(Message.sync_connections(list(range(1, 100_000))))
    measured_flood(agent, worker, sync, "syncs", seconds=8, max_bytes=512 * MiB)


def test_endless_empty_fragments_disconnect(gateway: Gateway, hostile: tuple[str, HostileAgent], worker: int) -> None:
    cluster, agent = hostile
    agent.send(agent.fragments([1]))
    measured_flood(agent, worker, agent.frame(OP_CONTINUATION, b"", fin=False) * 4096, "empty fragments")
    assert_disconnected(gateway, cluster, agent, code=1009, bound="fragments")


def test_an_oversized_fragmented_message_disconnects(gateway: Gateway, hostile: tuple[str, HostileAgent]) -> None:
    cluster, agent = hostile
    agent.flood(agent.fragments([64 * 1024] * 32), seconds=10, max_bytes=8 * MiB)
    assert_disconnected(gateway, cluster, agent, code=1009, bound="message_size")
