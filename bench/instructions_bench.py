"""Diagnostic: CPU instructions per proxied request in a ``serve`` worker, counted by callgrind.

    python bench/instructions_bench.py [--requests 2000] [--warm 300] [--idle] [--tree NAME=DIR ...]

This machine's speed drifts about 2x with what else runs on it, so per-request CPU *time* of two
trees can only be compared interleaved and in many rounds (``proxy_bench.py``). The number of
instructions a worker executes per request does not drift: callgrind counts them whatever the
load. It answers "did this change make the request path do more work", and where a time
measurement cannot separate a few per cent from noise.

The path is the production one with one worker: an HTTPS client on one keep-alive connection →
``bcs-middleware serve`` with its defaults (gevent worker, HTTPS, a ``view`` user's request to
``/tunnels/clusters/{id}/…``, the per-user limits on) → nginx over HTTPS (2 KiB answers). Each
tree's gateway is set up, stopped, and started again under ``valgrind --tool=callgrind`` with
instrumentation off; after ``--warm`` requests it is switched on for ``--requests`` and the
worker's count dumped. What is counted is user-space instructions (libssl included, the kernel's
work not); it is not a figure of speed (no caches, no system calls), and a gateway under valgrind
is never a headline figure.

Needs ``valgrind`` (``callgrind_control``) and ``nginx``.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bench.proxy_bench as proxy_bench  # noqa: E402
from tests.support.polling import wait_for  # noqa: E402
from tests.support.servers import BIN, ServerProcess, free_port  # noqa: E402


def _requests(conn: http.client.HTTPSConnection, path: str, headers: dict[str, str], count: int) -> None:
    for _ in range(count):
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{answer.status}: {body[:200]!r}")


def _worker_pid(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return int(children[-1])


def count(tmp: Path, name: str, root: Path | None, upstream: str, ca_file: Path, warm: int, requests: int,
          idle: bool = False) -> float:
    """Instructions per request of one tree's worker (with ``idle``, also printed: what it does
    while idle for as long as the requests took — background work, counted in the figure too)."""
    served, tokens = proxy_bench.start_serve(tmp, name, upstream, ca_file, package_root=root)
    port = served.port
    served.stop()
    limits = tmp / f"{name}-limits.yaml"
    out = tmp / "callgrind"
    out.mkdir(exist_ok=True)
    argv = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--instr-atstart=no",
            f"--callgrind-out-file={out}/{name}.%p", sys.executable, str(BIN / "bcs-middleware"), "serve",
            "--data-dir", str(tmp / name), *(["--limits-config", str(limits)] if limits.exists() else []),
            "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    env = {"BCS_ADMIN_TOKEN": proxy_bench.SERVE_ADMIN, **({"PYTHONPATH": str(root)} if root else {})}
    with ServerProcess(argv, port=port, env=env, scheme="https", timeout=600) as server:
        conn = http.client.HTTPSConnection("localhost", port, timeout=600,
                                           context=ssl.create_default_context(cafile=tokens["cafile"]))
        path = f"/tunnels/clusters/{proxy_bench.CLUSTER_ID}/payload.bin"
        headers = {"Authorization": f"Bearer {tokens['bench-user']}"}
        _requests(conn, path, headers, warm)
        worker = _worker_pid(server.proc.pid)
        subprocess.run(["callgrind_control", "--instr=on", str(worker)], check=True, capture_output=True)
        started = time.monotonic()
        _requests(conn, path, headers, requests)
        took = time.monotonic() - started
        subprocess.run(["callgrind_control", "--dump", str(worker)], check=True, capture_output=True)
        if idle:
            time.sleep(took)
            subprocess.run(["callgrind_control", "--dump", str(worker)], check=True, capture_output=True)
        conn.close()
        dumps = wait_for(lambda: sorted(glob.glob(f"{out}/{name}.{worker}.*"), key=os.path.getmtime)
                         [:2 if idle else 1], 60, "the dump")
        totals = [int(re.search(r"^(?:summary|totals): (\d+)", Path(d).read_text(), re.M).group(1)) for d in dumps]
    if idle:
        print(f"  {name}: requests {totals[0]:,}, idle as long {totals[1]:,}")
    return totals[0] / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--idle", action="store_true",
                        help="also count each worker idle for as long as its requests took")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="another checkout's bcs_middleware (repeatable); default: this one")
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [(name, Path(root)) for name, _, root in
                                            (tree.partition("=") for tree in args.tree)] or [("this", None)]
    with tempfile.TemporaryDirectory(prefix="instructions-bench-") as folder:
        tmp = Path(folder)
        tmp.chmod(0o755)  # nginx's workers read the payload
        pki = proxy_bench.Pki.create(tmp)
        tls_port = free_port()
        nginx = proxy_bench._start_nginx(tmp, pki, tls_port)
        proxy_bench.GUNICORN["workers"] = 1
        figures: dict[str, float] = {}
        try:
            for name, root in trees:
                started = time.monotonic()
                figures[name] = count(tmp, f"serve-{name}", root, f"https://127.0.0.1:{tls_port}", pki.ca_file,
                                      args.warm, args.requests, args.idle)
                print(f"{name:12s} {figures[name]:12,.0f} instructions/request "
                      f"({time.monotonic() - started:.0f} s)", flush=True)
        finally:
            nginx.stop()
    first = next(iter(figures.values()))
    for name, value in figures.items():
        print(f"{name:12s} {value / first:6.3f} x {trees[0][0]}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
