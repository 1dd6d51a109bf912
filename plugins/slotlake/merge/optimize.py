"""`slotlake optimize`: a source's gold tables compacted without Spark, as Spark SQL's `OPTIMIZE` compacts them.

Every small sync adds files to gold: an append or the rows a MERGE inserts and updates land in one new file, and with
deletion vectors each touched file also gets a vector. Readers (and the next batches' key reads) pay per file and
per vector (bench/README.md, "Vectors and small files piling up over 40 syncs": +6 ms a sync). This folds them back,
one commit per table that changes no data (`dataChange: false`): the rows, the table's watermark (its newest
slotlake commit's userMetadata) and its history (time travel, replays, recoveries) are as before.

    a table with deletion vectors   `dv_merge.compact`: the live rows of its files under 64 MB and of every file
                                    with a vector rewritten into files of at most 1 M rows (the vectors gone)
    any other table                 delta-rs's `optimize.compact()`: its files under the target size (the table's
                                    `delta.targetFileSize`, else 100 MB) bin-packed into bigger ones

A table with column mapping, or a feature the writer does not write, is left as it is with the reason (Spark SQL's
`OPTIMIZE` does it). The caller holds the source's run lock (no sync merges meanwhile); another writer's commit
in between fails the table's commit, which is then not written (run it again).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from slotlake import delta_log
from slotlake.merge import dv_merge
from slotlake.merge.plan import COLUMN_MAPPING
from slotlake.names import TableName


@dataclass(frozen=True)
class TableOptimize:
    """What `optimize_table` did to one gold table: its new version (None: nothing written, `skipped` says why)."""

    table: str  # schema.table, canonical form
    version: int | None
    files_removed: int = 0
    files_added: int = 0
    vectors_removed: int = 0
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        if self.version is None:
            return f"{self.table}: left as it is ({self.skipped})"
        vectors = f", {self.vectors_removed} deletion vector(s) dropped" if self.vectors_removed else ""
        return (f"{self.table}: {self.files_removed} file(s) compacted into {self.files_added}{vectors} "
                f"(gold version {self.version})")


def optimize_table(path: str, name: TableName) -> TableOptimize:
    """Compact the gold table `name` at `path` (module doc)."""
    from deltalake.exceptions import DeltaError

    table = delta_log.delta_rs_table(path)
    if (table.metadata().configuration or {}).get(COLUMN_MAPPING, "none") != "none":
        return TableOptimize(str(name), None, skipped="its columns are mapped: Spark SQL's OPTIMIZE compacts it")
    if delta_log.has_deletion_vectors(table):
        try:
            done = dv_merge.compact(path)
        except dv_merge.CannotMark as e:
            return TableOptimize(str(name), None, skipped=f"{e}: Spark SQL's OPTIMIZE compacts it")
        if done is None:
            return TableOptimize(str(name), None, skipped="no deletion vector and at most one small file")
        return TableOptimize(str(name), done.version, done.files_removed, done.files_added, done.vectors_removed)
    try:
        metrics = table.optimize.compact()
    except DeltaError as e:
        return TableOptimize(str(name), None, skipped=f"delta-rs does not compact it ({type(e).__name__}: "
                                                      f"{str(e).splitlines()[0] if str(e) else ''})")
    removed, added = int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))
    if not removed:
        return TableOptimize(str(name), None, skipped="no two small files to fold")
    return TableOptimize(str(name), table.version(), removed, added)
