"""Fair share: a light user's latency while a heavy user hammers the gateway, limits off and on;
and how many discovery requests reach the apiserver for cold ``kubectl get pods`` runs.

    python bench/fairness_bench.py [--heavy 200] [--watches 500] [--light-rate 10] [--phase 8]
                                   [--rounds 2] [--heavy-priority idle|nice] [--heavy-nice 19]
                                   [--same-apiserver]
                                   [--kubectl-runs 100] [--skip-discovery] [--json out.json]
    python bench/fairness_bench.py --pool run1.json run2.json ...

The production path: HTTPS clients → ``bcs-middleware serve`` with its defaults (two gevent
workers; limits on by default) → the HTTPS asyncio fake apiserver of
:mod:`tests.support.watch_apiserver`. Two gateways run side by side in front of it, one with
``--limits-config`` ``enabled: false``; each round measures, interleaved:

* ``alone``: the light user alone (a ``GET pods`` every ``1/light-rate`` s on a keep-alive
  connection opened before the first is timed, in this process; the connection's opening is
  reported apart, ``light_connect_ms``), on a cluster of its own whose fake apiserver serves only it
  (``--same-apiserver``: the heavy user's — a fake apiserver is one Python process, and the
  heavy user's watches through a gateway without limits saturate it: that measures the fake);
* ``off`` and ``on``: the same, once the heavy user is up (every connection and watch answered
  once: its start is a transient of its own), while it (another process, asyncio) keeps ``--heavy``
  keep-alive connections busy with one request after another (a 429 included) and ``--watches``
  watches that reconnect every second (a refused one a second later too);
* ``elsewhere`` (the control): the light user on the ``on`` gateway while the heavy user runs
  against the other one — what sharing the cores with the load generator and a busy gateway
  costs the light user, whatever the gateway it uses does.

Reported per phase: the light user's p50/p99 and errors, the heavy user's requests and 429
share, the gateway's CPU (its processes' user+system seconds per wall second, out of 2 cores).
The issue's target: the light user's p99 with the heavy user running at most twice its p99 alone.

``--kubectl-runs`` cold ``kubectl get pods`` (a new HOME each) through a gateway with the
discovery cache and through one without, to the threaded fake apiserver of
:mod:`tests.support.fake_apiserver`: the discovery requests (``/api``, ``/apis``, ``/api/v1``,
``/apis/{group}/{version}``, ``/openapi``) that reached it.

The issue's scale (200 connections, 500 watches) makes the load generator itself take a core
on this 2-core machine; the defaults are the issue's numbers and can be scaled down with the
flags (``bench/README.md`` says which were used). The load generator stands for clients on other
hosts: it runs in a CPU cgroup with ``cpu.idle = 1`` where one can be made (``--heavy-priority
idle``, the default: it gets only CPU nothing else wants, and yields a core to any other wake-up at
once), else at ``--heavy-nice`` in a session of its own (the kernel's autogroup shares the CPU
between sessions first) — which still let it hold a core for a slice whenever the light user's
processes woke. Results say which (``heavy_priority``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import socket
import ssl
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.streams_bench import _cpu_seconds, _pct  # noqa: E402
from tests.support.servers import BIN, ServerProcess, free_port  # noqa: E402
from tests.support.watch_apiserver import WatchAPIServer  # noqa: E402

ADMIN = "fairness-bench-admin-token-" + "f" * 20
SA = "fairness-bench-sa-token"
#: ``--serve-arg``: added to every gateway's command line.
SERVE_ARGS: list[str] = []
CLUSTER = "BCS-K8S-FAIR"
PODS = f"/tunnels/clusters/{CLUSTER}/api/v1/namespaces/default/pods"
#: The light user's cluster: on an apiserver of its own unless ``--same-apiserver``.
LIGHT_CLUSTER = "BCS-K8S-LIGHT"
LIGHT_PODS = f"/tunnels/clusters/{LIGHT_CLUSTER}/api/v1/namespaces/default/pods"
#: Seconds the heavy user may take to be up (every connection and watch answered once).
RAMP_LIMIT = 60.0


def _call(base: str, cafile: str, method: str, path: str, body: dict | None = None, token: str = ADMIN) -> Any:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Authorization": f"Bearer {token}",
                                                         "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=cafile)) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def _user(base: str, cafile: str, name: str) -> str:
    user = _call(base, cafile, "POST", "/rest/users/", {"user_name": name})
    token = _call(base, cafile, "POST", f"/rest/users/{user['id']}/tokens")["user_token"]
    for cluster in (CLUSTER, LIGHT_CLUSTER):
        _call(base, cafile, "PUT", f"/rest/clusters/{cluster}/permissions/{name}", {"permission": "view"})
    return str(token)


@contextmanager
def _gateway(data: Path, api_url: str, api_ca: str, extra: list[str],
             light_api: tuple[str, str] | None = None) -> Iterator[tuple[ServerProcess, str, dict]]:
    port = free_port()
    argv = [str(BIN / "bcs-middleware"), "serve", "--data-dir", str(data), "--bind", f"127.0.0.1:{port}",
            "--no-access-log", *SERVE_ARGS, *extra]
    with ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": ADMIN}, scheme="https", timeout=90) as server:
        cafile = str(data / "tls" / "ca.crt")
        base = f"https://localhost:{port}"
        for cluster, (url, ca) in ((CLUSTER, (api_url, api_ca)), (LIGHT_CLUSTER, light_api or (api_url, api_ca))):
            _call(base, cafile, "POST", "/rest/clusters/bcs", {"id": cluster, "project_id": "p", "cluster_type": "k8s"})
            _call(base, cafile, "PUT", f"/rest/clusters/{cluster}/credentials",
                  {"server_addresses": url, "cacert_data": ca, "user_token": SA})
        tokens = {name: _user(base, cafile, name) for name in ("heavy", "light")}
        yield server, cafile, tokens


# -- the heavy user: another process, asyncio


class _KeepAlive:
    """One of the heavy user's connections: requests one after another, reconnecting when it ends."""

    def __init__(self, port: int, context: ssl.SSLContext, token: str) -> None:
        self.port, self.context = port, context
        self.request = f"GET {PODS} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
        self.stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self) -> int:
        if self.stream is None:
            self.stream = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", self.port, ssl=self.context, server_hostname="localhost"), 30)
        reader, writer = self.stream
        try:
            writer.write(self.request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await asyncio.wait_for(reader.readexactly(length), 60)
            return int(head[9:12])
        except BaseException:
            writer.transport.abort()
            self.stream = None
            raise


async def _heavy_watch(port: int, context: ssl.SSLContext, token: str, index: int) -> int:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost"), 30)
    try:
        writer.write(f"GET {PODS}?watch=true&watchid=h{index} HTTP/1.1\r\nHost: localhost\r\n"
                     f"Authorization: Bearer {token}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        status = int(head[9:12])
        if status == 200:
            await asyncio.sleep(1.0)  # held a second, then the client reconnects
        return status
    finally:
        writer.transport.abort()


async def _heavy(port: int, cafile: str, token: str, connections: int, watches: int, seconds: float,
                 out: Any) -> dict:
    """The heavy user: ``seconds`` of load once it is up — every connection and watch has had a
    first answer (``out`` is told when, at most :data:`RAMP_LIMIT` s after the start)."""
    context = ssl.create_default_context(cafile=cafile)
    started = time.monotonic()
    state = {"end": started + RAMP_LIMIT + seconds, "waiting": connections + watches}
    counts: dict[str, int] = {}
    up = asyncio.Event()

    async def loop(kind: str, index: int) -> None:
        connection = _KeepAlive(port, context, token)
        first = True
        while time.monotonic() < state["end"]:
            try:
                status = await (connection.get() if kind == "get" else _heavy_watch(port, context, token, index))
                key = f"{kind}_{status}"
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ssl.SSLError, ValueError):
                key = f"{kind}_error"
                await asyncio.sleep(0.1)
            if up.is_set():  # the ramp is not counted: what the phase reports is the load once up
                counts[key] = counts.get(key, 0) + 1
            if first:
                first = False
                state["waiting"] -= 1
                if state["waiting"] == 0:
                    up.set()
            if kind == "watch" and not key.endswith("200"):
                await asyncio.sleep(1.0)  # a refused watch is retried a second later too

    async def ramp() -> None:
        try:
            await asyncio.wait_for(up.wait(), RAMP_LIMIT)
        except TimeoutError:
            up.set()
        state["end"] = time.monotonic() + seconds
        out.put({"ramp_s": round(time.monotonic() - started, 1)})

    await asyncio.gather(ramp(), *(loop("get", i) for i in range(connections)),
                         *(loop("watch", i) for i in range(watches)))
    return counts


def idle_cgroup() -> Path | None:
    """A new CPU cgroup whose tasks only get CPU nobody else wants (``cpu.idle = 1``), or ``None``
    where none can be made (no cgroup ``cpu`` controller, or not allowed).

    The load generator stands for clients on other hosts: it should take no CPU the gateway, the
    fake apiservers or the light user want. ``nice`` cannot say that. Even at nice 19 in an
    autogroup of weight 15, a running generator keeps a core until its protected slice ends
    (EEVDF's ``RUN_TO_PARITY``), so each of the light request's four wake-ups (client,
    gateway, apiserver, gateway) can wait that long. A task of an idle group is preempted by any
    other wake-up at once (``check_preempt_wakeup_fair``: an idle entity always yields to a
    non-idle one)."""
    for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")):  # cgroup v1, then v2
        if not (root / "cpu.idle").exists() and not (root / "cgroup.subtree_control").exists():
            continue
        group = root / f"bcs-fairness-bench-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / "cpu.idle").write_text("1")
        except OSError:
            with suppress(OSError):
                group.rmdir()
            continue
        return group
    return None


def _lower_priority(nice: int, cgroup: Path | None = None) -> None:
    """This process into ``cgroup`` (:func:`idle_cgroup`) when there is one; else at niceness
    ``nice`` — in a session of its own when the kernel shares the CPU between sessions first
    (autogroup): a process's nice then only orders it within its session's group, and the groups
    share alike, so the load generator would get as much as the gateway."""
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        return
    if nice <= 0:
        return
    os.nice(nice)
    autogroup = Path("/proc/self/autogroup")
    if autogroup.exists():
        os.setsid()
        autogroup.write_text(str(nice))


def _heavy_process(port: int, cafile: str, token: str, connections: int, watches: int, seconds: float,
                   nice: int, cgroup: Path | None, out: Any) -> None:
    _lower_priority(nice, cgroup)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out.put(asyncio.run(_heavy(port, cafile, token, connections, watches, seconds, out)))


# -- the light user: this process, one keep-alive connection


def _light(port: int, cafile: str, token: str, rate: float, seconds: float,
           path: str) -> tuple[list[float], int, float | None]:
    """The light user's requests on one keep-alive connection for ``seconds``: their latencies,
    the errors, and the seconds its connection took to open (TCP and TLS), timed apart.

    The connection is opened before the first timed request: a request's latency is that of a
    request on an established connection, as the phase says. Timed with the first request, the
    connection's handshake — in its turn behind the heavy user's reconnects in ``on`` — was one
    sample per phase of 200, and so one in each run's top 1 %: the p99 mixed two measures.
    A reconnection after an error is timed with its request (and the request counted an error).
    """
    context = ssl.create_default_context(cafile=cafile)
    request = (f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n").encode()
    latencies: list[float] = []
    errors = 0
    sock: ssl.SSLSocket | None = None
    connect_seconds: float | None = None
    with suppress(OSError):
        opened = time.monotonic()
        sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                   server_hostname="localhost")
        connect_seconds = time.monotonic() - opened
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while time.monotonic() < end:
        next_at += 1.0 / rate
        started = time.monotonic()
        try:
            if sock is None:
                sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                           server_hostname="localhost")
            sock.sendall(request)
            status = _read_response(sock)
            if status != 200:
                errors += 1
            latencies.append(time.monotonic() - started)
        except OSError:
            errors += 1
            sock = None
        time.sleep(max(0.0, next_at - time.monotonic()))
    if sock is not None:
        sock.close()
    return latencies, errors, connect_seconds


