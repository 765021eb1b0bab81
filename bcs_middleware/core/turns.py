"""Work that can wait its turn: one piece per turn of the worker's event loop, after the rest.

A gevent worker runs, at each turn of its loop, one step of every greenlet that became ready:
in arrival order, with no notion of whose it is. Two kinds of work come in bursts and are paid
before — or instead of — serving anyone:

* **TLS handshakes** (``serving/gevent_worker.py``): the most a connection costs before anyone
  knows whose it is, ~0.5 ms of CPU in one piece. A client reconnecting in a loop made them a
  third of a busy worker;
* **refusals** (``layers/limits.py``): a user over its limits gets its 429 a second after its
  request arrived, so a bot's refused requests, sent together, come due together — and its next
  ones arrive together again;
* **a busy user's further requests** (``layers/limits.py``, ``queue.turn_after``): past a few in
  flight in the worker, each more of that user's admitted requests starts in its turn;
* **upstream TLS handshakes** (``outbound/streams.py``): the client's side computes once the
  server has answered; a bot's watches reconnecting through the gateway are as many new upstream
  connections at once.

Either burst, run in one turn of the loop, made a request on an established connection wait
behind all of it at each of its few switches, in a worker less than half busy
(``bench/README.md``, "Handshakes and refusals in their turn").

:func:`wait_turn` queues the calling greenlet in its process's :class:`Turns`: at most one piece
starts per turn of the loop, after every socket and timer that turn made ready, in arrival order.
A request already in waits behind one such piece at most; the queue still moves at every turn, so
it is never shut out by a busy worker (waiting for a turn with nothing else to do was: eight busy
keep-alive clients left no such turn, and new clients timed out). Its length is bounded by what
feeds it (the worker's connections) and each wait by the caller's own timeout. Without gevent (the
gthread worker, a CLI) there is no loop to share and :func:`wait_turn` returns at once.
"""

from __future__ import annotations

from collections import deque
from contextlib import suppress
from typing import Any

from .forksafe import PerProcess
from .sockets import gevent_active

__all__ = ["Turns", "wait_turn"]


class Turns:
    """The calling thread's event loop's queue of work waiting for its turn, released one per
    turn of the loop."""

    def __init__(self) -> None:
        from gevent.hub import get_hub

        self._hub = get_hub()
        loop = self._hub.loop
        self._waiting: deque[Any] = deque()
        # A check watcher runs once per turn, after the poll; at the lowest priority, after
        # every watcher (socket, timer) that turn made ready.
        self._turn = loop.check()
        self._turn.priority = getattr(loop, "MINPRI", -2)
        # An idle watcher's only job: while work waits, the poll must not block for the next
        # event (there may be none), so that the next turn comes at once.
        self._awake = loop.idle()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def wait(self) -> bool:
        """Return when it is this greenlet's turn: ``True``; ``False`` at once from another
        native thread (none of this loop's turns are its)."""
        from gevent.hub import Waiter, get_hub

        if get_hub() is not self._hub:
            return False
        waiter = Waiter()
        self._waiting.append(waiter)
        if not self._turn.active:
            self._turn.start(self._give_turn)
            self._awake.start(_nothing)
        try:
            waiter.get()
        except BaseException:  # a timeout or a kill while waiting: out of the queue
            with suppress(ValueError):
                self._waiting.remove(waiter)
            self._stop_if_none_wait()
            raise
        return True

    def _give_turn(self) -> None:
        # In the hub: the switch runs the work until its first wait, then comes back.
        if self._waiting:
            self._waiting.popleft().switch(None)
        self._stop_if_none_wait()

    def _stop_if_none_wait(self) -> None:
        if not self._waiting:
            self._turn.stop()
            self._awake.stop()


def _nothing() -> None:
    pass


_turns: PerProcess[Turns] = PerProcess(Turns)


def wait_turn() -> bool:
    """Wait for this process's next turn (:class:`Turns`): ``True``; ``False`` at once without
    gevent (no loop, no turns)."""
    return gevent_active() and _turns.get().wait()
