"""Blocking calls (files, a database driver's C code) run on operating-system threads, bounded.

Under the gunicorn gevent worker every request of a worker is a greenlet on one thread: a
``write()`` or ``open()`` that hangs in the kernel (an NFS server gone, a full FUSE mount)
stops every one of them, because gevent can only switch greenlets at its own waits and a
system call is not one. :class:`Offload` runs such a call on a native thread of a pool of its
own (``gevent.threadpool.ThreadPool``; gevent's shared hub pool also resolves host names, which
a hung file system must not starve) and waits for it cooperatively, so the worker's other
greenlets go on. Without gevent (the gthread worker, a CLI) it is a
:class:`concurrent.futures.ThreadPoolExecutor` and the wait is an ordinary one.

Bounded in every way a hung call could grow: ``threads`` threads at most; at most ``pending``
calls submitted and not finished — one more is refused at once (:class:`OffloadBusy`); each
wait — for a free thread, then for the call — at most its ``timeout``
(:class:`OffloadTimeout`), after which a call that had not yet started never starts. A call
that did start cannot be taken back (no thread can be killed): it holds its thread until the
kernel returns, which is why the pool is bounded.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .forksafe import PerProcess
from .sockets import gevent_active

__all__ = ["Offload", "OffloadBusy", "OffloadTimeout"]

T = TypeVar("T")


class OffloadTimeout(TimeoutError):
    """The call did not finish within its timeout (it may still be running on its thread)."""


class OffloadBusy(RuntimeError):
    """Too many calls are outstanding (their threads are stuck): refused without waiting."""


class _Cancelled(Exception):
    """A call whose waiter gave up before a thread took it."""


class _Pool:
    """One process's threads and its count of outstanding calls."""

    def __init__(self, threads: int, name: str) -> None:
        self.outstanding = 0
        self.gevent = gevent_active()
        # Counted from the loop's thread under gevent (rawlink callbacks run in the hub), from
        # the pool's threads otherwise: a native lock either way (gevent leaves this one alone).
        self.lock = threading.Lock() if not self.gevent else _native_lock()
        if self.gevent:
            from gevent.threadpool import ThreadPool

            self.gevent_pool: Any = ThreadPool(threads)
        else:
            self.executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=name)

    def done(self, _result: object = None) -> None:
        with self.lock:
            self.outstanding -= 1


def _native_lock() -> Any:
    from gevent import monkey

    return monkey.get_original("threading", "Lock")()


class Offload:
    """Run blocking calls on a bounded pool of native threads (see the module docs).

    :param threads: the most calls running at once.
    :param pending: the most calls submitted and not finished (running or waiting for a thread).
    :param name: names the threads (without gevent).
    """

    def __init__(self, *, threads: int = 2, pending: int = 32, name: str = "bcs-offload") -> None:
        if threads < 1 or pending < threads:
            raise ValueError("an offload needs a thread and room for as many calls as threads")
        self._pending = pending
        self._pool: PerProcess[_Pool] = PerProcess(lambda: _Pool(threads, name))

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None) -> T:
        """``fn(*args)`` on a pool thread; its result or its exception.

        :raises OffloadBusy: ``pending`` calls are outstanding already.
        :raises OffloadTimeout: it took longer than ``timeout`` seconds (``None``: no bound).
        """
        pool = self._pool.get()
        with pool.lock:
            if pool.outstanding >= self._pending:
                raise OffloadBusy(f"{pool.outstanding} calls are waiting for their threads")
            pool.outstanding += 1
        cancelled = False

        def task() -> T:
            if cancelled:
                raise _Cancelled()
            return fn(*args)

        try:
            if pool.gevent:
                return self._call_gevent(pool, task, timeout)
            return self._call_thread(pool, task, timeout)
        except OffloadTimeout:
            cancelled = True
            raise

    @staticmethod
    def _call_gevent(pool: _Pool, task: Callable[[], T], timeout: float | None) -> T:
        import gevent

        # gevent's spawn() waits for a free thread: the deadline covers that wait too.
        deadline = gevent.Timeout(timeout)
        deadline.start()
        try:
            try:
                result = pool.gevent_pool.spawn(task)
            except BaseException:
                pool.done()
                raise
            result.rawlink(pool.done)
            return result.get()
        except gevent.Timeout as exc:
            if exc is not deadline:
                raise
            raise OffloadTimeout(f"the call took more than {timeout:g}s") from None
        finally:
            deadline.cancel()

    @staticmethod
    def _call_thread(pool: _Pool, task: Callable[[], T], timeout: float | None) -> T:
        try:
            future = pool.executor.submit(task)
        except BaseException:
            pool.done()
            raise
        future.add_done_callback(pool.done)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise OffloadTimeout(f"the call took more than {timeout:g}s") from None
