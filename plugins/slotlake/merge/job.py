"""The merge stage: silver/changes -> gold/<schema>/<table>, one Delta commit per table, by replica identity.

For each table the run applies the silver changes with `table watermark < commit_end_lsn`, `commit_lsn <= run end`
(run end = silver's watermark) in (commit_lsn, seq) order, as ONE Delta MERGE carrying the idempotent-write settings
and the new watermark (docs/internals.md "Gold"). All work on changes is Spark DataFrame work; the driver only
collects small summaries (table shapes, counts, the first offending row of an error).

Keyed tables (REPLICA IDENTITY DEFAULT / USING INDEX) are merged by row *lineage*: a change that updates or deletes
a row continues the lineage of the change that last wrote that key (possibly under another key, after a key
change), or starts from the gold row. Unchanged-TOAST columns take the last value written in their lineage (or
the gold row's). The last event per key then becomes the MERGE source. FULL tables are multisets: per distinct
row the net count change is applied to copies numbered by `_slotlake_dup`. NOTHING tables are insert-only.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache, partial

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DateType,
    IntegralType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from slotlake import contracts, delta_log, failpoints
from slotlake.catalog import CatalogVersion
from slotlake.config import Config, SourceConfig
from slotlake.contracts import STAGE_RUNS as RUNS_STAGE
from slotlake.decode.layouts import SHAPE_FIELDS, LayoutGroup, micros, shape_of
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge import lineage
from slotlake.merge.evolution import Evolution, plan_evolution
from slotlake.merge.evolve_job import (
    Layout,
    TableDefinitions,
    evolve_gold,
    gold_at_watermark,
    layouts_of,
    set_deletion_vectors,
    shape_col,
    sorted_fields,
    table_definitions,
    typed_layouts,
    unified_plan,
    with_types,
)
from slotlake.merge.plan import (
    COLUMN_MAPPING,
    COMMIT_TS_COL,
    DELETED_COL,
    DELETION_VECTORS,
    DUP_COL,
    LSN_COL,
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    KeyStrategy,
    TablePlan,
    merge_commit_conf,
    needs_column_mapping,
    rewrite_note,
    schema_mismatch,
    stage_metadata,
)
from slotlake.merge.report import MergeReport, TableMergeResult
from slotlake.merge.runs import append_runs_directly, last_complete_run
from slotlake.merge.silver_stats import SilverFileStats, files_to_read, has_changes, tables_in_window
from slotlake.merge.typed_values import always_exact
from slotlake.merge.typing_job import ensure_quarantine, ensure_table, has_bad_value, quarantine_bad_values
from slotlake.merge.visibility_job import not_seen_by_copy
from slotlake.merge.watermarks import (
    delta_state,
    footer_groups,
    local_files,
    runs_tables_at,
    silver_file_stats,
    spark_schema,
    table_bytes,
)
from slotlake.names import TableName
from slotlake.names import spark_ident as _q
from slotlake.source.visibility import CopySnapshot
from slotlake.spark import session as spark_session
from slotlake.spark.schemas import fields_of, struct_of
from slotlake.spark.session import codegen_for_batch, error_summary

log = logging.getLogger(__name__)

RUNS_SCHEMA = contracts.RUNS
_MAX_PARALLEL_TABLES = 8
_LISTING_JOB_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"
_BROADCAST_THRESHOLD = "spark.sql.autoBroadcastJoinThreshold"
_DV_BROADCAST_BYTES = 1 << 20  # a table with deletion vectors: see `_merge_table`
_KEY_FILTER_MAX = 5_000  # keys of a batch `_key_filter` names in the MERGE condition, at most


# ---- the run -----------------------------------------------------------------------------------------------

def run_merge(spark: SparkSession, cfg: Config, source: str,
              tables: Sequence[str] | Sequence[tuple[str, str]] | None = None, *,
              silver_path: str | None = None, gold_path_for: Callable[[str, str], str] | None = None,
              end_lsn: Lsn | None = None) -> MergeReport:
    """Merge every table (or `tables`: TableNames / (schema, table) pairs, or "schema.table" as PostgreSQL reads
    it) of `source` up to silver's watermark.

    Guarantees: each table's change is one Delta commit carrying its watermark; re-running is a no-op; `_runs`
    gets one row per table (also for tables without changes) once every table has merged.
    Raises MergeError (after the other tables finished) if any table cannot be merged.

    Live gold first gets the complete initial copies not loaded yet (`load_snapshots`). For replays:
    `silver_path` reads another changes table, `gold_path_for(schema, table)` writes other gold paths (then
    neither the copies nor `_runs` are written: those tables are not the lake's gold), `end_lsn` stops earlier
    than silver's watermark.
    """
    src = cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    if gold_path_for is None:
        # Live gold only: initial copies complete but not in gold yet are loaded first, so changes apply on top of
        # them. A replay or an undo (gold_path_for) writes other tables and leaves live gold alone.
        from slotlake.merge.snapshot_job import load_snapshots

        load_snapshots(spark, cfg, source)
    changes_path = silver_path or paths.changes
    end = delta_state(spark, changes_path).watermark
    if end is None:
        log.info("merge %s: silver has no decoded changes yet (%s)", source, changes_path)
        return MergeReport(source, None, ())
    if end_lsn is not None:
        end = min(end, Lsn.parse(end_lsn))
    # Silver through Delta, loaded only when asked for (its first load in the JVM is a Spark job over silver's log),
    # and its schema, from the log without Spark where delta-rs reads it (once for every table)
    silver = cache(lambda: spark.read.format("delta").load(changes_path))
    silver_schema = cache(lambda: spark_schema(changes_path) or silver().schema)
    # Silver's file statistics, read once without Spark: a table no file can hold a change of is not planned at
    # all, and the tables with changes are usually read off them too (merge/silver_stats.py).
    files = silver_file_stats(changes_path)
    # Live runs over every table look at silver's newest changes only (since the last complete run), not its
    # whole history: the scan of every silver file grew with the lake's age (bench/README.md).
    since = last_complete_run(paths, end) if silver_path is None and gold_path_for is None else None
    names = _table_names(spark, silver, src, end, tables, runs_path=paths.runs, since=since, files=files)
    ensure_quarantine(spark, paths.quarantine)
    results: dict[tuple[str, str], TableMergeResult] = {}
    errors: list[str] = []
    definitions = table_definitions(spark, paths, end)

    def one(name: tuple[str, str]) -> TableMergeResult:
        gold = gold_path_for(*name) if gold_path_for else paths.gold(*name)
        started = datetime.now(UTC)
        result = _merge_table(spark.newSession(), src, paths, name[0], name[1], end, changes_path, gold, definitions,
                              files, cfg.spark.conf, silver_schema=silver_schema)
        return replace(result, started_at=started)

    # Tables merge concurrently (each in its own session: invariant 4), at most _MAX_PARALLEL_TABLES at a time so a
    # source with hundreds of tables does not run hundreds of MERGEs (and their materialized sources) at once.
    with ThreadPoolExecutor(max_workers=max(1, min(len(names), _MAX_PARALLEL_TABLES)),
                            thread_name_prefix="slotlake-merge") as pool:
        futures = {name: pool.submit(one, name) for name in names}
        for name, fut in futures.items():
            try:
                results[name] = fut.result()
            except MergeError as e:
                errors.append(str(e))
            except Exception as e:  # a Spark/Delta failure: keep the table's name with it
                log.exception("merge of %s failed", TableName(*name))
                errors.append(f"{TableName(*name)}: {error_summary(e)}")
    if errors:
        raise MergeError(f"merge {source} to {end} failed for {len(errors)} table(s): " + " | ".join(errors))
    report = MergeReport(source, end, tuple(results[n] for n in names), _dropped_tables(spark, paths, end))
    if gold_path_for is not None:
        log.info("%s (custom gold paths: _runs not written)", report.summary())
        return report
    finished = datetime.now(UTC)
    runs = [(int(end), r.schema_name, r.table_name, r.gold_version, finished, r.started_at, r.changes,
             r.last_commit_ts) for r in results.values()]
    # A run over every table marks its commit with the run's end: the sync's no-Spark check (slotlake.pending)
    # reads it as "every table is merged up to silver's end". A run over chosen tables does not.
    record_runs(spark, paths.runs, runs, end, complete=tables is None and end_lsn is None)
    log.info("%s", report.summary())
    return report


def record_runs(spark: SparkSession, runs_path: str, runs: Sequence[tuple], end: Lsn, *, complete: bool) -> None:
    """Adds a run's rows (tuples in `RUNS_SCHEMA` order, every `run_end_lsn` = `end`) to `_runs`, in one commit
    marked as the end of a complete run when `complete`. Keyed by (run end, table), so a re-run adds nothing (a
    re-run after a crash before this commit records 0 changes for the tables the crashed run had already merged:
    their changes are in the gold commits).

    The rows `_runs` already holds for `end` are read with delta-rs (`runs_tables_at`), and the others are one
    append (with delta-rs, `runs.append_runs_directly`): no MERGE (its planning and jobs were ~1.4 s
    of every run's end, bench/README.md). When every row is there and only the complete run's mark is missing (a
    run over chosen tables that were all of them), an append of nothing or a MERGE that inserts nothing would
    commit nothing, so the mark rides a table-property commit (`slotlake.runs.completeEnd`). When delta-rs cannot
    read `_runs`, a MERGE inserts what is missing."""
    from delta.tables import DeltaTable

    ensure_table(spark, runs_path, RUNS_SCHEMA)
    present = runs_tables_at(runs_path, end)
    missing = list(runs) if present is None else [r for r in runs if (r[1], r[2]) not in present]
    if present is not None and not missing and (not complete or delta_log.stage_end(runs_path, RUNS_STAGE) == end):
        return  # a re-run: every row, and the mark, are there
    if complete:
        spark.conf.set(USER_METADATA, stage_metadata(end, RUNS_STAGE))
    try:
        if present is not None and missing:
            if not append_runs_directly(runs_path, missing, end, stage_metadata(end, RUNS_STAGE) if complete
                                         else None):
                spark.createDataFrame(missing, contracts.ddl(RUNS_SCHEMA)).write.format("delta").mode("append") \
                    .save(runs_path)
            return
        if present is not None:  # only the mark is missing
            quoted, prop = runs_path.replace("`", "``"), contracts.RUNS_COMPLETE_PROPERTY
            spark.sql(f"ALTER TABLE delta.`{quoted}` SET TBLPROPERTIES ('{prop}' = '{end}')")
            return
        rows = spark.createDataFrame(list(runs), contracts.ddl(RUNS_SCHEMA))
        # The literal `t.run_end_lsn = end` lets Delta skip every `_runs` file of other runs (one per run: a year
        # of hourly runs is 8,760 files); the join alone reads them all (bench/aged_lake.py).
        (DeltaTable.forPath(spark, runs_path).alias("t")
         .merge(rows.alias("s"), f"t.run_end_lsn = {int(end)} AND t.run_end_lsn = s.run_end_lsn "
                                  "AND t.schema_name = s.schema_name AND t.table_name = s.table_name")
         .whenNotMatchedInsertAll().execute())
    finally:
        if complete:
            spark.conf.unset(USER_METADATA)


def _table_names(spark: SparkSession, silver: Callable[[], DataFrame], src: SourceConfig, end: Lsn,
                 tables: Sequence[str] | Sequence[tuple[str, str]] | None, *, runs_path: str,
                 since: Lsn | None, files: Sequence[SilverFileStats] | None = None) -> list[tuple[str, str]]:
    """The tables a run merges: `tables`, else the config's list, else every table of the source with changes in
    silver up to `end`. With `since` (the end of the last complete run, which merged every table with changes up
    to it and recorded each in `_runs`), those are the tables `_runs` holds for `since` plus the tables with
    changes after it: the same set, from the silver files past `since` (Delta skips the older ones by their
    `commit_lsn` statistics) instead of all of silver. Those tables come from silver's file statistics (`files`)
    when they name them exactly, else from a Spark query."""
    if tables:
        return [TableName.parse(t) if isinstance(t, str) else TableName(t[0], t[1]) for t in tables]
    if src.listed_tables:
        return [TableName.parse(t) for t in src.listed_tables]
    # By end LSN, as each table's own window (`_merge_table`): the first commit after `since` may start exactly
    # there (its commit_lsn == since).
    found = tables_in_window(files, int(since) if since is not None else None, int(end)) \
        if files is not None else None
    if found is None:
        window = F.col("commit_lsn") <= int(end)
        if since is not None:
            window = window & (F.col("commit_end_lsn") > int(since))
        found = {TableName(r[0], r[1]) for r in silver().where(window).select("schema_name", "table_name")
                 .distinct().collect()}
    if since is not None:
        at_since = runs_tables_at(runs_path, since)
        if at_since is None:
            at_since = {(r[0], r[1]) for r in spark.read.format("delta").load(runs_path)
                        .where(F.col("run_end_lsn") == int(since)).select("schema_name", "table_name").collect()}
        found |= {TableName(s, t) for s, t in at_since}
    return sorted(t for t in found if src.syncs(str(t)))


# ---- one table ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Truncate:
    commit_lsn: int
    seq: int
    commit_ts: datetime


def _merge_table(session: SparkSession, src: SourceConfig, paths: LakePaths, schema: str, table: str,
                 end: Lsn, changes_path: str, gold: str, definitions: TableDefinitions,
                 files: Sequence[SilverFileStats] | None = None,
                 user_conf: Mapping[str, str] | None = None, *,
                 silver_schema: Callable[[], StructType]) -> TableMergeResult:
    from delta.tables import DeltaTable

    name = str(TableName(schema, table))
    numeric = partial(src.numeric.unconstrained_for, name)
    state = delta_state(session, gold)
    exists, mark = state.version is not None, state.watermark
    if mark is not None and mark >= end:
        return TableMergeResult(schema, table, 0, state.version, up_to_date=True)
    if files is not None and not has_changes(files, TableName(schema, table),
                                             int(mark) if mark is not None else None, int(end)):
        # No silver file can hold a change of the table in its window: what the query below would count as 0.
        log.debug("merge %s: no silver file holds a change after %s; nothing to do", name, mark)
        return TableMergeResult(schema, table, 0, state.version)
    direct = _silver_files(changes_path, files, TableName(schema, table), mark, end)
    if direct:
        # The files Delta's data skipping would pick, from the statistics already read: read as Parquet with
        # silver's schema (from its log, without Delta's snapshot in the JVM), so the queries over the batch do
        # not each run Delta's file filtering (a Spark job). Listed by the driver, not by a Spark job (Spark's
        # default: one for 32 paths or more).
        session.conf.set(_LISTING_JOB_THRESHOLD, str(len(direct) + 1))
        silver = session.read.schema(silver_schema()).parquet(*direct)
    else:
        silver = session.read.format("delta").load(changes_path)
    batch = silver.where((F.col("schema_name") == schema) & (F.col("table_name") == table)
                         & (F.col("commit_lsn") <= int(end)))
    if mark is not None:
        # The watermark is an end position (a commit's end LSN, a copy's consistent point), and the next commit's
        # record may start exactly there (commit_lsn == the previous commit's end_lsn): select by end LSN.
        batch = batch.where(F.col("commit_end_lsn") > int(mark))
    # A table copied under its own snapshot (added to a running source, or a resumed copy): skip the changes of
    # transactions the copy already holds (docs/internals.md "Snapshot").
    copied = _copy_snapshot(session, gold) if exists else None
    if copied is not None:
        batch = batch.where(not_seen_by_copy(copied))
    # Per column layout (none for TRUNCATE rows) its span and counts: added up from the silver files' footers when
    # the table's files lie wholly in the window (decode/layouts.py), else one Spark pass over the batch.
    groups = footer_groups(changes_path, files, TableName(schema, table), mark, end) if copied is None else None
    if groups is None:
        groups = _spark_groups(batch)
    n = sum(g.n for g in groups)
    if n == 0:
        return TableMergeResult(schema, table, 0, state.version)
    # The table's session, from here on: a small batch's queries run interpreted (no code to generate and compile).
    gold_bytes = _gold_bytes(session, gold) if exists else 0
    codegen = codegen_for_batch(session, n, user_conf or {}, gold_bytes)
    last_commit_ts = max((g.last_ts for g in groups if g.last_ts is not None), default=None)
    trunc = None
    if any(g.truncs for g in groups):  # rare: the last TRUNCATE from its own rows only
        last = batch.where(F.col("op") == "T").agg(F.max(F.struct("commit_lsn", "seq", "commit_ts"))).collect()[0][0]
        trunc = _Truncate(*last)
    plain = sum(g.plain for g in groups)  # plain inserts of the batch
    toast = sum(g.toast for g in groups)
    layouts = layouts_of(batch, [(g.shape_map, g.lo, g.hi) for g in groups if g.shape is not None])
    evo: Evolution | None = None
    schema_changes: list[str] = []
    if not layouts:  # only TRUNCATE in the batch
        if not exists:
            return TableMergeResult(schema, table, n, None, truncated=True, last_commit_ts=last_commit_ts)
        existing = DeltaTable.forPath(session, gold).toDF().schema
        plan = None
        soft = DELETED_COL in existing.fieldNames()
    else:
        start = gold_at_watermark(session, gold, state.marked_version) if exists else None
        events, captured = definitions.column_events(schema, table)
        evo = plan_evolution(name, start, [(lsn, shape) for (lsn, _), shape in layouts], events,
                             mark=int(mark) if mark is not None else -1, on_drop_column=src.on_drop_column,
                             ddl_capture=captured, unconstrained_numeric=numeric)
        plan = unified_plan(name, evo, [shape for _, shape in layouts], src.delete_mode, numeric,
                             keyless_appends=src.keyless_appends(name))
        soft = plan.soft_delete
        wanted = with_types(struct_of(plan.gold_schema), evo)
        if exists:
            schema_changes = evolve_gold(session, gold, name, evo, plan, src.schema_changes)
            diff = schema_mismatch(fields_of(sorted_fields(DeltaTable.forPath(session, gold).toDF().schema)),
                                   fields_of(sorted_fields(wanted)))
            if diff:
                raise MergeError(f"{name}: gold table {gold} does not match the table's definition in silver ({diff}); "
                                 "was it written by something else than slotlake? Resync the table")
        else:
            writer = session.createDataFrame([], wanted).write.format("delta").mode("ignore")
            if needs_column_mapping(wanted.fieldNames()):
                writer = writer.option(COLUMN_MAPPING, "name")
            if src.uses_deletion_vectors(name):  # config `deletion_vectors`
                writer = writer.option(DELETION_VECTORS, "true")
            writer.save(gold)

    after = batch
    if trunc is not None:  # changes before the (last) TRUNCATE are void: it empties the table at its LSN
        after = batch.where((F.col("commit_lsn") > trunc.commit_lsn)
                            | ((F.col("commit_lsn") == trunc.commit_lsn) & (F.col("seq") > trunc.seq)))
    after = after.where(F.col("op") != "T")

    quarantined = unapplied = 0
    source_df: DataFrame | None = None
    append_df: DataFrame | None = None
    if plan is not None and evo is not None:
        # Not cached: each later step reads the table's silver files again and types them as it goes. Building
        # Spark's columnar cache of the typed batch cost more than those reads at millions of changes
        # (bench/README.md, "the merge without its cache"), and held the batch in Spark's memory.
        typed = typed_layouts(after, plan, evo, layouts, numeric)
        # One pass over the typed batch counts what decides the later steps: values to quarantine, key
        # changes (keyed tables), updates/deletes an insert-only table cannot apply.
        # A batch that may be an append also counts, in the same pass, what `_append_rows` decides it by.
        keyed = plan.strategy is KeyStrategy.KEYED
        may_append = trunc is None and (plain == n or plan.strategy is KeyStrategy.INSERT_ONLY)
        checks: Row | dict[str, int]
        if trunc is None and not may_append and (not keyed or not sum(g.old_updates for g in groups)) \
                and _exact_types(evo, layouts, numeric):
            # Known without the pass: no value can be bad (`always_exact` types), no key can change (no update
            # carries an old tuple), and the layout counts hold the updates and deletes.
            checks = {"bad": 0, "moved": 0, "ud": sum(g.ud for g in groups)}
        else:
            checks = typed.agg(F.count(F.when(has_bad_value(plan), 1)).alias("bad"),
                               F.count(F.when(lineage.key_changed(plan), 1) if keyed else F.lit(None)).alias("moved"),
                               F.count(F.when(F.col("op").isin("U", "D"), 1)).alias("ud"),
                               *(_append_aggs(plan, typed) if may_append else [])).collect()[0]
        quarantined = quarantine_bad_values(session, src, paths, plan, typed, end, bad_rows=int(checks["bad"]))
        if may_append:
            append_df = _append_rows(session, plan, typed, gold, checks)
        if append_df is not None:
            if plan.strategy is KeyStrategy.INSERT_ONLY:
                unapplied = int(checks["ud"])
        elif keyed:
            # Gold seeds the lineages only to fill unchanged TOAST: a batch without any needs no read of gold
            # (a soft delete's values then come from gold in the MERGE itself, as `__partial` says).
            source_df = lineage.keyed_source(plan, typed, None if trunc or not toast
                                             else DeltaTable.forPath(session, gold).toDF(), toast=toast > 0,
                                             key_changes=int(checks["moved"]), base_lsn=_long_base(groups))
        elif plan.strategy is KeyStrategy.FULL_ROW:
            source_df = lineage.full_row_source(
                plan, typed, None if trunc else DeltaTable.forPath(session, gold).toDF())
        else:
            unapplied = int(checks["ud"])
            source_df = typed.where(F.col("op") == "I").select(*lineage.value_cols(plan), *lineage.meta_cols())
    if src.keeps_history(name) and gold == paths.gold(schema, table):  # not a replay's own gold paths
        from slotlake.merge.history_job import HistoryBatch, write_history

        write_history(session, HistoryBatch(src, paths, schema, table, end, batch, plan, evo, layouts, gold,
                                            mark))
    if unapplied:
        log.warning("%s is merged insert-only (REPLICA IDENTITY NOTHING, or keyless): %d update(s)/"
                    "delete(s) up to %s cannot be applied", name, unapplied, end)
    dv = src.uses_deletion_vectors(name)  # config `deletion_vectors`
    if exists:  # (a new table got it when created above)
        set_deletion_vectors(session, gold, dv)
    if dv and _BROADCAST_THRESHOLD not in (user_conf or {}):
        # A MERGE with deletion vectors joins its source with the touched files' rows (key, file path, row
        # index) and may broadcast that side, which Spark sizes from gold's compressed files scaled to the key
        # column: 10 M pgbench accounts were estimated under the 10 MB default and built a 1.1 GB hash table
        # (driver out of memory). At 1 MB a broadcast target stays small whatever the estimate's error
        # (bench/README.md, "Big gold tables").
        session.conf.set(_BROADCAST_THRESHOLD, str(_DV_BROADCAST_BYTES))
    keys = None
    small = n < spark_session.SMALL_BATCH_ROWS  # the sizes `codegen_for_batch` decides by
    if exists and trunc is None and source_df is not None and plan is not None \
            and plan.strategy is KeyStrategy.KEYED and (dv or (small and gold_bytes >= spark_session.SMALL_GOLD_BYTES)):
        # Gold's rows the MERGE can match lie within the batch's keys: said in its condition, Delta skips every
        # gold file whose key statistics hold none of them (recent keys of a big table: the files of the newest
        # rows) instead of reading the key column of all of gold (bench/README.md, "Big gold tables: the batch's
        # keys prune a copy-on-write MERGE"). Not for a big batch: finding its keys would be one more pass over it.
        keys = _key_filter(plan, source_df, ranges=small)
    _execute_merge(session, src, gold, schema, table, end, plan, soft, source_df, trunc, append_df, keys)
    version, metrics = _last_commit(session, gold)
    rewrite = rewrite_note(TableName(schema, table), metrics, dv)
    result = TableMergeResult(
        schema, table, n, version,
        rows_inserted=int(metrics.get("numTargetRowsInserted", metrics.get("numOutputRows", 0))),  # MERGE | append
        rows_updated=int(metrics.get("numTargetRowsUpdated", 0)),
        rows_deleted=int(metrics.get("numTargetRowsDeleted", 0)),
        quarantined=quarantined, unapplied=unapplied, truncated=trunc is not None,
        schema_changes=tuple(schema_changes),
        notes=(*(evo.notes if evo is not None else ()), *((rewrite,) if rewrite else ())),
        last_commit_ts=last_commit_ts)
    log.info("merged %s: %d change(s) up to %s -> gold version %s (+%d ~%d -%d rows, %d quarantined%s)",
             name, n, end, version, result.rows_inserted, result.rows_updated, result.rows_deleted, quarantined,
             f"; {codegen}" if codegen else "")
    return result


def _long_base(groups: Sequence[LayoutGroup]) -> int | None:
    """`lineage.long_base` of the batch's commit LSNs, from its layout groups' first and last changes."""
    return lineage.long_base(min((g.lo[0] for g in groups if g.lo is not None), default=None),
                             max((g.hi[0] for g in groups if g.hi is not None), default=None))


def _exact_types(evo: Evolution, layouts: Sequence[Layout], numeric: Callable[[str], str]) -> bool:
    """Whether every column of every layout of the batch is typed without a possible bad value (`always_exact`,
    as `typed_layouts` types it)."""
    return all(always_exact(shape.type_oids[p], shape.typmods[p], numeric(shape.columns[p]))
               for ((_, shape), positions) in zip(layouts, evo.positions, strict=True)
               for p in positions if p is not None)


def _spark_groups(batch: DataFrame) -> list[LayoutGroup]:
    """One pass over the batch: per column layout (none for TRUNCATE rows) what `LayoutGroup` holds."""
    rows = batch.groupBy(F.when(F.col("op") != "T", shape_col()).alias("shape")).agg(
        F.count(F.lit(1)).alias("n"),
        F.min(lineage.change_number()).alias("lo"), F.max(lineage.change_number()).alias("hi"),
        F.count(F.when(F.col("op") == "T", 1)).alias("truncs"),
        # plain inserts (no unchanged TOAST): when every change is one, the write may be an append (_append_rows)
        F.count(F.when((F.col("op") == "I") & (F.coalesce(F.size("unchanged"), F.lit(0)) <= 0), 1)).alias("plain"),
        # changes with unchanged TOAST: only they need gold's rows to fill values (_keyed_final's seeds)
        F.count(F.when(F.coalesce(F.size("unchanged"), F.lit(0)) > 0, 1)).alias("toast"),
        F.max("commit_ts").alias("last_ts"),
        F.count(F.when(F.col("op").isin("U", "D"), 1)).alias("ud"),
        # updates with an old tuple: only they can change a key
        F.count(F.when((F.col("op") == "U") & F.col("old").isNotNull(), 1)).alias("old_u"),
    ).collect()

    # Spark returns naive datetimes in this process's local time (and reads naive ones back the same way).
    return [LayoutGroup(None if r["shape"] is None else shape_of(r["shape"][f] for f in SHAPE_FIELDS),
                        int(r["n"]), lineage.change_of(r["lo"]) if r["lo"] is not None else None,
                        lineage.change_of(r["hi"]) if r["hi"] is not None else None,
                        int(r["truncs"]), int(r["plain"]), int(r["toast"]),
                        micros(r["last_ts"].astimezone(UTC)) if r["last_ts"] is not None else None, int(r["ud"]),
                        int(r["old_u"])) for r in rows]


def _silver_files(changes_path: str, files: Sequence[SilverFileStats] | None, table: TableName, mark: Lsn | None,
                  end: Lsn) -> list[str] | None:
    """The local paths of the silver files that may hold `table`'s changes in (mark, end], from silver's
    statistics; None when they are not known or the lake is not local (the merge reads silver through Delta)."""
    if files is None:
        return None
    chosen = files_to_read(files, table, int(mark) if mark is not None else None, int(end))
    return local_files(changes_path, chosen) if chosen else None


def _dropped_tables(spark: SparkSession, paths: LakePaths, end: Lsn) -> tuple[str, ...]:
    """Tables the catalog marks dropped (their newest version closed by a DDL drop) at or before `end`."""
    from slotlake.catalog import read_catalog

    latest: dict[int, CatalogVersion] = {}
    for v in read_catalog(spark, paths.catalog):
        if v.rel_oid not in latest or v.version > latest[v.rel_oid].version:
            latest[v.rel_oid] = v
    return tuple(sorted(f"{TableName(v.schema_name, v.table_name)} (dropped at {Lsn(v.valid_to_lsn)})"
                        for v in latest.values() if v.valid_to_lsn is not None and v.valid_to_lsn <= int(end)))


def _copy_snapshot(session: SparkSession, gold: str) -> CopySnapshot | None:
    from slotlake.merge.snapshot_job import gold_copy_snapshot  # imported late: snapshot_job imports this module

    return gold_copy_snapshot(session, gold)


def _gold_bytes(session: SparkSession, gold: str) -> int:
    """The size of gold's current files: from its log with delta-rs, else its Delta snapshot's (Spark)."""
    from delta.tables import DeltaTable

    size = table_bytes(gold)
    if size is not None:
        return size
    row = DeltaTable.forPath(session, gold).detail().select("sizeInBytes").first()
    return int(row[0] or 0) if row is not None else 0


def _last_commit(session: SparkSession, gold: str) -> tuple[int, dict[str, str]]:
    from delta.tables import DeltaTable

    if delta_log.readable(gold):
        newest = next(delta_log.commits(gold), None)
        if newest is not None:
            return newest.version, {k: str(v) for k, v in newest.metrics.items()}
    row = DeltaTable.forPath(session, gold).history(1).collect()[0]
    return int(row["version"]), dict(row["operationMetrics"] or {})


# ---- the one Delta commit ----------------------------------------------------------------------------------

_PRUNABLE = (NumericType, StringType, DateType, TimestampType, TimestampNTZType, BooleanType)


def _append_keys(plan: TablePlan, typed: DataFrame) -> tuple[list[int], list[int]]:
    """The key positions an append is checked by (KEYED: the key columns; FULL: every column; NOTHING: none),
    and those of them whose value ranges prune gold's files."""
    if plan.strategy is KeyStrategy.INSERT_ONLY:
        return [], []
    keys = list(plan.key_positions) if plan.strategy is KeyStrategy.KEYED else list(range(len(plan.shape.columns)))
    prunable = [k for k in keys if isinstance(typed.schema[f"__n{k}"].dataType, _PRUNABLE)]
    # Strings only when no other column can prune: their min/max per row cost the checks pass a quarter of its
    # time (bench/README.md, "2026-11-29, evening"), and the columns that keep appends apart from gold's rows
    # (serial keys, event times) are numbers and times.
    return keys, [k for k in prunable if not isinstance(typed.schema[f"__n{k}"].dataType, StringType)] or prunable


def _append_aggs(plan: TablePlan, typed: DataFrame) -> list:
    """Aggregates over the batch's inserts that `_append_rows` decides by: their number (`a_n`), their distinct
    keys (`a_keys`, KEYED) and, per prunable key column k, its range and NULLs (`a_lo{k}`, `a_hi{k}`,
    `a_nulls{k}`). Computed in the merge's one pass over the typed batch."""
    keys, prunable = _append_keys(plan, typed)
    if not keys:
        return []
    ins = F.col("op") == "I"
    aggs = [F.count(F.when(ins, 1)).alias("a_n")]
    if plan.strategy is KeyStrategy.KEYED:  # FULL rows may repeat: `_slotlake_dup` numbers the copies
        aggs.append(F.count_distinct(F.when(ins, F.struct(*[F.col(f"__n{k}") for k in keys]))).alias("a_keys"))
    for k in prunable:
        v = F.when(ins, F.col(f"__n{k}"))
        aggs += [F.min(v).alias(f"a_lo{k}"), F.max(v).alias(f"a_hi{k}"),
                 F.count(F.when(ins & F.col(f"__n{k}").isNull(), 1)).alias(f"a_nulls{k}")]
    return aggs


def _append_rows(session: SparkSession, plan: TablePlan, typed: DataFrame, gold: str,
                 r: Row | dict[str, int]) -> DataFrame | None:
    """The batch as gold rows to append, when appending them is exactly what the MERGE would do; else None.

    The caller has checked that the batch holds no TRUNCATE and only plain inserts (NOTHING tables: only the
    inserts are ever applied), and aggregated the inserts (`r`: `_append_aggs`). Then the MERGE inserts every row
    and updates none, unless gold already holds a row with the same key (KEYED: the key columns, a soft-deleted
    row included; FULL: the whole row, whose copies `_slotlake_dup` numbers) or the batch repeats a key: those
    batches keep the MERGE. That check reads only the gold files whose column statistics overlap the batch's value
    ranges (Delta data skipping), not all of gold, and when no file is left (new serial keys, new commit times)
    it reads neither gold nor the batch.
    """
    from delta.tables import DeltaTable

    shape = plan.shape
    inserts = typed.where(F.col("op") == "I")
    keys, prunable = _append_keys(plan, typed)
    if keys:
        if plan.strategy is KeyStrategy.KEYED and r["a_keys"] != r["a_n"]:
            return None  # a key inserted twice: the MERGE keeps the last one
        target = DeltaTable.forPath(session, gold).toDF()
        for k in prunable:
            c = F.col(_q(shape.columns[k]))
            within = c.between(r[f"a_lo{k}"], r[f"a_hi{k}"]) if r[f"a_lo{k}"] is not None else F.lit(False)
            target = target.where(within | c.isNull() if r[f"a_nulls{k}"] else within)
        # No gold file left after skipping by those ranges (an empty gold; keys or times past gold's, as serial
        # keys and commit times are): no row can match, so the batch is not read for the join.
        if target.inputFiles():
            # A semi join needs no distinct keys (and a whole-row distinct of a big FULL batch is a costly
            # aggregation).
            batch_keys = inserts.select(*[F.col(f"__n{k}").alias(f"__k{j}") for j, k in enumerate(keys)])
            cond = lineage.and_all([target[_q(shape.columns[k])].eqNullSafe(batch_keys[f"__k{j}"])
                                    for j, k in enumerate(keys)])
            if _gold_holds_any(target, batch_keys, cond):
                return None  # gold holds one of these keys: the MERGE updates (or revives) it
    cols = [F.col(f"__n{i}").alias(c) for i, c in enumerate(shape.columns)]
    meta = [F.col("commit_lsn").alias(LSN_COL), F.col("commit_ts").alias(COMMIT_TS_COL)]
    if plan.strategy is KeyStrategy.FULL_ROW:
        # As the MERGE numbers them: copies 1..n of each distinct row, all with the row's last change's LSN/time.
        # One hash aggregation per distinct row (a window over every column would sort the whole batch). The last
        # change is the one of the last commit: its LSN is the greatest, and every change of a commit has its
        # time, so no (commit_lsn, seq) number is needed (its decimal arithmetic per row cost the append ~30%).
        per_row = inserts.groupBy(*cols).agg(F.count(F.lit(1)).alias("__copies"),
                                             F.max("commit_lsn").alias(LSN_COL),
                                             F.max_by("commit_ts", "commit_lsn").alias(COMMIT_TS_COL))
        out = per_row.select(*[_q(c) for c in shape.columns], LSN_COL, COMMIT_TS_COL,
                             F.explode(F.sequence(F.lit(1), F.col("__copies").cast("int"))).alias(DUP_COL))
    else:
        out = inserts.select(*cols, *meta)
    if plan.soft_delete:
        out = out.withColumn(DELETED_COL, F.lit(False))
    fields = DeltaTable.forPath(session, gold).toDF().schema.fields
    return out.select(*[F.col(_q(f.name)).cast(f.dataType).alias(f.name) for f in fields])


def _gold_holds_any(target: DataFrame, batch_keys: DataFrame, cond) -> bool:
    """Whether a row of `target` (gold, skipped by the batch's key ranges) matches one of `batch_keys`."""
    return bool(target.join(batch_keys, cond, "left_semi").limit(1).count())


def _key_filter(plan: TablePlan, source_df: DataFrame, ranges: bool) -> Column | None:
    """For a keyed MERGE: a condition on gold's key columns that every row the MERGE can match passes, built from
    the batch's own match keys. Each key column IN the batch's values of it when the batch has at most
    `_KEY_FILTER_MAX` keys, else (`ranges`) BETWEEN its least and greatest value; OR NULL where the batch has a
    NULL. Delta skips the gold files whose statistics hold no such key, and Spark filters the rows of the others
    before the MERGE's joins: a few hundred keys of a 10 M-row table join as a few hundred rows, not as every row
    of the files they touch (bench/README.md, "Big gold tables"). None when a key column has another type than
    integers and strings (values that round-trip through Python exactly), or the batch has more keys and not
    `ranges`."""
    nkeys = len(plan.key_positions)
    names = [f"__k{j}" for j in range(nkeys)]
    if not all(isinstance(source_df.schema[c].dataType, (IntegralType, StringType)) for c in names):
        return None
    cols = [F.col(f"t.{_q(plan.shape.columns[k])}") for k in plan.key_positions]
    rows = source_df.select(*names).distinct().limit(_KEY_FILTER_MAX + 1).collect()
    conds = []
    if len(rows) <= _KEY_FILTER_MAX:
        for j, col in enumerate(cols):
            values = sorted({r[j] for r in rows if r[j] is not None})
            cond = col.isin(values) if values else F.lit(False)
            conds.append(cond | col.isNull() if any(r[j] is None for r in rows) else cond)
        return lineage.and_all(conds)
    if not ranges:
        return None
    bounds = source_df.agg(*[F.min(c).alias(f"min{j}") for j, c in enumerate(names)],
                           *[F.max(c).alias(f"max{j}") for j, c in enumerate(names)],
                           *[F.count(F.when(F.col(c).isNull(), 1)).alias(f"nulls{j}")
                             for j, c in enumerate(names)]).collect()[0]
    for j, col in enumerate(cols):
        lo, hi = bounds[f"min{j}"], bounds[f"max{j}"]
        cond = col.between(lo, hi) if lo is not None else F.lit(False)
        conds.append(cond | col.isNull() if bounds[f"nulls{j}"] else cond)
    return lineage.and_all(conds)


def _execute_merge(session: SparkSession, src: SourceConfig, gold: str, schema: str, table: str, end: Lsn,
                   plan: TablePlan | None, soft: bool, source_df: DataFrame | None, trunc: _Truncate | None,
                   append_df: DataFrame | None = None, key_filter: Column | None = None) -> None:
    from delta.tables import DeltaTable

    target = DeltaTable.forPath(session, gold).alias("t")
    if append_df is not None:  # insert-only batch (_append_rows): a plain append, same commit settings
        builder = None
    elif plan is None or source_df is None:  # TRUNCATE only: an empty source, every gold row unmatched
        builder = target.merge(session.range(0).alias("s"), F.lit(False))
    else:
        cols = plan.shape.columns
        values = {_q(c): F.col(f"s.__v{i}") for i, c in enumerate(cols)}
        meta = {_q(LSN_COL): F.col("s.__lsn"), _q(COMMIT_TS_COL): F.col("s.__ts")}
        live = {_q(DELETED_COL): F.lit(False)} if soft else {}
        is_del = F.col("s.__action") == "D"
        if plan.strategy is KeyStrategy.KEYED:
            cond = lineage.and_all([F.col(f"t.{_q(cols[k])}").eqNullSafe(F.col(f"s.__k{j}"))
                         for j, k in enumerate(plan.key_positions)])
            if key_filter is not None:
                cond = cond & key_filter
            builder = target.merge(source_df.alias("s"), cond)
            if soft:
                # A soft-deleted row keeps its last state; values a partial lineage lacks keep gold's.
                kept = {_q(c): F.when(F.col("s.__partial") & F.col(f"s.__v{i}").isNull(), F.col(f"t.{_q(c)}"))
                        .otherwise(F.col(f"s.__v{i}")) for i, c in enumerate(cols)}
                builder = builder.whenMatchedUpdate(is_del & ~F.col(f"t.{_q(DELETED_COL)}"),
                                                    {**kept, **meta, _q(DELETED_COL): F.lit(True)})
                builder = builder.whenMatchedUpdate(~is_del, {**values, **meta, **live})
                builder = builder.whenNotMatchedInsert(~F.col("s.__partial"), {
                    **values, **meta, _q(DELETED_COL): is_del})
            else:
                builder = builder.whenMatchedDelete(is_del)
                builder = builder.whenMatchedUpdate(~is_del, {**values, **meta})
                builder = builder.whenNotMatchedInsert(~is_del, {**values, **meta})
        elif plan.strategy is KeyStrategy.FULL_ROW:
            cond = lineage.and_all([F.col(f"t.{_q(c)}").eqNullSafe(F.col(f"s.__v{i}")) for i, c in enumerate(cols)]
                        + [F.col(f"t.{_q(DUP_COL)}") == F.col("s.__dup")])
            builder = target.merge(source_df.alias("s"), cond)
            dup = {_q(DUP_COL): F.col("s.__dup")}
            if soft:
                builder = builder.whenMatchedUpdate(is_del, {**meta, _q(DELETED_COL): F.lit(True)})
                builder = builder.whenMatchedUpdate(~is_del, {**meta, **live})
            else:
                builder = builder.whenMatchedDelete(is_del)
                builder = builder.whenMatchedUpdate(~is_del, {**meta})
            builder = builder.whenNotMatchedInsert(~is_del, {**values, **meta, **live, **dup})
        else:  # insert-only
            builder = target.merge(source_df.alias("s"), F.lit(False))
            builder = builder.whenNotMatchedInsert(values={**values, **meta, **live})
    if trunc is not None and builder is not None:
        if soft:
            builder = builder.whenNotMatchedBySourceUpdate(~F.col(f"t.{_q(DELETED_COL)}"), {
                _q(DELETED_COL): F.lit(True), _q(LSN_COL): F.lit(trunc.commit_lsn),
                _q(COMMIT_TS_COL): F.lit(trunc.commit_ts)})
        else:
            builder = builder.whenNotMatchedBySourceDelete()
    conf = merge_commit_conf(src.name, schema, table, end)
    for k, v in conf.items():
        session.conf.set(k, v)
    try:
        if builder is not None:
            builder.execute()
        elif append_df is not None:
            append_df.write.format("delta").mode("append").save(gold)
    finally:
        for k in (TXN_APP_ID, TXN_VERSION, USER_METADATA):
            session.conf.unset(k)
    # Test-only failpoint: the process dies right after the first table's commit, before the others and `_runs`.
    failpoints.die_at(failpoints.MERGE_AFTER_FIRST_TABLE)
