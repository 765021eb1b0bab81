#!/usr/bin/env python
"""The agent tunnel against the direct path to the same upstreams, in one run (issue 18).

    python bench/agent_tunnel_bench.py [--rounds 5] [--duration 3] [--connections 32,64]
                                       [--watches 1000] [--broadcasts 3] [--watch-rounds 2]
                                       [--no-workers1] [--skip-watches] [--skip-transfers] [--json out.json]

One ``bcs-middleware serve`` with its documented defaults (2 gevent workers, HTTPS with its
generated CA) run with ``--upstream-deny 127.0.0.1/32``; every upstream listens on 127.0.0.1
*and* ``[::1]``. Each upstream is two clusters of that gateway:

* **direct** — registered with ``PUT /rest/clusters/{id}/credentials`` and the ``https://[::1]``
  address: the gateway dials it itself;
* **agent** — a register token, and a real ``bcs-middleware kube-agent --tunnel`` process whose
  kubeconfig names ``https://127.0.0.1:…``: the gateway's address policy refuses that address,
  so every byte to it went through the agent's WebSocket (a request that did not would be a 503).

Three parts:

1. **req/s** — wrk (HTTPS, 1 thread) → the gateway → nginx over HTTPS answering the 2 KiB body
   of ``proxy_bench.py``; superuser token; contenders alternate inside each round, each at every
   level of ``--connections``, and a round's figure is each contender's best level (capacity).
   Reported: the median of per-round agent/direct ratios (target ≥ 0.7) and the CPU µs per
   request of the gateway (master and workers), the agent and nginx (``/proc`` utime+stime).
   The agent holds a connection in each of the two workers (``--tunnel-connections auto``, its
   default), so neither forwards to the other — that is the production path. A second gateway with
   ``--workers 1`` (its own agent) runs in the same rounds as a **diagnostic**.
2. **watches** — ``--watches`` concurrent watches on the asyncio fake apiserver of
   :mod:`tests.support.watch_apiserver`, all through one agent connection (``--tunnel-connections
   1``: the watches the other worker accepts cross the peer link to it), then ``--broadcasts``
   events each sent to every watch: delivery latency p50/p99 (target p99 < 250 ms), against
   the same number through the direct cluster and straight to the fake (the harness alone), in
   the same run; gateway and agent RSS with the watches open.
3. **1 GiB up and 1 GiB down** — through the agent and direct, to an HTTPS upstream that checks
   the upload's sha256 and serves the download: MiB/s, and RSS before / after / peak
   (``VmHWM`` reset through ``clear_refs``) of the agent and of each gateway worker.

Loopback only; the open-file limit is raised to the hard limit here (inherited by the servers
started here); every loop is bounded. Figures from one run on this machine, not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import secrets
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from proxy_bench import (  # noqa: E402
    BODY_SIZE,
    GiB,
    MiB,
    Pki,
    Sample,
    _children,
    _cpu_seconds,
    _download,
    _rest,
    _tree,
    _upload,
    _vm_kib,
    _wait_ready,
    load_wrk,
)

from tests.support.fake_upstream import FakeUpstream  # noqa: E402
from tests.support.kube import write_kubeconfig  # noqa: E402
from tests.support.servers import BIN, ServerProcess, free_port  # noqa: E402
from tests.support.watch_apiserver import UVLOOP_ENV, WatchAPIServer, open_watch, use_uvloop  # noqa: E402

ADMIN = "agent-bench-admin-token-" + "a" * 32
SA = "agent-bench-sa-token-" + "s" * 24
#: Only the tunnel reaches 127.0.0.1: the gateway's own dials there are refused.
DENY = ["--upstream-deny", "127.0.0.1/32"]
HOSTS = ("127.0.0.1", "::1")
HANDSHAKES_AT_ONCE = 100


# -- processes -------------------------------------------------------------------------------


def _rss_kib(pid: int) -> int:
    try:
        return _vm_kib(pid, "VmRSS")
    except OSError:
        return 0


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def start_nginx(tmp: Path, pki: Pki) -> tuple[ServerProcess, int]:
    """nginx serving proxy_bench's 2 KiB body over TLS on 127.0.0.1 and [::1] (one port)."""
    status_port, tls_port = free_port(), free_port()
    home = tmp / "nginx"
    www = home / "www"
    www.mkdir(parents=True)
    import hashlib

    (www / "payload.bin").write_bytes(hashlib.sha256(b"bench").digest() * (BODY_SIZE // 32))
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (home / name).mkdir()
    conf = home / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes 1;
pid {home}/nginx.pid;
error_log {home}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {home}/body;
    proxy_temp_path {home}/proxy;
    fastcgi_temp_path {home}/fastcgi;
    uwsgi_temp_path {home}/uwsgi;
    scgi_temp_path {home}/scgi;
    default_type application/octet-stream;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{status_port};
        location = /nginx_status {{ stub_status; }}
    }}
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        listen [::1]:{tls_port} ssl;
        ssl_certificate {pki.cert_file};
        ssl_certificate_key {pki.key_file};
        root {www};
    }}
}}
""")
    server = ServerProcess(["nginx", "-p", str(home), "-e", f"{home}/error.log", "-c", str(conf)], port=status_port)
    return server, tls_port


@dataclass
class Agent:
    cluster_id: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass
class Gateway:
    """``bcs-middleware serve`` (documented defaults, plus ``--upstream-deny 127.0.0.1/32``)."""

    name: str
    server: ServerProcess
    data: Path
    agents: list[Agent] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"https://localhost:{self.server.port}"

    @property
    def wrk_base(self) -> str:  # wrk takes the first address of a name: no guessing between ::1 and 127.0.0.1
        return f"https://127.0.0.1:{self.server.port}"

    @property
    def cafile(self) -> str:
        return str(self.data / "tls" / "ca.crt")

    def pids(self) -> list[int]:
        return _tree(self.server.proc.pid)

    def workers(self) -> list[int]:
        return _children(self.server.proc.pid)

    def rest(self, method: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
        return _rest(self.base, self.cafile, method, path, body, token=ADMIN)

    def direct_cluster(self, cluster_id: str, url: str, ca_pem: str) -> None:
        self.rest("POST", "/rest/clusters/bcs", {"id": cluster_id, "project_id": "bench", "cluster_type": "k8s"})
        self.rest("PUT", f"/rest/clusters/{cluster_id}/credentials",
                  {"server_addresses": url, "cacert_data": ca_pem, "user_token": SA})

    def agent_cluster(self, cluster_id: str, url: str, ca_pem: str, probe: str, *, connections: int = 1,
                      agent_args: tuple[str, ...] = ()) -> Agent:
        """A cluster reached through a real ``kube-agent --tunnel`` whose kubeconfig names ``url``;
        returns once the agent has opened ``connections`` connections (one per worker by default)."""
        self.rest("POST", "/rest/clusters/bcs", {"id": cluster_id, "project_id": "bench", "cluster_type": "k8s"})
        token = str(self.rest("POST", f"/rest/clusters/{cluster_id}/register_tokens")["token"])
        kubeconfig = write_kubeconfig(self.data.parent / f"{self.name}-{cluster_id}.kubeconfig", server=url,
                                      token=SA, ca_pem=ca_pem)
        log = self.data.parent / f"{self.name}-{cluster_id}-agent.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(BIN / "bcs-middleware"), "kube-agent", "--tunnel", "--bke-address", self.base,
                 "--cluster-id", cluster_id, "--kubeconfig", str(kubeconfig), *agent_args],
                env={**os.environ, "REGISTER_TOKEN": token, "SERVER_CERT": Path(self.cafile).read_text(),
                     "PYTHONUNBUFFERED": "1"},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        agent = Agent(cluster_id, proc, log)
        self.agents.append(agent)
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the agent of {cluster_id} exited:\n{log.read_text()[-2000:]}")
            connected = (self.rest("GET", f"/rest/clusters/{cluster_id}").get("agent") or {})
            opened = log.read_text(errors="replace").count("tunnel to ")
            if isinstance(connected, dict) and connected.get("tunnel_connected") and opened >= connections:
                try:
                    _wait_ready(f"{self.base}/tunnels/clusters/{cluster_id}{probe}",
                                {"Authorization": f"Bearer {ADMIN}"}, timeout=20, cafile=self.cafile)
                    return agent
                except RuntimeError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent of {cluster_id} did not connect:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.server.stop()


def start_gateway(tmp: Path, name: str, extra: list[str]) -> Gateway:
    data = tmp / name
    port = free_port()
    argv = [str(BIN / "bcs-middleware"), "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}",
            *DENY, *extra]
    server = ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=60)
    gateway = Gateway(name, server, data)
    _wait_ready(gateway.base + "/healthz", {}, cafile=gateway.cafile)
    return gateway


# -- 1. req/s ----------------------------------------------------------------------------------


@dataclass
class Contender:
    name: str
    gateway: Gateway
    cluster_id: str
    agent: Agent | None


@dataclass
class Measured:
    sample: Sample
    gateway_us: float
    agent_us: float | None
    nginx_us: float


def measure(contender: Contender, nginx: ServerProcess, duration: float, connections: int) -> Measured:
    gw = contender.gateway
    url = f"{gw.wrk_base}/tunnels/clusters/{contender.cluster_id}/payload.bin"
    gw_pids, ng_pids = gw.pids(), _tree(nginx.proc.pid)
    agent_pids = [contender.agent.pid] if contender.agent else []
    before = (_cpu_seconds(gw_pids), _cpu_seconds(agent_pids), _cpu_seconds(ng_pids))
    sample = load_wrk(url, {"Authorization": f"Bearer {ADMIN}"}, duration, connections)
    n = max(sample.requests, 1)
    after = (_cpu_seconds(gw_pids), _cpu_seconds(agent_pids), _cpu_seconds(ng_pids))
    return Measured(sample, (after[0] - before[0]) / n * 1e6,
                    (after[1] - before[1]) / n * 1e6 if agent_pids else None, (after[2] - before[2]) / n * 1e6)


def throughput(contenders: list[Contender], nginx: ServerProcess, rounds: int, duration: float,
               levels: list[int]) -> dict[str, object]:
    print(f"\n== 1. req/s: {', '.join(c.name for c in contenders)}; {rounds} rounds x {duration:g} s at "
          f"{levels} connections (load {_load()})", flush=True)
    for c in contenders:  # warm up: pools, TLS sessions, the agent's streams
        measure(c, nginx, 1.0, max(levels))
    best: dict[str, list[Measured]] = {c.name: [] for c in contenders}
    by_level: dict[int, dict[str, list[Measured]]] = {lv: {c.name: [] for c in contenders} for lv in levels}
    for round_no in range(rounds):
        order = contenders if round_no % 2 == 0 else contenders[::-1]
        for c in order:
            got = []
            for level in levels:
                m = measure(c, nginx, duration, level)
                by_level[level][c.name].append(m)
                got.append(m)
                print(f"round {round_no + 1} {c.name:16} c{level:<4} {m.sample.rps:8.0f} req/s "
                      f"p50 {m.sample.p50_ms:6.2f} p99 {m.sample.p99_ms:6.2f} ms  CPU us/req gateway "
                      f"{m.gateway_us:5.0f} agent {m.agent_us if m.agent_us is not None else 0:5.0f} "
                      f"nginx {m.nginx_us:4.0f}", flush=True)
            best[c.name].append(max(got, key=lambda x: x.sample.rps))

    def summary(view: dict[str, list[Measured]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, items in view.items():
            agent = [m.agent_us for m in items if m.agent_us is not None]
            out[name] = {"rps": statistics.median(m.sample.rps for m in items),
                         "p50_ms": statistics.median(m.sample.p50_ms for m in items),
                         "p99_ms": statistics.median(m.sample.p99_ms for m in items),
                         "gateway_cpu_us_per_req": statistics.median(m.gateway_us for m in items),
                         "agent_cpu_us_per_req": statistics.median(agent) if agent else None,
                         "nginx_cpu_us_per_req": statistics.median(m.nginx_us for m in items)}
        for agent_name, direct_name in (("agent", "direct"), ("agent_workers1", "direct_workers1"),
                                        ("direct", "direct_workers1"), ("agent", "agent_workers1"),
                                        ("agent_1conn", "direct"), ("agent", "agent_1conn"),
                                        ("agent_threads", "direct"), ("agent", "agent_threads")):
            if agent_name in view and direct_name in view:
                pairs = list(zip(view[agent_name], view[direct_name], strict=True))
                out[f"{agent_name}/{direct_name} req/s"] = statistics.median(a.sample.rps / d.sample.rps
                                                                             for a, d in pairs)
                out[f"{agent_name}/{direct_name} gateway CPU/req"] = statistics.median(
                    a.gateway_us / d.gateway_us for a, d in pairs)
        return out

    result: dict[str, object] = {f"c{lv}": summary(view) for lv, view in by_level.items()}
    result["capacity"] = summary(best)
    result["levels"] = levels
    for title, view in result.items():
        if not isinstance(view, dict):
            continue
        print(f"\n-- {title}" + (" (each contender's best level per round)" if title == "capacity" else ""))
        for name, value in view.items():
            if isinstance(value, dict):
                agent = value["agent_cpu_us_per_req"]
                print(f"  {name:16} {value['rps']:8.0f} req/s  p50 {value['p50_ms']:6.2f}"
                      f"  p99 {value['p99_ms']:6.2f} ms"
                      f"  CPU us/req gateway {value['gateway_cpu_us_per_req']:5.0f}"
                      f"  agent {agent if agent is not None else 0:5.0f}  nginx {value['nginx_cpu_us_per_req']:4.0f}")
            else:
                print(f"  {name:44} {value:6.2f}")
    result["load_after"] = _load()
    return result


# -- 2. watches --------------------------------------------------------------------------------

_EVENT = re.compile(rb'"name": "event-(\d+)".*?"sent": ([0-9.]+)')


class Watch:
    __slots__ = ("buffer", "id", "reader", "received", "writer")

    def __init__(self, wid: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.id = wid
        self.reader = reader
        self.writer = writer
        self.buffer = b""
        self.received: dict[int, tuple[float, float]] = {}  # event number -> (sent, received)

    async def follow(self) -> None:
        """Record every event's arrival until the stream ends (or is cancelled)."""
        while True:
            chunk = await self.reader.read(65536)
            if not chunk:
                return
            now = time.monotonic()
            self.buffer += chunk
            end = 0
            for match in _EVENT.finditer(self.buffer):
                self.received[int(match.group(1))] = (float(match.group(2)), now)
                end = match.end()
            self.buffer = self.buffer[end:][-4096:]


