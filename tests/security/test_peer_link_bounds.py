"""The peer link of a real ``serve`` against peers that send garbage, say nothing, or open many
pipes and never read them: each is cut or held in a bounded time and memory.

The worker holds a real ``kube-agent --tunnel`` whose "apiserver" is a source that writes as
fast as it is read (so a pipe nobody reads is felt at once); the test is the peer, raw (no
credential), or with the peer-link key derived from the gateway's secret key — another
gateway worker, or whoever stole that key.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
import trustme
from cryptography.fernet import Fernet

from bcs_middleware.agent_tunnel.peer_link import GREETING, PEER_KEY_PURPOSE
from bcs_middleware.store.crypto import SecretBox
from tests.agent_tunnel.conftest import DENY_LOOPBACK, Agent, create_cluster
from tests.agent_tunnel.hostile import reset_peak, vm_bytes, worker_pid
from tests.support.gateway import Gateway, served_gateway
from tests.support.peer_link import RawPeer
from tests.support.polling import wait_until
from tests.support.servers import ConnectionServer, free_port

KEY = Fernet.generate_key().decode()
PEER_KEY = SecretBox([KEY]).derive(PEER_KEY_PURPOSE)[0]
CLUSTER = "BCS-K8S-PEERBOUNDS"
MiB = 1024 * 1024
GROWTH_BOUND = 32 * MiB
PIPES = 24
#: What one pipe nobody reads may hold in the holder: its stream's window (256 KiB) and what was
#: in flight when its Pause left, the pipe's splice buffer (256 KiB), allocator slack; measured
#: 0.9-1.0 MiB a pipe with 8, 24 and 48 pipes. On a faster machine (2026-11-29) 1.0-1.9 MiB with
#: 24: more arrives while a Pause is on its way, and the peak counts it. A holder that never
#: paused would never hold the source back (``held`` fails) and would keep all it was sent: the
#: source writes ~190 MiB before it is held, well over 24 pipes at this bound (72 MiB).
PER_PIPE = 3 * 1024 * 1024


class Source(ConnectionServer):
    """Writes to every connection as fast as it is read; ``sent`` counts, all connections together."""

    def __init__(self) -> None:
        self.sent = 0
        self.ca_pem = trustme.CA().cert_pem.bytes().decode()  # reported by the agent, never used here
        super().__init__()
        self.url = f"https://127.0.0.1:{self.port}"
        self.address = f"127.0.0.1:{self.port}"

    def handle(self, conn: socket.socket) -> None:
        chunk = b"s" * 65536
        conn.settimeout(120)
        try:
            while True:
                conn.sendall(chunk)
                self.sent += len(chunk)
        except OSError:
            pass
        finally:
            conn.close()


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    server = Source()
    yield server
    server.close()


@pytest.fixture(scope="module")
def peer_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, peer_port: int) -> Iterator[Gateway]:
    args = ["--peer-address", f"127.0.0.1:{peer_port}", *DENY_LOOPBACK]
    with served_gateway(tmp_path_factory.mktemp("gw"), args=args, env={"BCS_SECRET_KEY": KEY}, workers=1) as gw:
        assert wait_until(lambda: _listening(peer_port), 20)
        yield gw
    assert KEY not in gw.server.output() and PEER_KEY.hex() not in gw.server.output()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def worker(gateway: Gateway) -> int:
    return worker_pid(gateway.server.proc.pid)


@pytest.fixture(scope="module")
def agent(gateway: Gateway, source: Source, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    running = Agent(gateway, source, CLUSTER, create_cluster(gateway, CLUSTER),  # type: ignore[arg-type]
                    tmp_path_factory.mktemp("agent"), args=["--tunnel-connections", "1"]).start()
    try:
        assert wait_until(lambda: gateway.json("GET", f"/rest/clusters/{CLUSTER}")["agent"]["tunnel_connected"], 30), \
            running.output()
        yield running
    finally:
        running.stop()


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Does the other end close ``sock`` (end of file or reset) within ``seconds``?"""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        pass
    return True


