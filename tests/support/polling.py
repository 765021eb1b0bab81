"""Waiting for a condition in tests: bounded in time, never a sleep of a guessed length.

The one polling helper of the suites: :func:`wait_until` answers whether the condition came true
(for ``assert wait_until(...), detail``), :func:`wait_for` fails the test with a message and
returns the condition's answer, :func:`seconds_until` returns how long it took (for tests that
bound how soon something happens).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], object], timeout: float = 10.0, step: float = 0.02) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` seconds passed; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())


def wait_for(condition: Callable[[], T], timeout: float = 10.0, message: str = "the condition never held",
             step: float = 0.02) -> T:
    """Poll ``condition`` until its answer is true and return that answer; after ``timeout``
    seconds fail with ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        answer = condition()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} (waited {timeout:g}s)")
        time.sleep(step)


def seconds_until(condition: Callable[[], object], timeout: float = 10.0,
                  message: str = "the condition never held", step: float = 0.02) -> float:
    """:func:`wait_for`, returning the seconds until ``condition`` held."""
    started = time.monotonic()
    wait_for(condition, timeout, message, step)
    return time.monotonic() - started
