"""Initial copies loaded into gold without Spark, in `slotlake sync`'s own process (a source's first sync, a table
added later): what `snapshot_job.load_table` writes, for the copies this process types exactly.

A first sync used to start a JVM for this alone (with the bootstrap catalog's commit, `decode.job`): ~20 s for a few
small tables, most of a new user's first run. Here each pending copy (`source.copies.pending_loads`) is read with
pyarrow, typed by `arrow_values` as the in-process merge types silver (`in_process._typed`), given the `_slotlake_`
columns the Spark load gives it (the watermark as `_slotlake_lsn`, no commit time, `_slotlake_deleted` false for soft
deletes, copies of one row numbered 1..n by `_slotlake_dup` for FULL identity) and written by delta-rs as a new gold
table in one commit: the `slotlake.snapshot` property naming the copy, userMetadata `{"slotlake": {"end_lsn":
<watermark>, "stage": "snapshot"}}`, the gold schema `plan.gold_schema` says (every column nullable, as Spark's
CREATE TABLE AS SELECT leaves them).

Tables with a key (or none) are read, typed and written a batch of `BATCH_ROWS` at a time, whatever the copy's size
(Parquet files of at most 1,000,000 rows, `dv_merge.create`); a FULL-identity copy is held whole, its identical rows
numbered across it, so it is loaded here only up to `MAX_COPY_ROWS` rows and `in_process_bytes` x
`COPY_BYTES_FACTOR` of Parquet.

Declined for a copy Spark loads instead (`load_snapshots` then loads it and the ones after it): gold exists already
(a resync's copy replaces a table: a new version of it), a big FULL-identity copy (above), a column type or value
`arrow_values` does not type exactly (Spark types it and quarantines what gold cannot hold; a value found in a later
batch: the files written before it are removed, no log entry was), column names that need Delta's column mapping,
deletion vectors (the table is created with them), a lake delta-rs does not write here.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from slotlake import delta_log, storage
from slotlake.config import Config, SourceConfig
from slotlake.contracts import COMMIT_TS_COL, DELETED_COL, DUP_COL, LSN_COL, STAGE_SNAPSHOT, arrow_type
from slotlake.lake import LakePaths
from slotlake.merge import dv_merge
from slotlake.merge.arrow_values import supported
from slotlake.merge.in_process import MAX_CHANGES, Declined, _copies_numbered, _typed
from slotlake.merge.plan import KeyStrategy, TablePlan, copy_plan, needs_column_mapping, stage_metadata
from slotlake.names import TableName
from slotlake.source.copies import (
    SNAPSHOT_PROPERTY,
    TableCopy,
    load_candidates,
    part_paths,
    pending_loads,
    snapshot_doc,
)

log = logging.getLogger(__name__)

MAX_COPY_ROWS = MAX_CHANGES
"""Rows of a FULL-identity copy loaded here at most (held in memory: its identical rows are numbered across the
copy); a bigger one is Spark's. Other copies are read, typed and written a batch at a time, whatever their size."""
COPY_BYTES_FACTOR = 4
"""A FULL-identity copy of more Parquet bytes than `spark.in_process_bytes` times this is loaded by Spark."""
BATCH_ROWS = 65_536  # copied rows typed and written at a time (tables with a key, or none)


@dataclass(frozen=True)
class CopyLoad:
    table: str
    copy_id: str
    rows: int
    gold_version: int | None  # None: gold was loaded from this copy already (nothing written)


def load_copies_in_process(cfg: Config, source: str) -> list[CopyLoad] | None:
    """Every complete copy of the current slot generation not in gold yet, loaded here, in order; None at the first
    copy this process does not load (logged why; the ones before it are loaded, and Spark's `load_snapshots` skips
    them)."""
    src = cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    loads = []
    for copy in pending_loads(paths.root, load_candidates(paths.root, src)):
        try:
            loads.append(_load(src, paths, copy, cfg.spark.in_process_bytes * COPY_BYTES_FACTOR))
        except Declined as why:
            log.info("snapshot load %s in this process declined (%s): Spark loads it", copy.table, why)
            return None
    return loads