def _read_response(sock: ssl.SSLSocket) -> int:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return int(head[9:12])


Gateway = tuple[ServerProcess, str, dict]


def _phase(light: Gateway, args: argparse.Namespace, heavy: Gateway | None) -> dict:
    """The light user on ``light`` while the heavy user (if any) runs against ``heavy``."""
    server, cafile, tokens = light
    port = server.port
    out: Any = multiprocessing.get_context("spawn").Queue()
    proc = None
    ramp: dict[str, Any] = {}
    if heavy is not None:
        heavy_server, heavy_cafile, heavy_tokens = heavy
        proc = multiprocessing.get_context("spawn").Process(
            target=_heavy_process,
            args=(heavy_server.port, heavy_cafile, heavy_tokens["heavy"], args.heavy, args.watches,
                  args.phase + 1, args.heavy_nice, args.heavy_cgroup, out))
        proc.start()
        # The heavy user up first (every connection and watch answered once): its start — 700
        # connections at once — is a transient of its own, and measured with the phase it put
        # every run's worst light request (140 to 590 ms) in its first second: the pooled p99.
        ramp = out.get(timeout=RAMP_LIMIT + 60)
    cpu0, wall0 = _cpu_seconds(server.proc.pid), time.monotonic()
    latencies, errors, connect = _light(port, cafile, tokens["light"], args.light_rate, args.phase,
                                        LIGHT_PODS if args.apart else PODS)
    cpu = (_cpu_seconds(server.proc.pid) - cpu0) / (time.monotonic() - wall0)
    result: dict[str, Any] = {"light_p50_ms": round(_pct(latencies, 0.5) * 1000, 1),
                              "light_p90_ms": round(_pct(latencies, 0.9) * 1000, 1),
                              "light_p99_ms": round(_pct(latencies, 0.99) * 1000, 1),
                              "light_requests": len(latencies), "light_errors": errors,
                              "light_connect_ms": None if connect is None else round(connect * 1000, 1),
                              "gateway_cpu_cores": round(cpu, 2),
                              # every latency, for pooling runs: a phase's p99 is its 2nd-largest
                              "light_ms": [round(x * 1000, 2) for x in latencies]}
    if proc is not None:
        counts = out.get(timeout=args.phase + 120)
        proc.join(60)
        gets = sum(v for k, v in counts.items() if k.startswith("get_"))
        watches = sum(v for k, v in counts.items() if k.startswith("watch_"))
        result.update(heavy=counts, heavy_ramp_s=ramp["ramp_s"],
                      heavy_get_429_share=round(counts.get("get_429", 0) / max(gets, 1), 3),
                      heavy_watch_429_share=round(counts.get("watch_429", 0) / max(watches, 1), 3))
    return result


