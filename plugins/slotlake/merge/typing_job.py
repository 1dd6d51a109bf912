"""Typing a batch of silver changes for gold, and the `_quarantine` table for values gold's types cannot hold.

Used by the merge (`merge.job`) and by the load of initial copies (`snapshot_job`), which type their rows with the
same code (`decode/types.py`, `merge/typed_values.py`).
"""
from __future__ import annotations

import logging

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from slotlake import contracts, delta_log
from slotlake.config import SourceConfig
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.plan import KeyStrategy, TablePlan
from slotlake.merge.typed_values import typed_value
from slotlake.names import spark_ident as _q
from slotlake.spark.schemas import struct_type

log = logging.getLogger(__name__)

QUARANTINE_SCHEMA = struct_type(contracts.QUARANTINE)


def ensure_table(spark: SparkSession, path: str, schema: contracts.Columns) -> None:
    """Create the Delta table, or add the columns of `schema` it lacks (a table an older slotlake created: its
    rows get NULL there, and appends with the full schema keep working)."""
    from delta.tables import DeltaTable

    from slotlake.merge.watermarks import table_columns

    known = table_columns(path)  # from the Delta log, without a snapshot load in the JVM
    if known is not None:
        have = set(known)
    elif delta_log.readable(path) and not delta_log.has_commits(path):  # no table yet: created without Spark
        delta_log.create_empty(path, schema)
        return
    elif not DeltaTable.isDeltaTable(spark, path):
        spark.createDataFrame([], contracts.ddl(schema)).write.format("delta").mode("ignore").save(path)
        return
    else:
        have = set(DeltaTable.forPath(spark, path).toDF().columns)
    missing = [(name, spark_type) for name, spark_type in schema if name not in have]
    if missing:
        spark.sql(f"ALTER TABLE delta.`{path.replace('`', '``')}` ADD COLUMNS (" + ", ".join(
            f"{_q(name)} {spark_type}" for name, spark_type in missing) + ")")


def ensure_quarantine(spark: SparkSession, path: str) -> None:
    """Create `_quarantine`, or add the columns an older one lacks; call before writers run in parallel."""
    ensure_table(spark, path, contracts.QUARANTINE)


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


def has_bad_value(plan: TablePlan) -> Column:
    """True for a typed change (`typed_changes`, `typed_layouts`) holding a value its gold type cannot hold."""
    reasons = [F.col(f"__r{i}") for i in range(len(plan.shape.columns))]
    return F.coalesce(*reasons).isNotNull() if reasons else F.lit(False)


def quarantine_bad_values(session: SparkSession, src: SourceConfig, paths: LakePaths, plan: TablePlan,
                          typed: DataFrame, end: Lsn, *, bad_rows: int | None = None) -> int:
    """Record values the gold type cannot hold, each with its row's key (`row_key`); with on_bad_value: fail,
    refuse the merge instead. `bad_rows`: the count of `has_bad_value` rows when the caller has it (0: nothing
    to do, no pass over the batch)."""
    if bad_rows == 0:
        return 0
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
