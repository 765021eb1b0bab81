"""Work that request threads hand off, applied in batches by one background thread per process.

The access log and the request metrics both need the same thing: under gunicorn's
threads, every lock a request thread may wait on and every wake-up it causes hands
the interpreter lock to another thread (bench/README.md). So request threads only
``put`` onto a deque (``append`` is atomic: no lock), and a daemon thread, started on
first use, passes whatever has queued up to ``apply`` every ``period`` seconds —
polling, because waking it per item would cost a hand-off per request.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.forksafe import PerProcess

log = logging.getLogger(__name__)


class BatchQueue:
    """Items put by any thread, handed to ``apply`` in batches.

    :param apply: called with a list of items, from the background thread, from
        :meth:`drain` and at exit; calls never overlap.
    :param period: seconds an item may wait.
    :param name: the background thread's name.
    :param max_items: when this many are waiting (``apply`` is stuck, or its thread
        starved), :meth:`put` applies its item on the calling thread instead: nothing
        is dropped and memory stays bounded.

    Fork-safe: the queue, its lock and its thread are a :class:`~bcs_middleware.core.forksafe.PerProcess`
    value, so a forked child starts empty, without the parent's thread, and starts its own on
    its first :meth:`put`.
    """

    def __init__(self, apply: Callable[[list[Any]], None], *, period: float, name: str,
                 max_items: int = 65536) -> None:
        self.apply = apply
        self.period = period
        self.name = name
        self.max_items = max_items
        self._state: PerProcess[_State] = PerProcess(_State)

    def __len__(self) -> int:
        return len(self._state.get().items)

    def put(self, item: Any) -> None:
        state = self._state.get()
        items = state.items
        if len(items) >= self.max_items:
            self.apply_now([item])
            return
        items.append(item)
        if not state.started:
            self._start(state)

    def apply_now(self, items: list[Any]) -> None:
        """``apply(items)`` on the calling thread, never alongside a drain."""
        with self._state.get().lock:
            self.apply(items)

    def drain(self) -> None:
        """Apply everything queued so far."""
        state = self._state.get()
        with state.lock:
            items = state.items
            batch: list[Any] = []
            while items:
                try:
                    batch.append(items.popleft())
                except IndexError:
                    break
            if batch:
                self.apply(batch)

    def _start(self, state: _State) -> None:
        with state.lock:
            if state.started:
                return
            threading.Thread(target=self._run, name=self.name, daemon=True).start()
            atexit.register(self.drain)
            state.started = True

    def _run(self) -> None:
        while True:
            time.sleep(self.period)
            try:
                self.drain()
            except Exception:  # one bad batch must not stop the ones after it
                log.exception("%s: applying queued items failed", self.name)


class _State:
    """One process's queue of a :class:`BatchQueue`: its items, its lock, whether its thread runs."""

    __slots__ = ("items", "lock", "started")

    def __init__(self) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self.lock = threading.Lock()
        self.started = False
