"""The initial copy of the source tables, joined to the change stream with no gap and no overlap.

Two ways to copy (docs/internals.md "Snapshot"):

* **With a new slot** (first sync of a source, `resync`): the slot is created over a `replication=database`
  connection with `CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')`. The exported snapshot sees exactly the
  transactions whose commit record lies before the slot's consistent point C; the slot streams the others. Every
  table is copied under that snapshot, and its gold table gets the watermark C - 1 (merge applies commit_lsn >= C).
  The exported snapshot lives only while the replication connection stays open and idle, so it is held open for
  the whole copy. The start of a slot is recorded as a *generation* (`bronze/snapshot/_generations/<C>.json`).
* **Without a slot** (a table added to a running source, or a table whose copy under the slot's snapshot died
  halfway): the table is copied under a fresh `pg_current_snapshot()`, taken only after every transaction that
  was running when the table joined the publication has finished (so no transaction can have changes the stream
  misses and the copy does not see). Gold gets the same watermark C - 1 of the generation plus the snapshot, and
  the merge skips the changes of the transactions that snapshot saw (`slotlake.source.visibility`).

Copies read on several connections in parallel (`workers`), each inside `BEGIN ISOLATION LEVEL REPEATABLE READ;
SET TRANSACTION SNAPSHOT`, through ADBC (COPY binary into Arrow batches, streamed to Parquet: flat memory). A
large table is split into ctid block ranges (a TID range scan each). Values are PostgreSQL text, rendered by each
type's output function with the pinned session settings, i.e. exactly the text pgoutput sends.

Files: `<lake>/<source>/bronze/snapshot/<schema>.<table>/<copy id>/part-NNNNN.parquet` (columns c0..cN, strings;
the folder names encoded as in `slotlake.lake.path_segment`, so `.` separates exactly the two names)
and `manifest.json` (columns, snapshot, parts done, `complete`). Parts are written under a hidden temporary name
and renamed into place; the manifest is rewritten atomically after every part.

Test-only failpoint (`slotlake.failpoints`): `SLOTLAKE_FAILPOINT=snapshot_after_parts:N` stops the copy after N parts
were recorded.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql

from slotlake import bronze, failpoints, storage
from slotlake.config import Config, SourceConfig
from slotlake.errors import PreflightError, SlotLostError, SnapshotError
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.source.catalog_read import archive_bootstrap, generated_published, read_table_defs
from slotlake.source.connection import (
    connect,
    connect_bulk,
    one_row,
    resolve_dsn,
    scalar,
    scrub,
    session_dsn,
    table_ident,
)
from slotlake.source.copies import (
    MANIFEST,
    Generation,
    TableCopy,
    complete_copy,
    copy_dir,
    current_generation,
    publication_record,
    record_generation,
    table_copies,
    write_atomic,
)
from slotlake.source.ddl import TableDef
from slotlake.source.slot import PLUGIN, slot_info

log = logging.getLogger(__name__)

FAILPOINT_ENV = failpoints.ENV
FAILPOINT_AFTER_PARTS = failpoints.SNAPSHOT_AFTER_PARTS
# The config's `snapshot:` section sets these; the environment overrides it (tests use tiny parts).
WORKERS_ENV = "SLOTLAKE_SNAPSHOT_WORKERS"
PART_PAGES_ENV = "SLOTLAKE_SNAPSHOT_PART_PAGES"
BARRIER_TIMEOUT_S = 600.0

# Types whose cast to text is their output function (I/O conversion or binary-coercible text). Every other type
# goes through concat(), which always calls the output function: bool::text gives 'true' (pgoutput sends 't'),
# char(n)::text strips the padding, inet::text adds the netmask.
_CAST_IS_OUTPUT = {20, 21, 23, 25, 26, 700, 701, 1700, 1043, 1082, 1083, 1114, 1184, 1186, 1266, 2950, 114, 3802, 17}


def record_publication_start(conn: psycopg.Connection, lake_root: str, source: SourceConfig,
                             publication: str, timeout: float = BARRIER_TIMEOUT_S) -> Lsn:
    """After `publication` was created for an existing slot: wait until every transaction running now has
    ended, then record the WAL insert position L. Every transaction whose changes began before the publication
    existed has committed before L, so reading the slot without the publication up to L and with it from there
    never meets a change pgoutput cannot decode. The tables only this publication carries are new to the source
    and are copied afterwards (`copy_tables_now`, whose own barrier comes after L), so the changes read without
    it up to L are in their copy."""
    _publication_barrier(conn, source, timeout)
    lsn = Lsn.parse(scalar(conn, "SELECT pg_current_wal_insert_lsn()::text"))
    write_atomic(publication_record(lake_root, publication),
                  json.dumps({"publication": publication, "slot": source.slot, "from_lsn": str(lsn)}))
    log.info("source %s: publication %s was created after slot %s: it is read from %s on", source.name,
             publication, source.slot, lsn)
    return lsn


# ---- results -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TableCopyResult:
    table: str
    kind: str
    rows: int
    bytes: int
    parts: int
    seconds: float
    path: str


@dataclass(frozen=True)
class SnapshotReport:
    """What one snapshot step did. `slot_created` is set when a slot (and a generation) was created."""

    source: str
    generation: Lsn | None
    slot_created: bool
    copies: tuple[TableCopyResult, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.copies)

    def summary(self) -> str:
        if not self.copies:
            return f"snapshot {self.source}: nothing to copy" + (f" ({'; '.join(self.notes)})" if self.notes else "")
        tables = ", ".join(f"{c.table} {c.rows} rows ({c.kind})" for c in self.copies)
        return (f"snapshot {self.source}: copied {len(self.copies)} table(s), {self.rows} rows, "
                f"{sum(c.bytes for c in self.copies) / 1e6:.1f} MB Parquet, joined at {self.generation}: {tables}")


# ---- planning -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Part:
    table: str
    index: int
    lower: int | None  # first block (None: from the start)
    upper: int | None  # block past the end (None: to the end of the relation)


def plan_parts(table: str, pages: int, part_pages: int, partitioned: bool) -> list[_Part]:
    """ctid block ranges of at most `part_pages` blocks; the last one is open-ended (blocks added after the
    size was read hold only rows the snapshot cannot see, but are scanned anyway). One part for a partitioned
    table (its rows live in the partitions; ctid ranges have no meaning across them)."""
    if partitioned or pages <= part_pages:
        return [_Part(table, 0, None, None)]
    bounds = list(range(0, pages, part_pages))
    return [_Part(table, i, lo if i else None, bounds[i + 1] if i + 1 < len(bounds) else None)
            for i, lo in enumerate(bounds)]


def _value_expr(col: dict[str, Any], i: int) -> sql.Composable:
    ident = sql.Identifier(col["name"])
    if int(col["type_oid"]) in _CAST_IS_OUTPUT:
        return sql.SQL("{}::text AS {}").format(ident, sql.Identifier(f"c{i}"))
    return sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE concat({c}) END AS {a}").format(
        c=ident, a=sql.Identifier(f"c{i}"))


def part_query(copy: TableCopy, part: _Part) -> sql.Composed:
    cols = sql.SQL(", ").join(_value_expr(c, i) for i, c in enumerate(copy.columns))
    where = []
    if part.lower is not None:
        where.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({part.lower},0)")))
    if part.upper is not None:
        where.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({part.upper},0)")))
    query = sql.SQL("SELECT {} FROM {}").format(cols, table_ident(TableName.parse(copy.table)))
    if where:
        query = sql.SQL("{} WHERE {}").format(query, sql.SQL(" AND ").join(where))
    return query


def _columns_of(d: TableDef) -> tuple[dict[str, Any], ...]:
    return tuple({"name": c.name, "type_oid": c.type_oid, "type_name": c.type_name, "typmod": c.typmod,
                  "is_key": c.is_key, "not_null": c.not_null} for c in d.replicated_columns)


def _now() -> str:
    return datetime.now(UTC).isoformat()


# ---- the copy -----------------------------------------------------------------------------------------------

def _failpoint_parts() -> int | None:
    return failpoints.count(FAILPOINT_AFTER_PARTS)


class _OpenFailed(Exception):
    """A worker could not open its connection in the snapshot (the cause is chained)."""


class _Stopped(Exception):
    """The copy is stopping: a part not started yet is not copied."""


@dataclass
class _Progress:
    """Per-table running totals (coordinator thread only)."""

    copy: TableCopy
    started: float
    bytes: int = 0
    rows: int = 0
    done: set[int] = field(default_factory=set)


def _copy_part(bulk, copy: TableCopy, part: _Part, folder: str) -> dict[str, Any]:
    """Stream one part into `part-NNNNN.parquet` (temporary name, fsync, rename; on S3 a local scratch file, then
    one PUT). Returns its manifest entry. A part copied again (a retry) replaces the earlier file."""
    name = f"part-{part.index:05d}.parquet"
    final = storage.join(folder, name)
    if storage.is_s3(folder):
        scratch = bronze.scratch_dir(folder)  # a local folder of this copy's own
        scratch.mkdir(parents=True, exist_ok=True)
        tmp = scratch / f".{name}.tmp"
    else:
        tmp = storage.local_path(folder) / f".{name}.tmp"
    rows = 0
    writer = None
    cur = bulk.cursor()
    try:
        cur.execute(part_query(copy, part).as_string(None))
        reader = cur.fetch_record_batch()
        schema = pa.schema([(f"c{i}", pa.string()) for i in range(len(copy.columns))])
        writer = pq.ParquetWriter(str(tmp), schema)
        for batch in reader:
            if batch.num_rows == 0:
                continue
            arrays = [batch.column(i) if batch.column(i).type == pa.string() else batch.column(i).cast(pa.string())
                      for i in range(batch.num_columns)]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
            rows += batch.num_rows
        writer.close()
        writer = None
    finally:
        if writer is not None:
            writer.close()
        cur.close()
    size = storage.files_for(final).replace_file(final, str(tmp))
    return {"index": part.index, "name": name, "rows": rows, "bytes": size}


def _open_in_snapshot(source: SourceConfig, snapshot_name: str):
    """An ADBC connection inside a REPEATABLE READ transaction that imported `snapshot_name`."""
    bulk = connect_bulk(source)
    cur = bulk.cursor()
    try:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cur.execute(f"SET TRANSACTION SNAPSHOT '{snapshot_name}'")
    finally:
        cur.close()
    return bulk


def _sizes(cfg: Config, workers: int | None, part_pages: int | None) -> dict[str, int]:
    """Connections and part size: the caller's, else the environment's (tests), else the config's."""
    return {"workers": workers or int(os.environ.get(WORKERS_ENV, cfg.snapshot.workers)),
            "part_pages": part_pages or int(os.environ.get(PART_PAGES_ENV, cfg.snapshot.part_pages))}


