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
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    MapType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from slotlake import delta_log
from slotlake.catalog import CatalogVersion
from slotlake.config import Config, SchemaChanges, SourceConfig
from slotlake.decode.types import typed_value
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.evolution import ColumnHistoryEvent, Evolution, column_events, plan_evolution
from slotlake.merge.plan import (
    COLUMN_MAPPING,
    COMMIT_TS_COL,
    DELETED_COL,
    DUP_COL,
    LSN_COL,
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    KeyStrategy,
    TablePlan,
    TableShape,
    merge_commit_conf,
    needs_column_mapping,
    newest_watermark,
    plan_table,
    schema_mismatch,
    stage_metadata,
)
from slotlake.merge.visibility import CopySnapshot
from slotlake.names import TableName
from slotlake.names import spark_ident as _q
from slotlake.pending import RUNS_STAGE
from slotlake.spark.session import error_summary
from slotlake.spark.visibility import not_seen_by_copy

log = logging.getLogger(__name__)

QUARANTINE_SCHEMA = StructType([
    StructField("schema_name", StringType()), StructField("table_name", StringType()),
    StructField("column_name", StringType()), StructField("type_oid", IntegerType()),
    StructField("raw_value", StringType()), StructField("reason", StringType()),
    StructField("commit_lsn", LongType()), StructField("xid", LongType()), StructField("seq", IntegerType()),
    StructField("detected_at", TimestampType()),
    # The row's replica identity key (column -> PostgreSQL text); the whole row for FULL / NOTHING identity.
    # Added after the first release: older _quarantine tables get it by ALTER TABLE ADD COLUMNS (_ensure_table).
    StructField("row_key", MapType(StringType(), StringType())),
])
RUNS_SCHEMA = StructType([
    StructField("run_end_lsn", LongType()), StructField("schema_name", StringType()),
    StructField("table_name", StringType()), StructField("gold_version", LongType()),
    StructField("finished_at", TimestampType()),
])
_MAX_LINEAGE_ROUNDS = 64
_RECENT_COMMITS = 20
_MAX_PARALLEL_TABLES = 8
TEXT_OID = 25


@dataclass(frozen=True)
class TableMergeResult:
    schema_name: str
    table_name: str
    changes: int  # silver rows of the table in (watermark, run end]
    gold_version: int | None  # Delta version after the run (None: no gold table yet)
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    quarantined: int = 0  # values the gold type cannot hold (raw text in _quarantine)
    unapplied: int = 0  # updates/deletes of a REPLICA IDENTITY NOTHING table (cannot be applied)
    truncated: bool = False
    up_to_date: bool = False  # the table's watermark was already at the run end: nothing done
    schema_changes: tuple[str, ...] = ()  # what the run did to the gold schema ("added c", "renamed a to b", ...)
    notes: tuple[str, ...] = ()  # what slotlake could not see (e.g. defaults of columns added without DDL capture)


@dataclass(frozen=True)
class MergeReport:
    source: str
    end_lsn: Lsn | None  # None: silver has no decoded changes yet
    tables: tuple[TableMergeResult, ...]
    dropped_tables: tuple[str, ...] = ()  # tables the catalog marks dropped: no changes any more, gold kept

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(n for t in self.tables for n in t.notes)

    @property
    def quarantined(self) -> int:
        return sum(t.quarantined for t in self.tables)

    @property
    def unapplied(self) -> int:
        return sum(t.unapplied for t in self.tables)

    def summary(self) -> str:
        changed = sum(t.changes for t in self.tables)
        out = (f"merge {self.source}: {len(self.tables)} table(s) at {self.end_lsn}, {changed} change(s), "
               f"{self.quarantined} quarantined value(s), {self.unapplied} unapplied change(s)")
        evolved = [f"{TableName(t.schema_name, t.table_name)}: {', '.join(t.schema_changes)}" for t in self.tables
                   if t.schema_changes]
        if evolved:
            out += "; schema changes: " + "; ".join(evolved)
        if self.dropped_tables:
            out += "; dropped in the source (gold kept): " + ", ".join(self.dropped_tables)
        if self.notes:
            out += "; NOTE: " + " | ".join(self.notes)
        return out


# ---- watermarks --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeltaState:
    """What a Delta table's history says: its latest version and the newest slotlake watermark."""

    version: int | None  # None: no Delta table at the path
    watermark: Lsn | None
    marked_version: int | None = None  # the version of the newest commit with a watermark


def delta_state(spark: SparkSession, path: str) -> DeltaState:
    """Latest version and watermark (end LSN of the newest commit with slotlake userMetadata) of `path`."""
    from delta.tables import DeltaTable

    if delta_log.readable(path):
        local = _local_delta_state(path)
        if local is not None:
            return local
    if not DeltaTable.isDeltaTable(spark, path):
        return DeltaState(None, None)
    table = DeltaTable.forPath(spark, path)
    # The newest commits first: every slotlake write carries the watermark, so the full history (a month of
    # hourly commits) is read only when the recent ones are all someone else's (OPTIMIZE, VACUUM, ...).
    def history(limit: int | None) -> list[tuple[int, str | None]]:
        h = table.history(limit) if limit else table.history()
        return [(r["version"], r["userMetadata"]) for r in h.select("version", "userMetadata").collect()]

    rows = history(_RECENT_COMMITS)
    newest = newest_watermark(rows)
    if newest is None and len(rows) >= _RECENT_COMMITS:
        rows = history(None)
        newest = newest_watermark(rows)
    return DeltaState(max(v for v, _ in rows), newest[1] if newest else None, newest[0] if newest else None)


def _local_delta_state(path: str) -> DeltaState | None:
    """`delta_state` from the JSON commits of a local table, without a Spark job (each history() call is one or
    more, several per table and run); None when the log holds no JSON commit (only a checkpoint): ask Spark."""
    if not delta_log.is_delta_table(path):
        return DeltaState(None, None)
    version = None
    for c in delta_log.commits(path):
        if version is None:
            version = c.version
        if c.end_lsn is not None:
            try:
                return DeltaState(version, Lsn.parse(c.end_lsn), c.version)
            except (ValueError, TypeError):
                pass  # not a watermark (as `watermark_of` skips it)
    return DeltaState(version, None, None) if version is not None else None


