"""The recover Spark work (see slotlake.recover.point for the semantics).

    POINT ──(silver: last commit at or before it)──▶ commit LSN L (one for every table)
    a table whose history table covers L (history_from <= L <= its watermark): its versions valid at L
    the others: replay --dest scratch, from = to = L: gold as of the nearest recorded end <= L (time travel)
    + the archived changes after it up to L, re-decoded with the historical catalog
      (slotlake.recover.replay_job.run_replay)
    scratch table ──project onto the `_catalog` columns at L──▶ DEST/<schema>/<table> (Delta)
                                                          └──▶ COPY into <into-schema>.<table> (PostgreSQL)
The projection leaves out columns the source had dropped by L (gold keeps them, NULL from then on) so the result
has the table's columns as they were at L. Scratch tables live under `<lake>/<source>/_recover/<run id>/` and are
removed afterwards.
"""
from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from slotlake.catalog import CatalogVersion, read_catalog
from slotlake.config import Config
from slotlake.contracts import STAGE_RECOVER, CommitMeta
from slotlake.decode.job import decode_watermark
from slotlake.lake import LakePaths, table_dir
from slotlake.lsn import Lsn
from slotlake.merge.history_job import history_as_of, history_coverage
from slotlake.merge.plan import COLUMN_MAPPING, needs_column_mapping
from slotlake.names import TableName, spark_ident
from slotlake.recover.point import (
    Point,
    RecoveredTable,
    RecoverError,
    RecoverRequest,
    RecoverResult,
    version_at,
)
from slotlake.recover.point_in_process import check_point, check_resolved
from slotlake.recover.replay import ReplayRequest, format_point
from slotlake.recover.replay_job import _delete_path, run_replay

log = logging.getLogger(__name__)


def resolve_as_of(spark, changes_path: str, point: Point) -> tuple[Lsn, datetime | None, Lsn | None]:
    """(commit LSN, its commit time, silver's last commit LSN) for `point`: the greatest commit LSN in silver
    <= an LSN, or with commit time <= a moment.

    With no commit at or before the point: an LSN stays as given, a moment becomes the LSN just before silver's
    first commit (the state before any decoded change: the initial copy's), with no commit time."""
    from pyspark.sql import functions as F

    if isinstance(point, Lsn):
        at = F.col("commit_lsn") <= F.lit(point.value)
    else:  # silver's commit_ts is UTC wall time (the session time zone is UTC: slotlake.spark.session)
        at = F.col("commit_ts") <= F.lit(point.astimezone(UTC).replace(tzinfo=None))
    got = (spark.read.format("delta").load(changes_path)
           .agg(F.max(F.when(at, F.struct("commit_lsn", "commit_ts"))).alias("at"),
                F.min("commit_lsn").alias("first"), F.max("commit_lsn").alias("last"))
           .collect()[0])
    last = Lsn(got["last"]) if got["last"] is not None else None
    if got["at"] is not None:
        ts = got["at"]["commit_ts"]
        return Lsn(got["at"]["commit_lsn"]), ts.replace(tzinfo=UTC) if ts else None, last
    if isinstance(point, Lsn):
        return point, None, last
    return (Lsn(max(got["first"] - 1, 0)) if got["first"] is not None else Lsn(0)), None, last