async def _open_watch(port: int, context: ssl.SSLContext, prefix: str, token: str, wid: str,
                      gate: asyncio.Semaphore) -> Watch | None:
    opened = await open_watch(port, context, prefix, token, wid, gate)
    return None if opened is None else Watch(wid, *opened)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _watch_path(label: str, api: WatchAPIServer, port: int, cafile: str | None, prefix: str, token: str,
                      count: int, broadcasts: int, rss_pids: dict[str, list[int]]) -> dict[str, object]:
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context(cadata=api.ca_pem)
    gate = asyncio.Semaphore(HANDSHAKES_AT_ONCE)
    loop = asyncio.get_running_loop()
    rss_idle = {name: sum(_rss_kib(p) for p in pids) for name, pids in rss_pids.items()}
    started = time.monotonic()
    tag = secrets.token_hex(3)
    opened = await asyncio.gather(*(_open_watch(port, context, prefix, token, f"{tag}-{i}", gate)
                                    for i in range(count)))
    watches = [w for w in opened if w is not None]
    open_seconds = time.monotonic() - started
    deadline = time.monotonic() + 60
    while (await loop.run_in_executor(None, api.stats))["open"] < len(watches) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    held = (await loop.run_in_executor(None, api.stats))["open"]
    await asyncio.sleep(1.0)
    rss_open = {name: sum(_rss_kib(p) for p in pids) for name, pids in rss_pids.items()}
    followers = [asyncio.ensure_future(w.follow()) for w in watches]
    p50s, p99s, within = [], [], []
    for _ in range(broadcasts):
        await asyncio.sleep(0.5)
        seen_before = {id(w): set(w.received) for w in watches}
        await loop.run_in_executor(None, api.broadcast)
        wait_until = time.monotonic() + 10
        while time.monotonic() < wait_until:
            fresh = [w for w in watches if len(w.received) > len(seen_before[id(w)])]
            if len(fresh) == len(watches):
                break
            await asyncio.sleep(0.05)
        delays = []
        for w in watches:
            new = set(w.received) - seen_before[id(w)]
            delays += [w.received[n][1] - w.received[n][0] for n in new]
        p50s.append(_pct(delays, 0.5) * 1000)
        p99s.append(_pct(delays, 0.99) * 1000)
        within.append(len(delays) / max(count, 1))
        await asyncio.sleep(1.0)
    for f in followers:
        f.cancel()
    for w in watches:
        w.writer.transport.abort()
    await asyncio.gather(*followers, return_exceptions=True)
    deadline = time.monotonic() + 30
    while (await loop.run_in_executor(None, api.stats))["open"] > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    result: dict[str, object] = {
        "path": label, "asked": count, "established": len(watches), "held_by_apiserver": held,
        "open_seconds": round(open_seconds, 2),
        "event_p50_ms": [round(x, 1) for x in p50s], "event_p99_ms": [round(x, 1) for x in p99s],
        "delivered_share": [round(x, 4) for x in within],
        "rss_idle_mib": {k: round(v / 1024, 1) for k, v in rss_idle.items()},
        "rss_open_mib": {k: round(v / 1024, 1) for k, v in rss_open.items()},
    }
    print(f"  {label:8} established {len(watches)}/{count} (apiserver holds {held}) in {open_seconds:.1f} s; "
          f"event p50 {result['event_p50_ms']} p99 {result['event_p99_ms']} ms; delivered {result['delivered_share']}; "
          f"RSS MiB idle {result['rss_idle_mib']} open {result['rss_open_mib']}", flush=True)
    return result


