#!/usr/bin/env python
"""What does the peer link (``bcs_middleware.agent_tunnel.peer_link``) add to a stream to an agent?

A requester reaching an agent held by another worker or instance opens a pipe through the
holder's peer listener (TCP, TLS 1.3, challenge, HMAC credential, answer) and its bytes then
cross two more copies: the requester's socketpair pump and the holder's splice. This
measures, on loopback, against a local echo server standing in for the agent's stream:

* ``open``: establishing one pipe (what a new upstream connection pays; pooled connections
  pay it once);
* ``rtt``: a 200-byte request and its echo, sequentially, on one connection — through the
  pipe and directly;
* ``throughput``: ``--mib`` MiB up and echoed back, through the pipe and directly.

Usage: ``python bench/peer_link_bench.py [--opens 200] [--rtts 2000] [--mib 64] [--gevent]``
(``--gevent`` monkey-patches first, as the gateway's default worker does: listener, pumps
and splices are greenlets then).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--opens", type=int, default=200)
    parser.add_argument("--rtts", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--gevent", action="store_true")
    args = parser.parse_args()
    if args.gevent:
        from gevent import monkey

        monkey.patch_all()
    run(args)


def run(args: argparse.Namespace) -> None:
    import socket
    import statistics
    import threading
    import time

    from cryptography.fernet import Fernet

    from bcs_middleware.agent_tunnel.peer_client import PeerClient
    from bcs_middleware.agent_tunnel.peer_link import PEER_KEY_PURPOSE, PeerAddress
    from bcs_middleware.agent_tunnel.peer_listener import PeerListener
    from bcs_middleware.store.crypto import SecretBox

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(262144):
                conn.sendall(data)

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

    class Agents:
        def open_local(self, cluster_id: str, address: str, timeout: float) -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=timeout)

    keys = SecretBox([Fernet.generate_key()]).derive(PEER_KEY_PURPOSE)
    listener = PeerListener(keys=keys, address=PeerAddress.parse("127.0.0.1"))
    listener.start(Agents())
    client = PeerClient(keys[0])

    def pipe() -> socket.socket:
        return client.open(listener.advertised or "", listener.fingerprint, "BCS-K8S-BENCH", "10.0.0.1:6443", 5)

    def direct() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    opens = []
    for _ in range(args.opens):
        started = time.perf_counter()
        sock = pipe()
        opens.append(time.perf_counter() - started)
        sock.close()
    opens.sort()
    print(f"open: p50 {opens[len(opens) // 2] * 1e3:.2f} ms, p99 {opens[int(len(opens) * 0.99)] * 1e3:.2f} ms "
          f"({args.opens} pipes)")

    def rtt(sock: socket.socket) -> float:
        payload = b"x" * 200
        samples = []
        with sock:
            for _ in range(args.rtts):
                started = time.perf_counter()
                sock.sendall(payload)
                got = 0
                while got < len(payload):
                    got += len(sock.recv(65536))
                samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    via, plain = rtt(pipe()), rtt(direct())
    print(f"rtt (200 B echo, median of {args.rtts}): through the pipe {via * 1e6:.0f} µs, direct "
          f"{plain * 1e6:.0f} µs, the hop adds {(via - plain) * 1e6:.0f} µs")

    def throughput(sock: socket.socket) -> float:
        total = args.mib * 1024 * 1024
        chunk = b"y" * 262144

        def send() -> None:
            sent = 0
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)

        with sock:
            started = time.perf_counter()
            sender = threading.Thread(target=send)
            sender.start()
            got = 0
            while got < total:
                data = sock.recv(262144)
                if not data:
                    break
                got += len(data)
            sender.join()
            return total / (time.perf_counter() - started) / 1024 / 1024

    via_t, plain_t = throughput(pipe()), throughput(direct())
    print(f"throughput ({args.mib} MiB up and echoed back): through the pipe {via_t:.0f} MiB/s, direct "
          f"{plain_t:.0f} MiB/s")
    listener.close()


if __name__ == "__main__":
    main()
