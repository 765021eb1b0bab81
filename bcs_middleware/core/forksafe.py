"""The one way a process-owned resource survives ``fork``: made on first use, forgotten in a child.

gunicorn forks its workers from a master that may already have built the application (to
check its configuration). Connections, pools, threads and locks made in the master belong to
it: a child that used them would share sockets with its parent, or wait on a lock a thread
that no longer exists holds. So every such resource is a :class:`PerProcess` value: built by
its factory on first use in a process, and forgotten — not closed: the parent still owns it —
in a child right after the fork (``os.register_at_fork``), so the child builds its own on
first use. Nothing is checked on the way in (no ``getpid()`` per use).

Example::

    pools = PerProcess(lambda: ConnectionPool(...))
    pools.get().send(...)
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_values: weakref.WeakSet[PerProcess[object]] = weakref.WeakSet()


class PerProcess(Generic[T]):
    """A value built by ``factory`` on first use in each process (see the module docs).

    :param factory: builds the value; called at most once per process (under a lock).
    :param on_fork: called with the inherited value in a forked child before it is
        forgotten (drop inherited sockets without closing them, say); must not block.
    """

    def __init__(self, factory: Callable[[], T], *, on_fork: Callable[[T], None] | None = None) -> None:
        self._factory = factory
        self._on_fork = on_fork
        self._value: T | None = None
        self._lock = threading.Lock()
        _values.add(self)  # type: ignore[arg-type]

    def get(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                value = self._value
                if value is None:
                    value = self._value = self._factory()
        return value

    def peek(self) -> T | None:
        """The value if this process built one already, else ``None`` (builds nothing)."""
        return self._value

    def take(self) -> T | None:
        """Forget this process's value and return it (``None`` if none): the next
        :meth:`get` builds a new one."""
        with self._lock:
            value, self._value = self._value, None
        return value

    def _forget_in_child(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by a thread that is gone
        inherited, self._value = self._value, None
        if inherited is not None and self._on_fork is not None:
            self._on_fork(inherited)


def _after_fork_in_child() -> None:
    for value in list(_values):
        value._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