async def _watches(api: WatchAPIServer, gw: Gateway, agent: Agent, direct_id: str, agent_id: str,
                   count: int, broadcasts: int, rounds: int) -> dict[str, object]:
    pids = {"gateway": gw.pids(), "agent": [agent.pid]}
    port = gw.server.port
    runs: list[dict[str, object]] = []
    paths: list[tuple[str, int, str | None, str, str]] = [
        ("agent", port, gw.cafile, f"/tunnels/clusters/{agent_id}", ADMIN),
        ("direct", port, gw.cafile, f"/tunnels/clusters/{direct_id}", ADMIN),
    ]
    for round_no in range(rounds):
        for label, p, cafile, prefix, token in paths if round_no % 2 == 0 else paths[::-1]:
            runs.append(await _watch_path(label, api, p, cafile, prefix, token, count, broadcasts, pids))
    runs.append(await _watch_path("harness", api, api.port, None, "", SA, count, broadcasts, pids))
    out: dict[str, object] = {"runs": runs}
    for label in ("agent", "direct", "harness"):
        mine = [r for r in runs if r["path"] == label]
        p99 = [x for r in mine for x in r["event_p99_ms"]]  # type: ignore[attr-defined]
        p50 = [x for r in mine for x in r["event_p50_ms"]]  # type: ignore[attr-defined]
        out[label] = {"event_p99_ms_median": round(statistics.median(p99), 1), "event_p99_ms_max": round(max(p99), 1),
                      "event_p50_ms_median": round(statistics.median(p50), 1),
                      "established_min": min(int(r["established"]) for r in mine),  # type: ignore[call-overload]
                      "delivered_min": min(x for r in mine for x in r["delivered_share"])}  # type: ignore[attr-defined]
    return out