def run_recover(spark, cfg: Config, req: RecoverRequest, password: str | None = None) -> RecoverResult:
    """Recover `req` (see slotlake.recover.point). Raises RecoverError when the point is not covered, a table has
    no state at it, or a target exists (without replace)."""
    from delta.tables import DeltaTable

    started = time.monotonic()
    source = req.source
    paths = LakePaths.of(cfg.lake, source)
    silver_end = decode_watermark(spark, paths.changes, source)
    if silver_end is None:
        raise RecoverError(f"recover {source}: nothing is decoded yet ({paths.changes}); run `slotlake sync {source}`")
    check_point(paths, source, req.as_of)
    lsn, commit_ts, last = resolve_as_of(spark, paths.changes, req.as_of)
    check_resolved(paths, source, lsn, last, silver_end)
    log.info("recover %s: as of %s -> commit LSN %s (commit time %s)", source, format_point(req.as_of), lsn,
             commit_ts.isoformat() if commit_ts else "none")
    if req.to_delta is not None and not req.replace:
        there = [str(t) for t in req.tables if DeltaTable.isDeltaTable(spark, table_dir(req.to_delta, *t))]
        if there:
            raise RecoverError(f"recover {source}: {', '.join(there)} already exist(s) under {req.to_delta}; pass "
                               "--replace to overwrite, or choose another --to")
    scratch = paths.scratch("recover")
    # A table whose history table covers L is read from it (no re-decode); the others are rebuilt by replay.
    from_history = tuple(t for t in req.tables if _history_covers(spark, paths, t, lsn))
    replayed = tuple(t for t in req.tables if t not in from_history)
    try:
        if replayed:
            run_replay(spark, cfg, ReplayRequest(source=source, from_=lsn, to=lsn, tables=replayed,
                                                 dest=f"{scratch}/tables"))
        catalog = read_catalog(spark, paths.catalog)
        built = []
        for t in req.tables:
            version = version_at(catalog, t, lsn)
            if t in from_history:
                if version is None and req.to_postgres is not None:
                    raise RecoverError(f"recover {source}: {t} has no column definition in _catalog at {lsn} "
                                       "(dropped before it?); recover it --to a Delta folder instead")
                built.append((t, version, _at_point(history_as_of(spark, paths.gold_history(*t), lsn), version)))
                continue
            path = table_dir(f"{scratch}/tables", *t)
            if not DeltaTable.isDeltaTable(spark, path):
                raise RecoverError(f"recover {source}: {t} has no state at {lsn} (no gold table and no archived "
                                   f"change up to it); check the name (`slotlake status {source}` lists the tables)")
            if version is None and req.to_postgres is not None:
                raise RecoverError(f"recover {source}: {t} has no column definition in _catalog at {lsn} (dropped "
                                   "before it?); recover it --to a Delta folder instead")
            built.append((t, version, _at_point(spark.read.format("delta").load(path), version)))
        if req.to_postgres is not None:
            tables = _to_postgres(req, built, password)
        else:
            tables = [_to_delta(spark, req, t, df) for t, _, df in built]
    finally:
        _delete_path(spark, scratch)
    result = RecoverResult(source=source, as_of=format_point(req.as_of), lsn=lsn, commit_ts=commit_ts,
                           target=req.target, tables=tuple(tables), from_history=tuple(map(str, from_history)))
    log.info("recover %s: %d table(s) at %s into %s (%d from history) (%.1fs)", source, len(tables), lsn,
             req.target, len(from_history), time.monotonic() - started)
    return result


def _history_covers(spark, paths: LakePaths, table: TableName, lsn: Lsn) -> bool:
    """Whether `table`'s history table answers the state at `lsn`: it started at or before it (from gold's rows
    at its watermark then) and is written up to it. Else replay, which is simple and right for any point: history
    up to its watermark + a replay of the rest would be a second way of doing what replay does."""
    coverage = history_coverage(spark, paths.gold_history(*table))
    return coverage is not None and coverage.covers(lsn)


def _at_point(df, version: CatalogVersion | None):
    """The recovered gold rows with the columns of `version` (in its order) and the `_slotlake_*` ones; a column
    the catalog has but gold never got (added with no change since) is NULL."""
    from pyspark.sql import functions as F

    from slotlake.merge.typed_values import spark_type

    if version is None:
        return df
    have = set(df.columns)
    cols = [spark_ident(c.name) if c.name in have else F.lit(None).cast(spark_type(c.type_oid, c.typmod)).alias(c.name)
            for c in sorted(version.columns, key=lambda c: c.position)]
    return df.select(*cols, *[spark_ident(c) for c in df.columns if c.startswith("_slotlake_")])


def _to_delta(spark, req: RecoverRequest, table: TableName, df) -> RecoveredTable:
    target = table_dir(str(req.to_delta), *table)
    if req.replace:
        _delete_path(spark, target)  # a new table, not a new version of whatever was there
    writer = df.write.format("delta").mode("errorifexists").option(
        "userMetadata",
        CommitMeta(STAGE_RECOVER, None, {"source": req.source, "as_of": format_point(req.as_of)}).json())
    if needs_column_mapping(df.columns):
        writer = writer.option(COLUMN_MAPPING, "name")
    writer.save(target)
    rows = spark.read.format("delta").load(target).count()
    log.info("recover %s: %s -> %s (%d rows)", req.source, table, target, rows)
    return RecoveredTable(str(table), rows, target)


def _postgres_rows(df):
    """The data columns as Python rows, one partition at a time (toLocalIterator: never the whole table).

    Soft-deleted rows are left out. Timestamps with time zone travel as UTC text: PySpark would turn them into
    naive datetimes in the driver's local zone."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    if "_slotlake_deleted" in df.columns:
        df = df.where(~F.coalesce(F.col("_slotlake_deleted"), F.lit(False)))
    data = [f for f in df.schema.fields if not f.name.startswith("_slotlake_")]
    cols = [F.concat(F.date_format(spark_ident(f.name), "yyyy-MM-dd HH:mm:ss.SSSSSS"), F.lit("+00")).alias(f.name)
            if isinstance(f.dataType, TimestampType) else spark_ident(f.name) for f in data]
    for row in df.select(*cols).toLocalIterator():
        yield tuple(row)


def _to_postgres(req: RecoverRequest, built, password: str | None) -> list[RecoveredTable]:
    from slotlake.recover.to_postgres import TableLoad, load_tables

    loads = [TableLoad(req.postgres_table(t), version, _postgres_rows(df)) for t, version, df in built]
    counts = load_tables(str(req.to_postgres), loads, req.replace, password)
    return [RecoveredTable(str(t), n, str(req.postgres_table(t))) for (t, _, _), n in zip(built, counts)]