def _without_samples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_samples(v) for k, v in value.items() if k != "light_ms"}
    if isinstance(value, list):
        return [_without_samples(v) for v in value]
    return value


def pool(paths: list[str]) -> dict:
    """Every run's light-user latencies per phase, pooled: a phase of ``--phase 20`` has 200, so
    its p99 is its second-largest and swings with one hiccup; runs of one variant pooled give
    percentiles that mean something."""
    pooled: dict[str, list[float]] = {}
    connects: dict[str, list[float]] = {}
    for path in paths:
        for phases in json.loads(Path(path).read_text())["fairness"]["rounds"]:
            for name in ("alone", "off", "on", "elsewhere"):
                pooled.setdefault(name, []).extend(phases[name]["light_ms"])
                if phases[name].get("light_connect_ms") is not None:  # files before it was timed apart
                    connects.setdefault(name, []).append(phases[name]["light_connect_ms"])
    return {name: {"samples": len(values), **{f"p{int(q * 100)}_ms": round(_pct(values, q), 1)
                                              for q in (0.5, 0.9, 0.95, 0.99)},
                   "connect_ms": sorted(connects.get(name, []))}
            for name, values in pooled.items()}


def fairness(args: argparse.Namespace) -> dict:
    rounds: list[dict] = []
    with ExitStack() as stack:
        api = stack.enter_context(WatchAPIServer(token=SA))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairness-bench-")))
        off_file = tmp / "off.yaml"
        off_file.write_text("enabled: false\ndiscovery_cache: {enabled: false}\n")
        light_api = None
        if args.apart:
            own = stack.enter_context(WatchAPIServer(token=SA))
            light_api = (own.url, own.ca_pem)
        on = stack.enter_context(_gateway(tmp / "on", api.url, api.ca_pem, [], light_api))
        off = stack.enter_context(_gateway(tmp / "off", api.url, api.ca_pem, ["--limits-config", str(off_file)],
                                           light_api))
        for number in range(args.rounds):
            load = os.getloadavg()[0]
            # "elsewhere": the heavy user runs against the other gateway, so the light user's
            # gateway is idle but for it — what sharing the machine's cores with the load
            # generator and the other gateway costs the light user, whatever any gateway does.
            phases = {"alone": _phase(on, args, None), "off": _phase(off, args, off),
                      "on": _phase(on, args, on), "elsewhere": _phase(on, args, off)}
            phases["load_average"] = round(load, 1)
            print(f"round {number + 1}: {json.dumps(_without_samples(phases))}", flush=True)
            rounds.append(phases)
    return {"rounds": rounds, "light_p99_ratio_on": [round(r["on"]["light_p99_ms"] / r["alone"]["light_p99_ms"], 2)
                                                     for r in rounds],
            "light_p99_ratio_off": [round(r["off"]["light_p99_ms"] / r["alone"]["light_p99_ms"], 2)
                                    for r in rounds],
            "light_p99_ratio_elsewhere": [round(r["elsewhere"]["light_p99_ms"] / r["alone"]["light_p99_ms"], 2)
                                          for r in rounds]}


