"""The durable spool: order, the bound, the cursor across processes, torn tails, slots."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from bcs_middleware.audit.export.spool import Spool, SpoolLimits, orphans

LIMITS = SpoolLimits(max_bytes=4096, segment_bytes=512, fsync=True)


def records(start: int, stop: int) -> list[bytes]:
    return [b'{"n":%d,"pad":"%s"}' % (n, b"x" * 40) for n in range(start, stop)]


def read_all(spool: Spool, batch: int = 7) -> list[bytes]:
    got: list[bytes] = []
    while chunk := spool.read(batch, 1 << 20):
        got += chunk
        spool.ack(len(chunk))
    return got


def test_records_come_back_in_order_across_segments_and_done_segments_are_deleted(tmp_path: Path) -> None:
    spool = Spool.claim(tmp_path, LIMITS)
    assert spool.append(records(0, 40)) == 40
    assert len(list(spool.directory.glob("*.seg"))) > 3
    assert read_all(spool) == records(0, 40)
    assert spool.pending == 0
    assert list(spool.directory.glob("*.seg")) == []  # everything delivered: nothing kept
    assert spool.append(records(40, 42)) == 2
    assert read_all(spool) == records(40, 42)


def test_beyond_the_bound_new_records_are_refused_never_old_ones(tmp_path: Path) -> None:
    spool = Spool.claim(tmp_path, LIMITS)
    kept = spool.append(records(0, 100))
    assert 0 < kept < 100
    assert spool.size <= LIMITS.max_bytes
    assert sum(p.stat().st_size for p in spool.directory.glob("*.seg")) <= LIMITS.max_bytes
    assert spool.append(records(100, 101)) == 0
    assert read_all(spool) == records(0, kept)
    assert spool.append(records(101, 102)) == 1  # room again once delivered


def test_an_unacknowledged_read_is_read_again_after_a_rewind(tmp_path: Path) -> None:
    spool = Spool.claim(tmp_path, LIMITS)
    spool.append(records(0, 10))
    first = spool.read(4, 1 << 20)
    spool.ack(1)
    spool.rewind()
    assert spool.read(100, 1 << 20) == records(1, 10)
    assert first == records(0, 4)


def _append_then_exit(root: str) -> None:
    spool = Spool.claim(Path(root), LIMITS)
    spool.append(records(0, 10))
    chunk = spool.read(3, 1 << 20)
    spool.ack(len(chunk))
    os._exit(0)  # as a killed worker: no close, no cleanup


def test_the_next_owner_resumes_at_the_cursor_after_a_process_dies(tmp_path: Path) -> None:
    child = multiprocessing.get_context("fork").Process(target=_append_then_exit, args=(str(tmp_path),))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    spool = Spool.claim(tmp_path, LIMITS)
    assert spool.directory == tmp_path / "0"  # the dead process's slot is free again
    assert spool.pending == 7
    assert read_all(spool) == records(3, 10)


def test_a_record_torn_by_a_crash_is_cut_off_and_counted(tmp_path: Path) -> None:
    spool = Spool.claim(tmp_path, LIMITS)
    spool.append(records(0, 3))
    spool.close()
    segment = sorted((tmp_path / "0").glob("*.seg"))[-1]
    with open(segment, "ab") as fh:
        fh.write(b"\x00\x00\x01\x00garbage")  # a header promising 256 bytes, and a few of them
    again = Spool.claim(tmp_path, LIMITS)
    assert again.damaged == 1
    assert read_all(again) == records(0, 3)
    again.append(records(3, 4))
    assert read_all(again) == records(3, 4)


def test_a_flipped_byte_ends_its_segment_there(tmp_path: Path) -> None:
    spool = Spool.claim(tmp_path, SpoolLimits(max_bytes=4096, segment_bytes=4096))
    spool.append(records(0, 3))
    spool.close()
    segment = next((tmp_path / "0").glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the second record
    segment.write_bytes(bytes(data))
    again = Spool.claim(tmp_path, LIMITS)
    assert again.damaged == 1
    assert read_all(again) == records(0, 1)


def test_a_held_slot_is_not_claimed_and_a_free_one_with_records_is_an_orphan(tmp_path: Path) -> None:
    first = Spool.claim(tmp_path, LIMITS)
    second = Spool.claim(tmp_path, LIMITS)
    assert (first.directory.name, second.directory.name) == ("0", "1")
    second.append(records(0, 5))
    assert list(orphans(tmp_path, LIMITS)) == []  # held
    second.close()
    found = list(orphans(tmp_path, LIMITS))
    assert [o.directory.name for o in found] == ["1"]
    assert read_all(found[0]) == records(0, 5)
    found[0].close()
    assert list(orphans(tmp_path, LIMITS)) == []  # drained: nothing left to adopt
    first.close()


@pytest.mark.parametrize("fsync", [True, False])
def test_the_cursor_survives_a_reopen(tmp_path: Path, fsync: bool) -> None:
    limits = SpoolLimits(max_bytes=1 << 20, segment_bytes=1 << 16, fsync=fsync)
    spool = Spool.claim(tmp_path, limits)
    spool.append(records(0, 20))
    chunk = spool.read(12, 1 << 20)
    spool.ack(len(chunk))
    spool.close()
    again = Spool.claim(tmp_path, limits)
    assert again.pending == 8
    assert read_all(again) == records(12, 20)