def copy_tables(lake_root: str, source: SourceConfig, copies: list[TableCopy], snapshot_name: str,
                pages: dict[str, int],
                *, workers: int, part_pages: int) -> list[TableCopyResult]:
    """Copy `copies` (manifests planned by the caller) under the exported snapshot `snapshot_name`, on `workers`
    connections, in parts of `part_pages` blocks (`_sizes`). The snapshot must stay exported (its transaction or
    replication connection open) meanwhile."""
    progress: dict[str, _Progress] = {}
    todo: list[_Part] = []
    t0 = time.monotonic()
    for c in copies:
        parts = plan_parts(c.table, pages[c.table], part_pages, partitioned=pages[c.table] < 0)
        c = replace(c, parts_total=len(parts))
        folder = copy_dir(lake_root, c.table, c.copy_id)
        if not storage.is_s3(folder):
            storage.local_path(folder).mkdir(parents=True, exist_ok=True)
        write_atomic(storage.join(folder, MANIFEST), c.to_json())
        progress[c.table] = _Progress(c, t0)
        todo += parts
    dsn = resolve_dsn(source)
    stop = threading.Event()
    local = threading.local()  # each worker thread's connection in the snapshot
    opened: list[Any] = []
    opened_lock = threading.Lock()

    def connection() -> Any:
        bulk = getattr(local, "bulk", None)
        if bulk is None:
            bulk = _open_in_snapshot(source, snapshot_name)
            local.bulk = bulk
            with opened_lock:
                opened.append(bulk)
        return bulk

    def copy_one(part: _Part) -> dict[str, Any]:
        if stop.is_set():
            raise _Stopped()
        try:
            bulk = connection()
        except BaseException as e:
            raise _OpenFailed() from e
        c = progress[part.table].copy
        try:
            return _copy_part(bulk, c, part, copy_dir(lake_root, c.table, c.copy_id))
        except Exception as first:
            # Once more on a new connection in the same snapshot (still exported: the coordinator holds it),
            # e.g. after a dropped connection; a second failure fails the copy.
            log.warning("snapshot %s: %s part %d failed (%s); retrying it once in the same snapshot",
                        source.name, part.table, part.index, scrub(str(first), dsn))
            local.bulk = None
            return _copy_part(connection(), c, part, copy_dir(lake_root, c.table, c.copy_id))

    expected = len(todo)
    recorded = 0
    failpoint = _failpoint_parts()
    error: BaseException | None = None
    failed_table = ""
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, expected)), thread_name_prefix="slotlake-snapshot")
    try:
        futures = {pool.submit(copy_one, part): part for part in todo}
        for done in as_completed(futures):
            part = futures[done]
            try:
                outcome = done.result()
            except _OpenFailed as e:
                error, failed_table = e.__cause__, "open"
                break
            except BaseException as e:  # noqa: BLE001 - reported below, after the workers stopped
                error, failed_table = e, part.table
                break
            table = part.table
            pr = progress[table]
            pr.copy = replace(pr.copy, parts=pr.copy.parts + (outcome,))
            pr.rows += outcome["rows"]
            pr.bytes += outcome["bytes"]
            pr.done.add(part.index)
            if len(pr.done) == pr.copy.parts_total:
                pr.copy = replace(pr.copy, complete=True, finished_at=_now())
            write_atomic(storage.join(copy_dir(lake_root, table, pr.copy.copy_id), MANIFEST), pr.copy.to_json())
            recorded += 1
            secs = max(time.monotonic() - pr.started, 1e-9)
            pct = f"{100.0 * pr.rows / pr.copy.reltuples:.0f}% of reltuples" if pr.copy.reltuples > 0 else "n/a"
            log.info("snapshot %s: %s part %d/%d: %d rows (table %d rows, %.1f MB, %.0f rows/s, %.1f MB/s, %s)%s",
                     source.name, table, len(pr.done), pr.copy.parts_total, outcome["rows"], pr.rows,
                     pr.bytes / 1e6, pr.rows / secs, pr.bytes / 1e6 / secs, pct,
                     " complete" if pr.copy.complete else "")
            if failpoint is not None and recorded >= failpoint and recorded < expected:
                raise SnapshotError(f"failpoint {FAILPOINT_AFTER_PARTS}{failpoint}: stopped the copy after "
                                    f"{recorded} part(s) (test-only)")
    finally:
        # Parts not started are dropped; the ones running finish (a COPY cannot be interrupted halfway safely).
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for bulk in opened:
            try:
                bulk.close()
            except Exception:  # noqa: BLE001 - the transaction is read-only; closing is best effort
                pass
    if error is not None:
        if failed_table == "open":
            raise SnapshotError(f"snapshot {source.name}: cannot open a copy connection in the snapshot: "
                                f"{scrub(str(error), dsn)}") from error
        raise SnapshotError(f"snapshot {source.name}: copying table {failed_table} failed: "
                            f"{_reason(str(error), dsn)}") from error
    secs = time.monotonic() - t0
    out = []
    for table, pr in progress.items():
        out.append(TableCopyResult(table=table, kind=pr.copy.kind, rows=pr.rows, bytes=pr.bytes,
                                   parts=pr.copy.parts_total, seconds=secs,
                                   path=copy_dir(lake_root, table, pr.copy.copy_id)))
    return out


