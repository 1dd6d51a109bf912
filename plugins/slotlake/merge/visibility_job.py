"""The copy seam as a Spark predicate: the rule of `slotlake.source.visibility.seen_by_copy`, on columns."""
from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from slotlake.source.visibility import XID_HALF, XID_MOD, CopySnapshot, xid32


def not_seen_by_copy(snap: CopySnapshot, xid: str = "xid", commit_lsn: str = "commit_lsn") -> Column:
    """Spark predicate: the change's transaction is NOT in the copy (apply it). Same rule as `seen_by_copy`."""
    x = F.col(xid)

    def precedes(b: int) -> Column:
        return F.pmod(x - F.lit(b), F.lit(XID_MOD)) >= F.lit(XID_HALF)

    running = F.lit(False) if not snap.xip else x.isin([xid32(v) for v in snap.xip])
    seen = precedes(xid32(snap.xmin)) | (precedes(xid32(snap.xmax)) & ~running)
    return (F.col(commit_lsn) >= F.lit(int(snap.lsn_after))) | ~seen
