"""Load complete table copies (bronze/snapshot) into gold: one Delta commit per table, watermarked at the seam.

Each load creates or replaces `gold/<schema>/<table>` (a replace is a new Delta version: earlier versions stay
for time travel) in ONE commit carrying `userMetadata = {"slotlake": {"end_lsn": <generation C - 1>, "stage":
"snapshot"}}`, so the merge then applies exactly the changes with commit_lsn >= C. Values are typed by the same
code as the merge (`typed_changes`: `merge/typed_values.py`), values the gold type cannot hold go to `_quarantine` the
same way, and the gold schema is the merge's (`TablePlan.gold_schema`). REPLICA IDENTITY FULL rows get
`_slotlake_dup` 1..n among identical rows. `_slotlake_lsn` of a copied row is the watermark (the row was written
by a transaction committed before C); `_slotlake_commit_ts` is NULL (unknown).

The gold table property `slotlake.snapshot` (JSON) names the copy the table was loaded from (so a re-run loads
nothing twice) and, for copies taken under their own snapshot, the visibility filter the merge applies
(`gold_copy_snapshot`).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

from slotlake import delta_log
from slotlake.config import Config
from slotlake.contracts import STAGE_SNAPSHOT
from slotlake.lake import LakePaths
from slotlake.merge.plan import (
    COLUMN_MAPPING,
    COMMIT_TS_COL,
    DELETED_COL,
    DELETION_VECTORS,
    DUP_COL,
    LSN_COL,
    USER_METADATA,
    KeyStrategy,
    copy_plan,
    needs_column_mapping,
    stage_metadata,
)
from slotlake.merge.typing_job import ensure_quarantine, quarantine_bad_values, typed_changes
from slotlake.names import TableName
from slotlake.names import spark_ident as _q
from slotlake.source.copies import (
    SNAPSHOT_PROPERTY,
    TableCopy,
    load_candidates,
    part_paths,
    pending_loads,
    snapshot_doc,
)
from slotlake.source.visibility import CopySnapshot
from slotlake.spark.schemas import struct_of

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SnapshotLoad:
    table: str
    copy_id: str
    rows: int
    gold_version: int | None  # None: already loaded from this copy (nothing done)
    quarantined: int = 0


def _gold_property(spark: SparkSession, gold: str) -> dict | None:
    from delta.tables import DeltaTable

    if delta_log.readable(gold):  # a local or s3a lake: read the log's metaData, no Spark job (one per table and run)
        if not delta_log.is_delta_table(gold):
            return None
        local = delta_log.table_properties(gold)
        if local is not None:
            return snapshot_doc(local)
    if not DeltaTable.isDeltaTable(spark, gold):
        return None
    return snapshot_doc(DeltaTable.forPath(spark, gold).detail().select("properties").collect()[0][0])


def gold_copy_snapshot(spark: SparkSession, gold: str) -> CopySnapshot | None:
    """The snapshot of the copy a gold table was loaded from, when the merge must filter by it (else None)."""
    doc = _gold_property(spark, gold)
    if not doc or not doc.get("visibility"):
        return None
    return CopySnapshot.from_json(json.dumps(doc["visibility"]))


def _silver_like(df: DataFrame, copy: TableCopy) -> DataFrame:
    """The copy's rows shaped as silver inserts, so the merge's typing and quarantine apply unchanged."""
    n = len(copy.columns)
    return df.select(
        F.lit(int(copy.watermark)).cast(LongType()).alias("commit_lsn"), F.lit(0).alias("seq"),
        F.lit(None).cast(TimestampType()).alias("commit_ts"), F.lit(None).cast(LongType()).alias("xid"),
        F.lit("I").alias("op"), F.lit(None).cast(ArrayType(StringType())).alias("old"),
        F.array(*[F.col(f"c{i}") for i in range(n)]).alias("new"),
        F.array().cast(ArrayType(IntegerType())).alias("unchanged"))


def load_table(spark: SparkSession, cfg: Config, source: str, copy: TableCopy) -> SnapshotLoad:
    """Create or replace one gold table from a complete copy, in one Delta commit. No-op if already loaded."""
    src = cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    schema, table = TableName.parse(copy.table)
    gold = paths.gold(schema, table)
    loaded = _gold_property(spark, gold)
    if copy.loaded_in(loaded):
        return SnapshotLoad(copy.table, copy.copy_id, copy.rows, None)
    # The same numeric.unconstrained mapping as the merge, so the copy and the changes after it agree.
    plan = copy_plan(src, copy)
    shape = plan.shape
    files = part_paths(paths.root, copy)
    text_schema = StructType([StructField(f"c{i}", StringType()) for i in range(len(copy.columns))])
    raw = spark.read.schema(text_schema).parquet(*files)
    typed = typed_changes(_silver_like(raw, copy), plan).cache()
    try:
        ensure_quarantine(spark, paths.quarantine)
        quarantined = quarantine_bad_values(spark, src, paths, plan, typed, copy.watermark)
        cols = [F.col(f"__n{i}").alias(c) for i, c in enumerate(shape.columns)]
        cols += [F.col("commit_lsn").alias(LSN_COL), F.col("commit_ts").alias(COMMIT_TS_COL)]
        if plan.soft_delete:
            cols.append(F.lit(False).alias(DELETED_COL))
        out = typed.select(*cols)
        if plan.strategy is KeyStrategy.FULL_ROW:
            every = Window.partitionBy(*[F.col(_q(c)) for c in shape.columns]).orderBy(F.lit(1))
            out = out.withColumn(DUP_COL, F.row_number().over(every).cast(IntegerType()))
        gold_fields = struct_of(plan.gold_schema).fields
        out = out.select(*[F.col(_q(f.name)).cast(f.dataType).alias(f.name) for f in gold_fields])
        spark.conf.set(USER_METADATA, stage_metadata(copy.watermark, STAGE_SNAPSHOT))
        try:
            writer = (out.writeTo(f"delta.{_q(gold)}").using("delta")
                      .tableProperty(SNAPSHOT_PROPERTY, copy.property_doc()))
            if needs_column_mapping(shape.columns):
                writer = writer.tableProperty(COLUMN_MAPPING, "name")
            if src.uses_deletion_vectors(copy.table):
                writer = writer.tableProperty(DELETION_VECTORS, "true")
            writer.createOrReplace()
        finally:
            spark.conf.unset(USER_METADATA)
    finally:
        typed.unpersist()
    from delta.tables import DeltaTable

    version = int(DeltaTable.forPath(spark, gold).history(1).collect()[0]["version"])
    log.info("snapshot load %s: %d rows from copy %s (%s) -> gold version %d, watermark %s, %d quarantined",
             copy.table, copy.rows, copy.copy_id, copy.kind, version, copy.watermark, quarantined)
    return SnapshotLoad(copy.table, copy.copy_id, copy.rows, version, quarantined)



def load_snapshots(spark: SparkSession, cfg: Config, source: str,
                   tables: Sequence[str] | None = None) -> list[SnapshotLoad]:
    """Load every complete copy of the current slot generation not yet in gold (`tables`: "schema.table" subset;
    default: the configured tables, else every table with a copy). Re-running loads nothing twice."""
    paths = LakePaths.of(cfg.lake, source)
    src = cfg.source(source)
    names = [str(TableName.parse(t)) for t in tables] if tables else load_candidates(paths.root, src)
    return [load_table(spark, cfg, source, c) for c in pending_loads(paths.root, names)]
