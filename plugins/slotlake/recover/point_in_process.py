"""A recovery without Spark: the same result as `point_job.run_recover`, in the caller's process.

    POINT ──(silver: last commit at or before it, read with pyarrow)──▶ commit LSN L, checked as run_recover checks
    a table whose history table covers L: its versions valid at L (pyarrow)
    the others: `replay_in_process` --dest scratch, from = to = L (gold's recorded state <= L, time travel, + the
                archived changes up to L re-decoded and merged without a JVM)
    scratch table ──project onto the `_catalog` columns at L (pyarrow)──▶ DEST/<schema>/<table> (delta-rs)
                                                                     └──▶ COPY into <into-schema>.<table>

A table whose history table covers L is read from it instead (the versions valid at L, as
`history_job.history_as_of` selects them, with pyarrow), as the Spark app does.

The Spark app started a JVM for every recovery, a one-row question included (30-40 s on 2 cores). It declines
(returns None, nothing written to the target; the caller runs the Spark app, which does the whole recovery) where
the in-process replay declines (`replay_in_process`), for a history table delta-rs does not read as Spark wrote it
(column mapping, deletion vectors), for a target table whose names need Delta
column mapping, for a column of a type pyarrow does not hold as gold does, and when a value cannot be turned into
a Python value for the COPY (the transaction is rolled back first). The checks of the point against the lake
(`check_point`, `check_resolved`) are the Spark app's too.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from slotlake import delta_log, storage
from slotlake.bronze import covered_lsn, list_bronze, max_archived_end
from slotlake.catalog import CatalogVersion
from slotlake.config import Config
from slotlake.contracts import STAGE_DECODE, STAGE_RECOVER, CommitMeta
from slotlake.lake import LakePaths, table_dir
from slotlake.lsn import Lsn
from slotlake.merge.in_process import Declined, open_dataset
from slotlake.names import TableName
from slotlake.recover.point import (
    Point,
    RecoveredTable,
    RecoverError,
    RecoverRequest,
    RecoverResult,
    archive_gaps,
    gap_error,
    version_at,
)
from slotlake.recover.replay import ReplayRequest, format_point

log = logging.getLogger(__name__)


def check_point(paths: LakePaths, source: str, point: Point) -> None:
    """RecoverError when an LSN `point` is past what the archive holds, or lies in WAL a resync left unarchived
    (`ArchiveGap`). A time cannot be placed inside WAL the lake never read: it resolves to the last archived commit
    at or before it (README, resync)."""
    from slotlake.source.copies import generations

    if not isinstance(point, Lsn):
        return
    covered = covered_lsn(paths.root)
    if covered is None or point > covered:
        raise RecoverError(f"recover {source}: --as-of {point} is past what the archive holds ({covered}); "
                           f"run `slotlake sync {source}` first or choose an earlier point")
    gens = [(g.consistent_point, datetime.fromisoformat(g.created_at), g.archived_to)
            for g in generations(paths.root)]
    for gap in archive_gaps((f.end_lsn for f in list_bronze(paths.root)), gens):
        if gap.holds(point):
            raise gap_error(source, point, gap)


def check_resolved(paths: LakePaths, source: str, lsn: Lsn, last: Lsn | None, silver_end: Lsn) -> None:
    """RecoverError when the point resolved to silver's last commit while bronze holds undecoded changes: later
    archived commits are not decoded yet, so "the last commit at or before" it is not known."""
    if lsn == last and silver_end != max_archived_end(paths.root):
        raise RecoverError(f"recover {source}: the point is at or after silver's last commit ({last}) and bronze "
                           f"holds undecoded changes; run `slotlake sync {source}` first")


def recover_in_process(cfg: Config, req: RecoverRequest, password: str | None = None) -> RecoverResult | None:
    """`run_recover` without Spark (module doc); None when it declines (the reason logged). Raises RecoverError as
    `run_recover` does."""
    from slotlake.catalog import read_catalog
    from slotlake.recover.replay_in_process import replay_in_process, scratch_folder

    started = time.monotonic()
    source = req.source
    paths = LakePaths.of(cfg.lake, source)
    if not cfg.spark.in_process_bytes or not delta_log.readable(paths.changes) \
            or not delta_log.is_delta_table(paths.changes):
        return None
    silver_end = delta_log.stage_end(paths.changes, STAGE_DECODE)
    if silver_end is None:
        return None  # (Spark's history tells it, or the app says nothing is decoded)
    check_point(paths, source, req.as_of)
    lsn, commit_ts, last = resolve_as_of(paths.changes, req.as_of)
    check_resolved(paths, source, lsn, last, silver_end)
    log.info("recover %s: as of %s -> commit LSN %s (commit time %s)", source, format_point(req.as_of), lsn,
             commit_ts.isoformat() if commit_ts else "none")
    if req.to_delta is not None and not req.replace:
        there = [str(t) for t in req.tables if delta_log.is_delta_table(table_dir(req.to_delta, *t))]
        if there:
            raise RecoverError(f"recover {source}: {', '.join(there)} already exist(s) under {req.to_delta}; pass "
                               "--replace to overwrite, or choose another --to")
    scratch = scratch_folder(paths, "recover")
    try:
        # A table whose history table covers L is read from it (no re-decode); the others are rebuilt by replay.
        from_history = tuple(t for t in req.tables if _history_covers(paths, t, lsn))
        replayed = tuple(t for t in req.tables if t not in from_history)
        if replayed and replay_in_process(cfg, ReplayRequest(source=source, from_=lsn, to=lsn, tables=replayed,
                                                             dest=f"{scratch}/tables")) is None:
            raise Declined("the replay to the point is Spark's")
        catalog = read_catalog(None, paths.catalog)
        built = [(t, version_at(catalog, t, lsn),
                  _projected(source, req, t, lsn, catalog, *(_history_at(paths.gold_history(*t), lsn)
                                                             if t in from_history
                                                             else _replayed(source, t, lsn, scratch))))
                 for t in req.tables]
        if req.to_postgres is not None:
            tables = _to_postgres(req, built, password)
        else:
            tables = [_to_delta(req, t, data) for t, _, data in built]
    except Declined as why:
        log.info("recover %s in this process declined (%s): the Spark app recovers", source, why)
        return None
    finally:
        storage.files_for(scratch).remove_tree(scratch)
    result = RecoverResult(source=source, as_of=format_point(req.as_of), lsn=lsn, commit_ts=commit_ts,
                           target=req.target, tables=tuple(tables), from_history=tuple(map(str, from_history)))
    log.info("recover %s: %d table(s) at %s into %s (%d from history), in this process (%.1fs)", source,
             len(tables), lsn, req.target, len(from_history), time.monotonic() - started)
    return result


def resolve_as_of(changes_path: str, point: Point) -> tuple[Lsn, datetime | None, Lsn | None]:
    """`point_job.resolve_as_of` read with pyarrow: (commit LSN, its commit time, silver's last commit LSN) for
    `point`: the greatest commit LSN in silver <= an LSN, or with commit time <= a moment; with no commit at or
    before it, an LSN stays as given, a moment becomes the LSN just before silver's first commit."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    data = delta_log.delta_rs_table(changes_path).to_pyarrow_dataset(
        parquet_read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"))
    lsns = data.to_table(columns=["commit_lsn"]).column("commit_lsn")
    first, last = pc.min(lsns).as_py(), pc.max(lsns).as_py()
    at = ds.field("commit_lsn") <= point.value if isinstance(point, Lsn) \
        else ds.field("commit_ts") <= pa.scalar(point.astimezone(UTC), pa.timestamp("us", tz="UTC"))
    got = data.to_table(columns=["commit_lsn", "commit_ts"], filter=at)
    last_lsn = Lsn(last) if last is not None else None
    if got.num_rows:
        i = pc.index(got.column("commit_lsn"), pc.max(got.column("commit_lsn"))).as_py()
        ts = got.column("commit_ts")[i].as_py()
        if ts is not None:
            ts = ts.astimezone(UTC) if ts.tzinfo else ts.replace(tzinfo=UTC)
        return Lsn(got.column("commit_lsn")[i].as_py()), ts, last_lsn
    if isinstance(point, Lsn):
        return point, None, last_lsn
    return (Lsn(max(first - 1, 0)) if first is not None else Lsn(0)), None, last_lsn


def _history_covers(paths: LakePaths, table: TableName, lsn: Lsn) -> bool:
    """Whether `table`'s history table answers the state at `lsn` (`point_job._history_covers`; its coverage read
    from its Delta log)."""
    from slotlake.merge.history_job import history_coverage

    coverage = history_coverage(None, paths.gold_history(*table))  # type: ignore[arg-type]  # a local log: no Spark
    return coverage is not None and coverage.covers(lsn)


def _open(path: str):
    """The Delta table at `path` as a pyarrow dataset (`merge.in_process.open_dataset`); declined for one delta-rs
    does not read as Spark wrote it."""
    from deltalake.exceptions import DeltaError

    try:
        return open_dataset(path)
    except DeltaError as e:
        raise Declined(f"{path} not read with delta-rs ({type(e).__name__}: {e})") from None


def _history_at(path: str, lsn: Lsn) -> tuple[Any, Any, dict[str, Any]]:
    """The versions of a history table valid at commit LSN `lsn`, shaped like gold (`history_job.history_as_of`:
    valid_from <= L < valid_to): (dataset, filter, the `_slotlake_*` columns as expressions)."""
    import pyarrow.dataset as ds

    from slotlake.contracts import (
        COMMIT_TS_COL,
        DUP_COL,
        LSN_COL,
        VALID_FROM_LSN_COL,
        VALID_FROM_TS_COL,
        VALID_TO_LSN_COL,
    )

    data = _open(path)
    at = (ds.field(VALID_FROM_LSN_COL) <= int(lsn)) & (
        ds.field(VALID_TO_LSN_COL).is_null() | (ds.field(VALID_TO_LSN_COL) > int(lsn)))
    own = {LSN_COL: ds.field(VALID_FROM_LSN_COL), COMMIT_TS_COL: ds.field(VALID_FROM_TS_COL)}
    if DUP_COL in data.schema.names:
        own[DUP_COL] = ds.field(DUP_COL)
    return data, at, own


def _replayed(source: str, table: TableName, lsn: Lsn, scratch: str) -> tuple[Any, Any, dict[str, Any]]:
    """The replayed state of `table` at `lsn` in the scratch folder: (dataset, no filter, its `_slotlake_*`
    columns as they are)."""
    import pyarrow.dataset as ds

    path = table_dir(f"{scratch}/tables", *table)
    if not delta_log.is_delta_table(path):
        raise RecoverError(f"recover {source}: {table} has no state at {lsn} (no gold table and no archived "
                           f"change up to it); check the name (`slotlake status {source}` lists the tables)")
    data = _open(path)
    return data, None, {n: ds.field(n) for n in data.schema.names if n.startswith("_slotlake_")}


def _projected(source: str, req: RecoverRequest, table: TableName, lsn: Lsn, catalog: Sequence[CatalogVersion],
               data, where, own: dict[str, Any]):
    """The recovered rows of `table` as a pyarrow scanner over `data` (rows matching `where`, None: all): its
    columns projected onto the `_catalog` version at `lsn` (its order; a column gold never got is NULL of its gold
    type) and the `_slotlake_*` columns `own` (`point_job._at_point`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from slotlake.decode.types import gold_type
    from slotlake.merge.arrow_values import arrow_type
    from slotlake.merge.plan import needs_column_mapping

    version = version_at(catalog, table, lsn)
    if version is None and req.to_postgres is not None:
        raise RecoverError(f"recover {source}: {table} has no column definition in _catalog at {lsn} (dropped "
                           "before it?); recover it --to a Delta folder instead")
    names = [n for n in data.schema.names if not n.startswith("_slotlake_")]
    if version is None:
        columns: dict[str, Any] = {n: ds.field(n) for n in names}
    else:
        columns = {}
        for c in sorted(version.columns, key=lambda c: c.position):
            if c.name in names:
                columns[c.name] = ds.field(c.name)
                continue
            kind = arrow_type(gold_type(c.type_oid, c.typmod))
            if kind is None:
                raise Declined(f"{table}.{c.name}: a column gold never got, of a type written by Spark")
            columns[c.name] = pc.scalar(pa.scalar(None, kind))
    columns.update(own)
    if req.to_delta is not None and needs_column_mapping(columns):
        raise Declined(f"{table}: column names that need Delta column mapping")
    return data.scanner(columns=columns, filter=where, batch_size=65_536)


def _to_delta(req: RecoverRequest, table: TableName, data) -> RecoveredTable:
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties

    from slotlake.merge.watermarks import row_count

    target = table_dir(str(req.to_delta), *table)
    if req.replace:
        storage.files_for(target).remove_tree(target)  # a new table, not a new version of it
    meta = CommitMeta(STAGE_RECOVER, None, {"source": req.source, "as_of": format_point(req.as_of)}).json()
    uri, options = storage.delta_rs_table_args(target)
    write_deltalake(uri, data.to_reader(), mode="error", storage_options=options or None,
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))
    rows = row_count(target) or 0
    log.info("recover %s: %s -> %s (%d rows)", req.source, table, target, rows)
    return RecoveredTable(str(table), rows, target)


def _postgres_rows(data) -> Iterator[tuple[Any, ...]]:
    """The data columns as Python rows, a batch at a time; soft-deleted rows left out (`point_job._postgres_rows`).
    Time stamps with time zone come as aware UTC datetimes (psycopg sends the offset)."""
    import pyarrow.compute as pc

    for batch in data.to_batches():
        if "_slotlake_deleted" in batch.schema.names:
            batch = batch.filter(pc.invert(pc.fill_null(batch.column("_slotlake_deleted"), False)))
        cols = [batch.column(i).to_pylist() for i, n in enumerate(batch.schema.names)
                if not n.startswith("_slotlake_")]
        yield from zip(*cols)


def _to_postgres(req: RecoverRequest, built, password: str | None) -> list[RecoveredTable]:
    import pyarrow as pa

    from slotlake.recover.to_postgres import TableLoad, load_tables

    assert req.to_postgres is not None
    loads = [TableLoad(req.postgres_table(t), version, _postgres_rows(data)) for t, version, data in built]
    try:
        counts = load_tables(str(req.to_postgres), loads, req.replace, password)
    except (ValueError, OverflowError, pa.ArrowException) as e:  # the one transaction was rolled back
        raise Declined(f"a value pyarrow does not turn into Python ({type(e).__name__}: {e})") from None
    return [RecoveredTable(str(t), n, str(req.postgres_table(t))) for (t, _, _), n in zip(built, counts)]
