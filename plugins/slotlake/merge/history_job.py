"""The history table (source setting `history`): `gold_history/<schema>/<table>`, SCD2, kept by the merge.

One row per version of a source row: gold's columns, `_slotlake_valid_from_lsn` / `_slotlake_valid_to_lsn` (commit
LSNs; NULL while current), their commit times, `_slotlake_op` (I/U of the change that opened it; S: a gold row the
history started from). The merge calls `write_history` for a table right before the table's gold commit:

    history absent, or behind gold (history was off for a while) ──▶ (re)start from gold's live rows, one commit
        with `history_from` = gold's watermark W (valid_from = the row's `_slotlake_lsn`; before W nothing is known)
    the batch's changes with commit_end_lsn > history's watermark, typed like gold's (evolve_job.typed_layouts)
        keyed: lineage.keyed_states (TOAST filled along the key lineage, seeded by history's open rows)
        FULL:  each copy (`_slotlake_dup`, numbered as gold) is a version; a delete closes the top copy
        NOTHING / keyless appends: inserts only
    ──▶ ONE Delta MERGE: close the open rows the batch ends (a change on their key, or a TRUNCATE), insert the
        versions the batch opens; txnAppId slotlake-history-<source>-<table>, txnVersion = run end, userMetadata
        stage "history": a crash before the gold commit leaves history ahead of gold, and the re-run (its batch
        starts at gold's watermark, possibly ending later) applies only the changes past history's watermark.

A change's own state comes from the changes before it in the batch and history's open rows (not from gold), so it
is the same whichever of the two tables a crash left behind.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from slotlake import delta_log, failpoints
from slotlake.config import SourceConfig
from slotlake.contracts import CommitMeta
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.evolution import Evolution
from slotlake.merge.plan import (
    COLUMN_MAPPING,
    COMMIT_TS_COL,
    DELETED_COL,
    DUP_COL,
    HISTORY_STAGE,
    HISTORY_VERSION_FIELDS,
    LSN_COL,
    OP_COL,
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    VALID_FROM_LSN_COL,
    VALID_FROM_TS_COL,
    VALID_TO_LSN_COL,
    VALID_TO_TS_COL,
    KeyStrategy,
    TablePlan,
    history_app_id,
    in_history,
    needs_column_mapping,
    stage_metadata,
)
from slotlake.names import TableName
from slotlake.names import spark_ident as _q
from slotlake.spark.schemas import struct_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistoryBatch:
    """What the merge of one table hands the history write (see merge.job._merge_table)."""

    src: SourceConfig
    paths: LakePaths
    schema: str
    table: str
    end: Lsn  # the run's end (silver's watermark)
    batch: DataFrame  # the table's silver rows with commit_end_lsn > gold's watermark, commit_lsn <= end
    plan: TablePlan | None  # None: the batch holds only TRUNCATEs
    evo: Evolution | None
    layouts: Sequence[Any]  # evolve_job.Layout
    gold: str
    gold_mark: Lsn | None


@dataclass(frozen=True)
class HistoryCoverage:
    """The LSNs a history table answers as-of queries for: history_from <= L <= watermark."""

    history_from: Lsn
    watermark: Lsn

    def covers(self, lsn: Lsn) -> bool:
        return self.history_from <= lsn <= self.watermark


@dataclass(frozen=True)
class _Truncate:
    lsn: int
    seq: int
    ts: datetime | None


def history_coverage(spark: SparkSession, path: str) -> HistoryCoverage | None:
    """The coverage of the history table at `path` (None: no history table, or it was never written)."""
    from delta.tables import DeltaTable

    if delta_log.readable(path):
        if not delta_log.is_delta_table(path):
            return None
        metas = [c.meta for c in delta_log.commits(path) if c.meta is not None]
    else:
        if not DeltaTable.isDeltaTable(spark, path):
            return None
        rows = DeltaTable.forPath(spark, path).history().orderBy(F.col("version").desc()).select(
            "userMetadata").collect()
        metas = [m for m in (CommitMeta.parse(r[0]) for r in rows) if m is not None]
    mark = next((m.end_lsn for m in metas if m.end_lsn is not None), None)
    start = next((m.get("history_from") for m in metas if m.get("history_from")), None)
    if mark is None or start is None:
        return None
    return HistoryCoverage(Lsn.parse(start), mark)


def history_as_of(spark: SparkSession, path: str, lsn: Lsn) -> DataFrame:
    """The table's rows at commit LSN `lsn`, shaped like gold (`_slotlake_lsn`, `_slotlake_commit_ts` of the
    change that wrote the row; `_slotlake_dup` for FULL tables).

    Commit LSNs, not end LSNs, on both sides: every version starts and ends at a change's commit LSN, a commit's
    LSN is unique, and a recovery point is resolved to the last commit LSN at or before it, so `valid_from <= L <
    valid_to` holds exactly the versions written by commits up to L and not ended by one of them."""
    df = spark.read.format("delta").load(path)
    at = (F.col(VALID_FROM_LSN_COL) <= F.lit(int(lsn))) & (
        F.col(VALID_TO_LSN_COL).isNull() | (F.col(VALID_TO_LSN_COL) > F.lit(int(lsn))))
    data = [c for c in df.columns if not c.startswith("_slotlake_")]
    extra = [DUP_COL] if DUP_COL in df.columns else []
    return df.where(at).select(*[_q(c) for c in data], F.col(VALID_FROM_LSN_COL).alias(LSN_COL),
                               F.col(VALID_FROM_TS_COL).alias(COMMIT_TS_COL), *extra)


def write_history(session: SparkSession, hb: HistoryBatch) -> None:
    """Bring `gold_history/<schema>/<table>` to the run's end, right before the table's gold commit."""
    from delta.tables import DeltaTable

    from slotlake.merge.evolve_job import evolve_gold as _evolve_gold
    from slotlake.merge.watermarks import delta_state

    name = str(TableName(hb.schema, hb.table))
    path = hb.paths.gold_history(hb.schema, hb.table)
    hist = delta_state(session, path)
    start = hb.gold_mark if hb.gold_mark is not None else Lsn(0)
    if hist.watermark is None or hist.watermark < start:
        if hist.watermark is not None:
            log.warning("%s: history ends at %s but gold at %s (history was off): history restarts from gold's "
                        "rows at %s", name, hist.watermark, start, start)
        _start_from_gold(session, hb, path, start)
        mark = start
    else:
        mark = hist.watermark
    if mark >= hb.end:
        return  # written by a run that died before its gold commit
    if hb.evo is not None and hb.plan is not None:
        _evolve_gold(session, path, name, hb.evo, hb.plan, hb.src.schema_changes)
    batch = hb.batch.where(F.col("commit_end_lsn") > int(mark))
    truncs = [_Truncate(int(r[0]), int(r[1]), r[2]) for r in batch.where(F.col("op") == "T").select(
        "commit_lsn", "seq", "commit_ts").orderBy("commit_lsn", "seq").collect()]
    target = DeltaTable.forPath(session, path)
    conf = {TXN_APP_ID: history_app_id(hb.src.name, hb.schema, hb.table), TXN_VERSION: str(int(hb.end)),
            USER_METADATA: stage_metadata(hb.end, HISTORY_STAGE)}
    if batch.limit(1).count() == 0:
        # History is ahead of gold (a run died between the two commits) and nothing more came for the table: an
        # empty commit still moves history's watermark to the run's end, with gold's.
        empty = session.createDataFrame([], target.toDF().schema)
        _with_conf(session, conf, lambda: empty.write.format("delta").mode("append").save(path))
        return
    open_rows = target.toDF().where(F.col(VALID_TO_LSN_COL).isNull())
    plan = hb.plan
    if plan is not None and hb.evo is not None:
        events = _events(plan, hb, batch.where(F.col("op") != "T"), open_rows, truncs)
        versions, closers = _versions(events, plan, truncs)
        source = closers.unionByName(versions, allowMissingColumns=True)
        key_match = _key_match(plan)
    else:  # only TRUNCATEs: every open version ends at the first one
        source, key_match = session.range(0).select(F.lit("open").alias("__kind")), F.lit(False)
    builder = target.alias("t").merge(
        source.alias("s"), (F.col("s.__kind") == "close") & F.col(f"t.{VALID_TO_LSN_COL}").isNull() & key_match)
    if plan is not None:
        builder = builder.whenMatchedUpdate(set={_q(VALID_TO_LSN_COL): F.col("s.__to_lsn"),
                                                 _q(VALID_TO_TS_COL): F.col("s.__to_ts")})
        values = {_q(c): F.col(f"s.__v{i}") for i, c in enumerate(plan.shape.columns)}
        if plan.strategy is KeyStrategy.FULL_ROW:
            values[_q(DUP_COL)] = F.col("s.__dup")
        builder = builder.whenNotMatchedInsert(F.col("s.__kind") == "open", {
            **values, _q(VALID_FROM_LSN_COL): F.col("s.commit_lsn"), _q(VALID_FROM_TS_COL): F.col("s.commit_ts"),
            _q(VALID_TO_LSN_COL): F.col("s.__to_lsn"), _q(VALID_TO_TS_COL): F.col("s.__to_ts"),
            _q(OP_COL): F.col("s.op")})
    if truncs:
        first = truncs[0]
        builder = builder.whenNotMatchedBySourceUpdate(F.col(f"t.{VALID_TO_LSN_COL}").isNull(), {
            _q(VALID_TO_LSN_COL): F.lit(first.lsn), _q(VALID_TO_TS_COL): F.lit(first.ts).cast("timestamp")})
    _with_conf(session, conf, builder.execute)
    log.info("%s: history written up to %s (%s)", name, hb.end, path)
    # Test-only failpoint: the process dies after the history commit, before the table's gold commit.
    failpoints.die_at(failpoints.MERGE_AFTER_HISTORY)


def _with_conf(session: SparkSession, conf: dict[str, str], write: Any) -> None:
    """Run `write` with the idempotent-write settings and watermark of the history commit."""
    for k, v in conf.items():
        session.conf.set(k, v)
    try:
        write()
    finally:
        for k in conf:
            session.conf.unset(k)


def _start_from_gold(session: SparkSession, hb: HistoryBatch, path: str, start: Lsn) -> None:
    """One commit replacing the history table by gold's live rows, each open since its `_slotlake_lsn`."""
    from delta.tables import DeltaTable

    gold = DeltaTable.forPath(session, hb.gold).toDF()
    if DELETED_COL in gold.columns:
        gold = gold.where(~F.col(DELETED_COL))
    schema = StructType([f for f in gold.schema.fields if in_history(f.name)]
                        + struct_of(HISTORY_VERSION_FIELDS).fields)
    cols = []
    for f in schema.fields:
        if f.name == VALID_FROM_LSN_COL:
            cols.append(F.col(LSN_COL).alias(f.name))
        elif f.name == VALID_FROM_TS_COL:
            cols.append(F.col(COMMIT_TS_COL).alias(f.name))
        elif f.name == OP_COL:
            cols.append(F.lit("S").alias(f.name))
        elif f.name in (VALID_TO_LSN_COL, VALID_TO_TS_COL):
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
        else:
            cols.append(F.col(_q(f.name)))
    meta = stage_metadata(start, HISTORY_STAGE, history_from=str(start))
    writer = (gold.select(*cols).write.format("delta").mode("overwrite").option("overwriteSchema", "true")
              .option("userMetadata", meta))
    if needs_column_mapping(gold.columns):
        writer = writer.option(COLUMN_MAPPING, "name")
    writer.save(path)
    log.info("%s: history starts from gold's rows at %s (%s)", TableName(hb.schema, hb.table), start, path)


