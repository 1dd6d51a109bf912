"""The seam of a copy taken under its own snapshot: which streamed transactions the copy already holds."""
from __future__ import annotations

import pytest

from slotlake.lsn import Lsn
from slotlake.source.snapshot import plan_parts
from slotlake.source.visibility import CopySnapshot, seen_by_copy, xid32

pytestmark = pytest.mark.unit

AFTER = Lsn(0x5000)
SNAP = CopySnapshot.parse("100:110:102,105", AFTER)


@pytest.mark.parametrize("xid,commit_lsn,seen", [
    (99, 0x4000, True),     # finished before the snapshot
    (100, 0x4000, True),    # xmin itself, not running: visible
    (102, 0x4000, False),   # running when the snapshot was taken
    (105, 0x4000, False),
    (104, 0x4000, True),    # between xmin and xmax, not running: committed before
    (110, 0x4000, False),   # xmax: not yet started
    (200, 0x4000, False),
    (99, 0x5000, False),    # committed at/after lsn_after: never in the copy, whatever the xid says
], ids=["before-xmin", "xmin", "running-1", "running-2", "committed-between", "xmax", "future", "after-lsn"])
def test_seen_by_copy(xid, commit_lsn, seen):
    assert seen_by_copy(xid, commit_lsn, SNAP) is seen


def test_xid8_epoch_dropped_and_wraparound():
    # Epoch 3, the 32-bit counter wrapped between xmin and xmax: 0xFFFFFFF0 .. 0x10.
    epoch = 3 << 32
    snap = CopySnapshot(xmin=epoch + 0xFFFFFFF0, xmax=(4 << 32) + 0x10,
                        xip=((4 << 32) + 0x5,), lsn_after=AFTER)
    assert xid32(snap.xmin) == 0xFFFFFFF0 and xid32(snap.xmax) == 0x10
    assert seen_by_copy(0xFFFFFFEF, 0x10, snap)        # before xmin (just below the wrap)
    assert seen_by_copy(0xFFFFFFF5, 0x10, snap)        # after xmin, before the wrap, not running
    assert seen_by_copy(0x3, 0x10, snap)               # after the wrap, before xmax
    assert not seen_by_copy(0x5, 0x10, snap)           # running
    assert not seen_by_copy(0x10, 0x10, snap)          # xmax
    assert not seen_by_copy(0x20, 0x10, snap)


def test_snapshot_text_and_json_round_trip():
    assert SNAP.text == "100:110:102,105"
    assert CopySnapshot.from_json(SNAP.to_json()) == SNAP
    assert CopySnapshot.parse("7:7:", AFTER).xip == ()
    with pytest.raises(ValueError):
        CopySnapshot.parse("nonsense", AFTER)


@pytest.mark.parametrize("pages,part_pages,partitioned,expect", [
    (0, 10, False, [(None, None)]),
    (10, 10, False, [(None, None)]),
    (25, 10, False, [(None, 10), (10, 20), (20, None)]),
    (25, 10, True, [(None, None)]),
], ids=["empty", "one-part", "three-parts-last-open", "partitioned"])
def test_plan_parts(pages, part_pages, partitioned, expect):
    parts = plan_parts("public.t", pages, part_pages, partitioned)
    assert [(p.lower, p.upper) for p in parts] == expect
    assert [p.index for p in parts] == list(range(len(expect)))