def _load(src: SourceConfig, paths: LakePaths, copy: TableCopy, max_bytes: int) -> CopyLoad:
    import pyarrow as pa

    name = TableName.parse(copy.table)
    gold = paths.gold(name.schema, name.name)
    if not delta_log.readable(gold):
        raise Declined("a lake delta-rs does not write here")
    if delta_log.has_commits(gold):
        if copy.loaded_in(snapshot_doc(delta_log.table_properties(gold))):
            return CopyLoad(copy.table, copy.copy_id, copy.rows, None)
        raise Declined("gold exists: the copy replaces it in a new version")
    plan = copy_plan(src, copy)
    shape = plan.shape
    numbered = plan.strategy is KeyStrategy.FULL_ROW
    if numbered and (copy.rows > MAX_COPY_ROWS or sum(int(p.get("bytes", 0)) for p in copy.parts) > max_bytes):
        raise Declined(f"a FULL-identity copy of more than {MAX_COPY_ROWS:,} rows or {max_bytes:,} bytes of Parquet "
                       "(its identical rows are numbered in memory)")
    if needs_column_mapping(shape.columns):
        raise Declined("column names that need Delta's column mapping")
    if src.uses_deletion_vectors(copy.table):
        raise Declined("gold gets deletion vectors")
    for i, c in enumerate(shape.columns):
        if not supported(shape.type_oids[i], shape.typmods[i], plan.numeric_mode(i)):
            raise Declined(f"{c}: a type Spark types")
    schema = pa.schema([pa.field(f.name, arrow_type(f.type), True) for f in plan.gold_schema])
    rows = [0]

    def batches():
        for texts in _copy_texts(paths, copy, whole=numbered):
            batch = _gold_batch(plan, copy, texts, schema)
            rows[0] += batch.num_rows
            yield batch

    try:
        # (delta-rs's own writers refuse a table property they do not know, such as `slotlake.snapshot`)
        version = dv_merge.create(gold, schema, batches(), configuration={SNAPSHOT_PROPERTY: copy.property_doc()},
                                  user_metadata=stage_metadata(copy.watermark, STAGE_SNAPSHOT),
                                  what_to_do="run the sync again")
    except Declined:
        if not delta_log.has_commits(gold):  # the files written before the value it declined: not a table yet
            storage.files_for(gold).remove_tree(gold)
        raise
    log.info("snapshot load %s in this process: %d rows from copy %s (%s) -> gold version %d, watermark %s",
             copy.table, rows[0], copy.copy_id, copy.kind, version, copy.watermark)
    return CopyLoad(copy.table, copy.copy_id, rows[0], version)


def _copy_texts(paths: LakePaths, copy: TableCopy, *, whole: bool):
    """The copy's rows as each column's texts (PostgreSQL's, NULL for SQL NULL): batches of `BATCH_ROWS` read
    part by part, or `whole`, the copy at once (one batch: a FULL-identity table's identical rows are numbered
    across the copy)."""
    import pyarrow.dataset as ds

    n = len(copy.columns)
    columns = [f"c{i}" for i in range(n)]
    filesystem = None
    files = []
    for path in part_paths(paths.root, copy):
        filesystem, on_fs = storage.arrow_files(path)
        files.append(on_fs)
    data = ds.dataset(files, format="parquet", filesystem=filesystem)
    if whole:
        table = data.to_table(columns=columns)
        yield [table.column(i).combine_chunks() for i in range(n)]
        return
    for batch in data.to_batches(columns=columns, batch_size=BATCH_ROWS):
        yield [batch.column(i) for i in range(n)]


def _gold_batch(plan: TablePlan, copy: TableCopy, texts: list, schema):
    """Copied rows (each column's texts) as a batch of gold's `schema`: the values typed (Declined for one this
    process does not type exactly), `_slotlake_lsn` the copy's watermark, no commit time, not deleted, and for
    FULL identity the copy number of each row among the identical ones (`texts` is then the whole copy)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    dups = None
    if plan.strategy is KeyStrategy.FULL_ROW:
        take, dups = _copies_numbered(texts)
        texts = [pc.take(t, take) for t in texts]
    count = len(texts[0]) if texts else 0
    columns = {c: _typed(plan, texts[i], i) for i, c in enumerate(plan.shape.columns)}
    columns[LSN_COL] = pa.array(np.full(count, int(copy.watermark), dtype=np.int64))
    columns[COMMIT_TS_COL] = pa.nulls(count, arrow_type("timestamp"))
    if plan.soft_delete:
        columns[DELETED_COL] = pa.array(np.zeros(count, dtype=bool))
    if dups is not None:
        columns[DUP_COL] = dups
    return pa.RecordBatch.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)
