"""The departure watcher's thread belongs to one process: a forked child makes its own."""

from __future__ import annotations

import os

from bcs_middleware.apps import departure


def test_a_forked_child_gets_its_own_watcher() -> None:
    parent = departure._threads()
    assert departure._threads() is parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        child = departure._threads()
        os.write(write, b"1" if child is not parent and departure._threads() is child else b"0")
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert departure._threads() is parent
