"""A PerProcess value is built once per process and never shared with a forked child."""

from __future__ import annotations

import os
import threading

from bcs_middleware.core.forksafe import PerProcess


def test_a_value_is_built_once_and_kept() -> None:
    built: list[object] = []
    value = PerProcess(lambda: built.append(object()) or built[-1])
    assert value.peek() is None
    first = value.get()
    assert value.get() is first and value.peek() is first and len(built) == 1


def test_threads_racing_on_first_use_get_one_value() -> None:
    barrier = threading.Barrier(8)
    built: list[object] = []

    def factory() -> object:
        built.append(object())
        return built[-1]

    value = PerProcess(factory)
    seen: list[object] = []

    def use() -> None:
        barrier.wait()
        seen.append(value.get())

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1 and len({id(v) for v in seen}) == 1


def test_a_forked_child_builds_its_own_and_reports_the_inherited_one() -> None:
    inherited: list[object] = []
    value = PerProcess(object, on_fork=inherited.append)
    parent_value = value.get()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only if it got a fresh value and saw the parent's
        try:
            fresh = value.get()
            ok = fresh is not parent_value and inherited == [parent_value] and value.get() is fresh
            os.write(write_end, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 1)
    os.waitpid(pid, 0)
    os.close(read_end)
    assert answer == b"1"
    assert value.get() is parent_value and inherited == []
