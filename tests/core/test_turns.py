"""Work that waits its turn: one piece per turn of the event loop, after the rest (``core/turns.py``).

In-process, on gevent's loop: "established connections" are socket pairs playing ping-pong
(each step a real readiness event of the loop), the waiting work greenlets that wait for their
turn and then compute for a millisecond, as a TLS handshake or a refusal does. Served through a
real gateway: every TLS test (every connection to ``serve`` handshakes in its turn), the
keep-alive and slow-client tests (``tests/serving/test_keepalive.py``,
``tests/apps/test_proxy_streams.py``: new connections are not shut out by busy ones, and
clients that never say hello hold nobody up), and the limits tests (refusals).
"""

from __future__ import annotations

import itertools
import time

import gevent
import gevent.socket

from bcs_middleware.core import turns as turns_module
from bcs_middleware.core.turns import Turns

FLOWS = 8


class _PingPong:
    """Established connections: each flow sends a byte, its peer answers, for ever; ``steps``
    counts both ends' steps (one of them is ready at each turn of the loop)."""

    def __init__(self, flows: int) -> None:
        self.steps = [0] * flows
        self._greenlets = []
        self._sockets = []
        for number in range(flows):
            one, other = gevent.socket.socketpair()
            self._sockets += [one, other]
            self._greenlets += [gevent.spawn(self._ping, number, one), gevent.spawn(self._pong, number, other)]

    def _ping(self, number: int, sock: gevent.socket.socket) -> None:
        while True:
            sock.sendall(b"x")
            sock.recv(1)
            self.steps[number] += 1

    def _pong(self, number: int, sock: gevent.socket.socket) -> None:
        while data := sock.recv(1):
            self.steps[number] += 1
            sock.sendall(data)

    def stop(self) -> None:
        gevent.killall(self._greenlets)
        for sock in self._sockets:
            sock.close()


def _compute(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_one_piece_per_turn_in_arrival_order_and_none_is_shut_out() -> None:
    turns = Turns()
    flows = _PingPong(FLOWS)
    seen: list[tuple[int, list[int]]] = []

    def piece(number: int) -> None:
        turns.wait()
        seen.append((number, list(flows.steps)))
        _compute(0.001)

    gevent.sleep(0.05)  # every flow running
    pieces = [gevent.spawn(piece, number) for number in range(20)]
    try:
        # Never shut out: all twenty get their turn while the flows never stop.
        assert gevent.joinall(pieces, timeout=5) and all(g.dead for g in pieces)
        assert [number for number, _ in seen] == list(range(20))
        # Between two pieces every established connection took a step: never two in a row
        # while other work was ready.
        for (_, before), (_, after) in itertools.pairwise(seen):
            assert all(b > a for a, b in zip(before, after, strict=True)), (before, after)
    finally:
        gevent.killall(pieces)
        flows.stop()


def test_on_an_idle_worker_the_turn_comes_at_once() -> None:
    turns = Turns()
    started = time.monotonic()
    waited = gevent.spawn(turns.wait)
    waited.join(timeout=5)
    assert time.monotonic() - started < 0.05
    assert turns.waiting == 0 and waited.value is True  # it had a loop's turn


def test_work_given_up_leaves_the_queue_and_the_loop_sleeps_again() -> None:
    turns = Turns()
    waiting_after_kill: list[int] = []

    def connections() -> list[gevent.Greenlet]:
        quitter, later = gevent.spawn(turns.wait), gevent.spawn(turns.wait)
        gevent.sleep(0)  # both are queued now, and no turn has come (none comes before the poll)
        quitter.kill(block=False)  # the client left, or its head timeout fired
        gevent.sleep(0)
        waiting_after_kill.append(turns.waiting)
        return [quitter, later]

    quitter, later = gevent.spawn(connections).get(timeout=5)
    gevent.joinall([quitter, later], timeout=5)
    assert waiting_after_kill == [1]
    assert later.successful() and isinstance(quitter.value, gevent.GreenletExit)
    assert turns.waiting == 0
    # Nobody waits: no watcher keeps the loop from blocking (it would spin a core).
    cpu = time.process_time()
    gevent.sleep(0.3)
    assert time.process_time() - cpu < 0.1


def test_without_gevent_there_is_no_loop_to_share(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # This process has not monkey-patched socket (the gthread worker, a CLI): no wait, no loop.
    monkeypatch.setattr(turns_module, "_turns", None)  # used, it would fail
    started = time.monotonic()
    assert turns_module.wait_turn() is False  # no turn was waited for (not counted as one)
    assert time.monotonic() - started < 0.01


def test_a_native_thread_does_not_wait_for_another_loops_turns() -> None:
    import threading

    turns = Turns()  # this thread's loop
    done = threading.Event()

    def elsewhere() -> None:
        if turns.wait() is False:  # none of that loop's turns: not counted as one
            done.set()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(timeout=5)
    assert done.is_set() and turns.waiting == 0
