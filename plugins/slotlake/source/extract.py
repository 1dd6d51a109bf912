"""Extract: peek the slot in bounded calls, archive each call's output to bronze, then advance the slot.

One run:
  1. `upto_lsn` = the WAL flush position when the run starts (invariant 6: every peek is bounded by it and by
     `upto_nchanges`; changes committed later are left for the next run).
  2. Crash recovery ("never twice", invariant 2): if bronze already holds commits past the slot's confirmed
     position, a previous run placed a file and died before advancing; advance the slot to bronze's end first.
  3. Per call: `pg_logical_slot_peek_binary_changes` read through ADBC (COPY binary into Arrow record batches,
     streamed, so a 10-million-row transaction passes with flat memory), written batch by batch to a Parquet
     file, the end LSN taken from the last Commit frame, the file placed atomically (on S3: one conditional PUT
     of the finished local file, `bronze.place`), and only then the slot
     advanced to that end LSN (invariant 1: never past what is durable). A call that returned fewer rows than
     `upto_nchanges` decoded everything up to `upto_lsn`, so the slot goes straight there and the run ends; a
     run with nothing to archive moves the slot to `upto_lsn` too, so quiet publications never pin WAL. Before
     the slot moves past the end of the last bronze file, a coverage marker records that position
     (`bronze.place_covered`), so a replay can end anywhere the slot has passed.

pgoutput without streaming emits a transaction whole when its commit is decoded, and a peek call stops only
after a whole WAL record, so each call's output is whole transactions. The one thing that may follow the last
Commit is a non-transactional logical message (`pg_logical_emit_message(false, ...)`); the file's end LSN then
becomes that message's LSN + 1, which is where the slot must be advanced to so the message is not sent again.

Test-only failpoints (`slotlake.failpoints`): `SLOTLAKE_FAILPOINT=extract_after_write` makes a run raise right after
placing its first file and before advancing the slot, to simulate a crash in that window; `extract_after_files:N`
raises after N files were placed and the slot advanced past them (a run that fails halfway).
"""
from __future__ import annotations

import functools
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from psycopg import sql

from slotlake import bronze, contracts, failpoints
from slotlake.config import Config, SourceConfig
from slotlake.errors import ExtractError, PreflightError, SlotLostError
from slotlake.lsn import Lsn
from slotlake.read_ahead import ReadAhead
from slotlake.source.connection import connect, connect_bulk, resolve_dsn, scrub
from slotlake.source.copies import publication_start
from slotlake.source.frame_summary import FrameScan
from slotlake.source.slot import advance_slot, current_flush_lsn, idle_slot_timeout, lost_slot_message, slot_info

log = logging.getLogger(__name__)

FAILPOINT_ENV = failpoints.ENV
FAILPOINT_AFTER_WRITE = failpoints.EXTRACT_AFTER_WRITE

SCHEMA = contracts.arrow_schema(contracts.BRONZE)
_COMMIT_LEN = 26  # 'C', int8 flags, int64 commit_lsn, int64 end_lsn, int64 commit ts
_END_LSN = struct.Struct(">Q")  # Commit.end_lsn at byte offset 10


@functools.cache
def _markers() -> tuple[pa.Scalar, pa.Scalar, pa.Scalar]:
    """Commit tag, Message tag, non-transactional Message flags (bit 0 = transactional). Built on first use: a
    pyarrow value made from Python objects imports pandas (seconds), which a sync with nothing to archive skips."""
    return pa.scalar(b"C", pa.binary()), pa.scalar(b"M", pa.binary()), pa.scalar(b"\x00", pa.binary())


@dataclass(frozen=True)
class ExtractResult:
    """What one extract run archived. `end_lsn` is the slot's confirmed position when the run finished."""

    source: str
    files: tuple[str, ...]
    rows: int
    bytes: int  # pgoutput bytes read (the `data` column)
    file_bytes: int  # Parquet bytes written
    start_lsn: Lsn
    end_lsn: Lsn
    upto_lsn: Lsn
    calls: int
    seconds: float
    recovered_to: Lsn | None = None  # set when a crashed run's file was found and the slot advanced to it


@dataclass
class _Call:
    """Running state of one peek call while its rows stream through."""

    rows: int = 0
    data_bytes: int = 0
    last_commit_end: Lsn | None = None
    trailing_message_lsn: Lsn | None = None  # non-transactional message after the last commit
    open_transaction: bool = False  # rows after the last commit that are not non-transactional messages

    @property
    def end_lsn(self) -> Lsn | None:
        ends = [x for x in (self.last_commit_end,
                            self.trailing_message_lsn + 1 if self.trailing_message_lsn is not None else None)
                if x is not None]
        return max(ends) if ends else None


