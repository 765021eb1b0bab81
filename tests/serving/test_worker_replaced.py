"""A one-worker gateway whose worker dies keeps its port: connections made while gunicorn starts
the replacement wait in the master's backlog and are answered, never refused.

(With a ``SO_REUSEPORT`` socket per worker the master holds no listener, so a lone worker's death
refused every connection until the next one bound its own.)
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.polling import wait_for
from tests.support.servers import BIN, ServerProcess, free_port, http_get


def _workers(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def test_a_lone_workers_death_does_not_refuse_connections(tmp_path: Path) -> None:
    port = free_port()
    argv = [str(BIN / "bcs-middleware"), "serve", "--data-dir", str(tmp_path), "--bind", f"127.0.0.1:{port}",
            "--workers", "1"]
    server = ServerProcess(argv, port=port, env={"BCS_ADMIN_TOKEN": "replaced-admin-" + "r" * 30},
                           scheme="https", timeout=60)
    try:
        cafile = str(tmp_path / "tls" / "ca.crt")
        [worker] = wait_for(lambda: _workers(server.proc.pid), 30, "the worker")
        os.kill(worker, signal.SIGKILL)
        # Straight away, before gunicorn noticed: the connection is queued, then served by the next worker.
        status, _, _ = http_get(f"https://localhost:{port}/healthz", cafile=cafile, timeout=60)
        assert status == 200
        [replacement] = _workers(server.proc.pid)
        assert replacement != worker
    finally:
        server.stop()
