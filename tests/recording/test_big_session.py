"""A session that prints 100 MiB through a real gateway does not grow the gateway's memory: the
recording's buffer is bounded, the writer streams to the store, and the recording holds every byte."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
import time
from pathlib import Path

from bcs_middleware.recording import asciicast
from tests.agent_tunnel.hostile import reset_peak, vm_bytes, worker_pid
from tests.support.gateway import Gateway
from tests.support.kube import _argv, _env

from .terminal_pod import EXIT_CODE, TerminalPod
from .test_kubectl_sessions import finished_session, session_ids

MiB = 1024 * 1024
BIG = 100 * MiB
#: What the worker may grow by while it splices and records 100 MiB: buffers, not the stream.
ALLOWED_GROWTH = 48 * MiB


def test_a_100_mib_session_does_not_grow_the_gateway(gateway: Gateway, alice: str, kubeconfigs: dict[str, Path],
                                                     pod: TerminalPod) -> None:
    worker = worker_pid(gateway.server.proc.pid)
    before_ids = session_ids(gateway, alice)
    reset_peak(worker)
    before = vm_bytes(worker, "VmRSS")
    pod.big = BIG
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="kubectl-home-") as home:
            done = subprocess.run(_argv(["exec", "p", "-c", "app", "--", "yes"], kubeconfigs["alice"], None, 120),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(home), timeout=300)
    finally:
        pod.big = 0
    seconds = time.monotonic() - started
    assert done.returncode == EXIT_CODE, done.stderr
    info = finished_session(gateway, alice, before_ids)
    peak = vm_bytes(worker, "VmHWM")
    print(f"\n100 MiB session in {seconds:.1f}s; worker RSS {before / MiB:.0f} MiB before, peak "
          f"{peak / MiB:.0f} MiB (+{(peak - before) / MiB:.1f}); recording {info['size'] / MiB:.1f} MiB")
    assert peak - before < ALLOWED_GROWTH
    assert info["status"] == "complete" and info["bytes_to_client"] > BIG
    seen = pod.sessions[-1]
    assert len(seen.stdout) > BIG
    # Every byte is in the recording: compared by digest, read back in pieces.
    status, body = gateway.call("GET", f"/rest/sessions/{info['id']}/recording", timeout=120)
    assert status == 200
    _header, events = asciicast.parse(body.decode().splitlines(keepends=True))
    digest = hashlib.sha256()
    for event in events:
        if event.code == "o":
            digest.update(event.data.encode())
    assert digest.hexdigest() == hashlib.sha256(seen.stdout).hexdigest()
