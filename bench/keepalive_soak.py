"""Busy keep-alive connections for minutes: is every request answered, and no connection dropped?

    /work/venvs/NAME/bin/python bench/keepalive_soak.py [--seconds 100] [--clients 8]
        [--worker-class gevent|gthread] [--workers 1] [--keepalive 75] [--requests get|post|mixed]

* A real ``bcs-middleware serve`` (HTTPS, generated CA, SQLite) on loopback, with the
  server's default timeouts unless given (``--keepalive``, ``--header-timeout``,
  ``--body-idle-timeout``): the soak must outlast every one of them (the default 100 s does).
* ``--clients`` threads, each on one keep-alive connection of its own, send requests back
  to back: ``GET /rest/clusters/``, ``POST /rest/clusters/bcs`` (a new cluster each time),
  or both (``mixed``: even clients list, odd ones register).
* A client never reconnects: a request without a complete answer, or an answer that says
  ``Connection: close``, ends that client and is reported. At the end: requests answered per
  client, failures (with when they happened), latency percentiles, and whether the clusters
  the server lists are exactly the ones it answered 201 for.

Exit status 0 when every request was answered and no connection was ended, 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.gateway import ADMIN, Gateway, served_gateway  # noqa: E402


@dataclass
class Client:
    number: int
    kind: str
    answered: int = 0
    latencies: list[float] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    failure: str | None = None


def run_client(gw: Gateway, client: Client, until: float, started: float) -> None:
    context = ssl.create_default_context(cafile=gw.ca_file)
    conn = http.client.HTTPSConnection("localhost", gw.server.port, context=context, timeout=60)
    conn.connect()
    sock = conn.sock
    auth = {"Authorization": f"Bearer {ADMIN}"}
    try:
        while time.monotonic() < until:
            cluster = f"BCS-K8S-SOAK{client.number:02d}{client.answered:07d}"
            sent = time.monotonic()
            try:
                if client.kind == "post":
                    conn.request("POST", "/rest/clusters/bcs", headers={**auth, "Content-Type": "application/json"},
                                 body=json.dumps({"id": cluster, "project_id": "soak", "cluster_type": "k8s"}))
                else:
                    conn.request("GET", "/rest/clusters/", headers=auth)
                response = conn.getresponse()
                body = response.read()
            except (http.client.HTTPException, OSError) as exc:
                client.failure = (f"{sent - started:.1f}s: request {client.answered + 1} unanswered "
                                  f"({type(exc).__name__}: {exc})")
                return
            client.latencies.append(time.monotonic() - sent)
            expected = 201 if client.kind == "post" else 200
            if response.status != expected:
                client.failure = f"{sent - started:.1f}s: HTTP {response.status} {body[:200]!r}"
                return
            client.answered += 1
            if client.kind == "post":
                client.created.append(cluster)
            if response.will_close or conn.sock is not sock:
                client.failure = f"{sent - started:.1f}s: the server ended the connection (Connection: close)"
                return
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--worker-class", choices=("gevent", "gthread"), default="gevent")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--requests", choices=("get", "post", "mixed"), default="mixed")
    parser.add_argument("--keepalive", type=int, help="serve --keepalive (default: serve's, 75)")
    parser.add_argument("--header-timeout", type=float, help="serve --header-timeout (default: serve's, 10)")
    parser.add_argument("--body-idle-timeout", type=float, help="serve --body-idle-timeout (default: serve's, 60)")
    args = parser.parse_args()

    serve_args = ["--worker-class", args.worker_class, "--no-access-log"]
    for option, value in (("--keepalive", args.keepalive), ("--header-timeout", args.header_timeout),
                          ("--body-idle-timeout", args.body_idle_timeout)):
        if value is not None:
            serve_args += [option, str(value)]
    kinds = {"get": ["get"], "post": ["post"], "mixed": ["get", "post"]}[args.requests]
    clients = [Client(n, kinds[n % len(kinds)]) for n in range(args.clients)]
    with tempfile.TemporaryDirectory(prefix="keepalive-soak-") as data, \
            served_gateway(Path(data), args=serve_args, workers=args.workers) as gw:
        started = time.monotonic()
        until = started + args.seconds
        threads = [threading.Thread(target=run_client, args=(gw, client, until, started)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        status, body = gw.call("GET", "/rest/clusters/")
        listed = {c["id"] for c in json.loads(body) if c["id"].startswith("BCS-K8S-SOAK")} if status == 200 else set()

    created = {cluster for client in clients for cluster in client.created}
    latencies = sorted(latency for client in clients for latency in client.latencies)
    total = sum(client.answered for client in clients)
    print(f"serve --worker-class {args.worker_class} --workers {args.workers} {' '.join(serve_args[2:])}")
    print(f"{args.clients} keep-alive clients ({args.requests}) for {elapsed:.1f}s: {total} requests answered "
          f"({total / elapsed:.0f}/s)")
    if latencies:
        def pct(q: float) -> float:
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

        print(f"latency ms: median {statistics.median(latencies) * 1000:.1f}  p99 {pct(0.99):.1f}  "
              f"max {latencies[-1] * 1000:.1f}")
    for client in clients:
        print(f"  client {client.number} ({client.kind}): {client.answered} answered"
              + (f"; ENDED {client.failure}" if client.failure else ""))
    consistent = listed == created
    print(f"registrations answered 201: {len(created)}; listed by the server: {len(listed)}"
          f"{'' if consistent else '  MISMATCH'}")
    failed = [client for client in clients if client.failure]
    print("every request answered, no connection ended" if not failed and consistent
          else f"{len(failed)} connection(s) ended")
    return 0 if not failed and consistent else 1


if __name__ == "__main__":
    sys.exit(main())
