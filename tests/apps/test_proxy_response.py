"""Ending open streams on SIGTERM never waits for the stream registry's lock."""

from __future__ import annotations

import threading

from bcs_middleware.apps import proxy_response


def test_end_streams_runs_while_the_registry_lock_is_held() -> None:
    """A second SIGTERM interrupts the first handler (or a request registering a stream) while
    it holds the lock: waiting for it there would hang the worker (under gevent: raise in the hub)."""
    done = threading.Event()

    def call() -> None:
        proxy_response.end_streams()
        done.set()

    with proxy_response._open_lock:
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        assert done.wait(5), "end_streams waited for the lock"
