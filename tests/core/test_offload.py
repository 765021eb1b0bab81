"""The bounded offload: calls on native threads, refused when too many are outstanding, given up
after their timeout, and a call given up before a thread took it never runs."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from bcs_middleware.core.offload import Offload, OffloadBusy, OffloadTimeout
from tests.support.polling import wait_until


def test_a_call_returns_its_result_and_raises_its_exception() -> None:
    offload = Offload(threads=1, pending=2)
    assert offload.call(pow, 2, 10, timeout=5) == 1024
    with pytest.raises(ZeroDivisionError):
        offload.call(divmod, 1, 0, timeout=5)


def test_calls_beyond_the_bound_are_refused_and_a_late_one_never_runs() -> None:
    offload = Offload(threads=1, pending=2)
    release = threading.Event()
    ran: list[str] = []
    holder = threading.Thread(target=lambda: offload.call(release.wait, 30, timeout=None))
    holder.start()
    try:
        # The one thread is held: the next call waits for it, gives up, and is never run.
        with pytest.raises(OffloadTimeout):
            offload.call(ran.append, "late", timeout=0.2)
        with pytest.raises(OffloadBusy):  # two outstanding (the held one and the given-up one)
            offload.call(ran.append, "refused", timeout=0.2)
    finally:
        release.set()
        holder.join(10)
    assert wait_until(lambda: offload.call(ran.append, "after", timeout=5) is None and "after" in ran, timeout=10)
    assert ran == ["after"]


def test_under_gevent_a_blocked_call_leaves_the_event_loop_running() -> None:
    # In a process gevent patched: a call stuck in a native thread, greenlets go on.
    script = """
from gevent import monkey; monkey.patch_all()
import gevent, os, time
from bcs_middleware.core.offload import Offload, OffloadTimeout
r, w = os.pipe()
offload = Offload(threads=1, pending=4)
ticks = []
ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.01)) for _ in range(20)])
started = time.monotonic()
try:
    offload.call(os.read, r, 1, timeout=0.5)  # blocks in the kernel: nobody writes
except OffloadTimeout:
    pass
assert time.monotonic() - started < 2
assert len(ticks) == 20, len(ticks)
os.write(w, b"x")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
