"""source/frame_summary.py: the extract's summary of a bronze file's frames (catalog transactions, big
transactions with their Commit's LSNs, row changes per relation), from frames captured from the real server,
against a frame-by-frame reference, however the frames are split into batches."""
from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from pgframes import Capture, Frame
from slotlake import bronze
from slotlake.bronze import FrameSummary
from slotlake.decode.messages import Commit
from slotlake.decode.pgoutput import decode_message
from slotlake.source.frame_summary import FrameScan

pytestmark = pytest.mark.unit

BIG = 100


def _frames(pg_db: str) -> list[Frame]:
    cap = Capture(pg_db)
    try:
        cap.execute("CREATE TABLE fa (id int PRIMARY KEY, v text)")
        cap.execute("CREATE TABLE fb (id int PRIMARY KEY)")
        cap.transaction("INSERT INTO fa VALUES (1, 'x')")
        cap.transaction("INSERT INTO fb SELECT g FROM generate_series(1, 250) g")  # big: 252 frames
        cap.transaction("UPDATE fa SET v = 'y'", "SELECT pg_logical_emit_message(true, 'p', 'in a txn')")
        cap.execute("SELECT pg_logical_emit_message(false, 'p', 'outside')")  # non-transactional
        cap.transaction("TRUNCATE fa, fb")  # one frame, two relations: one more row
        cap.transaction("INSERT INTO fb SELECT g FROM generate_series(1, 90) g")  # ~92 frames: not big
        cap.transaction("INSERT INTO fa SELECT g, 'z' FROM generate_series(1, 98) g", "TRUNCATE fb",
                        "INSERT INTO fb VALUES (1)")  # 98 + 1 + 1 frames, Begin, Commit (+ Relations): big
        cap.transaction("DELETE FROM fa WHERE id <= 3")
        return cap.peek()
    finally:
        cap.close()


def _reference(frames: list[Frame]) -> FrameSummary:
    """Frame by frame: what the decode's Spark aggregation (`decode.job._summarize`) computes per file."""
    meta, big, per_oid = set(), [], {}
    begin = extra = None
    for i, f in enumerate(frames):
        tag = f.data[:1]
        if tag in (b"R", b"Y", b"M"):
            meta.add(f.xid)
        elif tag in (b"I", b"U", b"D"):
            oid = struct.unpack_from(">I", f.data, 1)[0]
            per_oid[oid] = per_oid.get(oid, 0) + 1
        elif tag == b"B":
            begin, extra = i, 0
        elif tag == b"T":
            extra += struct.unpack_from(">i", f.data, 1)[0] - 1
        elif tag == b"C":
            m = decode_message(f.data)
            assert isinstance(m, Commit)
            if i - begin + 1 + extra > BIG:
                big.append((m.commit_lsn.value, m.end_lsn.value, i - begin + 1 + extra))
    return FrameSummary(meta_xids=tuple(sorted(meta)), big=tuple(big), per_oid=per_oid)


def _scan(frames: list[Frame], size: int) -> FrameSummary | None:
    scan = FrameScan()
    for at in range(0, len(frames), size):
        part = frames[at:at + size]
        scan.add(pa.array([f.data for f in part], pa.binary()), pa.array([f.xid for f in part], pa.int64()), at)
    return scan.result()


def test_the_summary_matches_the_frames_however_they_are_batched(pg_db, monkeypatch):
    monkeypatch.setattr(bronze, "BIG_TXN_MIN_ROWS", BIG)
    frames = _frames(pg_db)
    want = _reference(frames)
    assert len(want.big) == 2 and want.big[0][2] >= 250 + 2 and want.big[1][2] >= 98 + 1 + 1 + 2
    assert len(want.meta_xids) >= 3 and len(want.per_oid) == 2
    for size in (1, 3, 7, 64, len(frames)):
        got = _scan(frames, size)
        assert got == want, size
    # the footer's JSON round trip; a summary written under another threshold is not used
    assert FrameSummary.parse(want.json()) == want
    text = want.json()
    monkeypatch.setattr(bronze, "BIG_TXN_MIN_ROWS", BIG + 1)
    assert FrameSummary.parse(text) is None and FrameSummary.parse(None) is None


def test_frames_out_of_transaction_order_give_no_summary(pg_db):
    frames = _frames(pg_db)
    begins = [i for i, f in enumerate(frames) if f.data[:1] == b"B"]
    swapped = frames[:begins[1]] + frames[begins[1] + 1:]  # a transaction without its Begin
    assert _scan(swapped, 5) is None
    assert _scan(frames, 5) is not None


def test_a_frame_it_cannot_read_leaves_no_summary_and_raises_nothing(pg_db):
    frames = _frames(pg_db)
    truncate = next(i for i, f in enumerate(frames) if f.data[:1] == b"T")
    cut = frames[:truncate] + [Frame(frames[truncate].lsn, frames[truncate].xid, b"T")] + frames[truncate + 1:]
    assert _scan(cut, 4) is None  # a TRUNCATE frame too short to hold its relation count
