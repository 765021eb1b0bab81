"""A SIGTERM that reaches a worker before it serves (``serving/worker_stop.py``), on both gateway
workers under plain gunicorn: while loading it leaves at once; while starting its background
work it finishes the start and stops as a serving worker does, through its exit handlers."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.polling import wait_until
from tests.support.servers import BIN, ServerProcess, free_port

WORKERS = {
    "gevent": "bcs_middleware.serving.gevent_worker.GatewayGeventWorker",
    "gthread": "bcs_middleware.serving.gthread_worker.GatewayThreadWorker",
}

APP = '''
import os, pathlib, time
pathlib.Path(os.environ["LOADING"]).write_text("loading")
time.sleep(float(os.environ.get("LOAD_SECONDS", "0")))  # a slow load (a busy host)

def app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
'''

CONF = '''
import atexit, os, pathlib, time

def post_worker_init(worker):
    pathlib.Path(os.environ["STARTING"]).write_text("starting")
    time.sleep(float(os.environ.get("START_SECONDS", "0")))  # a slow start (a ZooKeeper registration)
    # What undoes the start is registered once the start has happened.
    atexit.register(lambda: pathlib.Path(os.environ["UNDONE"]).write_text("undone"))
'''


def _gunicorn(tmp_path: Path, worker: str, **seconds: str) -> tuple[ServerProcess, dict[str, Path]]:
    (tmp_path / "slowapp.py").write_text(APP)
    (tmp_path / "conf.py").write_text(CONF)
    files = {name: tmp_path / name.lower() for name in ("LOADING", "STARTING", "UNDONE")}
    port = free_port()
    server = ServerProcess(
        [str(BIN / "gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", "1", "--worker-class", WORKERS[worker],
         "--no-control-socket", "--graceful-timeout", "30", "-c", str(tmp_path / "conf.py"),
         "--chdir", str(tmp_path), "slowapp:app"],
        port=port, wait=False, env={**{k: str(v) for k, v in files.items()}, **seconds})
    return server, files


def _stopped_within(server: ServerProcess, timeout: float = 40.0) -> float:
    began = time.monotonic()
    server.signal(signal.SIGTERM)
    server.proc.wait(timeout)
    return time.monotonic() - began


@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_a_stop_while_starting_finishes_the_start_and_runs_its_exit_handlers(tmp_path: Path, worker: str) -> None:
    server, files = _gunicorn(tmp_path, worker, START_SECONDS="2")
    try:
        assert wait_until(files["STARTING"].exists, 30), server.output()
        took = _stopped_within(server)
        # Not held to graceful_timeout (30 s): the start ends, then the worker leaves at once.
        assert took < 15, f"took {took:.1f}s: {server.output()}"
        # Before, the stop raised SystemExit inside the start: what undoes it never ran.
        assert files["UNDONE"].exists(), server.output()
        assert "Traceback" not in server.output()
    finally:
        server.stop()


@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_a_stop_while_loading_does_not_wait_for_the_load(tmp_path: Path, worker: str) -> None:
    server, files = _gunicorn(tmp_path, worker, LOAD_SECONDS="20")
    try:
        assert wait_until(files["LOADING"].exists, 30), server.output()
        took = _stopped_within(server)
        assert took < 10, f"took {took:.1f}s: {server.output()}"
        assert not files["STARTING"].exists()  # it left during the load
    finally:
        server.stop()
