#!/usr/bin/env python
"""Does a worker's memory stay bounded when it talks to many distinct upstreams once each?

Pushes ``--clusters`` distinct upstream identities (each its own CA bundle text,
TLS server name and address prefix, as 10,000 clusters would be) through one
:class:`~bcs_middleware.outbound.transport.PooledTransport`, one request each,
against a few loopback TLS servers (asyncio, in a child process), then keeps using
one hot upstream while the idle state ages out. Prints this process's RSS before,
after the burst and after the idle period, and the size of the transport's tables.

Usage: ``python bench/pool_memory_bench.py [--clusters 10000] [--servers 3]
[--idle-timeout 2] [--state-ttl 5] [--wait 8]``

The timeouts default to a few seconds so the run is short; in production they are
55 s (idle connections) and 600 s (TLS contexts, parsed addresses). Runs against
any transport that has ``send``; keyword arguments it does not know are not passed
(so the same file measures an older transport for comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import inspect
import multiprocessing
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def _serve(certfile: str, ports: multiprocessing.SimpleQueue, count: int) -> None:  # type: ignore[type-arg]
    """Loopback TLS servers answering every request with ``ANSWER``, keeping connections open."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certfile)
        servers = [await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx, backlog=1024)
                   for _ in range(count)]
        for server in servers:
            ports.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _trim() -> None:
    """Give freed heap back to the kernel where glibc allows (what a long idle worker gets anyway)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _tables(transport: object) -> str:
    parts = []
    for name in ("_pool", "_tls", "_origins", "_failed", "_idle", "_contexts"):
        table = getattr(transport, name, None)
        if table is not None:
            size = len(table) if not isinstance(table, dict) else sum(
                len(v) if isinstance(v, list) else 1 for v in table.values())
            parts.append(f"{name.strip('_')}={size}")
    return " ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--idle-timeout", type=float, default=2.0)
    parser.add_argument("--state-ttl", type=float, default=5.0)
    parser.add_argument("--wait", type=float, default=8.0,
                        help="seconds of light traffic to one hot upstream after the burst")
    args = parser.parse_args()

    import trustme

    ca = trustme.CA()
    tmp = Path(tempfile.mkdtemp(prefix="pool-memory-"))
    cert = ca.issue_cert("*.bench.test", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
    ca_pem = ca.cert_pem.bytes().decode()

    ports_queue: multiprocessing.SimpleQueue = multiprocessing.SimpleQueue()  # type: ignore[type-arg]
    server = multiprocessing.Process(target=_serve, args=(str(tmp / "server.pem"), ports_queue,
                                                          args.servers), daemon=True)
    server.start()
    ports = [ports_queue.get() for _ in range(args.servers)]

    from bcs_middleware.core.environ import Upstream
    from bcs_middleware.outbound.transport import PooledTransport

    wanted = {"idle_timeout": args.idle_timeout, "state_ttl": args.state_ttl, "read_timeout": 10.0}
    accepted = inspect.signature(PooledTransport).parameters
    transport = PooledTransport(**{k: v for k, v in wanted.items() if k in accepted})

    def one(i: int) -> None:
        upstream = Upstream(
            base_urls=(f"https://127.0.0.1:{ports[i % len(ports)]}/c{i}",), path="/version",
            # One CA per cluster: the same certificate with a comment of its own makes a
            # distinct bundle (and a distinct context) exactly as a cluster's own CA would.
            ca_pem=f"# cluster {i}\n{ca_pem}", server_name=f"c{i}.bench.test", name=f"cluster-{i}")
        resp = transport.send(upstream, "GET", [("Accept", "application/json")], None, None)
        assert resp.read() == b"ok"
        resp.release_conn()

    hot = args.clusters  # an identity of its own, used all along
    for _ in range(50):
        one(hot)
    _trim()
    before = rss_mib()
    print(f"before: RSS {before:7.1f} MiB   {_tables(transport)}", flush=True)
    started = time.monotonic()
    for i in range(args.clusters):
        one(i)
        if i % 100 == 0:
            one(hot)
    burst = time.monotonic() - started
    after = rss_mib()
    print(f"after {args.clusters} clusters once each ({burst:.0f} s): RSS {after:7.1f} MiB "
          f"(+{after - before:.1f})   {_tables(transport)}", flush=True)
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        one(hot)
        time.sleep(0.05)
    _trim()
    idle = rss_mib()
    print(f"after {args.wait:.0f} s of one hot upstream: RSS {idle:7.1f} MiB "
          f"(+{idle - before:.1f})   {_tables(transport)}", flush=True)
    print(f"pid {os.getpid()}, transport {type(transport).__module__}", flush=True)
    transport.close()
    server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