def watches(api: WatchAPIServer, gw: Gateway, agent: Agent, direct_id: str, agent_id: str, count: int,
            broadcasts: int, rounds: int) -> dict[str, object]:
    print(f"\n== 2. {count} watches, {broadcasts} broadcasts each, {rounds} rounds per path (load {_load()})",
          flush=True)
    result = asyncio.run(_watches(api, gw, agent, direct_id, agent_id, count, broadcasts, rounds))
    for label in ("agent", "direct", "harness"):
        print(f"  {label:8} {result[label]}")
    result["load_after"] = _load()
    return result


# -- 3. 1 GiB up and down ----------------------------------------------------------------------


def transfers(gw: Gateway, agent: Agent, direct_id: str, agent_id: str) -> dict[str, object]:
    print(f"\n== 3. 1 GiB up and 1 GiB down, agent and direct (load {_load()})", flush=True)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    results: dict[str, object] = {}
    for kind, run in (("upload", _upload), ("download", _download)):
        for label, cluster_id in (("agent", agent_id), ("direct", direct_id)):
            procs = {f"worker {pid}": pid for pid in gw.workers()} | {"agent": agent.pid}
            before = {}
            for name, pid in procs.items():
                _reset_peak(pid)
                before[name] = _rss_kib(pid)
            started = time.monotonic()
            run(f"{gw.base}/tunnels/clusters/{cluster_id}", headers, gw.cafile)
            elapsed = time.monotonic() - started
            memory = {name: {"before_mib": round(before[name] / 1024, 1),
                             "after_mib": round(_rss_kib(pid) / 1024, 1),
                             "peak_mib": round(_vm_kib(pid, "VmHWM") / 1024, 1),
                             "peak_growth_mib": round((_vm_kib(pid, "VmHWM") - before[name]) / 1024, 1)}
                      for name, pid in procs.items()}
            key = f"{label} {kind}"
            results[key] = {"MiB/s": round(GiB / MiB / elapsed, 1), "seconds": round(elapsed, 1), "rss": memory}
            print(f"  {key:16} {GiB / MiB / elapsed:7.1f} MiB/s  " + "  ".join(
                f"{name}: {m['before_mib']}→{m['after_mib']} (peak {m['peak_mib']}, +{m['peak_growth_mib']}) MiB"
                for name, m in memory.items()), flush=True)
    for kind in ("upload", "download"):
        a = results[f"agent {kind}"]["MiB/s"]  # type: ignore[index]
        d = results[f"direct {kind}"]["MiB/s"]  # type: ignore[index]
        results[f"agent/direct {kind}"] = round(a / d, 2)
    results["peak_growth_max_mib"] = {
        who: max(m["peak_growth_mib"] for key, value in results.items() if isinstance(value, dict) and "rss" in value
                 for name, m in value["rss"].items() if (name == "agent") == (who == "agent"))
        for who in ("agent", "gateway worker")}
    results["load_after"] = _load()
    return results