def _reason(message: str, dsn: str) -> str:
    text = scrub(message, dsn)
    if "permission denied" in text:
        text += " (grant SELECT on the table to the replication role)"
    return text


def _plan_copies(conn: psycopg.Connection, tables: list[str], *, copy_id: str, gen: Generation, kind: str,
                 snapshot_text: str, lsn_after: Lsn, publication: str) -> tuple[list[TableCopy], dict[str, int]]:
    """Manifests (not yet written) and heap sizes in blocks (-1: partitioned) of `tables`, read in `conn`'s
    transaction (which runs under the copy's snapshot, so the definitions match it). The copy has the columns
    the publication sends (stored generated ones too on PostgreSQL 18 with publish_generated_columns)."""
    defs = {d.qualified_name: d for d in read_table_defs(
        conn, tables, generated_published=generated_published(conn, publication))}
    copies, pages = [], {}
    for t in tables:
        d = defs[t]
        if not d.replicated_columns:
            raise SnapshotError(f"snapshot: table {t} has no columns pgoutput replicates; nothing can be copied")
        row = one_row(
            conn,
            "SELECT c.relkind, greatest(c.reltuples, 0)::bigint, "
            "pg_relation_size(c.oid) / current_setting('block_size')::int FROM pg_class c WHERE c.oid = %s",
            (d.oid,))
        pages[t] = -1 if row[0] == "p" else int(row[2])
        copies.append(TableCopy(
            table=t, copy_id=copy_id, generation=gen.consistent_point.hex16, kind=kind, watermark=gen.watermark,
            snapshot=snapshot_text, lsn_after=lsn_after, replica_identity=d.replica_identity.value,
            columns=_columns_of(d), reltuples=int(row[1]), parts_total=0, started_at=_now()))
    return copies, pages


