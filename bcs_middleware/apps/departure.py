"""Noticing that a client went away while its response streams and nothing is written to it.

A quiet watch writes nothing to its client for minutes; a client that left (Ctrl-C,
a crashed controller, a closed laptop lid that then resets) is noticed by a write only
when the next event comes. Until then the stream holds its upstream connection, and
under the ``gthread`` worker a thread. :func:`watch` looks at the client socket
alongside the upstream read and calls back as soon as the client's end is gone, so the
stream can close its upstream at once.

How "gone" is decided (:func:`client_gone`), without reading a byte that belongs to
the server: the client socket becoming readable only says *something* arrived. On TCP
the kernel's connection state says what: anything but ``ESTABLISHED`` means the peer
sent its FIN (``CLOSE_WAIT``) or a reset. Readable while ``ESTABLISHED`` is data — a
pipelined request, or TLS records such as a ``close_notify`` a moment before the FIN —
and is left alone; the socket is then checked every half second instead, because it
stays readable. A client that half-closes its sending side while still reading counts
as gone (RFC 9112 §9.6 lets a server treat it so; no Kubernetes client does it).
Other sockets (Unix) are peeked at: end of input means gone.

Two ways to wait, chosen once per process by whether gevent has patched ``socket``:

* under gevent, one small greenlet per stream blocked in ``wait_read`` on the
  client's descriptor (no cost while the client is quiet);
* under threads, one process-wide thread with an ``epoll`` selector over every
  streaming client socket (one thread however many streams).
"""

from __future__ import annotations

import _socket
import errno
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..core.forksafe import PerProcess
from ..core.sockets import gevent_active

log = logging.getLogger(__name__)

_TCP_ESTABLISHED = 1
# How often a socket that stays readable (data the server has not read) is re-checked.
RECHECK = 0.5


class Watch(Protocol):
    def cancel(self) -> None: ...


def client_gone(sock: Any) -> bool:
    """Has the peer of ``sock`` closed its end or reset the connection?"""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
        return bool(info[0] != _TCP_ESTABLISHED)
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EINVAL):
            return True  # the descriptor is broken: nothing more will reach that client
    except AttributeError:  # no TCP_INFO on this platform
        pass
    return _peek_says_gone(sock)


def _peek_says_gone(sock: Any) -> bool:
    # A plain socket object over the same descriptor, so TLS sockets (which refuse
    # recv flags) can be peeked at too; detached again so the descriptor stays theirs.
    try:
        raw = _socket.socket(fileno=sock.fileno())
    except OSError:
        return True
    try:
        return raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        raw.detach()


def watch(sock: Any, on_gone: Callable[[], None]) -> Watch:
    """Call ``on_gone()`` (once, from another greenlet or thread) when ``sock``'s client leaves.

    ``cancel()`` must be called before the socket is closed.
    """
    if gevent_active():
        return _GreenletWatch(sock, on_gone)
    return _threads().add(sock, on_gone)


class _GreenletWatch:
    __slots__ = ("_greenlet",)

    def __init__(self, sock: Any, on_gone: Callable[[], None]) -> None:
        import gevent

        self._greenlet = gevent.spawn(_wait_for_departure, sock, sock.fileno(), on_gone)

    def cancel(self) -> None:
        import gevent

        greenlet = self._greenlet
        if not greenlet.dead:
            # Blocking (a switch to the hub): the greenlet's watcher on the descriptor
            # must be gone before the server closes that descriptor. The hub itself (a
            # body finalized there) cannot block; the kill then lands on its next turn.
            in_hub = gevent.getcurrent() is gevent.get_hub()
            greenlet.kill(block=not in_hub, timeout=1.0)


def _wait_for_departure(sock: Any, fd: int, on_gone: Callable[[], None]) -> None:
    import gevent
    from gevent.socket import wait_read

    while True:
        wait_read(fd)
        if client_gone(sock):
            on_gone()
            return
        gevent.sleep(RECHECK)  # readable with data: it stays readable, so look again later


class _ThreadWatch:
    __slots__ = ("_owner", "fd", "on_gone", "sock")

    def __init__(self, owner: _Watcher, sock: Any, on_gone: Callable[[], None]) -> None:
        self._owner = owner
        self.sock = sock
        self.fd = sock.fileno()
        self.on_gone = on_gone

    def cancel(self) -> None:
        self._owner.remove(self)


class _Watcher:
    """One thread and one ``epoll`` set for every streaming client socket of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._watches: dict[int, _ThreadWatch] = {}
        self._readable: set[_ThreadWatch] = set()  # ESTABLISHED with unread data: polled
        self._thread: threading.Thread | None = None

    def add(self, sock: Any, on_gone: Callable[[], None]) -> _ThreadWatch:
        entry = _ThreadWatch(self, sock, on_gone)
        with self._lock:
            self._selector.register(entry.fd, selectors.EVENT_READ, entry)
            self._watches[entry.fd] = entry
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bcs-departures", daemon=True)
                self._thread.start()
        return entry

    def remove(self, entry: _ThreadWatch) -> None:
        with self._lock:
            if self._watches.get(entry.fd) is not entry:
                return
            del self._watches[entry.fd]
            if entry in self._readable:
                self._readable.discard(entry)
            else:
                self._selector.unregister(entry.fd)

    def _run(self) -> None:
        while True:
            try:
                self._once()
            except Exception:  # a bug here must not end departure detection for good
                log.exception("departure watcher failed; continuing")

    def _once(self) -> None:
        events = self._selector.select(RECHECK if self._readable else None)
        gone: list[_ThreadWatch] = []
        with self._lock:
            candidates: list[_ThreadWatch] = [key.data for key, _ in events]
            candidates += self._readable
            for entry in candidates:
                if self._watches.get(entry.fd) is not entry:
                    continue  # cancelled meanwhile
                if client_gone(entry.sock):
                    del self._watches[entry.fd]
                    if entry in self._readable:
                        self._readable.discard(entry)
                    else:
                        self._selector.unregister(entry.fd)
                    gone.append(entry)
                elif entry not in self._readable:
                    self._selector.unregister(entry.fd)
                    self._readable.add(entry)
        for entry in gone:
            entry.on_gone()


# One watcher thread per process: a forked child makes its own (the parent's thread does not
# exist there).
_watcher: PerProcess[_Watcher] = PerProcess(_Watcher)
_threads = _watcher.get