# ---- the versions of a batch --------------------------------------------------------------------------------

def _events(plan: TablePlan, hb: HistoryBatch, changes: DataFrame, open_rows: DataFrame,
            truncs: list[_Truncate]) -> DataFrame:
    """One row per version opened (`__kind` open, values `__v{i}`) or ended (`close`) by a change, with `__key`
    (the row's identity: the key; for FULL the whole row and its copy number; for inserts-only the change),
    `__id` = (commit_lsn, seq), `__sub` (a change ends its old version before it opens the new one)."""
    from slotlake.merge.evolve_job import typed_layouts as _typed_layouts
    from slotlake.merge.lineage import keyed_states

    ncols = len(plan.shape.columns)
    def numeric(column: str) -> str:
        return hb.src.numeric.unconstrained_for(plan.shape.qualified, column)

    # hb.evo is set whenever there are changes to type
    typed = _typed_layouts(changes, plan, hb.evo, list(hb.layouts), numeric)  # type: ignore[arg-type]
    cid = F.struct("commit_lsn", "seq").alias("__id")
    meta = ["commit_lsn", "commit_ts", "op"]
    if plan.strategy is KeyStrategy.KEYED:
        states = keyed_states(replace(plan, soft_delete=False), typed, open_rows)
        opens = states.where(F.col("op").isin("I", "U")).select(
            F.col("__nk").alias("__key"), "__id", F.lit(1).alias("__sub"), F.lit("open").alias("__kind"), *meta,
            *[F.col(f"__f{i}.v").alias(f"__v{i}") for i in range(ncols)])
        closes = states.where(F.col("op").isin("U", "D")).select(
            F.col("__ok").alias("__key"), "__id", F.lit(0).alias("__sub"), F.lit("close").alias("__kind"), *meta)
        return opens.unionByName(closes, allowMissingColumns=True)
    if plan.strategy is KeyStrategy.INSERT_ONLY:
        return typed.where(F.col("op") == "I").select(
            cid.alias("__key"), cid, F.lit(1).alias("__sub"), F.lit("open").alias("__kind"), *meta,
            *[F.col(f"__n{i}").alias(f"__v{i}") for i in range(ncols)])
    # FULL: a multiset. Copies of a row are numbered 1..n as in gold; an insert opens copy n+1, a delete ends copy
    # n. Counting starts from history's open copies and again from 0 after each TRUNCATE (an epoch).
    old_row = F.struct(*[F.col(f"__o{i}").alias(f"c{i}") for i in range(ncols)])
    new_row = F.struct(*[F.when(F.col(f"__u{i}"), F.col(f"__o{i}")).otherwise(F.col(f"__n{i}")).alias(f"c{i}")
                         for i in range(ncols)])
    moves = (typed.where(F.col("op").isin("I", "U"))
             .select(new_row.alias("__row"), F.lit(1).alias("__sign"), cid, F.lit(1).alias("__sub"), *meta)
             .unionByName(typed.where(F.col("op").isin("U", "D"))
                          .select(old_row.alias("__row"), F.lit(-1).alias("__sign"), cid, F.lit(0).alias("__sub"),
                                  *meta)))
    epoch = F.lit(0)
    for t in truncs:
        epoch = epoch + _before(t, F.col("__id.commit_lsn"), F.col("__id.seq")).cast("int")
    counts = (open_rows.select(F.struct(*[F.col(_q(c)).alias(f"c{i}") for i, c in enumerate(plan.shape.columns)])
                               .alias("__trow")).groupBy("__trow").agg(F.count(F.lit(1)).alias("__base")))
    moves = moves.withColumn("__epoch", epoch)
    moves = moves.join(counts, moves["__row"].eqNullSafe(counts["__trow"]), "left")
    base = F.when(F.col("__epoch") == 0, F.coalesce("__base", F.lit(0))).otherwise(F.lit(0))
    running = F.sum("__sign").over(Window.partitionBy("__row", "__epoch").orderBy("__id", "__sub")
                                   .rowsBetween(Window.unboundedPreceding, 0))
    dup = (base + running + F.when(F.col("__sign") < 0, 1).otherwise(0)).cast("int")
    return moves.select(
        F.struct("__row", dup.alias("__dup")).alias("__key"), "__id", "__sub",
        F.when(F.col("__sign") > 0, "open").otherwise("close").alias("__kind"), *meta,
        *[F.col("__row").getField(f"c{i}").alias(f"__v{i}") for i in range(ncols)], dup.alias("__dup"))


