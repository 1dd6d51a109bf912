"""The frame summary of a bronze file (`bronze.FrameSummary`), computed by the extract as the frames stream by.

The decode must know, before decoding a file, which transactions carry catalog frames (decoded first, in the
driver), which may be too big for a task to hold (their Commit's end LSN), and how many row changes each relation
has. Without a summary it finds out with a Spark aggregation over every raw frame (`decode.job._summarize`: ~1-1.6 s
per 1 M changes). The extract already holds each batch of frames as Arrow arrays: here the same facts come from a
few vectorised passes over them, and go into the file's footer.

pgoutput without streaming sends each transaction's frames together, from its Begin to its Commit; a batch may
end inside a transaction, so the open one is carried to the next batch. A stream that does not alternate Begin
and Commit leaves the file without a summary (the decode then aggregates it itself).
"""
from __future__ import annotations

import logging
import struct
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slotlake import bronze
from slotlake.bronze import FrameSummary

log = logging.getLogger(__name__)

_COMMIT = struct.Struct(">QQ")  # commit_lsn, end_lsn after the tag and flags


class FrameScan:
    """Accumulates a file's `FrameSummary` over its batches of frames, in file order."""

    def __init__(self) -> None:
        self.meta_xids: set[int | None] = set()
        self.big: list[tuple[int, int, int]] = []
        self.per_oid: Counter[int] = Counter()
        self.open_begin: int | None = None  # ord of the Begin of the transaction still open at the last batch's end
        self.open_extra = 0  # TRUNCATE rows beyond one per frame in that transaction so far
        self.ok = True

    def add(self, data: pa.Array, xid: pa.Array, first_ord: int) -> None:
        """The next batch of frames (`data` and `xid` columns), its first frame at `first_ord` of the file. The
        summary is optional: frames it cannot make sense of leave the file without one, never fail the extract."""
        if not self.ok or not len(data):
            return
        try:
            self._add(data, xid, first_ord)
        except Exception as e:  # noqa: BLE001 - a malformed frame is the decode's to report, with its position
            log.warning("bronze frame summary: frames from ord %d not summarized (%s: %s); nothing to do, the decode "
                        "aggregates this file's frames itself", first_ord, type(e).__name__, e)
            self.ok = False

    def _add(self, data: pa.Array, xid: pa.Array, first_ord: int) -> None:
        tag = pc.binary_slice(data, 0, 1)
        meta = pc.is_in(tag, value_set=pa.array([b"R", b"Y", b"M"], pa.binary()))
        if pc.any(meta).as_py():
            self.meta_xids.update(pc.unique(pc.filter(xid, meta)).to_pylist())
        rows = pc.is_in(tag, value_set=pa.array([b"I", b"U", b"D"], pa.binary()))
        if pc.any(rows).as_py():
            counts = pc.value_counts(pc.filter(pc.binary_slice(data, 1, 5), rows))  # OIDs only: no copy of frames
            for oid, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
                self.per_oid[int.from_bytes(oid, "big")] += n
        begins = pc.indices_nonzero(pc.equal(tag, pa.scalar(b"B", pa.binary()))).to_numpy().astype(np.int64)
        commits = pc.indices_nonzero(pc.equal(tag, pa.scalar(b"C", pa.binary()))).to_numpy().astype(np.int64)
        truncs = pc.indices_nonzero(pc.equal(tag, pa.scalar(b"T", pa.binary()))).to_numpy().astype(np.int64)
        b = begins + first_ord
        c = commits + first_ord
        if self.open_begin is not None:
            b = np.concatenate([[self.open_begin], b])
        # Begin, Commit, Begin, Commit, ...: each Commit after its Begin and before the next Begin
        if not (len(c) <= len(b) <= len(c) + 1 and np.all(b[:len(c)] < c) and np.all(c[:len(b) - 1] < b[1:len(c) + 1])):
            self.ok = False
            return
        extra = np.zeros(len(b), dtype=np.int64)
        extra[:1] += self.open_extra
        if len(truncs):
            t = truncs + first_ord
            nrel = [struct.unpack_from(">i", data[int(i)].as_py(), 1)[0] for i in truncs]
            owner = np.searchsorted(b, t, side="right") - 1  # the transaction whose Begin precedes the frame
            if np.any(owner < 0):  # a TRUNCATE outside any transaction: not pgoutput as known
                self.ok = False
                return
            np.add.at(extra, owner, np.array(nrel, dtype=np.int64) - 1)
        spans = c - b[:len(c)] + 1 + extra[:len(c)]
        for k in np.nonzero(spans > bronze.BIG_TXN_MIN_ROWS)[0]:
            commit_lsn, end_lsn = _COMMIT.unpack_from(data[int(commits[k])].as_py(), 2)
            self.big.append((commit_lsn, end_lsn, int(spans[k])))
        if len(b) > len(c):
            self.open_begin, self.open_extra = int(b[-1]), int(extra[-1])
        else:
            self.open_begin, self.open_extra = None, 0

    def result(self) -> FrameSummary | None:
        """The file's summary; None when its frames did not alternate Begin and Commit as expected."""
        if not self.ok:
            return None
        return FrameSummary(meta_xids=tuple(sorted(self.meta_xids, key=lambda x: (x is None, x or 0))),
                            big=tuple(self.big), per_oid=dict(self.per_oid))