def _check_select(conn: psycopg.Connection, source: SourceConfig, tables: list[str]) -> None:
    for t in tables:
        schema, name = TableName.parse(t)
        ok = scalar(conn, "SELECT has_table_privilege(format('%%I.%%I', %s::text, %s::text), 'SELECT')",
                    (schema, name))
        if not ok:
            user = scalar(conn, "SELECT current_user")
            raise SnapshotError(f"snapshot {source.name}: table {t} cannot be copied: role {user} has no SELECT on "
                                f"it; run GRANT SELECT ON {t} TO {user}")


def source_tables(conn: psycopg.Connection, source: SourceConfig) -> list[str]:
    """The tables the source syncs (canonical names): the configured ones (`tables` + `insert_only`), else every
    table its publications carry (of its `schemas`, when set): tables created later included."""
    listed = source.listed_tables
    if listed is not None:
        return list(listed)
    names = (str(TableName(s, t)) for s, t in conn.execute(
        "SELECT DISTINCT schemaname, tablename FROM pg_publication_tables WHERE pubname = ANY(%s) ORDER BY 1, 2",
        (list(source.publications),)))
    return [n for n in names if source.syncs(n)]


def create_slot_with_snapshot(cfg: Config, source: SourceConfig, *, reason: str = "new source",
                              workers: int | None = None, part_pages: int | None = None
                              ) -> SnapshotReport:
    """Create the source's slot with an exported snapshot and copy every table under it (the publication must
    exist). Records the generation first, so a copy that dies halfway is resumed (see `ensure_snapshots`)."""
    root = f"{cfg.lake.rstrip('/')}/{source.name}"
    dsn = resolve_dsn(source)
    with connect(source) as ctl:  # fail before creating anything
        _check_select(ctl, source, source_tables(ctl, source))
    try:
        repl = psycopg.connect(session_dsn(dsn), autocommit=True, replication="database",
                               application_name="slotlake-snapshot")
    except psycopg.Error as e:
        raise PreflightError(f"source {source.name}: cannot open a replication connection: {scrub(str(e), dsn)}; "
                             "the role needs REPLICATION and pg_hba.conf must allow it") from None
    with repl:
        try:
            row = one_row(repl, sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL {} (SNAPSHOT 'export')").format(
                sql.Identifier(source.slot), sql.Identifier(PLUGIN)))
        except psycopg.Error as e:
            raise PreflightError(f"source {source.name}: cannot create replication slot {source.slot}: "
                                 f"{scrub(str(e), dsn)}") from None
        consistent, snapshot_name = Lsn.parse(row[1]), row[2]
        gen = Generation(slot=source.slot, consistent_point=consistent, reason=reason, created_at=_now(),
                         archived_to=bronze.covered_lsn(root))
        record_generation(root, gen)
        log.info("source %s: created replication slot %s (pgoutput) at consistent point %s with exported snapshot "
                 "%s (%s)", source.name, source.slot, consistent, snapshot_name, reason)
        with connect(source, autocommit=False) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # psycopg's BEGIN carries it
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
            tables = source_tables(conn, source)
            _check_select(conn, source, tables)
            # The table definitions in force at the consistent point, for the multi-version catalog.
            archive_bootstrap(conn, root, tables, consistent,
                              generated_published=generated_published(conn, source.publication))
            snap_text = scalar(conn, "SELECT pg_current_snapshot()::text")
            copies, pages = _plan_copies(conn, tables, copy_id=consistent.hex16, gen=gen, kind="exported",
                                         snapshot_text=snap_text, lsn_after=consistent,
                                         publication=source.publication)
            results = copy_tables(root, source, copies, snapshot_name, pages, **_sizes(cfg, workers, part_pages))
            conn.rollback()
    report = SnapshotReport(source=source.name, generation=consistent, slot_created=True, copies=tuple(results))
    log.info("%s", report.summary())
    return report


