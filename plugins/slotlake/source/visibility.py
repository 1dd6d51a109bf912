"""Which streamed transactions a table copy already contains: the seam of a copy taken without a slot.

A table added to a running source (or a copy resumed after its slot's exported snapshot was gone) is copied under
a snapshot of its own, `pg_current_snapshot()` = xmin:xmax:xip (xid8 values). The stream for that table is then
applied only for the transactions that snapshot did NOT see:

* xid < xmin: finished before the snapshot, so visible (already in the copy): skip;
* xid >= xmax: not started yet when the snapshot was taken: apply;
* xid in xip: running when it was taken: apply;
* otherwise visible: skip.

pgoutput carries 32-bit xids, the snapshot 64-bit ones (epoch << 32 | xid). The comparison is done the way
PostgreSQL compares 32-bit xids (modulo 2^32, "a precedes b" when (a - b) mod 2^32 >= 2^31), which is exact for
xids within 2^31 of the snapshot. It is made exact for the rest by `lsn_after`: the WAL insert position read right
after the snapshot was taken. A transaction the snapshot saw wrote its commit record before that, so any change
with `commit_lsn >= lsn_after` is applied without looking at its xid; only transactions committed before the copy
(a short window of xids near the snapshot) go through the xid test.

The same rule as a Spark predicate, for the merge: `slotlake.merge.visibility_job.not_seen_by_copy`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from slotlake.lsn import Lsn

XID_MOD = 1 << 32
XID_HALF = 1 << 31


@dataclass(frozen=True)
class CopySnapshot:
    """The snapshot a table copy was read under (xid8 values) and the WAL insert position read right after it."""

    xmin: int
    xmax: int
    xip: tuple[int, ...]
    lsn_after: Lsn

    @classmethod
    def parse(cls, text: str, lsn_after: Lsn) -> CopySnapshot:
        """From `pg_current_snapshot()::text` ("xmin:xmax:xip1,xip2,...")."""
        try:
            xmin, xmax, xip = text.strip().split(":")
            return cls(int(xmin), int(xmax), tuple(sorted(int(x) for x in xip.split(",") if x)), lsn_after)
        except ValueError:
            raise ValueError(f"not a pg_snapshot: {text!r}") from None

    @property
    def text(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in self.xip)}"

    def to_json(self) -> str:
        return json.dumps({"snapshot": self.text, "lsn_after": str(self.lsn_after)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CopySnapshot:
        doc = json.loads(text)
        return cls.parse(doc["snapshot"], Lsn.parse(doc["lsn_after"]))


def xid32(xid8: int) -> int:
    """The 32-bit xid pgoutput sends for a transaction whose xid8 is `xid8` (the epoch dropped)."""
    return xid8 & 0xFFFFFFFF


def _precedes(a: int, b: int) -> bool:
    """PostgreSQL's TransactionIdPrecedes for normal 32-bit xids: a < b modulo 2^32."""
    return (a - b) % XID_MOD >= XID_HALF


def seen_by_copy(xid: int, commit_lsn: Lsn | int, snap: CopySnapshot) -> bool:
    """True when the transaction (32-bit `xid`, commit LSN) is already in the copy, so its changes are skipped."""
    if int(commit_lsn) >= int(snap.lsn_after):
        return False
    if _precedes(xid, xid32(snap.xmin)):
        return True
    if not _precedes(xid, xid32(snap.xmax)):
        return False
    return xid not in {xid32(x) for x in snap.xip}