# -- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--connections", default="32,64")
    parser.add_argument("--watches", type=int, default=1000)
    parser.add_argument("--broadcasts", type=int, default=3)
    parser.add_argument("--watch-rounds", type=int, default=2, help="runs of each path (agent, direct)")
    parser.add_argument("--no-workers1", action="store_true", help="skip the --workers 1 diagnostic gateway")
    parser.add_argument("--one-connection", action="store_true",
                        help="diagnostic: also an agent holding one connection (--tunnel-connections 1) to the "
                             "2-worker gateway, so that the other worker forwards over the peer link")
    parser.add_argument("--threads-agent", action="store_true",
                        help="diagnostic: also an agent on OS threads (--io threads) to the 2-worker gateway")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-watches", action="store_true")
    parser.add_argument("--skip-transfers", action="store_true")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra argument for both gateways")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("nginx") is None:
        print("needs nginx and wrk (apt-get install -y nginx-light wrk)", file=sys.stderr)
        return 2
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by every server started here
    os.environ[UVLOOP_ENV] = "1"  # the watch fake and this process's watch clients run on uvloop
    loop_name = "uvloop" if use_uvloop() else "asyncio"

    tmp = Path(tempfile.mkdtemp(prefix="agent-tunnel-bench-"))
    tmp.chmod(0o755)  # nginx workers run as an unprivileged user when started by root
    pki = Pki.create(tmp, HOSTS)
    ca_pem = pki.ca_file.read_text()
    result: dict[str, object] = {"load_start": _load(), "cpus": os.cpu_count(), "harness_loop": loop_name,
                                 "nofile": hard}
    print(f"load average at start {_load()}; {os.cpu_count()} CPUs; open files {hard}", flush=True)
    nginx, nginx_port = start_nginx(tmp, pki)
    stops: list[Callable[[], object]] = [nginx.stop]
    targets: dict[str, bool] = {}
    try:
        gw = start_gateway(tmp, "gateway", args.serve_arg)
        stops.append(gw.stop)
        contenders: list[Contender] = []
        if not args.skip_throughput:
            gw.direct_cluster("BCS-K8S-DIRECT", f"https://[::1]:{nginx_port}", ca_pem)
            # serve's default: 2 workers, and the agent holds a connection in each (auto).
            agent = gw.agent_cluster("BCS-K8S-AGENT", f"https://127.0.0.1:{nginx_port}", ca_pem, "/payload.bin",
                                     connections=2)
            contenders += [Contender("direct", gw, "BCS-K8S-DIRECT", None),
                           Contender("agent", gw, "BCS-K8S-AGENT", agent)]
            if args.one_connection:
                one = gw.agent_cluster("BCS-K8S-AGENT-1CONN", f"https://127.0.0.1:{nginx_port}", ca_pem,
                                       "/payload.bin", agent_args=("--tunnel-connections", "1"))
                contenders.append(Contender("agent_1conn", gw, "BCS-K8S-AGENT-1CONN", one))
            if args.threads_agent:
                threads = gw.agent_cluster("BCS-K8S-AGENT-THREADS", f"https://127.0.0.1:{nginx_port}", ca_pem,
                                           "/payload.bin", connections=2, agent_args=("--io", "threads"))
                contenders.append(Contender("agent_threads", gw, "BCS-K8S-AGENT-THREADS", threads))
            if not args.no_workers1:
                gw1 = start_gateway(tmp, "gateway-workers1", ["--workers", "1", *args.serve_arg])
                stops.append(gw1.stop)
                gw1.direct_cluster("BCS-K8S-DIRECT", f"https://[::1]:{nginx_port}", ca_pem)
                agent1 = gw1.agent_cluster("BCS-K8S-AGENT", f"https://127.0.0.1:{nginx_port}", ca_pem,
                                           "/payload.bin")
                contenders += [Contender("direct_workers1", gw1, "BCS-K8S-DIRECT", None),
                               Contender("agent_workers1", gw1, "BCS-K8S-AGENT", agent1)]
            levels = [int(x) for x in args.connections.split(",")]
            tp = throughput(contenders, nginx, args.rounds, args.duration, levels)
            result["throughput"] = tp
            ratio = tp["capacity"]["agent/direct req/s"]  # type: ignore[index]
            targets["req/s agent/direct >= 0.7 (2 workers, capacity)"] = ratio >= 0.7
            for c in contenders[2:]:
                if c.gateway is not gw:
                    c.gateway.stop()  # the diagnostic gateway is done: its processes leave the machine
                elif c.agent is not None:
                    c.agent.stop()
        if not args.skip_watches:
            with WatchAPIServer(token=SA, hosts=HOSTS) as api:
                gw.direct_cluster("BCS-K8S-WATCH-DIRECT", api.url_for("::1"), api.ca_pem)
                # Every watch over one agent connection (the case; half of them cross the
                # peer link to the worker holding it).
                watch_agent = gw.agent_cluster("BCS-K8S-WATCH-AGENT", api.url_for("127.0.0.1"), api.ca_pem,
                                               "/version", agent_args=("--tunnel-connections", "1"))
                wr = watches(api, gw, watch_agent, "BCS-K8S-WATCH-DIRECT", "BCS-K8S-WATCH-AGENT", args.watches,
                             args.broadcasts, args.watch_rounds)
                result["watches"] = wr
                watch_agent.stop()
                agent_w = wr["agent"]
                targets[f"{args.watches} watches over one agent: all established and every event delivered"] = (
                    agent_w["established_min"] == args.watches and agent_w["delivered_min"] >= 1.0)  # type: ignore[index]
                targets["watch event p99 < 250 ms through the agent (worst broadcast)"] = (
                    agent_w["event_p99_ms_max"] < 250)  # type: ignore[index]
        if not args.skip_transfers:
            with FakeUpstream(tls=pki.server_context()) as fake4, \
                    FakeUpstream(host="::1", tls=pki.server_context()) as fake6:
                gw.direct_cluster("BCS-K8S-TX-DIRECT", fake6.url, ca_pem)
                tx_agent = gw.agent_cluster("BCS-K8S-TX-AGENT", fake4.url, ca_pem, "/echo", connections=2)
                tx = transfers(gw, tx_agent, "BCS-K8S-TX-DIRECT", "BCS-K8S-TX-AGENT")
                result["transfers"] = tx
                tx_agent.stop()
                growth = tx["peak_growth_max_mib"]
                targets["1 GiB up and down: peak RSS growth < 32 MiB (agent and each gateway worker)"] = max(
                    growth.values()) < 32  # type: ignore[attr-defined]
        output = gw.server.output()
        result["gateway_tracebacks"] = output.count("Traceback")
    finally:
        for stop in reversed(stops):
            try:
                stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping: {exc}", file=sys.stderr)
    result["load_end"] = _load()
    result["targets"] = targets
    print(f"\nload average start {result['load_start']}, end {result['load_end']}; gateway tracebacks "
          f"{result.get('gateway_tracebacks')}\ntargets")
    for name, ok in targets.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