def delta_watermark(spark: SparkSession, path: str) -> Lsn | None:
    """The end LSN recorded by the newest slotlake commit of the Delta table at `path` (None: none/no table)."""
    return delta_state(spark, path).watermark


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

    For replays: `silver_path` reads another changes table, `gold_path_for(schema, table)` writes other gold
    paths (then `_runs` is not written: those tables are not the lake's gold), `end_lsn` stops earlier than
    silver's watermark.
    """
    from delta.tables import DeltaTable

    src = cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    # Initial copies complete but not in gold yet are loaded first, so changes apply on top of them (issue 4).
    from slotlake.spark.snapshot_job import load_snapshots

    load_snapshots(spark, cfg, source)
    changes_path = silver_path or paths.changes
    end = delta_state(spark, changes_path).watermark
    if end is None:
        log.info("merge %s: silver has no decoded changes yet (%s)", source, changes_path)
        return MergeReport(source, None, ())
    if end_lsn is not None:
        end = min(end, Lsn.parse(end_lsn))
    silver = spark.read.format("delta").load(changes_path)
    names = _table_names(silver, src, end, tables)
    ensure_quarantine(spark, paths.quarantine)
    results: dict[tuple[str, str], TableMergeResult] = {}
    errors: list[str] = []
    definitions = _table_definitions(spark, paths, end)

    def one(name: tuple[str, str]) -> TableMergeResult:
        gold = gold_path_for(*name) if gold_path_for else paths.gold(*name)
        return _merge_table(spark.newSession(), src, paths, name[0], name[1], end, changes_path, gold, definitions)

    # Tables merge concurrently (each in its own session: invariant 4), at most _MAX_PARALLEL_TABLES at a time so a
    # source with hundreds of tables does not hold hundreds of cached batches in the driver at once.
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
    runs = spark.createDataFrame(
        [(int(end), r.schema_name, r.table_name, r.gold_version, finished) for r in results.values()], RUNS_SCHEMA)
    _ensure_table(spark, paths.runs, RUNS_SCHEMA)
    # A run over every table marks its commit with the run's end: the sync's no-Spark check (slotlake.pending)
    # reads it as "every table is merged up to silver's end". A run over chosen tables does not.
    if tables is None and end_lsn is None:
        spark.conf.set(USER_METADATA, stage_metadata(end, RUNS_STAGE))
    try:
        # Keyed by (run end, table) so a re-run adds nothing.
        (DeltaTable.forPath(spark, paths.runs).alias("t")
         .merge(runs.alias("s"), "t.run_end_lsn = s.run_end_lsn AND t.schema_name = s.schema_name "
                                  "AND t.table_name = s.table_name")
         .whenNotMatchedInsertAll().execute())
    finally:
        spark.conf.unset(USER_METADATA)
    log.info("%s", report.summary())
    return report


def _table_names(silver: DataFrame, src: SourceConfig, end: Lsn,
                 tables: Sequence[str] | Sequence[tuple[str, str]] | None) -> list[tuple[str, str]]:
    if tables:
        return [TableName.parse(t) if isinstance(t, str) else TableName(t[0], t[1]) for t in tables]
    if src.listed_tables:
        return [TableName.parse(t) for t in src.listed_tables]
    rows = (silver.where(F.col("commit_lsn") <= int(end)).select("schema_name", "table_name").distinct()
            .orderBy("schema_name", "table_name").collect())
    return [TableName(r[0], r[1]) for r in rows if src.syncs(str(TableName(r[0], r[1])))]


def _ensure_table(spark: SparkSession, path: str, schema: StructType) -> None:
    """Create the Delta table, or add the columns of `schema` it lacks (a table an older slotlake created: its
    rows get NULL there, and appends with the full schema keep working)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        spark.createDataFrame([], schema).write.format("delta").mode("ignore").save(path)
        return
    have = set(DeltaTable.forPath(spark, path).toDF().columns)
    missing = [f for f in schema.fields if f.name not in have]
    if missing:
        spark.sql(f"ALTER TABLE delta.`{path.replace('`', '``')}` ADD COLUMNS (" + ", ".join(
            f"{_q(f.name)} {f.dataType.simpleString()}" for f in missing) + ")")


def ensure_quarantine(spark: SparkSession, path: str) -> None:
    """Create `_quarantine`, or add the columns an older one lacks; call before writers run in parallel."""
    _ensure_table(spark, path, QUARANTINE_SCHEMA)


# ---- one table ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Truncate:
    commit_lsn: int
    seq: int
    commit_ts: datetime


def _merge_table(session: SparkSession, src: SourceConfig, paths: LakePaths, schema: str, table: str,
                 end: Lsn, changes_path: str, gold: str, definitions: _TableDefinitions) -> TableMergeResult:
    from delta.tables import DeltaTable

    name = str(TableName(schema, table))
    numeric = partial(src.numeric.unconstrained_for, name)
    state = delta_state(session, gold)
    exists, mark = state.version is not None, state.watermark
    if mark is not None and mark >= end:
        return TableMergeResult(schema, table, 0, state.version, up_to_date=True)
    batch = (session.read.format("delta").load(changes_path)
             .where((F.col("schema_name") == schema) & (F.col("table_name") == table)
                    & (F.col("commit_lsn") <= int(end))))
    if mark is not None:
        # The watermark is an end position (a commit's end LSN, a copy's consistent point), and the next commit's
        # record may start exactly there (commit_lsn == the previous commit's end_lsn): select by end LSN.
        batch = batch.where(F.col("commit_end_lsn") > int(mark))
    # A table copied under its own snapshot (added to a running source, or a resumed copy): skip the changes of
    # transactions the copy already holds (docs/internals.md "Snapshot").
    copied = _copy_snapshot(session, gold) if exists else None
    if copied is not None:
        batch = batch.where(not_seen_by_copy(copied))
    # One pass over the batch: per column layout (NULL for TRUNCATE rows) its span and counts.
    groups = batch.groupBy(F.when(F.col("op") != "T", _shape_col()).alias("shape")).agg(
        F.count(F.lit(1)).alias("n"),
        F.min(_change_id()).alias("lo"), F.max(_change_id()).alias("hi"),
        F.max(F.when(F.col("op") == "T", F.struct("commit_lsn", "seq", "commit_ts"))).alias("trunc"),
        # plain inserts (no unchanged TOAST): when every change is one, the write may be an append (_append_rows)
        F.count(F.when((F.col("op") == "I") & (F.coalesce(F.size("unchanged"), F.lit(0)) <= 0), 1)).alias("plain"),
        # changes with unchanged TOAST: only they need gold's rows to fill values (_keyed_final's seeds)
        F.count(F.when(F.coalesce(F.size("unchanged"), F.lit(0)) > 0, 1)).alias("toast"),
    ).collect()
    n = sum(int(g["n"]) for g in groups)
    if n == 0:
        return TableMergeResult(schema, table, 0, state.version)
    truncs = [tuple(g["trunc"]) for g in groups if g["trunc"] is not None]
    trunc = _Truncate(*max(truncs)) if truncs else None
    plain = sum(int(g["plain"]) for g in groups)  # plain inserts of the batch
    toast = sum(int(g["toast"]) for g in groups)
    layouts = _layouts(batch, [g for g in groups if g["shape"] is not None])
    evo: Evolution | None = None
    schema_changes: list[str] = []
    if not layouts:  # only TRUNCATE in the batch
        if not exists:
            return TableMergeResult(schema, table, n, None, truncated=True)
        existing = DeltaTable.forPath(session, gold).toDF().schema
        plan = None
        soft = DELETED_COL in existing.fieldNames()
    else:
        start = _gold_at_watermark(session, gold, state.marked_version) if exists else None
        events, captured = definitions.column_events(schema, table)
        evo = plan_evolution(name, start, [(lsn, shape) for (lsn, _), shape in layouts], events,
                             mark=int(mark) if mark is not None else -1, on_drop_column=src.on_drop_column,
                             ddl_capture=captured, unconstrained_numeric=numeric)
        plan = _unified_plan(name, evo, [shape for _, shape in layouts], src.delete_mode, numeric,
                             keyless_appends=src.keyless_appends(name))
        soft = plan.soft_delete
        wanted = _with_types(plan.gold_schema, evo)
        if exists:
            schema_changes = _evolve_gold(session, gold, name, evo, plan, src.schema_changes)
            diff = schema_mismatch(_sorted_fields(DeltaTable.forPath(session, gold).toDF().schema),
                                   _sorted_fields(wanted))
            if diff:
                raise MergeError(f"{name}: gold table {gold} does not match the table's definition in silver ({diff}); "
                                 "was it written by something else than slotlake? Resync the table")
        else:
            writer = session.createDataFrame([], wanted).write.format("delta").mode("ignore")
            if needs_column_mapping(wanted.fieldNames()):
                writer = writer.option(COLUMN_MAPPING, "name")
            writer.save(gold)

    after = batch
    if trunc is not None:  # changes before the (last) TRUNCATE are void: it empties the table at its LSN
        after = batch.where((F.col("commit_lsn") > trunc.commit_lsn)
                            | ((F.col("commit_lsn") == trunc.commit_lsn) & (F.col("seq") > trunc.seq)))
    after = after.where(F.col("op") != "T")

    quarantined = unapplied = 0
    typed: DataFrame | None = None
    source_df: DataFrame | None = None
    append_df: DataFrame | None = None
    try:
        if plan is not None and evo is not None:
            typed = _typed_layouts(after, plan, evo, layouts, numeric).persist(StorageLevel.MEMORY_AND_DISK)
            quarantined = quarantine_bad_values(session, src, paths, plan, typed, end)
            if trunc is None and (plain == n or plan.strategy is KeyStrategy.INSERT_ONLY):
                append_df = _append_rows(session, plan, typed, gold)
            if append_df is not None:
                if plan.strategy is KeyStrategy.INSERT_ONLY:
                    unapplied = typed.where(F.col("op").isin("U", "D")).count()
            elif plan.strategy is KeyStrategy.KEYED:
                # Gold seeds the lineages only to fill unchanged TOAST: a batch without any needs no read of gold
                # (a soft delete's values then come from gold in the MERGE itself, as `__partial` says).
                source_df = _keyed_source(plan, typed, None if trunc or not toast
                                          else DeltaTable.forPath(session, gold).toDF(), toast=toast > 0)
            elif plan.strategy is KeyStrategy.FULL_ROW:
                source_df = _full_row_source(plan, typed, None if trunc else DeltaTable.forPath(session, gold).toDF())
            else:
                unapplied = typed.where(F.col("op").isin("U", "D")).count()
                source_df = typed.where(F.col("op") == "I").select(*_value_cols(plan), *_meta_cols())
        if src.keeps_history(name) and gold == paths.gold(schema, table):  # not a replay's own gold paths
            from slotlake.spark.history_job import HistoryBatch, write_history

            write_history(session, HistoryBatch(src, paths, schema, table, end, batch, plan, evo, layouts, gold,
                                                mark))
        if unapplied:
            log.warning("%s is merged insert-only (REPLICA IDENTITY NOTHING, or keyless): %d update(s)/"
                        "delete(s) up to %s cannot be applied", name, unapplied, end)
        _execute_merge(session, src, gold, schema, table, end, plan, soft, source_df, trunc, append_df)
    finally:
        if typed is not None:
            typed.unpersist()
    version, metrics = _last_commit(session, gold)
    result = TableMergeResult(
        schema, table, n, version,
        rows_inserted=int(metrics.get("numTargetRowsInserted", metrics.get("numOutputRows", 0))),  # MERGE | append
        rows_updated=int(metrics.get("numTargetRowsUpdated", 0)),
        rows_deleted=int(metrics.get("numTargetRowsDeleted", 0)),
        quarantined=quarantined, unapplied=unapplied, truncated=trunc is not None,
        schema_changes=tuple(schema_changes), notes=evo.notes if evo is not None else ())
    log.info("merged %s: %d change(s) up to %s -> gold version %s (+%d ~%d -%d rows, %d quarantined)",
             name, n, end, version, result.rows_inserted, result.rows_updated, result.rows_deleted, quarantined)
    return result


# ---- schema evolution (docs/internals.md "Gold: schema evolution") ------------------------------------------

Layout = tuple[tuple[int, int], TableShape]  # ((commit_lsn, seq) of its first change, shape)


def _shape_of(schema: str, table: str, s) -> TableShape:
    return TableShape(schema, table, tuple(s["columns"]), tuple(s["type_oids"]), tuple(s["typmods"]),
                      tuple(s["key_columns"] or ()), s["replica_identity"])


def _shape_col() -> Column:
    return F.struct("schema_name", "table_name", "columns", "type_oids", "typmods", "key_columns", "replica_identity")


def _change_id() -> Column:
    return F.struct("commit_lsn", "seq")


def _layouts(batch: DataFrame, spans: list) -> list[Layout]:
    """The column layouts of the batch's row changes in commit order, each with the id of its first change.

    `spans`: per layout of the row changes its (shape, lo, hi) change ids (the merge's one pass over the batch).
    Usually one. Several when the source's schema changed: one per switch, so a layout that comes back (a column
    added and dropped again) is a new entry. Only small summaries reach the driver.
    """
    rows = batch.where(F.col("op") != "T")
    shape = _shape_col().alias("shape")
    spans = sorted(spans, key=lambda r: tuple(r["lo"]))
    if all(tuple(a["hi"]) < tuple(b["lo"]) for a, b in zip(spans, spans[1:])):
        return [((int(r["lo"][0]), int(r["lo"][1])), _shape_of(r["shape"]["schema_name"], r["shape"]["table_name"],
                                                              r["shape"])) for r in spans]
    # A layout comes back: find every switch (one row per transaction and layout, ordered; a small result).
    per_tx = rows.groupBy("commit_lsn", shape).agg(F.min("seq").alias("lo"))
    w = Window.orderBy("commit_lsn", "lo")
    switches = (per_tx.withColumn("prev", F.lag("shape").over(w))
                .where(F.col("prev").isNull() | (F.col("prev") != F.col("shape")))
                .orderBy("commit_lsn", "lo").collect())
    return [((int(r["commit_lsn"]), int(r["lo"])), _shape_of(r["shape"]["schema_name"], r["shape"]["table_name"],
                                                            r["shape"])) for r in switches]


def _gold_at_watermark(session: SparkSession, gold: str, marked_version: int | None) -> list[tuple[str, DataType]]:
    """Gold's source columns as of its newest watermarked commit (the state the run starts from; without one,
    the table's first version, the empty table slotlake created).

    Not the latest schema: a run that died after evolving the schema (ALTERs are their own commits) and before
    its merge commit must see the same start again, so the re-run makes the same decisions (defaults included).
    """
    from delta.tables import DeltaTable

    version = marked_version
    if version is None:
        version = min(r["version"] for r in DeltaTable.forPath(session, gold).history().select("version").collect())
    local = delta_log.schema_at(gold, version) if delta_log.readable(gold) else None
    if local is not None:  # the log's schema: no Spark job to resolve a time-travel snapshot
        fields = StructType.fromJson(local).fields
    else:
        fields = session.read.format("delta").option("versionAsOf", version).load(gold).schema.fields
    return [(f.name, f.dataType) for f in fields if not f.name.startswith("_slotlake_")]


@dataclass(frozen=True)
class _TableDefinitions:
    """The bootstrap read's and the DDL events' table definitions up to a run's end, read once per run (not per
    table: each read of `_ddl_log` is several Spark jobs)."""

    definitions: tuple[tuple[int, Any], ...]  # (commit LSN, TableDef)
    captured: bool  # DDL capture in use: `_ddl_log` holds events

    def column_events(self, schema: str, table: str) -> tuple[list[ColumnHistoryEvent], bool]:
        """Renames and adds of the table, and whether DDL capture is in use."""
        return column_events(list(self.definitions), schema, table), self.captured


def _table_definitions(session: SparkSession, paths: LakePaths, end: Lsn) -> _TableDefinitions:
    from delta.tables import DeltaTable

    from slotlake.source.catalog_read import as_published, list_bootstrap
    from slotlake.source.ddl import parse_ddl_event
    from slotlake.spark.decode_job import ddl_log_path

    boots = list_bootstrap(paths.root)
    definitions = [(b.lsn.value, t) for b in boots for t in b.tables]
    log_path = ddl_log_path(paths)
    captured = False
    if DeltaTable.isDeltaTable(session, log_path):
        events = session.read.format("delta").load(log_path).where(F.col("commit_lsn") <= int(end))
        captured = events.limit(1).count() > 0
        for r in events.where(F.size("tables") > 0).select("commit_lsn", "lsn", "event_json") \
                .orderBy("commit_lsn", "lsn").collect():
            definitions += [(int(r["commit_lsn"]), as_published(t, boots, int(r["commit_lsn"])))
                            for t in parse_ddl_event(r["event_json"].encode("utf-8")).tables]
    return _TableDefinitions(tuple(definitions), captured)


def _unified_plan(name: str, evo: Evolution, shapes: list[TableShape], delete_mode: str,
                  unconstrained_numeric: Callable[[str], str], *, keyless_appends: bool = False) -> TablePlan:
    """The plan over gold's columns after the run: type of the newest layout holding each column, its keys."""
    oids, mods = [], []
    for i in range(len(evo.columns)):
        where = [(k, at) for k, p in enumerate(evo.positions) if (at := p[i]) is not None]
        if where:
            k, at = where[-1]
            oids.append(shapes[k].type_oids[at])
            mods.append(shapes[k].typmods[at])
        else:  # a column the source dropped: never typed again (its values are NULL from now on)
            oids.append(TEXT_OID)
            mods.append(-1)
    last = shapes[-1]
    gold_of = {p: evo.columns[i] for i, p in enumerate(evo.positions[-1]) if p is not None}
    keys = tuple(gold_of[last.columns.index(k)] for k in last.key_columns)
    shape = TableShape(last.schema_name, last.table_name, evo.columns, tuple(oids), tuple(mods), keys,
                       last.replica_identity)
    return plan_table(shape, delete_mode, unconstrained_numeric, keyless_appends=keyless_appends)


def _with_types(schema: StructType, evo: Evolution) -> StructType:
    types = dict(zip(evo.columns, evo.types))
    return StructType([StructField(f.name, types.get(f.name, f.dataType), f.nullable) for f in schema.fields])


def _sorted_fields(schema: StructType) -> StructType:
    return StructType(sorted(schema.fields, key=lambda f: f.name))


def _evolve_gold(session: SparkSession, gold: str, name: str, evo: Evolution, plan: TablePlan,
                 modes: SchemaChanges = SchemaChanges()) -> list[str]:
    """Bring gold's schema to `evo` with Delta DDL, each step only if not done yet (a re-run repeats none).

    Returns what was done, for the report. Old rows of an added column get the value PostgreSQL gave them (its
    constant default) by an UPDATE of the rows still NULL, repeated harmlessly by a re-run. Renames, drops and
    widenings follow `modes` (config `schema_changes`): `rewrite` applies them in one rewrite of the table
    (`_rewrite_gold`), `column_mapping` / `type_widening` in place with those Delta table features.
    """
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(session, gold)
    current = {f.name: f.dataType for f in table.toDF().schema.fields}
    props = _LazyProperties(session, gold)  # read only when a schema change needs them (most runs have none)
    ref = f"delta.{_q(gold)}"
    done: list[str] = []
    renames = [(o, n) for o, n in evo.renames if o in current and n not in current]
    drops = [d for d in evo.drops if d in current]
    new_names = [n for _, n in renames] + [a.name for a in evo.adds if a.name not in current]
    if ((modes.rename == "column_mapping" and (renames or drops)) or needs_column_mapping(new_names)) \
            and props.get(COLUMN_MAPPING) != "name":
        # Column mapping by name: a rename or drop changes metadata only, the data files stay as they are; and
        # Delta allows names with spaces, commas, parentheses ... only under it.
        session.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('{COLUMN_MAPPING}' = 'name')")
    rewrite_renames: dict[str, str] = {}
    rewrite_drops: list[str] = []
    if modes.rename == "column_mapping":
        for old, new in renames:
            session.sql(f"ALTER TABLE {ref} RENAME COLUMN {_q(old)} TO {_q(new)}")
            current[new] = current.pop(old)
            done.append(f"renamed {old} to {new}")
    else:
        rewrite_renames = dict(renames)
        current = {rewrite_renames.get(c, c): t for c, t in current.items()}
        rewrite_drops = [d for d in evo.drops if d in current]
        done += [f"renamed {old} to {new}" for old, new in renames]
    widen = [(c, t) for c, t in evo.widen if c in current and current[c] != t]
    rewrite_widen = dict(widen) if modes.widen == "rewrite" else {}
    if rewrite_renames or rewrite_widen or rewrite_drops:
        _rewrite_gold(session, gold, rewrite_renames, rewrite_widen, rewrite_drops)
        done += [f"widened {c} to {t.simpleString()}" for c, t in rewrite_widen.items()]
        log.info("%s: gold table rewritten in a new Delta version (renamed %s, widened %s, dropped %s)", name,
                 rewrite_renames or "-", list(rewrite_widen) or "-", rewrite_drops or "-")
        widen = [] if rewrite_widen else widen
    if widen and props.get("delta.enableTypeWidening") != "true":
        session.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    for c, t in widen:
        try:
            session.sql(f"ALTER TABLE {ref} ALTER COLUMN {_q(c)} TYPE {t.simpleString()}")
        except Exception as e:  # AnalysisException: a change Delta type widening does not support
            raise MergeError(
                f"{name}: column {c} changed type from {current[c].simpleString()} to {t.simpleString()}, which Delta "
                f"type widening cannot apply ({str(e).splitlines()[0][:200]}); rebuild the table: `slotlake resync "
                f"<source>`, or replay it into a new Delta table with `slotlake replay <source> --table {name} "
                "--from <LSN of the change> --to <LSN> --dest <path>`") from None
        done.append(f"widened {c} to {t.simpleString()}")
    adds = [a for a in evo.adds if a.name not in current]
    if adds:
        session.sql(f"ALTER TABLE {ref} ADD COLUMNS (" + ", ".join(
            f"{_q(a.name)} {a.dtype.simpleString()}" for a in adds) + ")")
        done += [f"added {a.name}" for a in adds]
    for a in evo.adds:
        if a.existing_rows is not None:
            i = plan.shape.columns.index(a.name)
            value = typed_value(F.lit(a.existing_rows), plan.shape.type_oids[i], plan.shape.typmods[i],
                                plan.numeric_mode(i))[0]
            # A fresh handle: the one above predates the ALTERs and would not know the column.
            DeltaTable.forPath(session, gold).update(F.col(_q(a.name)).isNull(), {_q(a.name): value.cast(a.dtype)})
    if modes.rename == "column_mapping":
        for d in drops:
            session.sql(f"ALTER TABLE {ref} DROP COLUMN {_q(d)}")
            done.append(f"dropped {d}")
    done += [f"dropped {d}" for d in rewrite_drops]
    done += [f"kept dropped column {c} (NULL from now on)" for c in evo.dropped_kept]
    for line in done:
        log.info("%s: gold schema: %s", name, line)
    return done


class _LazyProperties:
    """A Delta table's properties, read on first use: from the log of a local table, else with Spark."""

    def __init__(self, session: SparkSession, path: str) -> None:
        self._session, self._path = session, path
        self._props: dict[str, str] | None = None

    def get(self, key: str) -> str | None:
        if self._props is None:
            local = delta_log.table_properties(self._path) if delta_log.readable(self._path) else None
            if local is None:
                from delta.tables import DeltaTable

                local = DeltaTable.forPath(self._session, self._path).detail().select("properties").collect()[0][0]
            self._props = dict(local or {})
        return self._props.get(key)


def _rewrite_gold(session: SparkSession, gold: str, renames: dict[str, str], widen: dict[str, DataType],
                  drops: Sequence[str]) -> None:
    """Rename, widen (`widen` by new name) and drop columns by rewriting the whole table in one new Delta version
    (overwrite + overwriteSchema).

    Why not in place: Delta type widening adds the `typeWidening` reader feature, which delta-rs (deltalake, and
    so Polars and most Python readers) refuses, and delta-rs 1.6 reads the columns of a column-mapped table that
    were renamed or added later as NULL. A plain rewrite keeps the protocol as it was. Like the ALTERs, the commit
    carries no slotlake userMetadata, so the watermark stays that of the last merge (the run's MERGE commits the
    new one); table properties and idempotent-write ids (txn actions) survive an overwrite, and earlier versions
    stay readable with time travel. Widening casts are exact: `plan_evolution` only widens to a type that holds
    every value of the old one. Cost: the table's size in I/O, once per run that needs it.
    """
    df = session.read.format("delta").load(gold)
    cols = []
    for f in df.schema.fields:
        new = renames.get(f.name, f.name)
        if new in drops:  # `drops` and `widen` name columns after the renames
            continue
        col = F.col(_q(f.name))
        cols.append((col.cast(widen[new]) if new in widen else col).alias(new))
    df.select(*cols).write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(gold)


def _typed_layouts(after: DataFrame, plan: TablePlan, evo: Evolution, layouts: list[Layout],
                   unconstrained_numeric: Callable[[str], str]) -> DataFrame:
    """`typed_changes` over gold's columns: each change typed with its own layout, cast to gold's type, and a
    column its layout lacks filled (the added column's existing-row value, else NULL). `new`/`old` are rewritten
    in gold column order so the quarantine reads them by gold position. A layout's column is typed with the
    numeric.unconstrained of its name in that layout, as `plan_evolution` typed it."""
    ncols = len(plan.shape.columns)
    need_old = set(range(ncols)) if plan.strategy is KeyStrategy.FULL_ROW else set(plan.key_positions)
    parts = []
    for k, ((lsn, seq), shape) in enumerate(layouts):
        seg = after.where((F.col("commit_lsn") > lsn) | ((F.col("commit_lsn") == lsn) & (F.col("seq") >= seq)))
        if k + 1 < len(layouts):
            (nl, ns), _ = layouts[k + 1]
            seg = seg.where((F.col("commit_lsn") < nl) | ((F.col("commit_lsn") == nl) & (F.col("seq") < ns)))
        cols: list[Column] = [F.col(c) for c in ("commit_lsn", "seq", "commit_ts", "xid", "op")]
        for i, (p, fill, dtype) in enumerate(zip(evo.positions[k], evo.fills[k], evo.types)):
            if p is None:
                v = (F.lit(None).cast(dtype) if fill is None else
                     typed_value(F.lit(fill), plan.shape.type_oids[i], plan.shape.typmods[i],
                                 plan.numeric_mode(i))[0].cast(dtype))
                cols += [v.alias(f"__n{i}"), F.lit(None).cast("string").alias(f"__r{i}"), F.lit(False).alias(f"__u{i}")]
                if i in need_old:
                    cols.append(F.when(F.col("old").isNotNull(), v).alias(f"__o{i}"))
                continue
            oid, mod, mode = shape.type_oids[p], shape.typmods[p], unconstrained_numeric(shape.columns[p])
            value, reason = typed_value(F.col("new").getItem(p), oid, mod, mode)
            cols += [value.cast(dtype).alias(f"__n{i}"), reason.alias(f"__r{i}"),
                     F.coalesce(F.array_contains(F.col("unchanged"), p), F.lit(False)).alias(f"__u{i}")]
            if i in need_old:
                cols.append(typed_value(F.col("old").getItem(p), oid, mod, mode)[0].cast(dtype).alias(f"__o{i}"))

        def raw(arr: str, k: int = k) -> Column:
            return F.when(F.col(arr).isNull(), F.lit(None)).otherwise(F.array(*[
                # F.get: NULL past the end (an old tuple may hold only the key), where getItem fails under ANSI
                F.get(F.col(arr), p) if p is not None else F.lit(None).cast("string") for p in evo.positions[k]]))

        parts.append(seg.select(*cols, raw("old").alias("old"), raw("new").alias("new")))
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


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
    from slotlake.spark.snapshot_job import gold_copy_snapshot  # imported late: snapshot_job imports this module

    return gold_copy_snapshot(session, gold)


def _last_commit(session: SparkSession, gold: str) -> tuple[int, dict[str, str]]:
    from delta.tables import DeltaTable

    if delta_log.readable(gold):
        newest = next(delta_log.commits(gold), None)
        if newest is not None:
            return newest.version, {k: str(v) for k, v in newest.metrics.items()}
    row = DeltaTable.forPath(session, gold).history(1).collect()[0]
    return int(row["version"]), dict(row["operationMetrics"] or {})


# ---- typing ------------------------------------------------------------------------------------------------

def typed_changes(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """Add per column i: __n{i} typed new value, __r{i} reason it cannot be held, __u{i} unchanged TOAST flag,
    and __o{i} typed old value where the strategy needs it (key columns; every column for FULL)."""
    shape = plan.shape
    cols: list[Column] = [F.col(c) for c in ("commit_lsn", "seq", "commit_ts", "xid", "op", "old", "new")]
    need_old = (range(len(shape.columns)) if plan.strategy is KeyStrategy.FULL_ROW else plan.key_positions)
    for i, (oid, mod) in enumerate(zip(shape.type_oids, shape.typmods)):
        value, reason = typed_value(F.col("new").getItem(i), oid, mod, plan.numeric_mode(i))
        cols += [value.alias(f"__n{i}"), reason.alias(f"__r{i}"),
                 F.coalesce(F.array_contains(F.col("unchanged"), i), F.lit(False)).alias(f"__u{i}")]
        if i in need_old:
            cols.append(typed_value(F.col("old").getItem(i), oid, mod, plan.numeric_mode(i))[0].alias(f"__o{i}"))
    return changes.select(*cols)


def quarantine_bad_values(session: SparkSession, src: SourceConfig, paths: LakePaths, plan: TablePlan,
                          typed: DataFrame, end: Lsn) -> int:
    """Record values the gold type cannot hold, each with its row's key (`row_key`); with on_bad_value: fail,
    refuse the merge instead."""
    shape = plan.shape
    bad = F.array(*[F.struct(F.lit(c).alias("column_name"), F.lit(o).alias("type_oid"),
                             F.col("new").getItem(i).alias("raw_value"), F.col(f"__r{i}").alias("reason"))
                    for i, (c, o) in enumerate(zip(shape.columns, shape.type_oids))])
    rows = (typed.select("commit_lsn", "xid", "seq", _row_key(plan).alias("row_key"), F.explode(bad).alias("b"))
            .where(F.col("b.reason").isNotNull())
            .select(F.lit(shape.schema_name).alias("schema_name"), F.lit(shape.table_name).alias("table_name"),
                    "b.column_name", "b.type_oid", "b.raw_value", "b.reason", "commit_lsn", "xid", "seq",
                    F.current_timestamp().alias("detected_at"), "row_key"))
    if src.on_bad_value == "fail":
        first = rows.orderBy("commit_lsn", "seq").limit(1).collect()
        if first:
            r = first[0]
            raise MergeError(
                f"{shape.qualified}: column {r['column_name']} value {r['raw_value']!r} at LSN {Lsn(r['commit_lsn'])} "
                f"(xid {r['xid']}, row {dict(r['row_key'])}) cannot be stored: {r['reason']}; set on_bad_value: "
                "quarantine to load it as NULL and keep the raw text in _quarantine")
        return 0
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        count = rows.count()
        if count:
            # Idempotent per (table, run end) so a re-run after a crash does not record the values twice.
            (rows.write.format("delta").mode("append")
             .option("txnAppId", f"slotlake-quarantine-{src.name}-{shape.qualified}")
             .option("txnVersion", int(end)).save(paths.quarantine))
            log.warning("%s: %d value(s) the gold types cannot hold were quarantined (NULL in gold)",
                        shape.qualified, count)
        return count
    finally:
        rows.unpersist()


def _row_key(plan: TablePlan) -> Column:
    """The changed row's identity as {column: PostgreSQL text}, from the new tuple: the replica identity key, or
    the whole row when there is no key (FULL, NOTHING). An unchanged-TOAST value comes from the old tuple (FULL
    logs the whole old row)."""
    shape = plan.shape
    cols = plan.key_positions if plan.strategy is KeyStrategy.KEYED else range(len(shape.columns))
    values = [F.when(F.col(f"__u{i}"), F.get(F.col("old"), i)).otherwise(F.get(F.col("new"), i)) for i in cols]
    return F.map_from_arrays(F.array(*[F.lit(shape.columns[i]) for i in cols]),
                             F.array(*values).cast("array<string>"))


def _value_cols(plan: TablePlan) -> list[Column]:
    return [F.col(f"__n{i}").alias(f"__v{i}") for i in range(len(plan.shape.columns))]


def _meta_cols() -> list[Column]:
    return [F.lit("U").alias("__action"), F.col("commit_lsn").alias("__lsn"), F.col("commit_ts").alias("__ts")]


# ---- keyed tables: lineage ---------------------------------------------------------------------------------

def keyed_states(plan: TablePlan, typed: DataFrame, target: DataFrame | None) -> DataFrame:
    """Every change of a keyed batch with the row state it leaves (`__f{i}`: struct(v), unchanged TOAST filled
    along the row's lineage, seeded by `target`'s row), its old/new key (`__ok`/`__nk`), `__id`, `op`,
    `commit_lsn`, `commit_ts`: the per-change view the history table is built from (spark/history_job.py)."""
    return _keyed_source(plan, typed, target, filled_only=True)


def _keyed_source(plan: TablePlan, typed: DataFrame, target: DataFrame | None, *, toast: bool = True,
                  filled_only: bool = False) -> DataFrame:
    """One row per key touched: its final state (`__action` U with `__v*`) or its removal (`__action` D).

    `toast`: False when no change of the batch has an unchanged TOAST value (every new tuple is whole)."""
    shape = plan.shape
    keys = plan.key_positions
    cid = F.struct("commit_lsn", "seq")
    # Old key: from the old tuple when there is one (key changed, or a delete), else the key did not change.
    ok = F.when(F.col("op").isin("U", "D"), F.struct(*[
        F.when(F.col("old").isNotNull(), F.col(f"__o{k}")).otherwise(F.col(f"__n{k}")).alias(f"k{j}")
        for j, k in enumerate(keys)]))
    nk = F.when(F.col("op").isin("I", "U"), F.struct(*[F.col(f"__n{k}").alias(f"k{j}") for j, k in enumerate(keys)]))
    ch = typed.withColumn("__id", cid).withColumn("__ok", ok).withColumn("__nk", nk)
    moved = (F.col("op") == "U") & ~F.col("__ok").eqNullSafe(F.col("__nk"))
    if ch.where(moved).limit(1).count() == 0:
        if not toast and not plan.soft_delete and not filled_only:
            return _last_per_key(plan, ch)
        # No key changed in the batch (the usual case): a row's lineage is its key (rid: the key's first change;
        # an insert after a delete writes every column, so sharing the key's lineage fills nothing wrong), and
        # the lineage resolution (several Spark jobs) is not needed.
        first = F.first("__id").over(Window.partitionBy(F.coalesce("__ok", "__nk")).orderBy("__id"))
        return _keyed_final(plan, ch.withColumn("rid", first), target, filled_only)
    links = _lineage_links(ch, moved, shape.qualified)
    return _keyed_final(plan, ch.join(links.select("__id", "rid"), "__id"), target, filled_only)


def _last_per_key(plan: TablePlan, ch: DataFrame) -> DataFrame:
    """`_keyed_final`'s result when no key changed, no change has unchanged TOAST and deletes are hard: each key's
    last change is its whole final state (an insert or update carries every column; a delete's values are not
    used), so one aggregation gives it, pre-aggregated before the shuffle (a hot row updated thousands of times
    in a batch leaves each task as one row), instead of three window passes over the batch."""
    ncols = len(plan.shape.columns)
    nkeys = len(plan.key_positions)
    last = F.max_by(F.struct("op", "commit_lsn", "commit_ts", *[F.col(f"__n{i}").alias(f"v{i}") for i in range(ncols)]),
                    "__id")
    per_key = ch.groupBy(F.coalesce("__ok", "__nk").alias("key")).agg(last.alias("l"))
    return per_key.select(*[F.col("key").getField(f"k{j}").alias(f"__k{j}") for j in range(nkeys)],
                          F.when(F.col("l.op") == "D", "D").otherwise("U").alias("__action"),
                          *[F.col(f"l.v{i}").alias(f"__v{i}") for i in range(ncols)],
                          F.col("l.commit_lsn").alias("__lsn"), F.col("l.commit_ts").alias("__ts"),
                          F.lit(False).alias("__partial"))


def _lineage_links(ch: DataFrame, moved: Column, name: str) -> DataFrame:
    """(__id, rid): for every change, the first change of the row lineage it belongs to, following key changes."""
    # Events per key: a change leaves its old key (delete, key change), stays (in-place update) or arrives.
    events = (ch.where(F.col("op").isin("U", "D"))
              .select("__id", F.col("__ok").alias("key"),
                      F.when((F.col("op") == "U") & ~moved, "stay").otherwise("leave").alias("kind"))
              .unionByName(ch.where((F.col("op") == "I") | moved)
                           .select("__id", F.col("__nk").alias("key"), F.lit("arrive").alias("kind"))))
    w = Window.partitionBy("key").orderBy("__id")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    events = (events
              .withColumn("prev", F.last(F.when(F.col("kind").isin("arrive", "leave"), F.struct("kind", "__id")),
                                         ignorenulls=True).over(before))
              .withColumn("first_id", F.first("__id").over(w.rowsBetween(Window.unboundedPreceding, 0))))
    touching = events.where(F.col("kind") != "arrive")
    # Link of each change to the lineage it continues: itself (insert), the gold row (rid = first change on the
    # key, which has no earlier arrival), or the change that last brought a row to this key (resolved below).
    # `broken`: the key was left by an earlier change and nothing arrived since: an inconsistent stream.
    links = (touching.select(
        "__id",
        F.when(F.col("prev").isNull(), F.col("first_id")).alias("rid"),
        F.when(F.col("prev.kind") == "arrive", F.col("prev.__id")).alias("ptr"),
        F.when(F.col("prev.kind") == "leave", F.col("key")).alias("broken"))
        .unionByName(ch.where(F.col("op") == "I").select("__id", F.col("__id").alias("rid")),
                     allowMissingColumns=True)).localCheckpoint()
    broken = links.where(F.col("broken").isNotNull()).limit(1).collect()
    if broken:
        b = broken[0]
        raise MergeError(f"{name}: the change at LSN {Lsn(b['__id']['commit_lsn'])} (seq {b['__id']['seq']}) "
                         f"updates or deletes key {b['broken']} after an earlier change in the batch removed it; "
                         "the silver changes are inconsistent (were they decoded twice or out of order?)")
    return _resolve_lineage(links, name)


def _keyed_final(plan: TablePlan, ch: DataFrame, target: DataFrame | None, filled_only: bool = False) -> DataFrame:
    """From the changes with their lineage (`rid`: the lineage's first change) to one MERGE source row per key."""
    shape = plan.shape
    ncols = len(shape.columns)
    keys = plan.key_positions
    # Fill unchanged TOAST along each lineage, seeded by the gold row when the lineage starts from it.
    rows = ch.withColumn("__sub", F.lit(1))
    rows = rows.select("rid", "__id", "__sub", "op", "__ok", "__nk", "commit_lsn", "commit_ts", *[
        F.when((F.col("op") == "D") | F.col(f"__u{i}"), F.lit(None)).otherwise(F.struct(F.col(f"__n{i}").alias("v")))
        .alias(f"__w{i}") for i in range(ncols)])
    if target is not None:
        live = target if not plan.soft_delete else target.where(~F.col(DELETED_COL))
        roots = rows.where((F.col("rid") == F.col("__id")) & (F.col("op") != "I"))
        cond = _and([roots["__ok"].getField(f"k{j}").eqNullSafe(live[_q(shape.columns[k])])
                     for j, k in enumerate(keys)])
        seeds = roots.join(live, cond).select(
            "rid", F.col("rid").alias("__id"), F.lit(0).alias("__sub"),
            *[F.struct(live[_q(c)].alias("v")).alias(f"__w{i}") for i, c in enumerate(shape.columns)])
        rows = rows.unionByName(seeds, allowMissingColumns=True)
    by_rid = Window.partitionBy("rid").orderBy("__id", "__sub")
    lw = by_rid.rowsBetween(Window.unboundedPreceding, 0)
    # Soft deletes keep the row under its old key as it was there: the lineage's state BEFORE the leaving change
    # (for a key change that is not the new row, whose new key would otherwise land on the deleted row).
    prior = ([F.last(f"__w{i}", ignorenulls=True).over(by_rid.rowsBetween(Window.unboundedPreceding, -1))
              .alias(f"__p{i}") for i in range(ncols)] if plan.soft_delete else [])
    filled = rows.select("__id", "__sub", "op", "__ok", "__nk", "commit_lsn", "commit_ts",
                         *[F.last(f"__w{i}", ignorenulls=True).over(lw).alias(f"__f{i}") for i in range(ncols)],
                         *prior).where(F.col("__sub") == 1)
    if filled_only:
        return filled

    def state(pre: str) -> list[Column]:
        missing = F.array_compact(F.array(*[F.when(F.col(f"{pre}{i}").isNull(), F.lit(c))
                                            for i, c in enumerate(shape.columns)]))
        return ([F.col(f"{pre}{i}.v").alias(f"__v{i}") for i in range(ncols)]
                + [F.col("commit_lsn").alias("__lsn"), F.col("commit_ts").alias("__ts"), missing.alias("__missing")])

    leaving = filled.where((F.col("op") == "D") | ((F.col("op") == "U") & ~F.col("__ok").eqNullSafe(F.col("__nk"))))
    final = (leaving.select(F.col("__ok").alias("key"), "__id", F.lit("D").alias("__action"),
                            *state("__p" if plan.soft_delete else "__f"))
             .unionByName(filled.where(F.col("op").isin("I", "U"))
                          .select(F.col("__nk").alias("key"), "__id", F.lit("U").alias("__action"), *state("__f"))))
    final = (final.withColumn("__rn", F.row_number().over(Window.partitionBy("key").orderBy(F.col("__id").desc())))
             .where(F.col("__rn") == 1)).localCheckpoint()  # checked below, then merged: compute once
    gap = final.where((F.col("__action") == "U") & (F.size("__missing") > 0)).limit(1).collect()
    if gap:
        g = gap[0]
        key = {shape.columns[k]: g["key"][f"k{j}"] for j, k in enumerate(keys)}
        raise MergeError(
            f"{shape.qualified}: row {key} written at LSN {Lsn(g['__id']['commit_lsn'])} has unchanged TOAST "
            f"column(s) {list(g['__missing'])} whose value is neither in gold nor in an earlier change of this batch; "
            "the gold table is missing the row (was it loaded by an initial snapshot?). Reload the table to fix it")
    return final.select(*[F.col("key").getField(f"k{j}").alias(f"__k{j}") for j in range(len(keys))],
                        "__action", *[f"__v{i}" for i in range(ncols)], "__lsn", "__ts",
                        (F.size("__missing") > 0).alias("__partial"))


def _resolve_lineage(links: DataFrame, name: str) -> DataFrame:
    """Pointer jumping until every change knows the first change of its lineage (`rid`).

    Only chains through key changes need rounds: one per doubling of the longest chain of key changes.
    """
    for _ in range(_MAX_LINEAGE_ROUNDS):
        if links.where(F.col("rid").isNull()).limit(1).count() == 0:
            return links.select("__id", "rid")
        p = links.select(F.col("__id").alias("__pid"), F.col("rid").alias("__prid"), F.col("ptr").alias("__pptr"))
        nxt = links.join(p, links["ptr"] == p["__pid"], "left")
        lost = nxt.where(F.col("rid").isNull() & F.col("__pid").isNull()).limit(1).collect()
        if lost:
            raise MergeError(f"{name}: change {lost[0]['__id']} continues a row whose earlier change is missing "
                             "from the batch; the silver changes are inconsistent")
        links = nxt.select("__id", F.coalesce("rid", "__prid").alias("rid"),
                           F.when(F.col("rid").isNull() & F.col("__prid").isNull(), F.col("__pptr")).alias("ptr")
                           ).localCheckpoint()
    raise MergeError(f"{name}: key-change chains longer than 2^{_MAX_LINEAGE_ROUNDS} in one batch")


def _and(conds: list[Column]) -> Column:
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out


# ---- FULL tables: multisets --------------------------------------------------------------------------------

def _full_row_source(plan: TablePlan, typed: DataFrame, target: DataFrame | None) -> DataFrame:
    """Per distinct row the copies to add (`U`, copy numbers above the current count) or remove (`D`, the top ones)."""
    shape = plan.shape
    ncols = len(shape.columns)
    old_row = F.struct(*[F.col(f"__o{i}").alias(f"c{i}") for i in range(ncols)])
    # Unchanged TOAST in the new tuple: REPLICA IDENTITY FULL logs the whole old row, so the value is right there.
    new_row = F.struct(*[F.when(F.col(f"__u{i}"), F.col(f"__o{i}")).otherwise(F.col(f"__n{i}")).alias(f"c{i}")
                         for i in range(ncols)])
    cid = F.struct("commit_lsn", "seq")
    moves = (typed.where(F.col("op").isin("I", "U"))
             .select(new_row.alias("row"), F.lit(1).alias("sign"), cid.alias("__id"), "commit_lsn", "commit_ts")
             .unionByName(typed.where(F.col("op").isin("U", "D"))
                          .select(old_row.alias("row"), F.lit(-1).alias("sign"), cid.alias("__id"), "commit_lsn",
                                  "commit_ts")))
    delta = moves.groupBy("row").agg(F.sum("sign").alias("d"),
                                     F.max_by(F.struct("commit_lsn", "commit_ts"), "__id").alias("last"))
    if target is not None:
        live = target if not plan.soft_delete else target.where(~F.col(DELETED_COL))
        counts = live.select(F.struct(*[F.col(_q(c)).alias(f"c{i}") for i, c in enumerate(shape.columns)])
                             .alias("trow")).groupBy("trow").agg(F.count(F.lit(1)).alias("tc"))
        delta = delta.join(counts, delta["row"].eqNullSafe(counts["trow"]), "left")
        tc = F.coalesce(F.col("tc"), F.lit(0))
    else:
        tc = F.lit(0)
    delta = delta.withColumn("tc", tc).withColumn("nc", F.greatest(F.col("tc") + F.col("d"), F.lit(0)))
    # A delete of a row gold never had (e.g. no initial load yet) removes nothing, as for keyed tables.
    adds = (delta.where(F.col("nc") > F.col("tc"))
            .select("row", "last", F.lit("U").alias("__action"),
                    F.explode(F.sequence(F.col("tc") + 1, F.col("nc"))).alias("__dup")))
    drops = (delta.where(F.col("nc") < F.col("tc"))
             .select("row", "last", F.lit("D").alias("__action"),
                     F.explode(F.sequence(F.col("nc") + 1, F.col("tc"))).alias("__dup")))
    return adds.unionByName(drops).select(
        *[F.col("row").getField(f"c{i}").alias(f"__v{i}") for i in range(ncols)],
        F.col("__dup").cast("int").alias("__dup"), "__action",
        F.col("last.commit_lsn").alias("__lsn"), F.col("last.commit_ts").alias("__ts"))


# ---- the one Delta commit ----------------------------------------------------------------------------------

_PRUNABLE = (NumericType, StringType, DateType, TimestampType, TimestampNTZType, BooleanType)


def _append_rows(session: SparkSession, plan: TablePlan, typed: DataFrame, gold: str) -> DataFrame | None:
    """The batch as gold rows to append, when appending them is exactly what the MERGE would do; else None.

    The caller has checked that the batch holds no TRUNCATE and only plain inserts (NOTHING tables: only the
    inserts are ever applied). Then the MERGE inserts every row and updates none, unless gold already holds a row
    with the same key (KEYED: the key columns, a soft-deleted row included; FULL: the whole row, whose copies
    `_slotlake_dup` numbers) or the batch repeats a key: those batches keep the MERGE. That check reads only the
    gold files whose column statistics overlap the batch's value ranges (Delta data skipping), not all of gold.
    """
    from delta.tables import DeltaTable

    shape = plan.shape
    ncols = len(shape.columns)
    inserts = typed.where(F.col("op") == "I")
    if plan.strategy is not KeyStrategy.INSERT_ONLY:
        keys = list(plan.key_positions) if plan.strategy is KeyStrategy.KEYED else list(range(ncols))
        key_cols = [F.col(f"__n{k}") for k in keys]
        prunable = [k for k in keys if isinstance(inserts.schema[f"__n{k}"].dataType, _PRUNABLE)]
        aggs = [F.count(F.lit(1)).alias("n"), F.count_distinct(F.struct(*key_cols)).alias("keys")]
        for k in prunable:
            aggs += [F.min(f"__n{k}").alias(f"lo{k}"), F.max(f"__n{k}").alias(f"hi{k}"),
                     F.count(F.when(F.col(f"__n{k}").isNull(), 1)).alias(f"nulls{k}")]
        r = inserts.agg(*aggs).collect()[0]
        if plan.strategy is KeyStrategy.KEYED and r["keys"] != r["n"]:
            return None  # a key inserted twice: the MERGE keeps the last one
        target = DeltaTable.forPath(session, gold).toDF()
        for k in prunable:
            c = F.col(_q(shape.columns[k]))
            within = c.between(r[f"lo{k}"], r[f"hi{k}"]) if r[f"lo{k}"] is not None else F.lit(False)
            target = target.where(within | c.isNull() if r[f"nulls{k}"] else within)
        batch_keys = inserts.select(*[F.col(f"__n{k}").alias(f"__k{j}") for j, k in enumerate(keys)]).distinct()
        cond = _and([target[_q(shape.columns[k])].eqNullSafe(batch_keys[f"__k{j}"]) for j, k in enumerate(keys)])
        if target.join(batch_keys, cond, "left_semi").limit(1).count():
            return None  # gold holds one of these keys: the MERGE updates (or revives) it
    cols = [F.col(f"__n{i}").alias(c) for i, c in enumerate(shape.columns)]
    meta = [F.col("commit_lsn").alias(LSN_COL), F.col("commit_ts").alias(COMMIT_TS_COL)]
    if plan.strategy is KeyStrategy.FULL_ROW:
        # As the MERGE numbers them: copies 1..n of each distinct row, all with the row's last change's LSN/time.
        every = Window.partitionBy(*[F.col(f"__n{i}") for i in range(ncols)])
        last = F.max_by(F.struct("commit_lsn", "commit_ts"), F.struct("commit_lsn", "seq")).over(every)
        out = inserts.select(*cols, last.alias("__last"),
                             F.row_number().over(every.orderBy("commit_lsn", "seq")).alias(DUP_COL))
        out = out.select(*[_q(c) for c in shape.columns], F.col("__last.commit_lsn").alias(LSN_COL),
                         F.col("__last.commit_ts").alias(COMMIT_TS_COL), DUP_COL)
    else:
        out = inserts.select(*cols, *meta)
    if plan.soft_delete:
        out = out.withColumn(DELETED_COL, F.lit(False))
    fields = DeltaTable.forPath(session, gold).toDF().schema.fields
    return out.select(*[F.col(_q(f.name)).cast(f.dataType).alias(f.name) for f in fields])


def _execute_merge(session: SparkSession, src: SourceConfig, gold: str, schema: str, table: str, end: Lsn,
                   plan: TablePlan | None, soft: bool, source_df: DataFrame | None, trunc: _Truncate | None,
                   append_df: DataFrame | None = None) -> None:
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
            cond = _and([F.col(f"t.{_q(cols[k])}").eqNullSafe(F.col(f"s.__k{j}"))
                         for j, k in enumerate(plan.key_positions)])
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
            cond = _and([F.col(f"t.{_q(c)}").eqNullSafe(F.col(f"s.__v{i}")) for i, c in enumerate(cols)]
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
    if os.environ.get("SLOTLAKE_FAILPOINT") == "merge_after_first_table":
        os._exit(137)