def _before(t: _Truncate, lsn: Column, seq: Column) -> Column:
    """Whether TRUNCATE `t` comes before the change (lsn, seq)."""
    return (F.lit(t.lsn) < lsn) | ((F.lit(t.lsn) == lsn) & (F.lit(t.seq) < seq))


def _first_truncate_after(truncs: list[_Truncate], lsn: Column, seq: Column) -> Column:
    """struct(l, s, ts) of the first TRUNCATE after the change (lsn, seq), else NULL."""
    out: Column = F.lit(None)
    for t in reversed(truncs):  # the outermost test is the earliest TRUNCATE
        after = (lsn < F.lit(t.lsn)) | ((lsn == F.lit(t.lsn)) & (seq < F.lit(t.seq)))
        out = F.when(after, F.struct(F.lit(t.lsn).cast("long").alias("l"), F.lit(t.seq).cast("int").alias("s"),
                                     F.lit(t.ts).cast("timestamp").alias("ts"))).otherwise(out)
    return out


def _earliest(a: Column, b: Column) -> Column:
    """The earlier of two struct(l, s, ts) ends (either may be NULL)."""
    a_first = (a.getField("l") < b.getField("l")) | (
        (a.getField("l") == b.getField("l")) & (a.getField("s") < b.getField("s")))
    return F.when(a.isNull(), b).when(b.isNull(), a).when(a_first, a).otherwise(b)


