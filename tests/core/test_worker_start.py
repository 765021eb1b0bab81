"""The start-once-serving registry: what serving's worker hook runs for the floors below it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bcs_middleware.core import worker_start
from bcs_middleware.serving.hooks import post_worker_init


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    worker_start._AT_WORKER_START.clear()
    worker_start._WORKERS.clear()


def test_registered_work_runs_once_in_order_when_the_worker_starts() -> None:
    ran: list[str] = []
    worker_start.at_worker_start(lambda: ran.append("listener"))
    worker_start.at_worker_start(lambda: ran.append("thread"))
    assert ran == []  # building the application starts nothing
    worker_start.worker_started(3)
    assert ran == ["listener", "thread"]
    worker_start.worker_started(3)
    assert ran == ["listener", "thread"]
    assert worker_start.serving_workers() == 3


@pytest.mark.parametrize("workers", [pytest.param(None, id="unknown"), pytest.param(0, id="zero")])
def test_a_worker_count_that_is_not_one_leaves_it_unknown(workers: int | None) -> None:
    worker_start.worker_started(workers)
    assert worker_start.serving_workers() is None


def test_the_serving_hook_runs_the_registry() -> None:
    ran: list[int | None] = []
    worker_start.at_worker_start(lambda: ran.append(worker_start.serving_workers()))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        post_worker_init(SimpleNamespace(cfg=SimpleNamespace(workers=2), sockets=[]))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ran == [2]


def test_the_serving_hook_freezes_the_heap_the_worker_built() -> None:
    """What the worker built before serving (modules, classes, the application) is never garbage:
    moved out of the collector's sight, full collections do not walk it on the request path."""
    import gc

    built = object.__new__(type("Built", (), {}))  # tracked by the collector, kept alive
    previous = signal.getsignal(signal.SIGTERM)
    try:
        post_worker_init(SimpleNamespace(cfg=SimpleNamespace(workers=2), sockets=[]))
        assert gc.get_freeze_count() > 0
        assert not any(obj is built for obj in gc.get_objects())  # frozen: no generation holds it
    finally:
        gc.unfreeze()
        signal.signal(signal.SIGTERM, previous)
    assert any(obj is built for obj in gc.get_objects())
