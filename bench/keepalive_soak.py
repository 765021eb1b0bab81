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
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.gateway import served_gateway  # noqa: E402
from tests.support.keepalive import Load  # noqa: E402


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
    with tempfile.TemporaryDirectory(prefix="keepalive-soak-") as data, \
            served_gateway(Path(data), args=serve_args, workers=args.workers) as gw:
        load = Load(gw, args.seconds, clients=args.clients, kinds=kinds, prefix="BCS-K8S-SOAK")
        clients = load.join(args.seconds + 120)
        elapsed = time.monotonic() - load.started
        load.close()
        status, body = gw.call("GET", "/rest/clusters/")
        listed = {c["id"] for c in json.loads(body) if c["id"].startswith("BCS-K8S-SOAK")} if status == 200 else set()

    created = load.created()
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
        ended = client.failure or (f"the server ended the connection (Connection: close) after answer "
                                   f"{client.told_close_after}" if client.told_close_after else None)
        print(f"  client {client.number} ({client.kind}): {client.answered} answered"
              + (f"; ENDED {ended}" if ended else ""))
    consistent = listed == created
    print(f"registrations answered 201: {len(created)}; listed by the server: {len(listed)}"
          f"{'' if consistent else '  MISMATCH'}")
    failed = [client for client in clients if client.failure or client.told_close_after]
    print("every request answered, no connection ended" if not failed and consistent
          else f"{len(failed)} connection(s) ended")
    return 0 if not failed and consistent else 1


if __name__ == "__main__":
    sys.exit(main())