def _discovery_paths(api: Any) -> int:
    return sum(1 for r in api.requests if r.path in ("/api", "/apis") or r.path.startswith("/openapi")
               or (r.path.startswith(("/api/v1", "/apis/")) and r.path.count("/") <= 3 and "namespaces" not in r.path))


def discovery(runs: int) -> dict:
    from tests.support.fake_apiserver import FakeAPIServer
    from tests.support.kube import kubectl, write_kubeconfig

    result = {}
    with FakeAPIServer(token=SA) as api, tempfile.TemporaryDirectory(prefix="fairness-kubectl-") as tmp:
        off_file = Path(tmp) / "nocache.yaml"
        off_file.write_text("discovery_cache: {enabled: false}\n")
        for name, extra in (("cached", []), ("uncached", ["--limits-config", str(off_file)])):
            with _gateway(Path(tmp) / name, api.url, api.ca_pem, extra) as (server, cafile, tokens):
                kubeconfig = write_kubeconfig(Path(tmp) / f"{name}.kubeconfig",
                                              server=f"https://localhost:{server.port}/tunnels/clusters/{CLUSTER}",
                                              token=tokens["light"], ca_file=cafile)
                before = _discovery_paths(api)
                started = time.monotonic()
                failures = sum(kubectl("get", "pods", kubeconfig=kubeconfig, timeout=60).returncode != 0
                               for _ in range(runs))
                result[name] = {"discovery_requests": _discovery_paths(api) - before, "kubectl_failures": failures,
                                "seconds": round(time.monotonic() - started, 1)}
                print(f"discovery {name}: {result[name]}", flush=True)
    return result


