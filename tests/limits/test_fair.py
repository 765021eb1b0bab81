"""Fair queuing in a worker: freed seats go to users in turn, lines are bounded, waits end."""

from __future__ import annotations

import threading

from bcs_middleware.limits.fair import FairQueue
from tests.support.polling import wait_until


def _free() -> str | None:
    return None


def test_a_freed_seat_goes_to_the_next_user_not_the_oldest_request() -> None:
    queue = FairQueue(1, length=100, wait=30)
    assert queue.enter("heavy", _free).granted
    order: list[str] = []
    lock = threading.Lock()

    def request(user: str) -> None:
        waited = queue.enter(user, _free)
        assert waited.granted and waited.limit == "worker_seats"
        with lock:
            order.append(user)
        queue.leave()

    threads = [threading.Thread(target=request, args=("heavy",)) for _ in range(5)]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: queue.waiting == 5)
    light = threading.Thread(target=request, args=("light",))
    light.start()
    assert wait_until(lambda: queue.waiting == 6)
    queue.leave()  # the first heavy request is done
    for thread in [*threads, light]:
        thread.join(30)
    # Five heavy requests waited before the light one; it was served second, not sixth.
    assert order.index("light") == 1, order


def test_a_full_line_is_refused_at_once() -> None:
    queue = FairQueue(1, length=1, wait=30)
    assert queue.enter("heavy", _free).granted
    waiter = threading.Thread(target=queue.enter, args=("heavy", _free))
    waiter.start()
    assert wait_until(lambda: queue.waiting == 1)
    refused = queue.enter("heavy", _free)
    assert not refused.granted and refused.full
    queue.leave()
    waiter.join(30)
    assert queue.busy == 1


def test_a_wait_ends_with_a_refusal_and_leaves_the_line() -> None:
    queue = FairQueue(None, length=10, wait=0.2)
    waited = queue.enter("alice", lambda: "user_inflight")
    assert not waited.granted and waited.limit == "user_inflight" and waited.seconds >= 0.2
    assert queue.waiting == 0 and queue.busy == 0


def test_claims_freed_elsewhere_are_seen_without_a_local_release() -> None:
    free = threading.Event()
    queue = FairQueue(None, length=10, wait=30)
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(queue.enter("alice", lambda: None if free.is_set() else "user_inflight").granted))
    waiter.start()
    assert wait_until(lambda: queue.waiting == 1)
    free.set()  # another worker released: nobody calls leave() here
    waiter.join(30)
    assert result == [True]
