"""Fair queuing in one worker: a bounded number of seats, per-user waiting lines served in turn.

A worker is one process on one core: how many requests it serves at once decides how long
each takes. When every seat is taken, or a user is at one of its shared caps, the request
waits in its user's line (bounded: :attr:`FairQueue.length`); a freed seat goes to the next
*user* in rotation, not to the oldest request — as kube-apiserver's API Priority and
Fairness serves its queues round-robin (``staging/src/k8s.io/apiserver/pkg/util/flowcontrol/
fairqueuing/queueset``), so a user with 200 requests waiting and a user with one each get
every other seat, and the light user waits for at most one request of each heavy one.

Caps shared with the other workers (:mod:`.table`) can be freed by another process, which
cannot wake this one: the worker looks again every :data:`TICK` seconds while requests wait. A
request waits :attr:`FairQueue.wait` seconds at most, then is refused (the caller answers 429).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["TICK", "FairQueue", "InFlight", "Waited"]

#: How often a waiting request re-checks caps other workers may have freed (seconds).
TICK = 0.02

#: ``try_acquire()``: ``None`` when the shared caps were taken, else the name of the limit
#: that holds the request back.
Acquire = Callable[[], "str | None"]


@dataclass(frozen=True, slots=True)
class Waited:
    """What happened to a request that asked for a seat.

    :param granted: it has a seat (and its shared claims); release it with :meth:`FairQueue.leave`.
    :param seconds: how long it waited.
    :param limit: the limit that made it wait or refused it (``""``: none did).
    :param full: refused at once because its user's line was full.
    """

    granted: bool
    seconds: float = 0.0
    limit: str = ""
    full: bool = False


@dataclass(eq=False)
class _Waiter:
    acquire: Acquire
    event: threading.Event = field(default_factory=threading.Event)
    granted: bool = False
    limit: str = ""


class FairQueue:
    """One worker's seats and its users' lines (see the module docs).

    :param seats: requests served at once; ``None``: no bound (lines only form behind the
        shared caps).
    :param length: requests one user may have waiting.
    :param wait: seconds a request waits before it is refused.
    """

    def __init__(self, seats: int | None, *, length: int, wait: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seats = seats
        self.length = length
        self.wait = wait
        self.clock = clock
        self.busy = 0
        self._lock = threading.Lock()
        self._lines: dict[str, deque[_Waiter]] = {}
        self._turns: deque[str] = deque()
        self._looking = False

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(line) for line in self._lines.values())

    def take_seat(self) -> bool:
        """A seat at once, when nobody waits and one is free (the caller holds its shared
        claims already); else ``False`` and the caller goes through :meth:`enter`."""
        with self._lock:
            if self._turns or not self._seat_free():
                return False
            self.busy += 1
            return True

    def enter(self, user: str, acquire: Acquire) -> Waited:
        """A seat for one of ``user``'s requests, ``acquire`` taking its shared claims."""
        with self._lock:
            if not self._turns and self._seat_free():
                limit = acquire()
                if limit is None:
                    self.busy += 1
                    return Waited(True)
            else:
                limit = "worker_seats"
            line = self._lines.get(user)
            if line is not None and len(line) >= self.length:
                return Waited(False, limit=limit, full=True)
            waiter = _Waiter(acquire, limit=limit)
            if line is None:
                line = self._lines[user] = deque()
                self._turns.append(user)
            line.append(waiter)
            if not self._looking:
                self._looking = True
                threading.Thread(target=self._look_while_waiting, name="fair-queue", daemon=True).start()
        return self._wait(user, waiter)

    def _wait(self, user: str, waiter: _Waiter) -> Waited:
        started = self.clock()
        deadline = started + self.wait
        remaining = deadline - self.clock()
        if remaining > 0:
            waiter.event.wait(remaining)
        with self._lock:
            if not waiter.granted:
                line = self._lines.get(user)
                if line is not None and waiter in line:
                    line.remove(waiter)
                    if not line:
                        del self._lines[user]
                        self._turns.remove(user)
        return Waited(waiter.granted, self.clock() - started, waiter.limit)

    def leave(self) -> None:
        """A granted request is done: its seat goes to the next user in turn."""
        with self._lock:
            self.busy -= 1
        self._serve()

    def _look_while_waiting(self) -> None:
        """Look for claims freed by other workers every :data:`TICK` while requests wait: one
        thread (a greenlet under gevent) for the whole worker, however many wait — each
        request waking to look would cost more than the requests."""
        while True:
            time.sleep(TICK)
            with self._lock:
                if not self._turns:
                    self._looking = False
                    return
            self._serve()

    def _seat_free(self) -> bool:
        return self.seats is None or self.busy < self.seats

    def _serve(self) -> None:
        """Give free seats to the users in turn whose shared claims can be taken now."""
        with self._lock:
            refused = 0
            while self._turns and self._seat_free() and refused < len(self._turns):
                user = self._turns[0]
                line = self._lines[user]
                waiter = line[0]
                limit = waiter.acquire()
                self._turns.rotate(-1)
                if limit is not None:
                    waiter.limit = limit
                    refused += 1
                    continue
                refused = 0
                line.popleft()
                if not line:
                    del self._lines[user]
                    self._turns.remove(user)
                self.busy += 1
                waiter.granted = True
                waiter.event.set()


class InFlight:
    """How many requests each user has in flight in this worker, whatever their kind.

    What :attr:`~bcs_middleware.limits.settings.QueueSettings.turn_after` is compared with: a
    user past it has each further request wait for its turn of the worker's loop. Only users
    with a request in flight are kept.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, user: str) -> int:
        """One more for ``user``; how many it has now."""
        with self._lock:
            count = self._counts[user] = self._counts.get(user, 0) + 1
        return count

    def leave(self, user: str) -> None:
        with self._lock:
            count = self._counts[user] - 1
            if count:
                self._counts[user] = count
            else:
                del self._counts[user]

    def __len__(self) -> int:
        """Users with a request in flight."""
        return len(self._counts)
