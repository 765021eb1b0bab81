"""Sockets: writing to them (the gunicorn worker, the upstream pool) and whether gevent patched them.

It imports nothing of the package: ``examples/gunicorn.conf.py`` imports the worker before it
sets ``PROMETHEUS_MULTIPROC_DIR``, so the worker's imports must not load the metrics.
"""

from __future__ import annotations

import socket
import sys


def send_all(sock: socket.socket, data: bytes) -> None:
    """``sock.sendall(data)``, through ``send()``; the socket's timeout bounds each wait.

    Why not ``sendall``: gevent's asks the kernel for ``SO_SNDBUF`` (a syscall) and slices
    a memoryview in Python on every call; writing through ``send()`` took a tenth off the
    gateway's CPU per tunnel request (bench/README.md). A TLS ``send()`` writes the whole
    of a request head or a 64 KiB piece at once, and a plain one nearly always does.
    """
    if not data:
        return  # an empty TLS write is an error in some OpenSSL versions (gevent#719)
    sent = sock.send(data)
    if sent < len(data):
        view = memoryview(data)[sent:]
        while view:
            view = view[sock.send(view):]


def gevent_active() -> bool:
    """Has gevent monkey-patched ``socket`` in this process (the gunicorn gevent worker)?"""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("socket"))
