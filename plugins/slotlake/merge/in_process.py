"""The merge of a small batch without Spark: delta-rs's MERGE in `slotlake sync`'s own process.

A spark-submit sync of ~1,000 changes spent most of its time starting a JVM and running Delta's MERGE in it cold
(bench/README.md, "A small sync without a JVM"). This module merges the batches whose outcome it can tell exactly
as `merge/job.py` would write it, and declines every other before writing anything: then `merge_in_process`
returns None and the caller runs the Spark merge, which picks up from each table's watermark (a table merged here
is up to date for it).

Merged here, per table with changes: a gold table that exists and that delta-rs writes (a local or s3a lake: on S3
the silver and gold files are read with pyarrow's S3 file system, `storage.arrow_files`, and every commit is a
conditional PUT of its log entry, `storage.delta_rs_options`; no column mapping, no copy snapshot to filter by;
deletion vectors only as the config asks, and then no TRUNCATE and no FULL-identity MERGE: merge/dv_merge.py
writes the commit, gold's changed rows marked deleted, not rewritten, or one appended file), whose columns are
what the batch's one column layout plans (no schema change, no DDL event since its watermark), with hard
deletes, no history table, column types `arrow_values` reads exactly, and one of:

    KEYED        not both a key change and an unchanged TOAST value: each key's last event is its
                 final state, one MERGE (delete / update / insert). A key change is a delete at its old key and
                 the row at its new key; an unchanged TOAST value is the key's last value written in the batch,
                 else the MERGE keeps gold's (whose key column tells it holds the row), as
                 `lineage._keyed_final` fills them
    NOTHING      inserts appended (updates and deletes counted as unapplied, as the Spark merge does)
    FULL         only plain inserts, none of which equals a gold row: appended, copies of one row numbered 1..n
                 by `_slotlake_dup` (`job._append_rows`); else per distinct row the copies the batch adds or
                 removes after gold's count of it (`lineage.full_row_source`), one MERGE on every column
                 (NULLs equal) and the copy number. Gold's rows are read only from the files whose statistics
                 may hold one of the batch's rows (at most `MAX_GOLD_ROWS_CHECKED`)

A batch with a TRUNCATE is one overwrite: what the changes after the last TRUNCATE leave in an empty table.

Each table's commit carries the same idempotent-write transaction (app id, the run's end LSN) and userMetadata as
Spark's MERGE, so a re-run, or Spark after a crash here, skips it; the run's `_runs` rows are one delta-rs append
marked as a complete run, as `record_runs` writes them.
"""
from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from typing import Any
from urllib.parse import unquote

from slotlake import contracts, delta_log, failpoints, storage
from slotlake.config import Config, SourceConfig
from slotlake.contracts import COMMIT_TS_COL, DUP_COL, LSN_COL, STAGE_DDL_LOG, STAGE_DECODE
from slotlake.decode.job import SLICE_MAX_ROWS
from slotlake.decode.layouts import LayoutGroup
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge import dv_merge
from slotlake.merge.arrow_values import ARROW_TYPES, delta_type, typed_array
from slotlake.merge.plan import (
    COLUMN_MAPPING,
    DELETION_VECTORS,
    KeyStrategy,
    TablePlan,
    TableShape,
    merge_app_id,
    plan_table,
    rewrite_note,
    stage_metadata,
)
from slotlake.merge.silver_stats import SilverFileStats, files_to_read, has_changes, tables_in_window
from slotlake.names import TableName

log = logging.getLogger(__name__)

MAX_CHANGES = SLICE_MAX_ROWS
"""Silver rows a run merges here at most, over all its tables: a slice's (`decode.job.in_process_slice`: at most
`SLICE_MAX_ROWS` bronze rows, each at most one change); a table far behind silver, after failed runs, may have more:
then Spark merges. The batch is held in this process's memory (~650 MB peak RSS for a 1,000,000-change slice of
tpcb-like pgbench)."""
_PLAIN_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")  # names delta-rs's SQL predicates read unquoted, as they are
_MS_US = 1_000  # Delta's time stamp statistics are cut to milliseconds


class Declined(Exception):
    """This batch (or replay, recovery, undo) is not one done without Spark exactly; the Spark app does it."""