def _versions(events: DataFrame, plan: TablePlan, truncs: list[_Truncate]) -> tuple[DataFrame, DataFrame]:
    """(versions the batch opens, with their end when the batch ends them; `close` rows for the versions open
    in history that the batch ends: the first event of their key when it is a close)."""
    w = Window.partitionBy("__key").orderBy("__id", "__sub")
    end = F.struct(F.col("__id.commit_lsn").alias("l"), F.col("__id.seq").alias("s"), F.col("commit_ts").alias("ts"))
    nxt = F.first(F.when(F.col("__kind") == "close", end), ignorenulls=True).over(
        w.rowsBetween(1, Window.unboundedFollowing))
    ev = events.withColumn("__next", nxt).withColumn("__rn", F.row_number().over(w))
    opened = (_earliest(F.col("__next"), _first_truncate_after(truncs, F.col("__id.commit_lsn"), F.col("__id.seq")))
              if truncs else F.col("__next"))
    versions = ev.where(F.col("__kind") == "open").withColumn("__end", opened)
    # A version open in history ends at its key's first close, or at an earlier TRUNCATE of the batch.
    first_trunc = _first_truncate_after(truncs, F.lit(-1).cast("long"), F.lit(0))
    closers = ev.where((F.col("__kind") == "close") & (F.col("__rn") == 1)).withColumn(
        "__end", _earliest(end, first_trunc) if truncs else end)
    ncols = len(plan.shape.columns)
    keep = ["__kind", "commit_lsn", "commit_ts", "op"] + [f"__v{i}" for i in range(ncols)]
    if plan.strategy is KeyStrategy.FULL_ROW:
        keep.append("__dup")
    keys = [F.col("__key").getField(f"k{j}").alias(f"__k{j}") for j in range(len(plan.key_positions))] \
        if plan.strategy is KeyStrategy.KEYED else []
    out = [F.col("__end.l").alias("__to_lsn"), F.col("__end.ts").alias("__to_ts")]
    versions = versions.select(*keep, *keys, *out)
    closer_cols = [c for c in keep if c in closers.columns]
    closers = closers.select(*closer_cols, *keys, *out)
    return versions, closers


def _key_match(plan: TablePlan) -> Column:
    """How a `close` row finds the open history row it ends."""
    cols = plan.shape.columns
    if plan.strategy is KeyStrategy.KEYED:
        conds = [F.col(f"t.{_q(cols[k])}").eqNullSafe(F.col(f"s.__k{j}")) for j, k in enumerate(plan.key_positions)]
    elif plan.strategy is KeyStrategy.FULL_ROW:
        conds = [F.col(f"t.{_q(c)}").eqNullSafe(F.col(f"s.__v{i}")) for i, c in enumerate(cols)]
        conds.append(F.col(f"t.{_q(DUP_COL)}") == F.col("s.__dup"))
    else:
        return F.lit(False)
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out
