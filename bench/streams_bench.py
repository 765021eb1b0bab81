"""Streams at scale: thousands of open watches through one gateway; departed and slow clients.

    python bench/streams_bench.py [--watches 1000,10000] [--departed 1000] [--slow 1000]
                                  [--serve-arg=--worker-class=gthread ...] [--json out.json]

For each number of watches, one run of ``bcs-middleware serve`` with its documented defaults
(plus ``--serve-arg``s) in front of the asyncio fake apiserver of
:mod:`tests.support.watch_apiserver` (TLS, holds any number of watches, broadcasts), driven by
an asyncio TLS client in this process. Reports:

* how many watches were established (answered 200 and held by the apiserver);
* the gateway's summed RSS (master and workers) with them open;
* one broadcast event: the share of watches that received it within 5 s, p50/p99 latency
  (apiserver send to client receive, one monotonic clock);
* p50/p99 of ordinary GETs through the tunnel during the broadcast;
* ``--departed`` quiet watches closed abruptly by their clients: the share whose upstream
  connection the apiserver saw closed within 1 s and within 5 s;
* ``/healthz`` latency (new TLS connection each) with ``--slow`` half-sent request heads open.

Figures from one run on this machine, not a timed test. The open-file limit is raised here
(to the hard limit) for this process and the servers it starts, not by the product.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.servers import BIN, ServerProcess, free_port  # noqa: E402
from tests.support.watch_apiserver import UVLOOP_ENV, WatchAPIServer, open_watch, use_uvloop  # noqa: E402

ADMIN = "streams-bench-admin-token-" + "b" * 20
SA = "streams-bench-sa-token"
CLUSTER = "BCS-K8S-STREAMS"
HANDSHAKES_AT_ONCE = 100


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_kib(pid: int) -> int:
    total = 0
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(entry))
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def _cpu_seconds(pid: int, *, children: bool = True) -> float:
    """CPU time (user + system) of ``pid`` and, with ``children``, its child processes."""
    pids = [pid]
    if children:
        try:
            pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            pass
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _rest(base: str, method: str, path: str, body: dict, cafile: str) -> None:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=cafile)) as resp:
        resp.read()


class Watch:
    __slots__ = ("id", "reader", "received", "writer")

    def __init__(self, wid: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.id = wid
        self.reader = reader
        self.writer = writer
        self.received: float | None = None


async def _open_watch(port: int, context: ssl.SSLContext, wid: str, gate: asyncio.Semaphore,
                      direct: bool = False) -> Watch | None:
    prefix, token = ("", SA) if direct else (f"/tunnels/clusters/{CLUSTER}", ADMIN)
    opened = await open_watch(port, context, prefix, token, wid, gate)
    return None if opened is None else Watch(wid, *opened)


async def _await_event(watch: Watch, sent_at: dict[str, float]) -> None:
    seen = b""
    while b"event-1" not in seen:
        chunk = await watch.reader.read(65536)
        if not chunk:
            return
        seen += chunk
    watch.received = time.monotonic()
    if "sent" not in sent_at:
        start = seen.index(b"{")
        sent_at["sent"] = json.loads(seen[start:seen.index(b"\n", start)])["object"]["sent"]


async def _get_latencies(port: int, context: ssl.SSLContext, count: int, concurrency: int) -> list[float]:
    path = f"/tunnels/clusters/{CLUSTER}/version"
    request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {ADMIN}\r\n\r\n".encode()
    latencies: list[float] = []

    async def client(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
        try:
            for _ in range(n):
                started = time.monotonic()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                latencies.append(time.monotonic() - started)
                await asyncio.sleep(0.01)
        finally:
            writer.transport.abort()

    await asyncio.gather(*(client(count // concurrency) for _ in range(concurrency)))
    return latencies


async def _healthz(port: int, context: ssl.SSLContext) -> float:
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = await reader.read()
    writer.transport.abort()
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    return time.monotonic() - started


async def _half_head(port: int, context: ssl.SSLContext, gate: asyncio.Semaphore) -> asyncio.StreamWriter | None:
    async with gate:
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                            server_hostname="localhost")
        except (OSError, ssl.SSLError):
            return None
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    return writer


def _harness_cpu(api: WatchAPIServer) -> float:
    own = os.times()
    return own.user + own.system + (_cpu_seconds(api.pid, children=False) if api.pid else 0.0)


async def _scenario(port: int, cafile: str, api: WatchAPIServer, server: ServerProcess, watches: int,
                    departed: int, slow: int) -> dict:
    context = ssl.create_default_context(cafile=cafile)
    gate = asyncio.Semaphore(HANDSHAKES_AT_ONCE)
    result: dict = {"watches": watches}
    idle_kib = _rss_kib(server.proc.pid)
    result["gateway_rss_idle_mib"] = round(idle_kib / 1024, 1)
    started = time.monotonic()
    opened = await asyncio.gather(*(_open_watch(port, context, str(i), gate) for i in range(watches)))
    streams = [w for w in opened if w is not None]
    result["open_seconds"] = round(time.monotonic() - started, 1)
    deadline = time.monotonic() + 60
    while api.stats()["open"] < len(streams) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    result["established"] = len(streams)
    result["held_by_apiserver"] = api.stats()["open"]
    await asyncio.sleep(2)
    busy_kib = _rss_kib(server.proc.pid)
    result["gateway_rss_mib"] = round(busy_kib / 1024, 1)
    result["rss_kib_per_watch"] = round((busy_kib - idle_kib) / max(len(streams), 1), 1)

    sent_at: dict[str, float] = {}
    waiting = [asyncio.ensure_future(_await_event(w, sent_at)) for w in streams]
    gets = asyncio.ensure_future(_get_latencies(port, context, 200, 4))
    await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    # CPU spent while the event is delivered: the gateway's, and the harness's (this client and
    # the fake apiserver) — on two cores the two share the same budget.
    gateway_cpu, harness_cpu = _cpu_seconds(server.proc.pid), _harness_cpu(api)
    await loop.run_in_executor(None, api.broadcast)
    await asyncio.wait(waiting, timeout=10)
    gateway_cpu, harness_cpu = _cpu_seconds(server.proc.pid) - gateway_cpu, _harness_cpu(api) - harness_cpu
    delivered = sum(w.received is not None for w in streams)
    result["broadcast_gateway_cpu_us_per_event"] = round(gateway_cpu / max(delivered, 1) * 1e6, 1)
    result["broadcast_harness_cpu_us_per_event"] = round(harness_cpu / max(delivered, 1) * 1e6, 1)
    get_latencies = await gets
    sent = sent_at.get("sent", float("nan"))
    delays = [w.received - sent for w in streams if w.received is not None]
    within = [d for d in delays if d <= 5.0]
    result["event_within_5s_share"] = round(len(within) / max(watches, 1), 5)
    result["event_p50_ms"] = round(_pct(delays, 0.50) * 1000, 1)
    result["event_p99_ms"] = round(_pct(delays, 0.99) * 1000, 1)
    result["get_p50_ms"] = round(_pct(get_latencies, 0.50) * 1000, 1)
    result["get_p99_ms"] = round(_pct(get_latencies, 0.99) * 1000, 1)
    result["gets"] = len(get_latencies)

    # Departed quiet watches: abrupt closes, then when did the apiserver see each upstream close?
    leaving = streams[:departed]
    closed_at: dict[str, float] = {}
    for w in leaving:
        w.writer.transport.abort()
        closed_at[w.id] = time.monotonic()
    await asyncio.sleep(5.5)
    seen = api.stats()["closed"]
    lags = [seen[wid] - t for wid, t in closed_at.items() if wid in seen]
    result["departed"] = len(leaving)
    result["departed_freed_1s_share"] = round(sum(lag <= 1.0 for lag in lags) / max(len(leaving), 1), 4)
    result["departed_freed_5s_share"] = round(sum(lag <= 5.0 for lag in lags) / max(len(leaving), 1), 4)
    result["departed_p50_ms"] = round(_pct(lags, 0.5) * 1000, 1)

    # Slow clients: half-sent heads held open while /healthz is asked.
    for w in streams[departed:]:
        w.writer.transport.abort()
    await asyncio.sleep(2)
    slow_writers = [w for w in await asyncio.gather(*(_half_head(port, context, gate) for _ in range(slow)))
                    if w is not None]
    result["slow_open"] = len(slow_writers)
    health = [await _healthz(port, context) for _ in range(20)]
    result["healthz_p50_ms"] = round(_pct(health, 0.5) * 1000, 1)
    result["healthz_max_ms"] = round(max(health) * 1000, 1)
    for w in slow_writers:
        w.transport.abort()
    return result


async def _direct(api: WatchAPIServer, watches: int) -> dict:
    """The harness alone: the same client straight to the fake apiserver (no gateway)."""
    context = ssl.create_default_context(cadata=api.ca_pem)
    gate = asyncio.Semaphore(HANDSHAKES_AT_ONCE)
    opened = await asyncio.gather(*(_open_watch(api.port, context, f"d{i}", gate, direct=True)
                                    for i in range(watches)))
    streams = [w for w in opened if w is not None]
    await asyncio.sleep(1)
    sent_at: dict[str, float] = {}
    waiting = [asyncio.ensure_future(_await_event(w, sent_at)) for w in streams]
    await asyncio.sleep(0.5)
    await asyncio.get_running_loop().run_in_executor(None, api.broadcast)
    await asyncio.wait(waiting, timeout=10)
    delays = [w.received - sent_at["sent"] for w in streams if w.received is not None]
    for w in streams:
        w.writer.transport.abort()
    return {"direct_watches": len(streams), "direct_event_p50_ms": round(_pct(delays, 0.5) * 1000, 1),
            "direct_event_p99_ms": round(_pct(delays, 0.99) * 1000, 1)}


def run_direct(watches: int) -> dict:
    with WatchAPIServer(token=SA) as api:
        return asyncio.run(_direct(api, watches))


def run(watches: int, departed: int, slow: int, serve_args: list[str]) -> dict:
    with WatchAPIServer(token=SA) as api, tempfile.TemporaryDirectory(prefix="streams-bench-") as data:
        port = free_port()
        argv = [str(BIN / "bcs-middleware"), "serve", "--data-dir", data, "--bind", f"127.0.0.1:{port}",
                *serve_args]
        with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60) as server:
            cafile = str(Path(data) / "tls" / "ca.crt")
            base = f"https://localhost:{port}"
            _rest(base, "POST", "/rest/clusters/bcs", {"id": CLUSTER, "project_id": "p", "cluster_type": "k8s"},
                  cafile)
            _rest(base, "PUT", f"/rest/clusters/{CLUSTER}/credentials",
                  {"server_addresses": api.url, "cacert_data": api.ca_pem, "user_token": SA}, cafile)
            result = asyncio.run(_scenario(port, cafile, api, server, watches, min(departed, watches), slow))
            result["serve_args"] = serve_args
            output = server.output()
            result["gateway_tracebacks"] = output.count("Traceback")
            result["refused_503"] = output.count('"status":503')
            return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watches", default="1000,10000")
    parser.add_argument("--departed", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--serve-arg", action="append", default=[])
    parser.add_argument("--direct", action="store_true",
                        help="also measure the harness alone: the client straight to the fake apiserver")
    parser.add_argument("--json")
    parser.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True,
                        help="run the harness (this client and the fake apiserver) on uvloop when it is "
                             "installed (default on: its own loop is otherwise a large share of two cores)")
    args = parser.parse_args()
    if args.uvloop:
        os.environ[UVLOOP_ENV] = "1"  # the fake apiserver's process inherits it
        if not use_uvloop():
            print("uvloop is not installed (pip install uvloop): the harness runs on asyncio's own loop",
                  file=sys.stderr)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the servers started here
    results = []
    for count in (int(n) for n in args.watches.split(",")):
        result = run(count, args.departed, args.slow, args.serve_arg)
        result["harness_loop"] = type(asyncio.get_event_loop_policy()).__module__.partition(".")[0]
        if args.direct:
            result.update(run_direct(count))
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
