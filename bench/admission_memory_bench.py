#!/usr/bin/env python
"""How much memory do concurrent admitted bodies cost a gateway worker?

A real ``bcs-middleware serve`` (one worker, gevent) in front of the fake apiserver,
with a ValidatingWebhookConfiguration on configmaps whose webhook (HTTPS, in this
process, on its own threads) allows everything. ``--concurrency`` clients each POST
one body of ``--size`` bytes through the tunnel at once, ``--rounds`` times; printed:
the worker's RSS before, its peak (``VmHWM`` after ``clear_refs``) and the peak growth
per body in flight, as a multiple of the body size.

Two body shapes (``--shape``):

* ``data``: a ConfigMap whose ``data`` holds ~100-byte values (many short strings:
  a realistic large object);
* ``dense``: the same size of ``[{}, {}, …]`` under one key (an attacker's: the most
  Python objects per byte).

Usage: ``python bench/admission_memory_bench.py [--concurrency 16] [--size 3000000]
[--shape data] [--rounds 2]``. ``PYTHONPATH`` pointing at another checkout's package
measures that one (the gateway processes inherit it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fake_apiserver import FakeAPIServer  # noqa: E402
from tests.support.gateway import CLUSTER, SA_TOKEN, register_cluster, served_gateway  # noqa: E402
from tests.support.webhooks import allow_configmaps, allow_review, served_webhook  # noqa: E402

TUNNEL = f"/tunnels/clusters/{CLUSTER}"


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def body(shape: str, size: int, index: int) -> bytes:
    head = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"big-{index}-{time.monotonic_ns()}", "namespace": "default"}}
    if shape == "data":
        entries = max(1, (size - 200) // 112)
        head["data"] = {f"key-{i:08d}": "v" * 96 for i in range(entries)}
    else:
        head["data"] = {"x": "y"}
        head["dense"] = [{}] * max(1, (size - 200) // 3)
    return json.dumps(head, separators=(",", ":")).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--size", type=int, default=3_000_000)
    parser.add_argument("--shape", choices=("data", "dense"), default="data")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="admission-memory-"))
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with served_webhook(allow_review) as hook, FakeAPIServer(token=SA_TOKEN) as api, \
            served_gateway(tmp / "gw", workers=1) as gw:
        register_cluster(gw, CLUSTER, server_url=api.url, ca_pem=api.ca_pem)
        status, answer = gw.call("POST", f"/rest/clusters/{CLUSTER}/admissionwebhookconfigurations",
                                 body=allow_configmaps(hook))
        assert status == 201, answer
        [worker] = _children(gw.server.proc.pid)

        def send(payload: bytes) -> int:
            return gw.call("POST", f"{TUNNEL}/api/v1/namespaces/default/configmaps", body=payload,
                           headers={"Content-Type": "application/json"}, timeout=300)[0]

        deadline = time.monotonic() + 30
        while send(body("data", 1000, -1)) != 201:  # the admission refresh picked the configuration up
            assert time.monotonic() < deadline, "the webhook configuration never applied"
            time.sleep(0.5)
        first = _vm_kib(worker, "VmRSS")
        for round_ in range(args.rounds):
            bodies = [body(args.shape, args.size, i) for i in range(args.concurrency)]
            before = _vm_kib(worker, "VmRSS")
            Path(f"/proc/{worker}/clear_refs").write_text("5")  # VmHWM := VmRSS
            started = time.monotonic()
            with ThreadPoolExecutor(args.concurrency) as pool:
                statuses = list(pool.map(send, bodies))
            took = time.monotonic() - started
            peak = _vm_kib(worker, "VmHWM")
            growth = (peak - before) * 1024
            print(json.dumps({
                "round": round_, "shape": args.shape, "concurrency": args.concurrency, "body_bytes": len(bodies[0]),
                "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
                "rss_first_mib": round(first / 1024, 1),
                "rss_before_mib": round(before / 1024, 1), "peak_mib": round(peak / 1024, 1),
                "peak_growth_mib": round(growth / 2**20, 1),
                "growth_per_body_in_flight": round(growth / (len(bodies[0]) * args.concurrency), 2),
                "seconds": round(took, 2), "load": "/".join(f"{x:.1f}" for x in os.getloadavg()),
            }), flush=True)


if __name__ == "__main__":
    main()
