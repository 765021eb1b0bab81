"""The shared counter table: buckets, caps, release, and what a dead worker left counted."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from bcs_middleware.limits.table import BUCKET, INFLIGHT, LONG_RUNNING, OK, CounterTable, key_digest

ALICE = key_digest("u:alice")
BOB = key_digest("u:bob")
CLUSTER = key_digest("c:c1")


def test_bucket_gives_burst_then_refills_at_rate() -> None:
    table = CounterTable(None, slots=64, workers=4)
    bucket = (ALICE, 2.0, 3)
    assert [table.admit(10.0, bucket, INFLIGHT, ())[0] for _ in range(4)] == [OK, OK, OK, BUCKET]
    verdict, wait = table.admit(10.0, bucket, INFLIGHT, ())
    assert verdict == BUCKET and wait == pytest.approx(0.5)
    assert table.admit(10.5, bucket, INFLIGHT, ())[0] == OK  # one token came back in 1/rate seconds
    assert table.admit(10.5, bucket, INFLIGHT, ())[0] == BUCKET
    # Another user's bucket is its own.
    assert table.admit(10.5, (BOB, 2.0, 3), INFLIGHT, ())[0] == OK


def test_caps_are_all_or_nothing_and_released() -> None:
    table = CounterTable(None, slots=64, workers=4)
    claims = [(ALICE, 2), (CLUSTER, 3)]
    assert table.admit(0.0, None, INFLIGHT, claims) == (OK, 0.0)
    assert table.admit(0.0, None, INFLIGHT, claims) == (OK, 0.0)
    assert table.admit(0.0, None, INFLIGHT, claims) == (0, 0.0)  # alice is at 2
    assert table.admit(0.0, None, INFLIGHT, [(BOB, 2), (CLUSTER, 3)]) == (OK, 0.0)
    assert table.admit(0.0, None, INFLIGHT, [(BOB, 2), (CLUSTER, 3)]) == (1, 0.0)  # the cluster is at 3
    assert table.counts(BOB) == (1, 0)  # nothing of the refused request was counted
    table.release(INFLIGHT, [ALICE, CLUSTER])
    assert table.counts(ALICE) == (1, 0) and table.counts(CLUSTER) == (2, 0)
    # Long-running requests have counts of their own.
    assert table.admit(0.0, None, LONG_RUNNING, [(ALICE, 1)]) == (OK, 0.0)
    assert table.admit(0.0, None, LONG_RUNNING, [(ALICE, 1)]) == (0, 0.0)
    assert table.counts(ALICE) == (1, 1)


def test_a_full_window_admits_uncounted_and_says_so() -> None:
    table = CounterTable(None, slots=32, workers=2)
    for index in range(32):
        assert table.admit(0.0, None, INFLIGHT, [(key_digest(f"c:{index}"), None)])[0] == OK
    assert table.admit(0.0, None, INFLIGHT, [(key_digest("c:more"), 1)])[0] == OK
    assert table.overflows == 1
    # A slot whose counts are back to zero is taken by the next key.
    table.release(INFLIGHT, [key_digest("c:0")])
    assert table.admit(0.0, None, INFLIGHT, [(key_digest("c:again"), 1)])[0] == OK
    assert table.counts(key_digest("c:again")) == (1, 0)
    assert table.overflows == 1


def _count_and_die(path: str, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    table = CounterTable(Path(path), slots=64, workers=4)
    for _ in range(3):
        table.admit(0.0, None, INFLIGHT, [(ALICE, 10)])
    ready.set()
    os._exit(0)  # as a killed worker: nothing is released


def test_workers_share_counts_and_a_dead_workers_are_subtracted(tmp_path: Path) -> None:
    path = tmp_path / "limits.table"
    table = CounterTable(path, slots=64, workers=4)
    assert table.admit(0.0, None, INFLIGHT, [(ALICE, 10)])[0] == OK
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    child = context.Process(target=_count_and_die, args=(str(path), ready))
    child.start()
    child.join(30)
    assert ready.is_set()
    assert table.counts(ALICE) == (4, 0)  # the other process's three are seen here
    # A new worker takes the dead one's column and takes its counts off the totals.
    context.Process(target=_claim_column, args=(str(path),)).start()
    assert _wait_counts(table, ALICE, (1, 0))


def _claim_column(path: str) -> None:
    table = CounterTable(Path(path), slots=64, workers=4)
    table.admit(0.0, None, INFLIGHT, [(BOB, 10)])
    table.release(INFLIGHT, [BOB])
    os._exit(0)


def _wait_counts(table: CounterTable, key: bytes, expected: tuple[int, int]) -> bool:
    from tests.support.polling import wait_until

    return wait_until(lambda: table.counts(key) == expected, timeout=30)


def test_a_table_of_another_shape_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "limits.table"
    CounterTable(path, slots=64, workers=4)
    with pytest.raises(ValueError, match="another shape"):
        CounterTable(path, slots=128, workers=4)
