"""Mesos route cost: gateway → driver → scheduler against the same request straight to the driver.

    /work/venv/bin/python bench/mesos_bench.py [--rounds 5] [--requests 400] [--threads 8]

* A real ZooKeeper (Debian package) holds the driver and scheduler registrations.
* The scheduler is a small JSON echo app under gunicorn; the driver is the
  ``driver`` paste app under gunicorn (2 workers, 8 threads); the gateway route
  (a stand-in user layer → :class:`MesosRoutingMiddleware` with
  :class:`ZookeeperDiscovery` → :class:`UpstreamProxy`) is under gunicorn too.
* Each round sends ``--requests`` GETs over ``--threads`` keep-alive clients to
  the gateway and then to the driver directly (order alternates per round);
  figures are medians over rounds.
* In-process: the routing decision over N=10000 calls with StaticDiscovery vs
  ZookeeperDiscovery, and the ZooKeeper reads made meanwhile (must be 0: the
  watch costs nothing per request).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bcs_middleware.apps.proxy import UpstreamProxy  # noqa: E402
from bcs_middleware.core import environ as env  # noqa: E402
from bcs_middleware.discovery.base import DEFAULT_ROOT, Endpoint  # noqa: E402
from bcs_middleware.discovery.registration import Registrar, driver_path  # noqa: E402
from bcs_middleware.discovery.static import StaticDiscovery  # noqa: E402
from bcs_middleware.discovery.zookeeper import ZookeeperDiscovery  # noqa: E402
from bcs_middleware.layers.mesos_route import MesosRoutingMiddleware  # noqa: E402

CLUSTER = "BCS-MESOS-BENCH"


def gateway() -> Any:
    """gunicorn factory ``mesos_bench:gateway()`` (configured through ZK_HOSTS)."""

    layer = MesosRoutingMiddleware(UpstreamProxy(), discovery=ZookeeperDiscovery(os.environ["ZK_HOSTS"]))

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        environ[env.USER] = env.User(1, "bench")
        return layer(environ, start_response)

    return app


def driver() -> Any:
    """gunicorn factory ``mesos_bench:driver()``."""
    from bcs_middleware.compose.driver import app_factory

    return app_factory({}, cluster_id=CLUSTER, zookeeper_hosts=os.environ["ZK_HOSTS"])


def load(url: str, headers: dict[str, str], total: int, threads: int) -> tuple[float, float]:
    """(requests per second, p99 latency in ms) for ``total`` GETs over ``threads`` sessions."""
    latencies: list[float] = []
    lock = threading.Lock()
    per = total // threads

    def worker() -> None:
        mine = []
        with requests.Session() as session:
            for _ in range(per):
                started = time.perf_counter()
                response = session.get(url, headers=headers, timeout=30)
                mine.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise RuntimeError(f"{url}: {response.status_code} {response.text[:200]}")
        with lock:
            latencies.extend(mine)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return len(latencies) / elapsed, latencies[int(len(latencies) * 0.99) - 1] * 1000


def route_cost(discovery: Any, n: int) -> float:
    """Microseconds per routing decision (no proxying: the next app is a no-op)."""
    layer = MesosRoutingMiddleware(lambda e, s: [b""], discovery=discovery)
    base = {"REQUEST_METHOD": "GET", "PATH_INFO": "/bcsapi/v4/scheduler/mesos/namespaces/ns/applications",
            "QUERY_STRING": "", "HTTP_BCS_CLUSTERID": CLUSTER, env.USER: env.User(1, "bench")}
    started = time.perf_counter()
    for _ in range(n):
        layer(dict(base), lambda *a: None)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()

    from tests.support.servers import gunicorn
    from tests.support.zookeeper import ZookeeperServer

    zk = ZookeeperServer()
    zk.start()
    environ = {"ZK_HOSTS": zk.hosts, "PYTHONPATH": f"{ROOT}:{ROOT / 'bench'}"}
    servers, registrars = [], []
    try:
        scheduler = gunicorn("tests.admission.apps:echo_app", workers=2, env=environ, extra=["--chdir", str(ROOT)])
        servers.append(scheduler)
        registrars.append(Registrar(zk.hosts, f"{DEFAULT_ROOT}/scheduler", Endpoint("127.0.0.1", scheduler.port)))
        drv = gunicorn("mesos_bench:driver()", workers=2, env=environ, extra=["--chdir", str(ROOT / "bench")])
        servers.append(drv)
        registrars.append(Registrar(zk.hosts, driver_path(CLUSTER), Endpoint("127.0.0.1", drv.port)))
        for registrar in registrars:
            registrar.register(10)
        gw = gunicorn("mesos_bench:gateway()", workers=2, env=environ, extra=["--chdir", str(ROOT / "bench")])
        servers.append(gw)
        headers = {"BCS-ClusterID": CLUSTER}
        targets = {
            "gateway → driver → scheduler": f"{gw.url}/bcsapi/v4/scheduler/mesos/namespaces/ns/applications",
            "driver → scheduler (direct)": f"{drv.url}/mesosdriver/v4/namespaces/ns/applications",
        }
        for url in targets.values():  # warm up: pools, first ZooKeeper snapshot in each worker
            load(url, headers, args.threads * 10, args.threads)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
        for round_ in range(args.rounds):
            order = list(targets.items())
            if round_ % 2:
                order.reverse()
            for name, url in order:
                results[name].append(load(url, headers, args.requests, args.threads))
        print(f"{args.rounds} rounds x {args.requests} requests, {args.threads} client threads; medians")
        medians = {}
        for name, samples in results.items():
            rps = statistics.median(s[0] for s in samples)
            p99 = statistics.median(s[1] for s in samples)
            medians[name] = (rps, p99)
            print(f"  {name:32s} {rps:8.0f} req/s   p99 {p99:6.1f} ms")
        (g_rps, g_p99), (d_rps, d_p99) = medians.values()
        print(f"  ratio gateway/direct: req/s {g_rps / d_rps:.2f}   p99 {g_p99 / d_p99:.2f}")

        n = 10_000
        static = StaticDiscovery({CLUSTER: [Endpoint("127.0.0.1", drv.port)]})
        watched = ZookeeperDiscovery(zk.hosts)
        watched.start()
        reads_before = watched.reads
        costs = {"static": [], "zookeeper": []}
        for _ in range(args.rounds):
            costs["static"].append(route_cost(static, n))
            costs["zookeeper"].append(route_cost(watched, n))
        print(f"routing decision, N={n} in-process, median of {args.rounds}:")
        for name, values in costs.items():
            print(f"  {name:10s} {statistics.median(values):6.2f} µs/call")
        print(f"  ZooKeeper reads during {n * args.rounds} routed calls: {watched.reads - reads_before}")
        watched.close()
    finally:
        for registrar in registrars:
            registrar.deregister()
        for server in reversed(servers):
            server.stop()
        zk.remove()


if __name__ == "__main__":
    main()