def _publication_barrier(conn: psycopg.Connection, source: SourceConfig, timeout: float) -> None:
    """Wait until every transaction running now has ended. Called after the tables joined the publication: a
    transaction that changed a table before it joined is not streamed, so it must be visible to the copy."""
    xmax = scalar(conn, "SELECT pg_snapshot_xmax(pg_current_snapshot())")
    deadline = time.monotonic() + timeout
    while True:
        xmin = scalar(conn, "SELECT pg_snapshot_xmin(pg_current_snapshot())")
        if int(xmin) >= int(xmax):
            return
        if time.monotonic() > deadline:
            raise SnapshotError(f"snapshot {source.name}: transactions older than xid {xmax} are still running "
                                f"after {timeout:.0f} s (see pg_stat_activity); the copy waits for them so that no "
                                "change is missed; end them or retry later")
        time.sleep(0.2)


def copy_tables_now(cfg: Config, source: SourceConfig, tables: list[str], gen: Generation, *,
                    workers: int | None = None, part_pages: int | None = None,
                    barrier_timeout: float = BARRIER_TIMEOUT_S) -> list[TableCopyResult]:
    """Copy `tables` (already in the publication) under a fresh snapshot, joined to generation `gen` with a
    visibility filter: for tables added to a running source and copies resumed after a failure."""
    root = f"{cfg.lake.rstrip('/')}/{source.name}"
    with connect(source) as ctl:
        _check_select(ctl, source, tables)
        _publication_barrier(ctl, source, barrier_timeout)
    with connect(source, autocommit=False) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snapshot_name, snap_text = one_row(conn, "SELECT pg_export_snapshot(), pg_current_snapshot()::text")
        # Read after the snapshot: every transaction it saw has its commit record before this position.
        lsn_after = Lsn.parse(scalar(conn, "SELECT pg_current_wal_insert_lsn()::text"))
        copies, pages = _plan_copies(conn, tables, copy_id=lsn_after.hex16, gen=gen, kind="current",
                                     snapshot_text=snap_text, lsn_after=lsn_after, publication=source.publication)
        log.info("snapshot %s: copying %s under snapshot %s (WAL %s), joined to slot generation %s",
                 source.name, ", ".join(tables), snap_text, lsn_after, gen.consistent_point)
        results = copy_tables(root, source, copies, snapshot_name, pages, **_sizes(cfg, workers, part_pages))
        conn.rollback()
    return results