def open_dataset(path: str, version: int | None = None):
    """The Delta table at `path` (as of `version`, else its latest) as a pyarrow dataset read with delta-rs; a
    table with deletion vectors as `dv_merge.LiveRows` (its files read with pyarrow, the rows their vectors delete
    left out: the same methods). Declined for a table delta-rs does not read as Spark wrote it (column mapping) or
    whose vectors this process does not read. delta-rs's own errors propagate."""
    import pyarrow.dataset as ds

    table = delta_log.delta_rs_table(path, version)
    props = table.metadata().configuration or {}
    if props.get(COLUMN_MAPPING, "none") != "none":
        raise Declined(f"{path} maps columns")
    if props.get(DELETION_VECTORS) == "true" or delta_log.has_deletion_vectors(table):
        import pyarrow as pa

        try:  # (delta-rs has read this version's log: its schema, not a second read)
            return dv_merge.LiveRows(path, table.version(), pa.schema(table.schema().to_arrow()))
        except dv_merge.CannotMark as e:
            raise Declined(f"{path}: its deletion vectors are not read here ({e})") from None
    return table.to_pyarrow_dataset(parquet_read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"))


@dataclass
class _Table:
    name: TableName
    gold: str
    version: int | None
    n: int = 0  # silver rows in the window
    plan: TablePlan | None = None
    source: Any = None  # pyarrow Table: the MERGE's source (KEYED) or the rows to append
    append: bool = False
    unapplied: int = 0
    last_commit_ts: datetime | None = None
    up_to_date: bool = False
    truncate: bool = False  # the batch holds a TRUNCATE: `source` is gold's whole new content (an overwrite)
    marked: bool = False  # gold has deletion vectors: a keyed batch's commit marks rows (`marks`, merge/dv_merge.py)
    marks: Any = None  # dv_merge.Marks


def merge_in_process(cfg: Config, source: str):
    """Merge every table of `source` up to silver's watermark without Spark, when each table's batch is one this
    module writes exactly (module doc); else None, nothing written, and the reason logged. Returns the run's
    `report.MergeReport` (the same one the Spark merge returns). The caller has checked that every complete initial
    copy is in gold (`load_snapshots` is Spark's)."""
    from slotlake.merge.report import MergeReport
    from slotlake.merge.runs import append_runs_directly, last_complete_run
    from slotlake.merge.watermarks import runs_tables_at, silver_file_stats

    src = cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    try:
        if not delta_log.readable(paths.changes):
            raise Declined("a lake delta-rs does not read here")
        end = delta_log.stage_end(paths.changes, STAGE_DECODE)
        if end is None:
            raise Declined("silver has no decode commit")
        files = silver_file_stats(paths.changes)
        since = last_complete_run(paths, end)  # None: no complete run yet (every change of silver is due)
        if files is None:
            raise Declined("silver's file statistics cannot be read")
        names = _table_names(src, files, since, end, paths.runs, runs_tables_at)
        ddl_end = delta_log.stage_end(paths.ddl_log, STAGE_DDL_LOG) if delta_log.is_delta_table(paths.ddl_log) \
            else None
        started = datetime.now(UTC)
        tables = _prepare_all(src, paths.changes, names, paths.gold, end, files,
                              lambda mark: ddl_end is not None and ddl_end > mark)
        present = runs_tables_at(paths.runs, end)
        if present is None:
            raise Declined("`_runs` cannot be read with delta-rs")
    except Declined as why:
        log.info("merge %s in this process declined (%s): Spark merges", source, why)
        return None
    results = _commit_all(src, tables, end, started)
    report = MergeReport(source, end, tuple(results))
    if not delta_log.is_delta_table(paths.runs):
        delta_log.create_empty(paths.runs, contracts.RUNS)  # the first run with changes (as `record_runs`)
    finished = datetime.now(UTC)
    missing = [(int(end), r.schema_name, r.table_name, r.gold_version, finished, r.started_at, r.changes,
                r.last_commit_ts) for r in results if (r.schema_name, r.table_name) not in present]
    if missing:
        if not append_runs_directly(paths.runs, missing, end, stage_metadata(end, contracts.STAGE_RUNS)):
            log.info("merge %s: `_runs` not appended to in this process; Spark's merge records the run", source)
            return None
    elif delta_log.stage_end(paths.runs, contracts.STAGE_RUNS) != end:
        log.info("merge %s: the run's rows are in `_runs` but not its mark; Spark's merge records it", source)
        return None
    log.info("%s (in this process, without Spark)", report.summary())
    return report


def merge_into(cfg: Config, source: str, changes_path: str, names: Sequence[TableName],
               gold_of: Callable[[str, str], str], end: Lsn, ddl_events: Callable[[Lsn, Lsn], bool]):
    """A replay's merge without Spark (`run_merge` with `silver_path`, `gold_path_for` and `end_lsn`): the changes
    of the silver-shaped table `changes_path` up to `end` into each of `names`' tables at `gold_of(schema, table)`
    (which exist, holding a watermark), each from its own watermark; `_runs` is not written. `ddl_events(mark,
    end)`: whether a DDL event lies in (mark, end] (then that table declines). Each table keeps its own deletion
    vectors (a replay's copies of gold are written without, whatever the config says: rows are rewritten there,
    not marked, and `undo_in_process` compares them file by file). The `report.MergeReport`, or None when a table's
    batch is not one this module writes exactly (nothing written; the reason logged)."""
    from slotlake.merge.report import MergeReport
    from slotlake.merge.watermarks import silver_file_stats

    src = cfg.source(source)
    try:
        files = silver_file_stats(changes_path)
        if files is None:
            raise Declined(f"the file statistics of {changes_path} cannot be read")
        started = datetime.now(UTC)
        tables = _prepare_all(src, changes_path, names, gold_of, end, files, lambda mark: ddl_events(mark, end),
                              vectors_as_configured=False)
    except Declined as why:
        log.info("merge %s into %s in this process declined (%s)", source, changes_path, why)
        return None
    return MergeReport(source, end, tuple(_commit_all(src, tables, end, started)))


def _prepare_all(src: SourceConfig, changes_path: str, names: Sequence[TableName],
                 gold_of: Callable[[str, str], str], end: Lsn, files: Sequence[SilverFileStats],
                 ddl_since: Callable[[Lsn], bool], vectors_as_configured: bool = True) -> list[_Table]:
    """Every table's commit prepared (`_prepare`), within `MAX_CHANGES` in all; Declined before anything is
    written (the first table's reason, in the order of `names`). The tables are prepared side by side
    (`_PREPARE_THREADS`: pyarrow releases the GIL in its reads and compute). `vectors_as_configured`: a gold
    table's deletion vectors must be as the config says (else Spark turns them on or off); False for a replay's
    tables, which keep their own (`merge_into`)."""
    budget = _Budget(MAX_CHANGES)

    def one(name: TableName) -> _Table:
        return _prepare(src, changes_path, name, gold_of(name.schema, name.name), end, files, ddl_since, budget,
                        vectors_as_configured)

    if len(names) < 2:
        return [one(n) for n in names]
    with ThreadPoolExecutor(max_workers=_PREPARE_THREADS, thread_name_prefix="slotlake-merge-prepare") as pool:
        return list(pool.map(one, names))


_PREPARE_THREADS = 2
"""Tables the in-process merge prepares at once (reads silver, types and plans; the machine's two cores): the
burst's two tables 1.09-1.29 s -> 0.89-1.08 s for the whole merge (bench/README.md, "Tables prepared side by
side")."""


class _Budget:
    """The changes a run may still take (`MAX_CHANGES` in all), shared by the tables prepared side by side: each
    takes its count once it knows it, before it reads its batch, so the rows held stay within the bound."""

    def __init__(self, changes: int) -> None:
        self.left = changes
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            if n > self.left:
                raise Declined(f"more than {MAX_CHANGES:,} changes to merge")
            self.left -= n


def _commit_all(src: SourceConfig, tables: Sequence[_Table], end: Lsn, started: datetime) -> list:
    """Each prepared table's commit, in order; their `report.TableMergeResult`s."""
    from slotlake.merge.report import TableMergeResult

    results = []
    for t in tables:
        if t.up_to_date or (t.plan is None and not t.truncate):
            results.append(TableMergeResult(t.name.schema, t.name.name, t.n, t.version, up_to_date=t.up_to_date,
                                            started_at=started))
            continue
        version, metrics = _commit(src, t, end)
        rewrite = rewrite_note(t.name, {k: str(v) for k, v in metrics.items()}, False)
        results.append(TableMergeResult(
            t.name.schema, t.name.name, t.n, version,
            rows_inserted=int(metrics.get("numTargetRowsInserted", metrics.get("numOutputRows", 0))),
            rows_updated=int(metrics.get("numTargetRowsUpdated", 0)),
            rows_deleted=int(metrics.get("numTargetRowsDeleted", 0)),
            unapplied=t.unapplied, started_at=started, last_commit_ts=t.last_commit_ts, truncated=t.truncate,
            notes=(rewrite,) if rewrite else ()))
        log.info("merged %s in this process: %d change(s) up to %s -> gold version %s", t.name, t.n, end, version)
        if t.unapplied:
            log.warning("%s is merged insert-only (REPLICA IDENTITY NOTHING, or keyless): %d update(s)/delete(s) "
                        "up to %s cannot be applied", t.name, t.unapplied, end)
        # Test-only failpoint, as the Spark merge's: the process dies after the first table's commit.
        failpoints.die_at(failpoints.MERGE_AFTER_FIRST_TABLE)
    return results


def _table_names(src: SourceConfig, files: Sequence[SilverFileStats], since: Lsn | None, end: Lsn, runs_path: str,
                 runs_tables_at) -> list[TableName]:
    """The tables the run merges, as `job._table_names` finds them (here only from silver's file statistics and
    `_runs`, which must say it exactly)."""
    if src.listed_tables:
        return [TableName.parse(t) for t in src.listed_tables]
    found = tables_in_window(files, int(since) if since is not None else None, int(end))
    at_since = runs_tables_at(runs_path, since) if since is not None else set()
    if found is None or at_since is None:
        raise Declined("the run's tables cannot be told from silver's statistics")
    found |= {TableName(s, t) for s, t in at_since}
    return sorted(t for t in found if src.syncs(str(t)))


def _prepare(src: SourceConfig, changes_path: str, name: TableName, gold: str, end: Lsn,
             files: Sequence[SilverFileStats], ddl_since: Callable[[Lsn], bool], budget: _Budget,
             vectors_as_configured: bool = True) -> _Table:
    """Everything the table's commit needs, or Declined (nothing is written before every table is prepared); its
    changes taken from `budget` (the run's `MAX_CHANGES` left)."""
    from slotlake.merge.watermarks import _local_delta_state, footer_groups
    from slotlake.source.copies import snapshot_doc

    state = _local_delta_state(gold)
    if state is None or state.version is None:
        raise Declined(f"{name} has no gold table readable here")
    mark = state.watermark
    t = _Table(name, gold, state.version)
    if mark is not None and mark >= end:
        t.up_to_date = True
        return t
    after = int(mark) if mark is not None else None
    if not has_changes(files, name, after, int(end)):
        return t
    if mark is None:
        raise Declined(f"{name}'s gold has no watermark")
    if ddl_since(mark):
        raise Declined(f"a DDL event since {name}'s watermark")
    groups: list[LayoutGroup] | None = footer_groups(changes_path, files, name, mark, end)
    batch = None
    if groups is None:  # a file without a summary, or one the window cuts (a replay's re-derived file): counted here
        batch, groups = _counted_batch(changes_path, files, name, after, int(end), budget.left)
    t.n = sum(g.n for g in groups)
    if t.n == 0:
        return t
    budget.take(t.n)
    shaped = [g for g in groups if g.shape is not None]
    if len(shaped) > 1:
        raise Declined(f"{name}: several column layouts")
    t.truncate = any(g.truncs for g in groups)
    if t.truncate and src.delete_mode != "hard":
        raise Declined(f"{name}: a TRUNCATE with soft deletes")
    props = delta_log.table_properties(gold)
    if props is None or props.get(COLUMN_MAPPING, "none") != "none":
        raise Declined(f"{name}: gold maps columns")
    if (snapshot_doc(props) or {}).get("visibility"):
        raise Declined(f"{name}: gold filters changes by its copy's snapshot")
    text = str(name)
    if src.keeps_history(text):
        raise Declined(f"{name}: a history table")
    # Deletion vectors (config `deletion_vectors`): a keyed batch marks gold's rows (merge/dv_merge.py); Spark
    # turns them on or off when the config and gold disagree, and takes every other kind of batch.
    t.marked = props.get(DELETION_VECTORS) == "true"
    if vectors_as_configured and t.marked != src.uses_deletion_vectors(text):
        raise Declined(f"{name}: gold's deletion vectors are to be turned {'off' if t.marked else 'on'}")
    if t.marked and t.truncate:  # (its log and features are read once, by `dv_merge.plan_*` below)
        raise Declined(f"{name}: gold has deletion vectors (a TRUNCATE)")
    t.last_commit_ts = max((g.last_ts for g in groups if g.last_ts is not None), default=None)
    if not shaped:  # TRUNCATE only: gold is emptied
        return t
    g = shaped[0]
    s = g.shape_map
    assert s is not None  # a group with a shape
    shape = TableShape(name.schema, name.name, tuple(s["columns"]), tuple(s["type_oids"]), tuple(s["typmods"]),
                       tuple(s["key_columns"] or ()), s["replica_identity"])
    numeric = partial(src.numeric.unconstrained_for, text)
    try:
        plan = plan_table(shape, src.delete_mode, numeric, keyless_appends=src.keyless_appends(text))
    except MergeError as e:
        raise Declined(str(e)) from None
    if plan.soft_delete:
        raise Declined("soft deletes")
    _check_gold_schema(gold, plan)
    if batch is None:
        batch = _read_batch(_silver_files(changes_path, files, name, after, int(end)), name, after, int(end))
    t.plan = plan
    if t.truncate:  # changes before the last TRUNCATE are void: gold becomes what the later ones leave
        _prepare_truncated(t, plan, batch)
        return t
    changes = _changes(batch)
    if plan.strategy is KeyStrategy.KEYED:
        t.source = _keyed_source(plan, changes, gold, holds=not t.marked)
    elif plan.strategy is KeyStrategy.INSERT_ONLY:
        t.source, t.append = _append_rows(plan, changes, numbered=False), True
        t.unapplied = g.ud
    elif g.plain == g.n and not _gold_holds_any(gold, plan, rows := _append_rows(plan, changes, numbered=True)):
        # (in a table with deletion vectors the rows a vector deletes count as held: such a batch declines)
        t.source, t.append = rows, True  # new rows only: copies numbered from 1
    elif t.marked:
        raise Declined(f"{name}: gold has deletion vectors, and the batch changes rows of a FULL-identity table")
    else:
        t.source = _full_source(plan, changes, gold)
    if t.marked:  # the commit merge/dv_merge.py writes: rows marked (KEYED) or one appended file
        import pyarrow as pa

        target = pa.schema(delta_log.delta_rs_table(gold).schema().to_arrow())
        try:
            t.marks = dv_merge.plan_append(gold, t.source.select(target.names).cast(target)) if t.append \
                else dv_merge.plan_marks(gold, plan, t.source, target)
        except dv_merge.CannotMark as why:
            raise Declined(f"{name}: {why}") from None
        except (KeyError, pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:  # (the append's columns and types)
            raise Declined(f"{name}: the batch's rows are not gold's columns and types ({e})") from None
    return t


def _changes(batch):
    """The batch without its TRUNCATE rows."""
    import pyarrow.compute as pc

    return batch.filter(pc.not_equal(batch.column("op"), "T"))


def _prepare_truncated(t: _Table, plan: TablePlan, batch) -> None:
    """`t.source` := gold's rows after the batch, which holds a TRUNCATE: what the changes after the last one leave
    in an empty table (as Spark's MERGE of them with every other gold row deleted): a keyed table's final states,
    a FULL table's copies numbered from 1, an insert-only table's inserts (its later updates and deletes
    unapplied). Declined when a later change leaves a TOAST value unchanged that none of them wrote."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ops = batch.column("op").to_numpy(zero_copy_only=False)
    after = _changes(batch.slice(int(np.flatnonzero(ops == "T")[-1]) + 1))
    cols = list(plan.shape.columns)
    if plan.strategy in (KeyStrategy.KEYED, KeyStrategy.FULL_ROW):
        keyed = plan.strategy is KeyStrategy.KEYED
        source = _keyed_source(plan, after, None) if keyed else _full_source(plan, after, None)
        if keyed:
            source = source.filter(pc.equal(source.column("__action"), "U"))
        extra = [("__lsn", LSN_COL), ("__ts", COMMIT_TS_COL)] + ([] if keyed else [("__dup", DUP_COL)])
        rows = pa.table([*(source.column(f"__v{i}") for i in range(len(cols))), *(source.column(c) for c, _ in extra)],
                        names=[*cols, *(n for _, n in extra)])
    else:
        rows = _append_rows(plan, after, numbered=False)
        t.unapplied = int(pc.sum(pc.is_in(after.column("op"), pa.array(["U", "D"]))).as_py() or 0)
    t.source = rows


def _check_gold_schema(gold: str, plan: TablePlan) -> None:
    want = [(f.name, delta_type(f.type)) for f in plan.gold_schema]
    if any(tp is None for _, tp in want) or not all(_PLAIN_NAME.match(n) for n, _ in want):
        raise Declined(f"{plan.shape.qualified}: a column type or name this merge does not handle")
    have = [(f.name, getattr(f.type, "type", None)) for f in delta_log.delta_rs_table(gold).schema().fields]
    if have != want:
        raise Declined(f"{plan.shape.qualified}: gold's columns are not the batch's")


def _silver_files(changes_path: str, files: Sequence[SilverFileStats], name: TableName, after: int | None,
                  upto: int) -> tuple[Any, list[str]]:
    """(pyarrow file system, paths) of the silver files that may hold the table's changes in (after, upto]
    (`watermarks.table_files`); Declined when there are none or they cannot be read here."""
    from slotlake.merge.watermarks import table_files

    chosen = files_to_read(files, name, after, upto)
    found = table_files(changes_path, chosen) if chosen else None
    if not found or not found[1]:
        raise Declined(f"{name}'s silver files cannot be read here")
    return found


def _counted_batch(changes_path: str, files: Sequence[SilverFileStats], name: TableName, after: int | None,
                   upto: int, budget: int) -> tuple[Any, list[LayoutGroup]]:
    """(`_read_batch`, its layout groups counted as the decode counts a file's, `decode.layouts.LayoutScan`) for a
    window whose files' footers cannot answer: one without a summary (Spark wrote it) or one holding changes on
    both sides of the window (an in-place replay re-derives silver for whole runs, so the next interval's replay
    starts inside its file). Declined past `budget` changes, before reading when the files hold more than twice
    as many rows."""
    import pyarrow.parquet as pq

    from slotlake.decode.layouts import SHAPE_FIELDS, LayoutScan

    fs, where = _silver_files(changes_path, files, name, after, upto)
    if sum(pq.read_metadata(p, filesystem=fs).num_rows for p in where) > 2 * budget:
        raise Declined(f"more than {MAX_CHANGES:,} changes to merge")
    batch = _read_batch((fs, where), name, after, upto, extra=SHAPE_FIELDS)
    if batch.num_rows > budget:
        raise Declined(f"more than {MAX_CHANGES:,} changes to merge")
    scan = LayoutScan()
    scan.add(batch)
    summary = scan.summary()
    if summary is None:
        raise Declined(f"{name}'s silver rows in the window cannot be counted here")
    return batch.drop_columns([c for c in SHAPE_FIELDS if c in batch.column_names]), list(summary.groups)


def _read_batch(files: tuple[Any, Sequence[str]], name: TableName, after: int | None, upto: int,
                extra: Sequence[str] = ()):
    """The table's silver rows in (after, upto] from `files` (pyarrow file system, paths), TRUNCATE rows included,
    ordered by (commit_lsn, seq); `extra`: more silver columns to read."""
    import pyarrow.dataset as ds

    cond = ((ds.field("schema_name") == name.schema) & (ds.field("table_name") == name.name)
            & (ds.field("commit_lsn") <= upto))
    if after is not None:
        cond = cond & (ds.field("commit_end_lsn") > after)
    cols = ["commit_lsn", "seq", "commit_ts", "op", "old", "new", "unchanged", *extra]
    table = ds.dataset(list(files[1]), format="parquet", filesystem=files[0]).to_table(columns=cols, filter=cond)
    return table.sort_by([("commit_lsn", "ascending"), ("seq", "ascending")])


def _typed(plan: TablePlan, texts, i: int):
    shape = plan.shape
    out = typed_array(texts, shape.type_oids[i], shape.typmods[i], plan.numeric_mode(i))
    if out is None:
        raise Declined(f"{shape.qualified}.{shape.columns[i]}: a value this merge does not type (Spark types and "
                       "quarantines it)")
    return out


def _column_texts(lists, i: int):
    """Element i of each list (PostgreSQL text), NULL for a NULL list or one that ends before i."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    if not len(lists):
        return pa.array([], pa.string())
    shortest = pc.min(pc.list_value_length(lists)).as_py()
    if shortest is None or shortest > i:
        return pc.list_element(lists, i)
    return pa.array([None if v is None or i >= len(v) else v[i] for v in lists.to_pylist()], pa.string())


def _meta(batch):
    import pyarrow as pa

    return batch.column("commit_lsn").cast(pa.int64()), batch.column("commit_ts").cast(ARROW_TYPES["timestamp"])


def _keyed_source(plan: TablePlan, batch, gold: str | None, *, holds: bool = True):
    """One row per key touched: its last event's action (D, else U), typed values, LSN and time, as
    `lineage.keyed_source` leaves it. The batch is in (commit_lsn, seq) order; each change is an event at its key
    (a delete's key is its old tuple's, any other its new tuple's), and an update whose old key differs from its
    new one (a key change) also leaves its old key: a delete there at the same change. A key's last event is its
    greatest number. An unchanged TOAST value is the key's last value written in the batch, else gold's row's: the
    MERGE keeps it (`__u{i}` true, `_merge_values`; gold must hold the row, `_check_gold_holds`). A batch with both
    key changes and unchanged TOAST declines (a row's value would follow it across keys)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    op, new, old = batch.column("op"), batch.column("new"), batch.column("old")
    is_del = pc.equal(op, "D")
    keys = plan.key_positions
    knames = [f"k{j}" for j in range(len(keys))]
    new_k = [_typed(plan, _column_texts(new, k), k) for k in keys]
    old_k = [_typed(plan, _column_texts(old, k), k) for k in keys]
    row_k = [pc.if_else(is_del, o, w) for o, w in zip(old_k, new_k)]
    if any(k.null_count for k in row_k):
        raise Declined(f"{plan.shape.qualified}: a change without its key")
    number = np.arange(n, dtype=np.int64)
    # event numbers: 2i+1 for change i at its key, 2i for a key change leaving its old key (kind 2)
    events = pa.table([*row_k, pa.array(2 * number + 1), pc.if_else(is_del, 2, pc.if_else(pc.equal(op, "I"), 0, 1))],
                      names=[*knames, "__ev", "__kind"])
    differs = pc.fill_null(_any([pc.not_equal(o, w) for o, w in zip(old_k, new_k)]), False)
    moved = np.flatnonzero(pc.and_(pc.equal(op, "U"), differs).to_numpy(zero_copy_only=False))
    if len(moved):
        taken = pa.array(moved)
        events = events.set_column(events.schema.get_field_index("__kind"), "__kind", pc.if_else(
            pc.is_in(pa.array(number), value_set=taken), 0, events.column("__kind")))  # it arrives at its new key
        leaves = pa.table([*(pc.take(o, taken) for o in old_k), pa.array(2 * moved), pa.array(np.full(len(moved), 2))],
                          names=[*knames, "__ev", "__kind"])
        events = pa.concat_tables([events, leaves.cast(events.schema)])
        _check_lineages(plan, events, knames)
    toast = _unchanged_columns(batch.column("unchanged"), n)
    provided = {}
    for i, unchanged in toast.items():  # the change's value of column i when it wrote one
        written = ~unchanged & ~is_del.to_numpy(zero_copy_only=False)
        provided[i] = pa.array(2 * number + 1, mask=~written)
    if provided and len(moved):
        raise Declined(f"{plan.shape.qualified}: a key change and unchanged TOAST in one batch")
    for i, p in provided.items():
        events = events.append_column(f"__p{i}", p)
    try:
        last = events.group_by(knames, use_threads=False).aggregate(
            [("__ev", "max"), *((f"__p{i}", "max") for i in provided)]).combine_chunks()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:
        raise Declined(f"{plan.shape.qualified}: keys pyarrow does not group ({e})") from None
    ev = last.column("__ev_max").to_numpy()
    rows = pa.array(ev // 2)
    chosen = batch.take(rows)
    action = pc.if_else(pc.or_(pa.array(ev % 2 == 0), pc.equal(chosen.column("op"), "D")), "D", "U")
    values = []
    for i in range(len(plan.shape.columns)):
        if i in provided:  # from the key's last change that wrote it (NULL: none did, gold's below)
            at = pc.divide(last.column(f"__p{i}_max"), 2)
            values.append(_typed(plan, pc.take(_column_texts(new, i), at), i))
        else:
            values.append(_typed(plan, _column_texts(chosen.column("new"), i), i))
    # __u{i}: the MERGE keeps gold's value (no change of the batch wrote one; `_merge_values`)
    kept = {i: pc.and_(pc.is_null(last.column(f"__p{i}_max")), pc.equal(action, "U")) for i in provided}
    if kept and gold is None:  # (after a TRUNCATE: no gold row to keep a value of)
        if pc.any(_any(list(kept.values()))).as_py():
            raise Declined(f"{plan.shape.qualified}: an unchanged TOAST value after a TRUNCATE that no later change "
                           "wrote")
        kept = {}
    if kept and holds:  # (else `dv_merge.plan_marks` checks it, reading gold's rows)
        assert gold is not None
        _check_gold_holds(plan, gold, [last.column(k) for k in knames], _any(list(kept.values())))
    lsn, ts = _meta(chosen)
    names = [*(f"__k{j}" for j in range(len(keys))), "__action",
             *(f"__v{i}" for i in range(len(plan.shape.columns))), "__lsn", "__ts", *(f"__u{i}" for i in kept)]
    return pa.table([*(last.column(k) for k in knames), action, *values, lsn, ts, *kept.values()], names=names)


def _merge_values(columns: Sequence[str], source_names: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The MERGE's (update, insert) values from a `_keyed_source` table: column i from `s.__v{i}`, or, where the
    source row's `__u{i}` is true (an unchanged TOAST value no change of the batch wrote), the target's own."""
    insert = {c: f"s.__v{i}" for i, c in enumerate(columns)}
    insert.update({LSN_COL: "s.__lsn", COMMIT_TS_COL: "s.__ts"})
    update = dict(insert)
    for i, c in enumerate(columns):
        if f"__u{i}" in source_names:
            update[c] = f"CASE WHEN s.__u{i} THEN t.{c} ELSE s.__v{i} END"
    return update, insert


def _any(masks):
    import pyarrow.compute as pc

    out = masks[0]
    for m in masks[1:]:
        out = pc.or_kleene(out, m)
    return out


def _unchanged_columns(unchanged, n: int) -> dict:
    """{column position: numpy mask of the changes that left it unchanged (TOAST)} for the positions any change
    of the batch left unchanged."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(unchanged, pa.ChunkedArray):
        unchanged = unchanged.combine_chunks()
    flat = pc.list_flatten(unchanged).to_numpy(zero_copy_only=False)
    if not len(flat):
        return {}
    parents = pc.list_parent_indices(unchanged).to_numpy(zero_copy_only=False)
    out = {}
    for i in np.unique(flat).tolist():
        mask = np.zeros(n, dtype=bool)
        mask[parents[flat == i]] = True
        out[int(i)] = mask
    return out


def _check_lineages(plan: TablePlan, events, knames: list[str]) -> None:
    """Declined (Spark's merge names the inconsistency) when an update or delete follows, at its key, a change
    that removed the row there with nothing arriving between (`lineage._lineage_links`' `broken`)."""
    import pyarrow.compute as pc

    s = events.sort_by([*((k, "ascending") for k in knames), ("__ev", "ascending")])
    if s.num_rows < 2:
        return
    other_key = _any([pc.not_equal(s.column(k).slice(1), s.column(k).slice(0, s.num_rows - 1)) for k in knames])
    after_leave = pc.and_(pc.equal(s.column("__kind").slice(0, s.num_rows - 1), 2),
                          pc.not_equal(s.column("__kind").slice(1), 0))
    if pc.any(pc.and_(pc.invert(other_key), after_leave)).as_py():
        raise Declined(f"{plan.shape.qualified}: a change at a key an earlier change of the batch left")


def _check_gold_holds(plan: TablePlan, gold: str, keys: list, mask) -> None:
    """Declined unless gold holds a row at each key `mask` selects (rows whose unchanged TOAST values the MERGE
    keeps from gold): Spark's merge reports a missing one. Reads only gold's key columns, in the files whose
    statistics may hold those keys."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as ds

    rows = pa.array(np.flatnonzero(mask.to_numpy(zero_copy_only=False)))
    if not len(rows):
        return
    kcols = [plan.shape.columns[k] for k in plan.key_positions]
    wanted = [k.take(rows) for k in keys]
    data = open_dataset(gold)
    cond = None
    for c, w in zip(kcols, wanted):
        part = ds.field(c).isin(w.cast(data.schema.field(c).type))
        cond = part if cond is None else cond & part
    found = data.to_table(columns=kcols, filter=cond)
    names = [f"k{j}" for j in range(len(kcols))]
    found = pa.table([found.column(c).cast(w.type) for c, w in zip(kcols, wanted)], names=names)
    ask = pa.table(wanted, names=names)
    if ask.join(found, names, join_type="left anti").num_rows or found.num_rows != len(rows):
        raise Declined(f"{plan.shape.qualified}: an unchanged TOAST value of a row gold does not hold once")


def _append_rows(plan: TablePlan, batch, *, numbered: bool):
    """The batch's inserts as gold rows (gold's column order). `numbered` (FULL identity): identical rows become
    copies 1..n with the LSN and time of the row's last insert, as `job._append_rows` numbers them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inserts = batch.filter(pc.equal(batch.column("op"), "I"))
    ncols = len(plan.shape.columns)
    new = inserts.column("new")
    texts = [_column_texts(new, i) for i in range(ncols)]
    dups = None
    if numbered:
        take, dups = _copies_numbered(texts)
        inserts = inserts.take(take)
        texts = [pc.take(t, take) for t in texts]
    values = [_typed(plan, texts[i], i) for i in range(ncols)]
    lsn, ts = _meta(inserts)
    cols = [*values, lsn, ts]
    names = [*plan.shape.columns, LSN_COL, COMMIT_TS_COL]
    if dups is not None:
        cols.append(dups)
        names.append(DUP_COL)
    return pa.table(cols, names=names)


def _copies_numbered(texts) -> tuple[Any, Any]:
    """Rows given as their columns' texts (NULLs equal, as the MERGE's <=>), each distinct row's copies numbered
    1..n: (the row indices to take, each one's copy number). Every copy of a row is taken as its last one (rows in
    commit order: the greatest index is the last insert, whose LSN and time the copies keep)."""
    import numpy as np
    import pyarrow as pa

    count = len(texts[0]) if texts else 0
    rows = pa.table([*texts, pa.array(np.arange(count, dtype=np.int64))],
                    names=[*(f"c{i}" for i in range(len(texts))), "__i"])
    per_row = rows.group_by([f"c{i}" for i in range(len(texts))], use_threads=False) \
        .aggregate([("__i", "max"), ("__i", "count")])
    counts = per_row.column("__i_count").to_numpy()
    take = pa.array(np.repeat(per_row.column("__i_max").to_numpy(), counts))
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return take, pa.array((np.arange(len(take)) - starts + 1).astype(np.int32))


MAX_GOLD_ROWS_CHECKED = 2_000_000
"""Gold rows a FULL append's check reads at most (the files whose statistics overlap the batch): beyond, Spark
merges."""


def _gold_holds_any(gold: str, plan: TablePlan, rows) -> bool:
    """Whether gold holds a row equal to one of `rows` on the table's columns (FULL identity: the whole row, NULLs
    equal, as the MERGE's `<=>`): then the MERGE numbers the batch's copies after gold's, which an append does not.
    Reads only the gold files whose statistics may hold one of the rows (`_gold_rows_like`), as Spark's append
    check reads only the files its data skipping leaves."""
    cols = list(plan.shape.columns)
    return _equal_rows(rows.select(cols), _gold_rows_like(gold, plan, rows)).num_rows > 0


def _equal_rows(left, right):
    """The rows of `left` equal to some row of `right` (same columns and types), NULLs equal."""
    a, b = _null_safe(left), _null_safe(right)
    return a.join(b, keys=a.column_names, join_type="left semi")


def _null_safe(t):
    """`t`'s columns as pairs (value with NULL filled, whether it is NULL), named v{i}/n{i}: rows that group and
    join equal exactly when they are equal with NULLs equal (the MERGE's `<=>`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def zero(tp):  # any value of the type: the NULL flag tells a filled NULL apart
        if pa.types.is_string(tp) or pa.types.is_large_string(tp):
            return pa.scalar("", tp)
        if pa.types.is_binary(tp) or pa.types.is_large_binary(tp):
            return pa.scalar(b"", tp)
        if pa.types.is_decimal(tp):  # (an int64 0 casts only to a decimal of 19 integer digits or more)
            return pa.scalar(Decimal(0), tp)
        if pa.types.is_boolean(tp):
            return pa.scalar(False)
        return pa.scalar(0, pa.int32() if pa.types.is_date32(tp) else pa.int64()).cast(tp)

    cols, names = [], []
    for i, c in enumerate(t.column_names):
        v = t.column(c)
        cols += [pc.fill_null(v, zero(v.type)), pc.is_null(v)]
        names += [f"v{i}", f"n{i}"]
    return pa.table(cols, names=names)


def _gold_rows_like(gold: str, plan: TablePlan, rows):
    """Gold's rows (the table's columns, typed as `rows`) in the files whose statistics may hold one of `rows`;
    Declined when they hold more than `MAX_GOLD_ROWS_CHECKED` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(plan.shape.columns)
    types = [rows.schema.field(c).type for c in cols]
    files = _files_that_may_hold(gold, plan, rows)
    if sum(n for _, n in files) > MAX_GOLD_ROWS_CHECKED:
        raise Declined(f"{plan.shape.qualified}: more than {MAX_GOLD_ROWS_CHECKED:,} gold rows to compare the batch's "
                       "rows with")
    fs, folder = storage.arrow_files(gold)
    parts = [pa.table([pa.array([], tp) for tp in types], names=cols)]
    for path, _ in files:  # gold has no column mapping here: Parquet names are gold's; Spark's INT96 time stamps
        f = pq.read_table(f"{folder.rstrip('/')}/{unquote(path)}", filesystem=fs, coerce_int96_timestamp_unit="us")
        parts.append(pa.table([f.column(c).cast(tp) if c in f.column_names else pa.nulls(f.num_rows, tp)
                               for c, tp in zip(cols, types)], names=cols))  # a column added since: NULL there
    return pa.concat_tables(parts)


def _full_source(plan: TablePlan, batch, gold: str | None):
    """A FULL-identity batch as the MERGE's source, as `lineage.full_row_source` builds it: per distinct row (NULLs
    equal) d = its inserts and new tuples minus its old tuples; with gold's count c of it, the copies c+1..c+d to
    add (`U`) or c+d+1..c to remove (`D`, never below none), each with the row's last change's LSN and time. A new
    tuple's unchanged TOAST value is its old tuple's (FULL logs the whole old row). `gold` None: an empty table."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = list(plan.shape.columns)
    n = batch.num_rows
    op, new, old = batch.column("op"), batch.column("new"), batch.column("old")
    ops = op.to_numpy(zero_copy_only=False)
    ins = np.flatnonzero(ops != "D")
    outs = np.flatnonzero(ops != "I")
    if pc.take(old, pa.array(outs)).null_count:
        raise Declined(f"{plan.shape.qualified}: an update or delete without its old row")
    unchanged = _unchanged_columns(batch.column("unchanged"), n)
    news, olds = [], []
    for i in range(len(cols)):
        texts = _column_texts(new, i)
        old_texts = _column_texts(old, i)
        if i in unchanged:
            texts = pc.if_else(pa.array(unchanged[i]), old_texts, texts)
        news.append(_typed(plan, pc.take(texts, pa.array(ins)), i))
        olds.append(_typed(plan, pc.take(old_texts, pa.array(outs)), i))
    moves = pa.concat_tables([
        pa.table([*news, pa.array(np.ones(len(ins), np.int64)), pa.array(ins.astype(np.int64))],
                 names=[*cols, "__sign", "__i"]),
        pa.table([*olds, pa.array(np.full(len(outs), -1, np.int64)), pa.array(outs.astype(np.int64))],
                 names=[*cols, "__sign", "__i"])])
    safe = _null_safe(moves.select(cols))
    keys = safe.column_names
    per_row = safe.append_column("__sign", moves.column("__sign")).append_column("__i", moves.column("__i")) \
        .group_by(keys, use_threads=False).aggregate([("__sign", "sum"), ("__i", "max")])
    per_row = per_row.filter(pc.not_equal(per_row.column("__sign_sum"), 0))
    rows = pa.table([pc.if_else(per_row.column(f"n{i}"), pa.nulls(per_row.num_rows, moves.schema.field(c).type),
                                per_row.column(f"v{i}")) for i, c in enumerate(cols)], names=cols)
    counts = _null_safe(_gold_rows_like(gold, plan, rows)).group_by(keys, use_threads=False) \
        .aggregate([("v0", "count")]) if rows.num_rows and gold is not None else None
    d = per_row.column("__sign_sum").to_numpy()
    have = np.zeros(len(d), np.int64)  # gold's copies of each row
    if counts is not None and counts.num_rows:
        numbered = per_row.select(keys).append_column("__r", pa.array(np.arange(len(d))))
        joined = numbered.join(counts, keys, join_type="inner")
        have[joined.column("__r").to_numpy()] = joined.column("v0_count").to_numpy()
    target = np.maximum(have + d, 0)
    lo, hi = np.minimum(have, target), np.maximum(have, target)  # copies lo+1..hi: added (target > have) or removed
    span = hi - lo
    take = pa.array(np.repeat(np.arange(len(d)), span))
    dup = np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span) + np.repeat(lo, span) + 1
    action = pa.array(np.where(np.repeat(target > have, span), "U", "D"))
    last = batch.take(pc.take(per_row.column("__i_max").combine_chunks(), take))
    lsn, ts = _meta(last)
    return pa.table([*(rows.column(col).take(take) for col in cols), pa.array(dup.astype(np.int32)), action, lsn, ts],
                    names=[*(f"__v{i}" for i in range(len(cols))), "__dup", "__action", "__lsn", "__ts"])


def _files_that_may_hold(gold: str, plan: TablePlan, rows) -> list[tuple[str, int]]:
    """The gold files (path relative to the table, rows) whose statistics let them hold one of `rows` (FULL
    identity: the whole row): the batch's range of a non-string column overlaps the file's on every such column
    (all files when there is no such column)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not rows.num_rows:
        return []
    actions = pa.table(delta_log.delta_rs_table(gold).get_add_actions(flatten=True))
    if not actions.num_rows:
        return []

    def chosen(mask) -> list[tuple[str, int]]:
        picked = actions.filter(mask)
        counts = picked.column("num_records").to_pylist() if "num_records" in picked.column_names \
            else [None] * picked.num_rows
        return [(p, MAX_GOLD_ROWS_CHECKED + 1 if n is None else int(n))
                for p, n in zip(picked.column("path").to_pylist(), counts)]

    cols = [c for c in plan.shape.columns  # (decimals: their statistics' type varies; a file is kept for them)
            if not any(f(rows.schema.field(c).type) for f in (pa.types.is_string, pa.types.is_boolean,
                                                              pa.types.is_decimal))]
    overlap = pa.array([True] * actions.num_rows)
    if not cols:
        return chosen(overlap)
    for c in cols:
        values = rows.column(c)
        lo, hi = pc.min(values), pc.max(values)
        has_nulls = values.null_count > 0
        if f"min.{c}" not in actions.column_names or f"max.{c}" not in actions.column_names:
            return chosen(pa.array([True] * actions.num_rows))
        fmin, fmax = actions.column(f"min.{c}"), actions.column(f"max.{c}")
        if pa.types.is_timestamp(fmax.type):  # statistics cut to milliseconds: a file's rows reach 1 ms past
            fmin, fmax = (x.cast(pa.timestamp("us")).cast(pa.int64()) for x in (fmin, fmax))
            fmax = pc.add(fmax, _MS_US)
            lo, hi = (pa.scalar(x.cast(pa.timestamp("us")).value, pa.int64()) if x.is_valid else x for x in (lo, hi))
        if lo.is_valid:
            within = pc.and_kleene(pc.less_equal(fmin, hi.cast(fmin.type)), pc.greater_equal(fmax, lo.cast(fmax.type)))
            within = pc.fill_null(within, True)  # a file without statistics may hold anything
        else:
            within = pa.array([False] * actions.num_rows)
        if has_nulls:
            nulls = actions.column(f"null_count.{c}") if f"null_count.{c}" in actions.column_names else None
            within = pc.or_(within, pa.array([True] * actions.num_rows) if nulls is None
                            else pc.fill_null(pc.greater(nulls, 0), True))
        overlap = pc.and_(overlap, within)
    return chosen(overlap)


def _commit(src: SourceConfig, t: _Table, end: Lsn) -> tuple[int, dict[str, int]]:
    """The table's one commit (a MERGE, or an append), idempotent per (table, run end); its version and metrics."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    assert t.truncate or (t.plan is not None and t.source is not None)
    app_id = merge_app_id(src.name, t.name.schema, t.name.name)
    table = delta_log.delta_rs_table(t.gold)
    done = table.transaction_version(app_id)
    if done is None or done < int(end):
        props = CommitProperties(custom_metadata={"userMetadata": stage_metadata(end, "merge")},
                                 app_transactions=[Transaction(app_id, int(end))])
        target = pa.schema(table.schema().to_arrow())
        if t.truncate:  # gold's whole new content, in one commit (none: a TRUNCATE was the last change)
            data = target.empty_table() if t.source is None else t.source.select(target.names).cast(target)
            write_deltalake(table, data, mode="overwrite", commit_properties=props)
        elif t.marks is not None:
            dv_merge.commit_marks(t.gold, t.marks, app_id=app_id, txn_version=int(end),
                                  user_metadata=stage_metadata(end, "merge"))
        elif t.append:
            data = t.source.select(target.names).cast(target)
            write_deltalake(table, data, mode="append", commit_properties=props)
        else:
            assert t.plan is not None
            _merge(table, t.plan, t.source, props)
    newest = next(delta_log.commits(t.gold))
    return newest.version, dict(newest.metrics)


def _merge(table, plan: TablePlan, source, props=None) -> None:
    """The MERGE of a `_keyed_source` (by the key) or `_full_source` (by every column, NULLs equal, and the copy
    number) into the delta-rs `table`, with `props` (`CommitProperties`) on its commit."""
    cols = plan.shape.columns
    if plan.strategy is KeyStrategy.FULL_ROW:
        insert = {c: f"s.__v{i}" for i, c in enumerate(cols)}
        insert.update({LSN_COL: "s.__lsn", COMMIT_TS_COL: "s.__ts", DUP_COL: "s.__dup"})
        update = {LSN_COL: "s.__lsn", COMMIT_TS_COL: "s.__ts"}
        cond = " AND ".join([*(f"(t.{c} IS NOT DISTINCT FROM s.__v{i})" for i, c in enumerate(cols)),
                             f"(t.{DUP_COL} IS NOT DISTINCT FROM s.__dup)"])
    else:
        update, insert = _merge_values(cols, source.column_names)
        cond = " AND ".join(f"t.{cols[k]} = s.__k{j}" for j, k in enumerate(plan.key_positions))
    (table.merge(source, cond, source_alias="s", target_alias="t", commit_properties=props)
     .when_matched_delete("s.__action = 'D'")
     .when_matched_update(update, "s.__action = 'U'")
     .when_not_matched_insert(insert, "s.__action = 'U'")
     .execute())
