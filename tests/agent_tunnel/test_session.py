"""Session: virtual streams between a gateway end and an agent end over one real TLS WebSocket.

Both ends run in this process on 127.0.0.1; the agent dials TCP servers standing in for
an apiserver. ``test_the_suite_passes_under_gevent`` runs this module again in a
subprocess with gevent's monkey-patching (the gateway's default worker class).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bcs_middleware.agent_tunnel.frames import Message, MessageType, decode, encode
from bcs_middleware.agent_tunnel.session import Dial, MemoryStream, Session, TooManyStreams, TunnelClosed
from tests.support.polling import wait_until

from .wsfixtures import (
    TLS,
    TargetServer,
    channel_pair,
    dial_any,
    pattern,
    pattern_digest,
    recv_exactly,
    rss_bytes,
)

UNDER_GEVENT = os.environ.get("BCS_TEST_TUNNEL_GEVENT") == "1"


@pytest.fixture(scope="module")
def tls() -> TLS:
    return TLS()


@pytest.fixture
def echo() -> Iterator[TargetServer]:
    server = TargetServer("echo")
    yield server
    server.close()


@contextlib.contextmanager
def tunnel(tls: TLS, *, dial: Dial = dial_any, gw: dict[str, Any] | None = None,
           agent: dict[str, Any] | None = None) -> Iterator[tuple[Session, Session]]:
    """(gateway session, agent session), both served, over one TLS WebSocket."""
    with channel_pair(tls) as (client, server):
        agent_session = Session(client, dial=dial, name="agent", **(agent or {}))
        gw_session = Session(server, name="gw", **(gw or {}))
        threads = [threading.Thread(target=s.serve, daemon=True) for s in (agent_session, gw_session)]
        for thread in threads:
            thread.start()
        try:
            yield gw_session, agent_session
        finally:
            gw_session.close("test over")
            agent_session.close("test over")
            for thread in threads:
                thread.join(10)


def test_bytes_travel_both_ways_through_one_stream(tls: TLS, echo: TargetServer) -> None:
    with tunnel(tls) as (gw, agent):
        with gw.open("tcp", echo.address, 5) as sock:
            sock.settimeout(5)
            sock.sendall(b"hello through the agent")
            assert recv_exactly(sock, 23) == b"hello through the agent"
            assert gw.streams == 1
        wait_until(lambda: (gw.streams, agent.streams, echo.ended) == (0, 0, 1), 5)
        assert (gw.streams, agent.streams, echo.ended) == (0, 0, 1)
        assert gw.bytes_out == 23 and gw.bytes_in == 23
        assert agent.bytes_in == 23 and agent.bytes_out == 23


def test_a_thousand_concurrent_streams_on_one_session(tls: TLS, echo: TargetServer) -> None:
    count = 1000
    with tunnel(tls) as (gw, _agent):
        socks = [gw.open("tcp", echo.address, 10) for _ in range(count)]
        try:
            assert gw.streams == count
            for i, sock in enumerate(socks):
                sock.settimeout(20)
                sock.sendall(b"stream %06d" % i)
            for i, sock in enumerate(socks):
                assert recv_exactly(sock, 13) == b"stream %06d" % i
        finally:
            for sock in socks:
                sock.close()
        assert echo.connections == count


def test_a_slow_reader_does_not_stall_a_fast_stream(tls: TLS, echo: TargetServer) -> None:
    size = 48 * 1024 * 1024
    source = TargetServer("source", size=size)
    window = 256 * 1024
    try:
        with tunnel(tls, gw={"window": window}) as (gw, _agent):
            slow = gw.open("tcp", source.address, 5)  # nobody reads it for now
            fast = gw.open("tcp", echo.address, 5)
            fast.settimeout(5)
            slow_stream = next(s for s in gw._streams.values() if s.conn_id == 1)
            assert wait_until(lambda: slow_stream.sent_pause, 15)  # the source filled its window
            started = time.monotonic()
            for i in range(200):
                fast.sendall(b"ping %04d" % i)
                assert recv_exactly(fast, 9) == b"ping %04d" % i
            assert time.monotonic() - started < 5
            # the slow stream is held at its window (plus what was in flight), not buffered whole
            slow_stream = next(s for s in gw._streams.values() if s.conn_id == 1)
            assert slow_stream.sent_pause
            # (what was in flight when the Pause left: at most the connection's TCP buffers)
            assert len(slow_stream.out) < window + 16 * 1024 * 1024
            # and it resumes: every byte arrives, in order
            slow.settimeout(20)
            digest = hashlib.sha256()
            got = 0
            while got < size:
                chunk = slow.recv(1 << 20)
                assert chunk
                digest.update(chunk)
                got += len(chunk)
            assert digest.digest() == pattern_digest(size)
            slow.close()
            fast.close()
    finally:
        source.close()


def test_an_apiserver_that_stops_reading_holds_only_its_own_upload(tls: TLS, echo: TargetServer) -> None:
    """The agent's end sends Pause; the gateway's end stops reading that stream's socket, and only it."""
    held = TargetServer("hold")
    window = 256 * 1024
    size = 48 * 1024 * 1024
    try:
        with tunnel(tls, agent={"window": window}) as (gw, agent), contextlib.ExitStack() as stack:
            upload = gw.open("tcp", held.address, 5)
            upload.settimeout(30)
            uploaded: list[int] = []

            def push() -> None:
                block = b"u" * (1 << 20)
                try:
                    for _ in range(size // len(block)):
                        upload.sendall(block)
                except OSError:
                    return  # the test failed and closed the stream
                uploaded.append(size)

            pusher = threading.Thread(target=push, daemon=True)
            pusher.start()
            stack.callback(upload.close)
            gw_stream = next(s for s in gw._streams.values() if s.conn_id == 1)

            def paused() -> bool:
                agent_stream = agent._streams.get(1)
                return gw_stream.peer_paused and agent_stream is not None and agent_stream.sent_pause

            # Polled, not slept: on a loaded machine the Pause takes its time to come back.
            assert wait_until(paused, timeout=30)
            assert pusher.is_alive()  # held: the socket pair and the stream's window are full
            agent_stream = agent._streams[1]
            assert len(agent_stream.out) < window + 16 * 1024 * 1024  # in flight when the Pause left
            fast = stack.enter_context(gw.open("tcp", echo.address, 5))
            fast.settimeout(5)
            started = time.monotonic()
            for i in range(200):
                fast.sendall(b"pong %04d" % i)
                assert recv_exactly(fast, 9) == b"pong %04d" % i
            assert time.monotonic() - started < 5
            held.release()
            pusher.join(30)
            assert uploaded == [size]
            upload.shutdown(socket.SHUT_WR)
            wait_until(lambda: held.received >= size, 30)
            assert held.received == size
            assert agent._excess == 0  # the accounting of bytes past the windows returns to nothing
    finally:
        held.close()


@pytest.mark.parametrize("direction", ["download", "upload"])
def test_64_mib_through_one_stream_with_bounded_memory(tls: TLS, direction: str) -> None:
    size = 64 * 1024 * 1024
    target = TargetServer("source" if direction == "download" else "sink", size=size)
    try:
        with tunnel(tls) as (gw, agent):
            before = rss_bytes()
            peak = before
            started = time.monotonic()
            with gw.open("tcp", target.address, 5) as sock:
                sock.settimeout(30)
                if direction == "download":
                    got = 0
                    digest = hashlib.sha256()
                    while got < size:
                        chunk = sock.recv(1 << 20)
                        assert chunk, f"end of file after {got} bytes: {gw.close_reason}"
                        digest.update(chunk)
                        got += len(chunk)
                        if got % (8 << 20) < len(chunk):
                            peak = max(peak, rss_bytes())
                    assert sock.recv(1) == b""  # the source closed: end of file follows the data
                    assert digest.digest() == pattern_digest(size)
                else:
                    block = b"u" * (1 << 20)
                    for i in range(size // len(block)):
                        sock.sendall(block)
                        if i % 8 == 0:
                            peak = max(peak, rss_bytes())
                    sock.shutdown(socket.SHUT_WR)
                    wait_until(lambda: target.received >= size, 30)
                    assert target.received == size
            elapsed = time.monotonic() - started
            assert elapsed < 60
            # both ends live in this process: together they hold a few windows, not the transfer
            assert peak - before < 32 * 1024 * 1024, f"RSS grew {(peak - before) >> 20} MiB"
            assert (gw.bytes_in if direction == "download" else gw.bytes_out) == size
            assert (agent.bytes_out if direction == "download" else agent.bytes_in) == size
    finally:
        target.close()


def test_a_failed_dial_reaches_the_opener_as_end_of_file(tls: TLS) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    with tunnel(tls) as (gw, _agent), gw.open("tcp", f"127.0.0.1:{port}", 5) as sock:
        sock.settimeout(5)
        started = time.monotonic()
        assert sock.recv(10) == b""
        assert time.monotonic() - started < 2


def test_a_refusing_dialer_reaches_the_opener_as_end_of_file_and_the_session_lives_on(
        tls: TLS, echo: TargetServer) -> None:
    def only_echo(proto: str, address: str, timeout: float) -> socket.socket:
        if address != echo.address:
            raise PermissionError(f"connect not allowed: {address}")
        return dial_any(proto, address, timeout)

    with tunnel(tls, dial=only_echo) as (gw, _agent):
        with gw.open("tcp", "10.0.0.1:6443", 5) as refused:
            refused.settimeout(5)
            assert refused.recv(10) == b""
        with gw.open("tcp", echo.address, 5) as allowed:
            allowed.settimeout(5)
            allowed.sendall(b"still up")
            assert recv_exactly(allowed, 8) == b"still up"
        assert echo.connections == 1


def test_the_gateway_end_refuses_connects_from_the_agent(tls: TLS, echo: TargetServer) -> None:
    with tunnel(tls) as (_gw, agent), agent.open("tcp", echo.address, 5) as sock:
        sock.settimeout(5)
        assert sock.recv(10) == b""
    assert echo.connections == 0


def test_data_before_the_end_is_delivered_to_a_late_reader(tls: TLS) -> None:
    source = TargetServer("source", size=3 * 1024 * 1024)
    try:
        with tunnel(tls) as (gw, _agent), gw.open("tcp", source.address, 5) as sock:
            assert wait_until(lambda: source.sent == 1, 10)  # the source has sent everything and closed
            sock.settimeout(10)
            data = bytearray()
            while chunk := sock.recv(1 << 20):
                data += chunk
            assert bytes(data) == pattern(3 * 1024 * 1024)
    finally:
        source.close()


def test_closing_the_local_end_closes_the_agents_connection(tls: TLS, echo: TargetServer) -> None:
    with tunnel(tls) as (gw, agent):
        sock = gw.open("tcp", echo.address, 5)
        sock.settimeout(5)
        sock.sendall(b"x")
        assert recv_exactly(sock, 1) == b"x"
        sock.close()
        assert wait_until(lambda: echo.ended == 1, 5)
        assert wait_until(lambda: agent.streams == 0, 5)


def test_closing_the_session_ends_every_stream_at_once(tls: TLS, echo: TargetServer) -> None:
    with tunnel(tls) as (gw, agent):
        socks = [gw.open("tcp", echo.address, 5) for _ in range(50)]
        for sock in socks:
            sock.settimeout(10)
            sock.sendall(b"a")
            assert recv_exactly(sock, 1) == b"a"
        results: list[bytes] = []
        readers = [threading.Thread(target=lambda s=sock: results.append(s.recv(10)), daemon=True) for sock in socks]
        for reader in readers:
            reader.start()
        time.sleep(0.2)  # the readers block in recv (a thread's start says nothing of where it is)
        started = time.monotonic()
        gw.close("shutting down")
        for reader in readers:
            reader.join(5)
        assert time.monotonic() - started < 1.5
        assert results == [b""] * 50
        with pytest.raises(TunnelClosed):
            gw.open("tcp", echo.address, 5)
        # the agent's session ends with the channel, and its connections to the apiserver with it
        assert wait_until(lambda: agent.closed and echo.ended == 50, 5), (agent.closed, echo.ended)
        for sock in socks:
            sock.close()


def test_a_silent_peer_is_taken_as_dead(tls: TLS, echo: TargetServer) -> None:
    with channel_pair(tls) as (_client, server):
        # the client end is never read: it answers no ping, so the gateway end hears nothing
        gw = Session(server, name="gw", ping_interval=0.2, dead_after=1.0)
        serving = threading.Thread(target=gw.serve, daemon=True)
        started = time.monotonic()
        serving.start()
        sock = gw.open("tcp", echo.address, 5)
        sock.settimeout(5)
        assert sock.recv(10) == b""
        serving.join(5)
        assert not serving.is_alive()
        assert 0.9 < time.monotonic() - started < 4
        assert gw.closed and "idle" in gw.close_reason
        sock.close()


def test_a_peer_that_ignores_pause_gets_the_stream_reset_not_the_memory(tls: TLS, echo: TargetServer) -> None:
    window = 64 * 1024
    with channel_pair(tls) as (raw, server):
        gw = Session(server, name="gw", window=window, overflow=512 * 1024)
        serving = threading.Thread(target=gw.serve, daemon=True)
        serving.start()
        raw.set_idle_timeout(10)
        flooded = gw.open("tcp", "10.0.0.1:6443", 5)  # nobody reads it
        connect = decode(raw.receive() or b"")
        assert connect.type is MessageType.CONNECT
        seen: list[Message] = []

        def read_raw() -> None:
            while (frame := raw.receive()) is not None:
                seen.append(decode(frame))

        reader = threading.Thread(target=read_raw, daemon=True)
        reader.start()
        chunk = b"z" * 32 * 1024
        for _ in range(64):  # 2 MiB, Pause or not
            raw.send(encode(Message.data(connect.conn_id, chunk)))
        wait_until(lambda: any(m.type is MessageType.ERROR for m in seen), 5)
        kinds = [(m.type, m.conn_id) for m in seen]
        assert (MessageType.PAUSE, connect.conn_id) in kinds
        errors = [m for m in seen if m.type is MessageType.ERROR]
        assert errors and errors[0].error_text == "buffer overflow"
        flooded.settimeout(5)
        data = bytearray()
        while chunk_in := flooded.recv(1 << 20):
            data += chunk_in
        assert len(data) < window + 512 * 1024 + 256 * 1024  # what the socket pair held before the reset
        assert not gw.closed  # one stream reset, the session carries on
        flooded.close()
        gw.close()
        serving.join(5)


def test_malformed_frames_end_the_session_without_a_crash(tls: TLS, echo: TargetServer) -> None:
    with channel_pair(tls) as (raw, server):
        raw.set_idle_timeout(10)
        gw = Session(server, name="gw")
        serving = threading.Thread(target=gw.serve, daemon=True)
        serving.start()
        sock = gw.open("tcp", echo.address, 5)
        raw.send(encode(Message(1, 1, MessageType.DATA, b"", 0))[:2])  # truncated header
        serving.join(5)
        assert not serving.is_alive()
        assert gw.closed and "protocol error" in gw.close_reason
        sock.settimeout(5)
        assert sock.recv(1) == b""
        sock.close()


# -- memory streams (Session.open_stream): what the transport's requests ride -------------------


def _echo(stream: MemoryStream, data: bytes) -> bytes:
    """Send ``data`` over a memory stream to the echo server and read as much back."""
    stream.send(data, 5)
    got = b""
    while len(got) < len(data):
        got += stream.recv(65536, 5)
    return got


def test_a_memory_stream_carries_bytes_both_ways_and_its_close_ends_the_agents_connection(
        tls: TLS, echo: TargetServer) -> None:
    with tunnel(tls) as (gw, agent):
        stream = gw.open_stream("tcp", echo.address, 5)
        assert _echo(stream, b"hello in memory") == b"hello in memory"
        assert not stream.readable()
        assert gw.streams == 1 and gw.bytes_out == 15 and gw.bytes_in == 15
        stream.close()
        stream.close()  # idempotent
        assert wait_until(lambda: echo.ended == 1 and agent.streams == 0 and gw.streams == 0)
        with pytest.raises(BrokenPipeError):
            stream.send(b"after the end", 5)


def test_a_memory_stream_whose_dial_fails_ends_with_end_of_file(tls: TLS) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    with tunnel(tls) as (gw, _agent):
        stream = gw.open_stream("tcp", f"127.0.0.1:{port}", 5)
        started = time.monotonic()
        assert stream.recv(10, 5) == b""
        assert time.monotonic() - started < 2
        assert stream.readable()  # the end stays: a pooled connection over it is seen closed
        with pytest.raises(BrokenPipeError):
            stream.send(b"x", 5)
        assert wait_until(lambda: gw.streams == 0)


def test_a_memory_stream_honours_its_timeout_and_stays_usable(tls: TLS, echo: TargetServer) -> None:
    with tunnel(tls) as (gw, _agent):
        stream = gw.open_stream("tcp", echo.address, 5)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            stream.recv(10, 0.3)
        assert 0.25 < time.monotonic() - started < 3
        assert _echo(stream, b"late") == b"late"
        stream.close()


def test_a_memory_stream_hands_over_at_most_the_limit(tls: TLS) -> None:
    source = TargetServer("source", size=256 * 1024)
    try:
        with tunnel(tls) as (gw, _agent):
            stream = gw.open_stream("tcp", source.address, 5)
            data = bytearray()
            while chunk := stream.recv(1000, 10):
                assert len(chunk) <= 1000
                data += chunk
            assert bytes(data) == pattern(256 * 1024)
    finally:
        source.close()


@pytest.mark.parametrize("ender", ["stream", "session"])
def test_a_reader_blocked_on_a_memory_stream_is_woken_by_its_end(tls: TLS, echo: TargetServer,
                                                                   ender: str) -> None:
    """What the transport's interrupt (a client gone during a watch) and an agent gone rely on."""
    with tunnel(tls) as (gw, _agent):
        stream = gw.open_stream("tcp", echo.address, 5)
        outcome: list[object] = []

        def read() -> None:
            started = time.monotonic()
            outcome.append(stream.recv(10, 30))
            outcome.append(time.monotonic() - started)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.3)  # the sleep is the test: the reader stays blocked while nothing comes
        assert not outcome  # blocked
        stream.close() if ender == "stream" else gw.close("the agent went away")
        reader.join(5)
        assert outcome and outcome[0] == b""
        assert isinstance(outcome[1], float) and outcome[1] < 3
        assert wait_until(lambda: echo.ended == 1)


def test_a_slow_memory_stream_is_paused_and_does_not_stall_a_fast_one(tls: TLS, echo: TargetServer) -> None:
    size = 48 * 1024 * 1024
    window = 256 * 1024
    source = TargetServer("source", size=size)
    try:
        with tunnel(tls, gw={"window": window}) as (gw, _agent):
            slow = gw.open_stream("tcp", source.address, 5)  # nobody reads it for now
            fast = gw.open_stream("tcp", echo.address, 5)
            slow_stream = next(s for s in gw._streams.values() if s.conn_id == 1)
            assert wait_until(lambda: slow_stream.sent_pause, 15)  # the source filled its window
            started = time.monotonic()
            for i in range(200):
                fast.send(b"ping %04d" % i, 5)
                got = b""
                while len(got) < 9:
                    got += fast.recv(9 - len(got), 5)
                assert got == b"ping %04d" % i
            assert time.monotonic() - started < 5
            slow_stream = next(s for s in gw._streams.values() if s.conn_id == 1)
            assert slow_stream.sent_pause
            assert len(slow_stream.out) < window + 16 * 1024 * 1024  # what was in flight
            digest = hashlib.sha256()
            got_total = 0
            while got_total < size:
                chunk = slow.recv(1 << 20, 20)
                assert chunk
                digest.update(chunk)
                got_total += len(chunk)
            assert digest.digest() == pattern_digest(size)
            assert slow.recv(10, 5) == b""
            assert gw._excess == 0
            fast.close()
    finally:
        source.close()


def test_a_memory_stream_the_peer_paused_holds_its_sender_within_the_timeout(tls: TLS) -> None:
    held = TargetServer("hold")
    window = 256 * 1024
    try:
        with tunnel(tls, agent={"window": window}) as (gw, agent):
            upload = gw.open_stream("tcp", held.address, 5)
            block = b"u" * (1 << 20)
            with pytest.raises(TimeoutError):
                for _ in range(64):  # 64 MiB: far more than the TCP buffers and the window hold
                    upload.send(block, 1.0)
            gw_stream = next(s for s in gw._streams.values() if s.conn_id == 1)
            assert gw_stream.peer_paused and agent._streams[1].sent_pause
            held.release()
            assert wait_until(lambda: not gw_stream.peer_paused, 10)
            upload.send(b"more", 5)  # resumed
            upload.close()
    finally:
        held.close()


def test_the_stream_limit_holds_for_both_kinds_of_stream(tls: TLS, echo: TargetServer) -> None:
    with tunnel(tls, gw={"max_streams": 2}) as (gw, _agent):
        sock = gw.open("tcp", echo.address, 5)
        stream = gw.open_stream("tcp", echo.address, 5)
        with pytest.raises(TooManyStreams):
            gw.open_stream("tcp", echo.address, 5)
        with pytest.raises(TooManyStreams):
            gw.open("tcp", echo.address, 5)
        assert gw.streams == 2
        stream.close()
        again = gw.open_stream("tcp", echo.address, 5)
        assert _echo(again, b"room again") == b"room again"
        again.close()
        sock.close()


#: The modules of the protocol side that run again under gevent.
GEVENT_MODULES = ("test_wschannel.py", "test_session.py", "test_agent.py")
#: Not run again: tests whose subject is another process (the ``kube-agent`` command refusing to
#: start or to trust a gateway), where this process's monkey-patching changes nothing.
NOT_REPEATED_UNDER_GEVENT = (
    "test_the_suite_passes_under_gevent",
    "test_the_cli_agent_refuses_an_unverified_gateway",
    "test_the_cli_agent_needs_https",
)


@pytest.mark.skipif(UNDER_GEVENT, reason="this is the gevent run")
def test_the_suite_passes_under_gevent() -> None:
    """The gateway runs on gevent by default: the channel, session and agent tests with gevent's monkey-patching."""
    here = Path(__file__).resolve().parent
    code = ("from gevent import monkey; monkey.patch_all()\n"
            "import sys, pytest\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-x', '-o', 'faulthandler_timeout=120',"
            f" '-k', {' and '.join(f'not {name}' for name in NOT_REPEATED_UNDER_GEVENT)!r}, *sys.argv[1:]]))\n")
    env = dict(os.environ, BCS_TEST_TUNNEL_GEVENT="1")
    modules = [str(here / name) for name in GEVENT_MODULES if (here / name).exists()]
    with tempfile.TemporaryFile("w+") as output:
        # Its own process group, so that a hang cannot outlive the bound (nor keep a pipe open).
        process = subprocess.Popen([sys.executable, "-c", code, *modules], cwd=here.parents[1], env=env,
                                   stdout=output, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            returncode = process.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
            returncode = -1
        output.seek(0)
        text = output.read()
    assert returncode == 0, text[-6000:]
    assert " passed" in text