def overhead(requests_count: int) -> dict:
    """In one process: the per-user layer's cost per request (µs) with the table in this
    process's memory, with the table in a shared file (as ``serve``'s workers use it), and
    the bare app — a request of a non-superuser, admitted, its answer closed."""
    from bcs_middleware.core import environ as env
    from bcs_middleware.core import facts
    from bcs_middleware.layers.limits import LimitsMiddleware
    from bcs_middleware.limits.settings import LimitSettings, UserLimits
    from bcs_middleware.limits.table import CounterTable

    def app(environ: dict, start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])
        yield b"{}"

    settings = LimitSettings(user=UserLimits(rate=1e9, burst=10**9, inflight=10**6))
    user = env.User(7, "bench-user", groups=("ops",))
    base = {"REQUEST_METHOD": "GET", "PATH_INFO": PODS, "QUERY_STRING": "", "wsgi.url_scheme": "https"}

    def timed(wsgi: Any) -> float:
        started = time.perf_counter()
        for _ in range(requests_count):
            environ = dict(base)
            environ[env.USER] = user
            environ[env.FACTS] = facts.classify(environ)
            body = wsgi(environ, lambda status, headers, exc_info=None: None)
            for _piece in body:
                pass
            getattr(body, "close", lambda: None)()
        return (time.perf_counter() - started) / requests_count * 1e6

    with tempfile.TemporaryDirectory(prefix="fairness-overhead-") as tmp:
        layered = {"memory": LimitsMiddleware(app, settings=settings, table=CounterTable(None)),
                   "shared_file": LimitsMiddleware(app, settings=settings,
                                                   table=CounterTable(Path(tmp) / "limits.table"))}
        figures: dict[str, list[float]] = {"bare": [], "memory": [], "shared_file": []}
        for _ in range(5):  # alternated: the machine is shared
            figures["bare"].append(timed(app))
            for name, wsgi in layered.items():
                figures[name].append(timed(wsgi))
    result = {name: round(sorted(values)[len(values) // 2], 1) for name, values in figures.items()}
    result["layer_memory_us"] = round(result["memory"] - result["bare"], 1)
    result["layer_shared_file_us"] = round(result["shared_file"] - result["bare"], 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heavy", type=int, default=200, help="the heavy user's busy connections")
    parser.add_argument("--watches", type=int, default=500, help="the heavy user's reconnecting watches")
    parser.add_argument("--light-rate", type=float, default=10.0, help="the light user's requests per second")
    parser.add_argument("--phase", type=float, default=8.0, help="seconds the light user is measured per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--same-apiserver", dest="apart", action="store_false",
                        help="the light user's cluster on the heavy user's apiserver (by default it has its own)")
    parser.add_argument("--heavy-nice", type=int, default=19, metavar="N",
                        help="the heavy user's load generator's niceness, in a session of its own (default 19; "
                             "0: as this process)")
    parser.add_argument("--heavy-priority", choices=("idle", "nice"), default="idle",
                        help="idle (default): the load generator in a CPU cgroup with cpu.idle = 1, where one can "
                             "be made (else as nice); nice: at --heavy-nice in a session of its own")
    parser.add_argument("--kubectl-runs", type=int, default=100)
    parser.add_argument("--skip-discovery", action="store_true")
    parser.add_argument("--skip-fairness", action="store_true")
    parser.add_argument("--overhead", type=int, default=20000, metavar="N",
                        help="requests timed in-process for the layer's cost (0: skip)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="an argument added to both gateways' serve command line (repeatable)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--pool", nargs="+", metavar="JSON",
                        help="measure nothing: pool the light user's latencies of these --json files")
    args = parser.parse_args()
    if args.pool:
        print(json.dumps(pool(args.pool), indent=2))
        return 0
    SERVE_ARGS.extend(args.serve_arg)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    args.heavy_cgroup = idle_cgroup() if args.heavy_priority == "idle" else None
    results: dict[str, Any] = {"args": {**vars(args), "heavy_cgroup": str(args.heavy_cgroup)},
                               "heavy_priority": "cgroup cpu.idle" if args.heavy_cgroup
                               else f"nice {args.heavy_nice}, a session of its own"}
    print(f"load generator: {results['heavy_priority']}", flush=True)
    try:
        return _measure(args, results)
    finally:
        if args.heavy_cgroup is not None:
            with suppress(OSError):  # empty once the generators have exited
                args.heavy_cgroup.rmdir()


def _measure(args: argparse.Namespace, results: dict[str, Any]) -> int:
    if args.overhead:
        results["overhead_us_per_request"] = overhead(args.overhead)
        print(f"overhead: {results['overhead_us_per_request']}", flush=True)
    if not args.skip_fairness:
        results["fairness"] = fairness(args)
    if not args.skip_discovery:
        results["discovery"] = discovery(args.kubectl_runs)
    print(json.dumps(_without_samples(results), indent=2))
    if args.json:  # with every latency: ``--pool`` reads them
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