def _scan(call: _Call, batch: pa.RecordBatch) -> None:
    """Find the last Commit frame (vectorised) and what follows it, updating `call`."""
    _C, _M, _NON_TRANSACTIONAL = _markers()
    data = batch.column("data")
    lengths = pc.binary_length(data)
    call.rows += batch.num_rows
    call.data_bytes += pc.sum(lengths).as_py() or 0
    first = pc.binary_slice(data, 0, 1)
    commits = pc.indices_nonzero(pc.and_(pc.equal(lengths, _COMMIT_LEN), pc.equal(first, _C)))
    after = 0
    if len(commits):
        last = commits[-1].as_py()
        call.last_commit_end = Lsn(_END_LSN.unpack_from(data[last].as_py(), 10)[0])
        call.trailing_message_lsn = None
        call.open_transaction = False
        after = last + 1
    if after == batch.num_rows:
        return
    tail = batch.slice(after)
    tail_data = tail.column("data")
    non_tx = pc.and_(pc.equal(pc.binary_slice(tail_data, 0, 1), _M),
                     pc.equal(pc.binary_slice(tail_data, 1, 2), _NON_TRANSACTIONAL))
    if pc.all(non_tx).as_py() and not call.open_transaction:
        call.trailing_message_lsn = Lsn(pc.max(tail.column("lsn")).as_py())
    else:
        call.open_transaction = True


ORIGIN_NONE_MIN_VERSION = 160000  # pgoutput's `origin` option


def origin_option(source: SourceConfig, server_version: int) -> str | None:
    """pgoutput's `origin` option for the source (None: not passed, every change is sent).

    `origin: none` makes pgoutput skip changes that carry a replication origin, i.e. that another logical
    replication (a subscription) applied to this database, so a two-way setup does not echo them back.
    """
    if source.origin == "any":
        return None
    if server_version < ORIGIN_NONE_MIN_VERSION:
        raise PreflightError(f"source {source.name}: origin: none needs PostgreSQL 16 or newer (pgoutput's origin "
                             f"option), the server is {server_version // 10000}; remove sources.{source.name}.origin "
                             "or set it to any")
    return source.origin


def _peek_query(conn, source: SourceConfig, upto_lsn: Lsn, upto_nchanges: int,
                publications: tuple[str, ...] | None = None) -> str:
    # pg_lsn and xid have no Arrow type in ADBC: cast them to bigint. publication_names is parsed as an
    # identifier list, so the names are passed quoted.
    names = ",".join(sql.Identifier(p).as_string(conn) for p in (publications or source.publications))
    origin = origin_option(source, conn.info.server_version)
    query = sql.SQL(
        "SELECT (lsn - '0/0'::pg_lsn)::bigint AS lsn, xid::text::bigint AS xid, data "
        "FROM pg_logical_slot_peek_binary_changes({slot}, {upto}::pg_lsn, {n}, "
        "'proto_version', '1', 'publication_names', {pub}, 'messages', 'true'{origin})"
    ).format(slot=sql.Literal(source.slot), upto=sql.Literal(str(upto_lsn)), n=sql.Literal(upto_nchanges),
             pub=sql.Literal(names),
             origin=sql.SQL(", 'origin', {}").format(sql.Literal(origin)) if origin else sql.SQL(""))
    return query.as_string(conn)


def _parquet_writer(path: str) -> pq.ParquetWriter:
    # pgoutput frames are nearly all distinct and LSNs only grow: dictionary pages and binary min/max statistics
    # would cost time for nothing. xid repeats (one per transaction) and keeps its dictionary; LSN statistics stay
    # (row groups can be skipped by LSN).
    return pq.ParquetWriter(path, SCHEMA, use_dictionary=["xid"], write_statistics=["lsn", "xid", "ord"])


# ADBC's batches of the peek's stream: 8 MB (its default 16 MB) keeps the extract's peak under what it was before
# the read-ahead at the same speed (a 10 M-row transaction: 224 MB against 267 MB at 16 MB, 244 MB without it).
_BATCH_BYTES = 8 << 20
_PREFETCH_BATCHES = 1  # ADBC batches read ahead while the previous one is written (`ReadAhead`)