def _pipe(peer_port: int, address: str) -> RawPeer:
    """An authenticated pipe to ``address`` through the worker's agent (its answer read)."""
    peer = RawPeer(peer_port)
    assert peer.greeting().startswith(GREETING)
    peer.send(peer.credential(PEER_KEY, CLUSTER, address))
    line = b""
    while not line.endswith(b"\n"):
        piece = peer.sock.recv(1)
        assert piece, "the listener closed the pipe"
        line += piece
    assert json.loads(line)["ok"] is True, line
    return peer


def test_garbage_on_the_peer_link_is_cut_at_once(gateway: Gateway, peer_port: int, worker: int,
                                                   agent: Agent, source: Source) -> None:
    before = vm_bytes(worker, "VmRSS")
    reset_peak(worker)
    # Not TLS at all.
    with socket.create_connection(("127.0.0.1", peer_port), timeout=10) as raw:
        try:
            raw.sendall(os.urandom(64 * 1024))
        except OSError:
            pass  # cut while writing
        assert _closed_within(raw, 3)
    # TLS, then a request line longer than 1 KiB, then one that is not JSON.
    for garbage in (b"x" * 4096, b"{not json at all}\n", json.dumps({"cluster": CLUSTER}).encode() + b"\n"):
        peer = RawPeer(peer_port)
        assert peer.greeting().startswith(GREETING)
        started = time.monotonic()
        peer.send(garbage)
        assert peer.rest() == b""  # nothing said: no answer, no pipe
        assert time.monotonic() - started < 3
        peer.close()
    assert vm_bytes(worker, "VmHWM") - before < GROWTH_BOUND
    # The listener still serves a peer with the credential.
    pipe = _pipe(peer_port, source.address)
    assert len(pipe.sock.recv(65536)) > 0
    pipe.close()
    assert "Traceback" not in gateway.server.output()


def test_peers_that_dial_and_say_nothing_are_cut_within_the_handshake_timeout(
        gateway: Gateway, peer_port: int, worker: int) -> None:
    before = vm_bytes(worker, "VmRSS")
    reset_peak(worker)
    socks = [socket.create_connection(("127.0.0.1", peer_port), timeout=10) for _ in range(300)]
    try:
        started = time.monotonic()
        # Beyond the 128 unauthenticated connections a listener holds, each is closed at once;
        # the others when the 5 s handshake timeout passes. None is held longer.
        closed = [threading.Event() for _ in socks]

        def watch(index: int) -> None:
            if _closed_within(socks[index], 15):
                closed[index].set()

        watchers = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(len(socks))]
        for thread in watchers:
            thread.start()
        assert wait_until(lambda: sum(event.is_set() for event in closed) >= len(socks) - 128, 3)
        for thread in watchers:
            thread.join(15)
        assert all(event.is_set() for event in closed)
        assert time.monotonic() - started < 10
    finally:
        for sock in socks:
            sock.close()
    assert vm_bytes(worker, "VmHWM") - before < GROWTH_BOUND


def test_pipes_a_peer_opens_and_never_reads_hold_bounded_memory(
        gateway: Gateway, peer_port: int, worker: int, agent: Agent, source: Source) -> None:
    before = vm_bytes(worker, "VmRSS")
    reset_peak(worker)
    pipes = [_pipe(peer_port, source.address) for _ in range(PIPES)]
    try:
        # Until the source is held back (flow control all the way): a second in which it wrote nothing.
        held = False
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            current = source.sent
            held = not wait_until(lambda current=current: source.sent != current, 1.0)
        grew = vm_bytes(worker, "VmHWM") - before
        print(f"\n{PIPES} pipes never read: the source wrote {source.sent / MiB:.0f} MiB before it was held; "
              f"worker RSS grew by {grew / MiB:.1f} MiB")
        assert held, "the source was never held back"
        assert grew < PIPES * PER_PIPE
        # The worker still serves: a request through the agent.
        status, _ = gateway.call("GET", f"/rest/clusters/{CLUSTER}")
        assert status == 200
    finally:
        for pipe in pipes:
            pipe.close()