def ensure_snapshots(cfg: Config, source: SourceConfig, *, workers: int | None = None,
                     part_pages: int | None = None) -> SnapshotReport:
    """The pipeline's snapshot step, after preflight and before extract: copy every table of the source that has
    no complete copy in the current slot generation (a table added to the config, or a copy that died halfway).
    A no-op when all are copied. Sources synced before snapshots existed (bronze but no generation) are left."""
    root = f"{cfg.lake.rstrip('/')}/{source.name}"
    with connect(source) as conn:
        info = slot_info(conn, source.slot)
        tables = source_tables(conn, source)
    gen = current_generation(root)
    if info is None:
        raise SlotLostError(f"slot {source.slot} does not exist; run `slotlake sync {source.name}` (its preflight "
                            f"creates it with the initial copy) or `slotlake resync {source.name}`")
    if gen is None or gen.slot != source.slot:
        if bronze.max_archived_end(root) is not None:
            note = "bronze predates slot generations: tables are not copied (run `slotlake resync` to copy them)"
            log.info("snapshot %s: %s", source.name, note)
            return SnapshotReport(source=source.name, generation=None, slot_created=False, notes=(note,))
        # The slot was created but its generation was not recorded (died in between): nothing was streamed yet,
        # so the slot's confirmed position is its consistent point.
        gen = Generation(slot=source.slot, consistent_point=info.confirmed_flush_lsn,  # type: ignore[arg-type]
                         reason="recovered",
                         created_at=_now())
        record_generation(root, gen)
    missing = [t for t in tables if complete_copy(root, t, gen) is None]
    if not missing:
        return SnapshotReport(source=source.name, generation=gen.consistent_point, slot_created=False)
    started = [t for t in missing if table_copies(root, t)]
    if started:
        log.warning("snapshot %s: %s have an unfinished copy; their snapshot is gone, so they are copied again "
                    "under a new one (the finished tables are kept)", source.name, ", ".join(started))
    results = copy_tables_now(cfg, source, missing, gen, workers=workers, part_pages=part_pages)
    report = SnapshotReport(source=source.name, generation=gen.consistent_point, slot_created=False,
                            copies=tuple(results))
    log.info("%s", report.summary())
    return report