def _write_call(bulk, query: str, path: str, source: SourceConfig, start: Lsn, batch_rows: int) -> _Call:
    """Stream one peek call into a Parquet file at `path`, in row groups of `batch_rows`; returns what was seen."""
    call = _Call()
    frames = FrameScan()  # the footer's frame summary, so the decode need not aggregate the frames in Spark
    writer: pq.ParquetWriter | None = None
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    cur = bulk.cursor()
    reader: ReadAhead | None = None
    try:
        from adbc_driver_postgresql import StatementOptions

        cur.adbc_statement.set_options(**{StatementOptions.BATCH_SIZE_HINT_BYTES.value: str(_BATCH_BYTES)})
        cur.execute(query)
        # ADBC reads the COPY stream only when asked for a batch: read ahead, the server does not wait while this
        # process summarizes and writes a batch
        reader = ReadAhead(cur.fetch_record_batch(), _PREFETCH_BATCHES, name="slotlake-extract-read")
        for batch in reader:
            if batch.num_rows == 0:
                continue
            ord_ = pa.array(np.arange(call.rows, call.rows + batch.num_rows, dtype=np.int64))
            frames.add(batch.column("data"), batch.column("xid"), call.rows)
            _scan(call, batch)
            pending.append(pa.RecordBatch.from_arrays(
                [batch.column("lsn"), batch.column("xid"), batch.column("data"), ord_], schema=SCHEMA))
            pending_rows += batch.num_rows
            if pending_rows >= batch_rows:
                if writer is None:
                    writer = _parquet_writer(path)
                table = pa.Table.from_batches(pending, schema=SCHEMA)
                full = (pending_rows // batch_rows) * batch_rows
                writer.write_table(table.slice(0, full), row_group_size=batch_rows)
                rest = table.slice(full)
                pending, pending_rows = rest.to_batches(), rest.num_rows
        if call.rows == 0:
            return call
        if writer is None:
            writer = _parquet_writer(path)
        if pending_rows:
            writer.write_table(pa.Table.from_batches(pending, schema=SCHEMA), row_group_size=batch_rows)
        end = call.end_lsn
        summary = frames.result()
        writer.add_key_value_metadata({
            bronze.META_START: str(start), bronze.META_END: str(end) if end else "",
            bronze.META_SLOT: source.slot, bronze.META_ROWS: str(call.rows),
            **({bronze.META_FRAMES: summary.json()} if summary is not None else {}),
        })
        writer.close()
        writer = None
        return call
    finally:
        if reader is not None:
            reader.close()
        if writer is not None:
            writer.close()
        cur.close()


def extract(cfg: Config, source: SourceConfig, *, upto_lsn: Lsn | None = None,
            on_first_file: Callable[[], None] | None = None) -> ExtractResult:
    """Archive the slot's changes up to `upto_lsn` (default: the WAL flush position now) into bronze.
    `on_first_file()` runs once, when the first file is placed and the slot advanced past it (the sync starts its
    Spark app then, `slotlake.spark.early`; an exception in it is logged and the extract goes on).

    Guarantees: every file placed holds whole transactions; the slot is advanced only after the file holding
    them is durable; a run after a crash between placing and advancing archives nothing twice.
    Call `run_preflight` first (it creates the publication and slot); a missing slot here is an error.
    """
    started = time.monotonic()
    root = f"{cfg.lake.rstrip('/')}/{source.name}"
    settings = cfg.extract
    with connect(source) as conn:
        upto = upto_lsn or current_flush_lsn(conn)
        info = slot_info(conn, source.slot)
        if info is None or info.confirmed_flush_lsn is None:
            raise SlotLostError(f"source {source.name}: replication slot {source.slot} does not exist; "
                                f"run `slotlake sync {source.name}` (preflight creates it) or, if it was dropped "
                                f"after bronze had files, `slotlake resync {source.name}`")
        if info.invalidated:
            raise SlotLostError(lost_slot_message(info, source.name, idle_slot_timeout(conn)))
        for name in bronze.remove_abandoned(root):
            log.warning("extract %s: removed %s, left by a run that died while writing it", source.name, name)
        position = info.confirmed_flush_lsn
        recovered = None
        archived = bronze.max_archived_end(root)
        if archived is not None and archived > position:
            # A previous run placed this file and died before advancing: its commits are archived already.
            position = advance_slot(conn, source.slot, archived)
            recovered = archived
            log.warning("extract %s: bronze holds commits up to %s but slot %s was at %s (a run died between "
                        "writing and advancing); advanced the slot to %s", source.name, archived, source.slot,
                        info.confirmed_flush_lsn, position)
        start_lsn = position
        files: list[str] = []
        rows = data_bytes = file_bytes = calls = 0
        # An insert-only publication created after the slot is named only from where it can be decoded.
        since = (publication_start(root, source.slot, source.insert_only_publication)
                 if source.insert_only else None)
        with connect_bulk(source) as bulk:
            while position < upto and calls < settings.max_calls:
                calls += 1
                stop, publications = upto, source.publications
                if since is not None and position < since:
                    stop, publications = min(upto, since), (source.publication,)
                flushed = current_flush_lsn(conn)
                t0 = time.monotonic()
                tmp = bronze.tmp_path(root, position)
                try:
                    call = _write_call(bulk, _peek_query(conn, source, stop, settings.upto_nchanges, publications),
                                       str(tmp), source, position, settings.batch_rows)
                except Exception as e:
                    tmp.unlink(missing_ok=True)  # never placed, so nothing was archived
                    raise ExtractError(f"extract {source.name}: peek on slot {source.slot} failed at {position}: "
                                       f"{scrub(str(e), resolve_dsn(source))}") from e
                if call.rows == 0:
                    if tmp.exists():
                        tmp.unlink()
                    # Nothing published committed before upto_lsn: move the slot there anyway so it does not pin
                    # WAL on a busy server with quiet tables. Safe because the peek decoded everything up to
                    # min(upto, flush position before the peek), and found nothing to archive.
                    idle_to = min(stop, flushed)
                    if idle_to > position:
                        # Recorded before the slot moves, so replays may end here (invariant 1: the record
                        # never claims more than is durable; bronze already holds everything before it).
                        bronze.place_covered(root, idle_to, slot=source.slot, upto=upto)
                        position = advance_slot(conn, source.slot, idle_to)
                        log.info("extract %s: no changes up to %s; advanced slot %s to %s",
                                 source.name, stop, source.slot, position)
                    if stop < upto and position >= stop:
                        continue  # on with every publication
                    break
                end = call.end_lsn
                if end is None or call.open_transaction:
                    tmp.unlink(missing_ok=True)
                    raise ExtractError(f"extract {source.name}: the peek output at {position} does not end with a "
                                       "Commit (is streaming enabled on the slot?); nothing was archived or advanced")
                size = os.path.getsize(tmp)
                # Durable when this returns: fsync + rename locally, one conditional PUT on S3 (invariant 1).
                placed = bronze.place(tmp, position, end, root)
                if failpoints.active(FAILPOINT_AFTER_WRITE):
                    raise ExtractError(f"failpoint {FAILPOINT_AFTER_WRITE}: stopped after placing {placed.name} "
                                       "and before advancing the slot (test-only)")
                # Fewer rows than upto_nchanges: the peek stopped at min(upto, flush position) and everything
                # before it is in this file, so move on to there in the same advance (an advance re-reads WAL
                # from restart_lsn, and a further empty call would decode it all again just to find nothing).
                reached_upto = call.rows < settings.upto_nchanges
                target = max(end, min(stop, flushed)) if reached_upto else end
                if target > end:  # the file is durable; record the coverage past it before the slot moves there
                    bronze.place_covered(root, target, slot=source.slot, upto=upto)
                t1 = time.monotonic()
                position = advance_slot(conn, source.slot, target)
                advance_s = time.monotonic() - t1
                if position < end:
                    raise ExtractError(f"extract {source.name}: slot {source.slot} advanced only to {position}, "
                                       f"not {end}; the next run resumes from bronze")
                files.append(placed.path)
                if on_first_file is not None and len(files) == 1:
                    try:
                        on_first_file()
                    except Exception as e:  # noqa: BLE001  (the caller's business: the extract goes on)
                        log.warning("extract %s: after the first file: %s", source.name, e)
                if len(files) == failpoints.count(failpoints.EXTRACT_AFTER_FILES):
                    raise ExtractError(f"failpoint {failpoints.EXTRACT_AFTER_FILES}{len(files)}: stopped after "
                                       f"{len(files)} files, the slot advanced past them (test-only)")
                rows += call.rows
                data_bytes += call.data_bytes
                file_bytes += size
                secs = max(time.monotonic() - t0, 1e-9)
                log.info("extract %s: call %d: %d rows, %.1f MB in %.2f s (%.0f rows/s, %.1f MB/s; the slot's advance "
                         "%.2f s), reached %s -> %s", source.name, calls, call.rows, call.data_bytes / 1e6, secs,
                         call.rows / secs, call.data_bytes / 1e6 / secs, advance_s, end, placed.name)
                if reached_upto and not (stop < upto and position >= stop):
                    break
            if position < upto and calls >= settings.max_calls:
                log.info("extract %s: stopped after max_calls=%d at %s (upto %s); the next run continues",
                         source.name, settings.max_calls, position, upto)
    seconds = time.monotonic() - started
    result = ExtractResult(source=source.name, files=tuple(files), rows=rows, bytes=data_bytes,
                           file_bytes=file_bytes, start_lsn=start_lsn, end_lsn=position, upto_lsn=upto,
                           calls=calls, seconds=seconds, recovered_to=recovered)
    log.info("extract %s: %d files, %d rows, %.1f MB pgoutput (%.1f MB Parquet) in %.1f s (%.0f rows/s, %.1f MB/s), "
             "%s -> %s (upto %s, %d calls)", source.name, len(files), rows, data_bytes / 1e6, file_bytes / 1e6,
             seconds, rows / max(seconds, 1e-9), data_bytes / 1e6 / max(seconds, 1e-9), start_lsn, position, upto,
             calls)
    return result
