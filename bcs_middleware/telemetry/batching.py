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
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

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

    Fork-safe: a forked child starts empty, without the parent's thread, and starts
    its own on its first :meth:`put` (a fork hook, not a ``getpid()`` per item).
    """

    def __init__(self, apply: Callable[[list[Any]], None], *, period: float, name: str,
                 max_items: int = 65536) -> None:
        self.apply = apply
        self.period = period
        self.name = name
        self.max_items = max_items
        self._forget()
        _queues.add(self)

    def _forget(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._started = False
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Any) -> None:
        items = self._items
        if len(items) >= self.max_items:
            self.apply_now([item])
            return
        items.append(item)
        if not self._started:
            self._start()

    def apply_now(self, items: list[Any]) -> None:
        """``apply(items)`` on the calling thread, never alongside a drain."""
        with self._lock:
            self.apply(items)

    def drain(self) -> None:
        """Apply everything queued so far."""
        with self._lock:
            items = self._items
            batch: list[Any] = []
            while items:
                try:
                    batch.append(items.popleft())
                except IndexError:
                    break
            if batch:
                self.apply(batch)

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            threading.Thread(target=self._run, name=self.name, daemon=True).start()
            atexit.register(self.drain)
            self._started = True

    def _run(self) -> None:
        while True:
            time.sleep(self.period)
            try:
                self.drain()
            except Exception:  # one bad batch must not stop the ones after it
                log.exception("%s: applying queued items failed", self.name)


_queues: weakref.WeakSet[BatchQueue] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for queue in list(_queues):
        queue._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
