"""The decode job: new bronze files -> `silver/changes` (one Delta commit) and `_catalog` (docs/internals.md).

    bronze/*.parquet ──one aggregation of the raw frames (JVM)──▶ BronzeSummary (catalog transactions, big
                                                                     transactions' commit ends, changes per table)
        frames of the catalog transactions minus their row changes ──collect (small), BatchDecoder in the driver──▶
            Relation/Type/DDL rows ──▶ catalog versioning ──▶ _catalog (rewrite, idempotent)
                             DDL rows ──▶ _ddl_log (append, idempotent)
        one partition per file, in row order ──mapInArrow(BatchDecoder, CommitEnds)──▶ changes ──by table──▶
            silver/changes (append, idempotent): on a local lake each task writes its Parquet files (one table
            per file) and the driver commits them with delta-rs (decode/silver_write.py); on s3a, Spark's writer
    bronze/catalog/*.json (bootstrap read at slot creation) ──▶ catalog versioning
    decode_range (a replay's re-decode): the same tasks keep an LSN window's changes, one overwrite commit

Each bronze file is decoded in order by one task (files in parallel), once: inside the silver write, nothing
cached. The catalog is written before the silver commit: the silver commit is the watermark, so a crash in between
re-decodes the files, and both writes are idempotent (Delta `txnAppId`/`txnVersion` and catalog versioning that
skips known definitions).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

from slotlake import bronze as bronze_files
from slotlake import contracts, delta_log, failpoints, storage
from slotlake.bronze import BronzeFile, list_bronze, read_frame_summary
from slotlake.catalog import (
    apply_definitions,
    drop_definition,
    only_new_tables,
    read_catalog,
    table_def_definition,
    write_catalog,
)
from slotlake.config import Config
from slotlake.contracts import STAGE_DDL_LOG, STAGE_DECODE, CommitMeta, ReplicaIdentity
from slotlake.decode import silver_write
from slotlake.decode.commit_ends import MAX_HELD_ROWS, CommitEnds, InFileOrder
from slotlake.decode.decoded import (
    KIND_CHANGE,
    KIND_DDL,
    KIND_RELATION,
    KIND_TYPE,
)
from slotlake.decode.messages import Column, Commit, Relation
from slotlake.decode.pgoutput import decode_message
from slotlake.decode.relations import relation_definition
from slotlake.decode.vector import BatchDecoder
from slotlake.errors import DecodeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.read_ahead import ReadAhead
from slotlake.source.catalog_read import BootstrapCatalog, as_published, list_bootstrap

log = logging.getLogger(__name__)

SILVER_DDL = contracts.ddl(contracts.SILVER)
SILVER_COLUMNS = contracts.names(contracts.SILVER)
# The mapInArrow output (`decode.decoded.decoded_schema()`, which says what each kind of row carries).
DECODED_DDL = contracts.ddl(contracts.DECODED)
_OUT_BATCH_ROWS = 8192  # rows per Arrow batch leaving the decoder: bounds executor memory
_BRONZE_ROWS: contracts.Columns = (*contracts.BRONZE, ("file", "string"))
"""The bronze rows a decode task takes: a bronze file's columns and the file's name (Spark's `_metadata.file_name`)."""
_BRONZE_BATCH_ROWS = 65_536
"""Bronze rows per Arrow batch a decode task reads: a bronze row group (the extract's `batch_rows` default), which
the reader holds in memory anyway. Against 10,000 (Spark's `maxRecordsPerBatch`, what the tasks read before they
read bronze themselves) the task's CPU time per file fell ~20%, same silver rows (bench/README.md, "Bronze read in
row groups")."""


@dataclass(frozen=True)
class DecodeResult:
    files_decoded: int
    changes_written: int
    end_lsn: Lsn | None  # silver's watermark after the run (end LSN of the last bronze file decoded)
    catalog_versions_added: int = 0
    ddl_events: int = 0  # slotlake.ddl events added to _ddl_log
    warnings: tuple[str, ...] = ()  # said once per run (also logged), e.g. what cannot be seen without DDL capture


def app_id(source: str) -> str:
    return f"slotlake-decode-{source}"


def decode_partition(batches: Iterator, known_ends: Mapping[int, int] | None = None,
                     max_held_rows: int = MAX_HELD_ROWS) -> Iterator:
    """mapInArrow function: bronze rows of whole files, each file in `ord` order, in; decoded rows out, in bounded
    batches, each row with its transaction's commit end LSN (`CommitEnds`; `known_ends`: those of the transactions
    that may be too big to hold, `BronzeSummary.big_ends`)."""
    order, decoder, ends = InFileOrder(), BatchDecoder(), CommitEnds(max_held_rows, known_ends)
    for batch in batches:
        order.check(batch)
        for out in decoder.feed(batch):
            for filled in ends.feed(out):
                for at in range(0, filled.num_rows, _OUT_BATCH_ROWS):
                    yield filled.slice(at, _OUT_BATCH_ROWS)
    decoder.finish()
    yield from ends.finish()


def decode_watermark(spark, changes_path: str, source: str) -> Lsn | None:
    """The end LSN silver has decoded up to: the newest decode commit's userMetadata (None: nothing yet)."""
    from delta.tables import DeltaTable

    if delta_log.readable(changes_path) and delta_log.is_delta_table(changes_path):
        # A local lake: the JSON commits say it without Spark jobs (the same commits history() reads).
        end = delta_log.stage_end(changes_path, STAGE_DECODE)
        if end is not None:
            return end
    if not DeltaTable.isDeltaTable(spark, changes_path):
        return None
    # Only decode appends this table, but OPTIMIZE/VACUUM commits may sit on top: look back a little.
    for row in DeltaTable.forPath(spark, changes_path).history(100).orderBy("version", ascending=False).collect():
        meta = CommitMeta.parse(row["userMetadata"])
        if meta is not None and meta.stage == STAGE_DECODE and meta.end_lsn is not None:
            return meta.end_lsn
    raise DecodeError(f"{changes_path} has no slotlake decode commit in its last 100 commits; its watermark is "
                      "unknown. Do not delete silver's Delta log history; to rebuild, move the table away and "
                      "decode again from bronze")


def pending_files(files: list[BronzeFile], watermark: Lsn | None) -> list[BronzeFile]:
    """Bronze files not decoded yet: those ending after the watermark, in LSN order."""
    return [f for f in files if watermark is None or f.end_lsn > watermark]


# Each bronze file is one read partition, read whole and in row order: no file splitting, no packing of files.
_WHOLE_FILES = {"spark.sql.files.maxPartitionBytes": str(1 << 62), "spark.sql.files.openCostInBytes": str(1 << 62)}


def _bronze(spark, files: list[BronzeFile]):
    """The rows of `files`, each file one partition read in its row order (a bronze file is the rows of one peek
    call, whole transactions: docs/internals.md "Bronze"), so each is decoded by one task, files in parallel: no
    shuffle, no sort. `InFileOrder` checks the order in the task."""
    from pyspark.sql import functions as F

    session = spark.newSession()
    for k, v in _WHOLE_FILES.items():
        session.conf.set(k, v)
    return (session.read.schema(contracts.ddl(contracts.BRONZE)).parquet(*[f.path for f in files])
            .select("lsn", "xid", "data", "ord", F.col("_metadata.file_name").alias("file")))


def _frame_type(*types: bytes):
    """The pgoutput message type byte of a bronze row is one of `types` (a binary comparison in the JVM)."""
    from pyspark.sql import functions as F

    return F.substring("data", 1, 1).isin(*[bytearray(t) for t in types])


def _frame_int(start: int, width: int):
    """The big-endian unsigned integer at byte `start` (1-based) of a bronze row's frame, as a long."""
    from pyspark.sql import functions as F

    return F.conv(F.hex(F.substring("data", start, width)), 16, 10).cast("long")


@dataclass(frozen=True)
class BronzeSummary:
    """What the decode learns from the raw frames in the JVM, before decoding them (`_summarize`)."""

    meta_txns: list[tuple[str, int]]  # (file, xid) of the transactions with Relation, Type or logical messages
    big_ends: dict[int, int]  # commit LSN -> end LSN of the transactions that may be too big to hold in a task
    changes_per_oid: dict[int, int]  # Insert/Update/Delete frames per relation OID (silver's file layout)


def _summarize(bronze, max_held_rows: int) -> BronzeSummary:
    """Aggregations of the raw frames, no Python: which transactions carry catalog messages; which may have more
    decoded rows than a task holds (each frame gives at most one row, a TRUNCATE one per relation; a
    transaction's frames are consecutive in its file, from its Begin to its Commit), and their Commit's LSNs;
    the row changes per relation."""
    from pyspark.sql import functions as F

    # One scan, one aggregation: a group per transaction (file, xid) of its Begin, Commit, Truncate and catalog
    # frames, and a group per relation (oid) of the Insert/Update/Delete frames.
    row_change = _frame_type(b"I", b"U", b"D")
    groups = (bronze.where(_frame_type(b"B", b"C", b"T", b"R", b"Y", b"M", b"I", b"U", b"D"))
              .groupBy(F.when(~row_change, F.col("file")).alias("file"), F.when(~row_change, F.col("xid")).alias("xid"),
                       F.when(row_change, F.substring("data", 2, 4)).alias("oid"))
              .agg((F.max("ord") - F.min("ord") + 1
                    + F.sum(F.when(_frame_type(b"T"), _frame_int(2, 4) - 1).otherwise(F.lit(0)))).alias("rows"),
                   F.count(F.when(_frame_type(b"R", b"Y", b"M"), 1)).alias("meta"),
                   F.count(F.lit(1)).alias("count")))
    txn = F.col("oid").isNull()
    # Half the limit: a row outside any transaction (a non-transactional message) may be held with the next one.
    got = groups.agg(
        F.collect_list(F.when(txn & (F.col("meta") > 0), F.struct("file", "xid"))).alias("meta"),
        F.collect_list(F.when(txn & (F.col("rows") > max_held_rows // 2), F.struct("file", "xid"))).alias("big"),
        F.collect_list(F.when(~txn, F.struct("oid", "count"))).alias("per_oid"),
    ).collect()[0]
    big_ends: dict[int, int] = {}
    if got["big"]:
        txns = bronze.sparkSession.createDataFrame([(r["file"], r["xid"]) for r in got["big"]], "file string, xid long")
        for r in bronze.join(F.broadcast(txns), ["file", "xid"], "left_semi").where(_frame_type(b"C")).collect():
            commit = decode_message(bytes(r["data"]), r["lsn"])
            if not isinstance(commit, Commit):  # pragma: no cover - the filter took Commit frames only
                raise DecodeError(f"bronze file {r['file']}: ord {r['ord']} is not a Commit message")
            big_ends[commit.commit_lsn.value] = commit.end_lsn.value
    return BronzeSummary(meta_txns=[(r["file"], int(r["xid"])) for r in got["meta"]], big_ends=big_ends,
                         changes_per_oid={int.from_bytes(r["oid"], "big"): int(r["count"]) for r in got["per_oid"]})


def _footer_summary(files: list[BronzeFile], max_held_rows: int) -> BronzeSummary | None:
    """`_summarize`'s result from the frame summaries the extract put in the bronze files' footers
    (`bronze.FrameSummary`), without reading a frame; None when a file has none (written before them, or by other
    means), on an s3a lake, or when the summaries' big-transaction list is too short for `max_held_rows`: then
    `_summarize` aggregates the frames."""
    if bronze_files.BIG_TXN_MIN_ROWS > max_held_rows // 2 or any(storage.is_s3(f.path) for f in files):
        return None
    meta: list[tuple[str, int]] = []
    big_ends: dict[int, int] = {}
    per_oid: Counter[int] = Counter()
    for f in files:
        summary = read_frame_summary(f.path)
        if summary is None or None in summary.meta_xids:
            return None
        meta += [(f.name, int(x)) for x in summary.meta_xids if x is not None]
        big_ends.update({c: e for c, e, rows in summary.big if rows > max_held_rows // 2})
        per_oid.update(summary.per_oid)
    return BronzeSummary(meta_txns=meta, big_ends=big_ends, changes_per_oid=dict(per_oid))


def _local_catalog_frames(files: list[BronzeFile], summary: BronzeSummary, schema):
    """The frames of `summary.meta_txns` without their row changes (Insert, Update, Delete, Truncate), read from
    the local bronze files with pyarrow, as one batch (lsn, xid, data, ord, file) sorted by file and ord."""
    import pyarrow as pa
    import pyarrow.compute as pc

    wanted: dict[str, set[int]] = {}
    for name, xid in summary.meta_txns:
        wanted.setdefault(name, set()).add(xid)
    changes = pa.array([b"I", b"U", b"D", b"T"], pa.binary())
    tables = []
    for f in sorted(files, key=lambda f: f.name):  # file names sort as their LSNs, as Spark's sort by file did
        if f.name not in wanted:
            continue
        t = bronze_files.read_txn_frames(f.path, wanted[f.name])
        t = t.filter(pc.invert(pc.is_in(pc.binary_slice(t["data"], 0, 1), value_set=changes)))
        tables.append(t.sort_by("ord").append_column("file", pa.array([f.name] * t.num_rows, pa.string())))
    batches = pa.concat_tables(tables).select(schema.names).cast(schema).combine_chunks().to_batches() \
        if tables else []
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema)


def _catalog_rows(bronze, summary: BronzeSummary, files: list[BronzeFile] | None = None) -> list[dict]:
    """The decoded Relation, Type and DDL-event rows (with their transaction's commit LSNs): the frames of the
    transactions that carry them, without their row changes, decoded in this process in stream order. With
    `files` (local bronze files), they are read with pyarrow; else with a Spark job over `bronze`."""
    import pyarrow as pa

    if not summary.meta_txns:
        return []
    schema = contracts.arrow_schema(_BRONZE_ROWS)
    if files is not None:  # local files: their row groups that can hold those transactions, read here (no Spark job)
        batch = _local_catalog_frames(files, summary, schema)
    else:
        from pyspark.sql import functions as F

        txns = bronze.sparkSession.createDataFrame(summary.meta_txns, "file string, xid long")
        frames = (bronze.join(F.broadcast(txns), ["file", "xid"], "left_semi")
                  .where(~_frame_type(b"I", b"U", b"D", b"T")).collect())
        frames.sort(key=lambda r: (r["file"], r["ord"]))
        batch = pa.RecordBatch.from_pydict({c: pa.array([bytes(r[c]) if c == "data" else r[c] for r in frames], t)
                                            for c, t in zip(schema.names, schema.types)})
    out = [row for b in decode_partition(iter([batch])) for row in b.to_pylist()]
    return [r for r in out if r["kind"] in (KIND_RELATION, KIND_TYPE, KIND_DDL)]


def _silver_changes(bronze, summary: BronzeSummary, max_held_rows: int, where=None):
    """Silver's rows of the decoded `bronze` (changes only, with their commit end LSNs), laid out by table, ready
    to write: the decode runs once, inside the write (nothing is cached)."""
    from pyspark.sql import functions as F

    decode = partial(decode_partition, known_ends=summary.big_ends, max_held_rows=max_held_rows)
    changes = (bronze.mapInArrow(decode, DECODED_DDL).where(F.col("kind") == KIND_CHANGE)
               .select(*SILVER_COLUMNS))
    if where is not None:
        changes = changes.where(where)
    return _by_table(changes, summary.changes_per_oid)


_ROWS_PER_FILE = 1_000_000  # silver rows per Parquet file of one table (a bigger batch of a table: more files)


def _by_table(changes, per_oid: dict[int, int]):
    """`changes` laid out for the merge: each silver file holds the changes of one table (a big batch of a table:
    several files), so the merge of a table reads only its own files (Delta skips the others by their schema and
    table name statistics), not every change of the run. `per_oid` (the row changes per relation, counted from the
    frames) sizes the layout; a relation it lacks (only TRUNCATEd) goes with the first."""
    from pyspark.sql import functions as F

    session = changes.sparkSession
    layout, total = [], 0
    for oid, n in sorted(per_oid.items()):
        k = -(-n // _ROWS_PER_FILE)
        layout.append((oid, total, k))
        total += k
    if total <= 1:
        return changes.repartition(1)
    seeds = _partition_seeds(session, total)
    slots = session.createDataFrame(layout, "rel_oid long, __first int, __parts int")
    part = F.coalesce(F.col("__first"), F.lit(0)) + F.pmod(F.hash("commit_lsn", "seq"),
                                                          F.coalesce(F.col("__parts"), F.lit(1)))
    return (changes.join(F.broadcast(slots), "rel_oid", "left")
            .withColumn("__seed", F.element_at(F.array(*[F.lit(v).cast("long") for v in seeds]), part + 1))
            .repartition(total, "__seed").select(*SILVER_COLUMNS))


def _partition_seeds(session, n: int) -> list[int]:
    """seeds[p]: a long that hash partitioning into `n` partitions (`repartition(n, col)`: Murmur3 hash, pmod)
    sends to partition p, so a computed partition number is where the row goes, without collisions."""
    from pyspark.sql import functions as F

    span = 64 * n
    while True:
        found = {int(r["p"]): int(r["seed"]) for r in session.range(0, span)
                 .groupBy(F.pmod(F.hash("id"), F.lit(n)).alias("p")).agg(F.min("id").alias("seed")).collect()}
        if len(found) == n:
            return [found[p] for p in range(n)]
        span *= 4


def run_decode(spark, cfg: Config, source: str) -> DecodeResult:
    """Decode every bronze file past silver's watermark into silver/changes, `_catalog` and `_ddl_log`.

    Re-running is a no-op. Bootstrap definitions archived at slot creation (`bronze/catalog/*.json`) enter
    `_catalog` here too, also when there is no new bronze file.
    """

    cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    watermark = decode_watermark(spark, paths.changes, source)
    todo = pending_files(list_bronze(paths.root), watermark)
    boots = list_bootstrap(paths.root)
    if not todo:
        # A new slot has no changes yet, but its bootstrap definitions belong in the catalog already.
        fresh = [b for b in boots if watermark is None or b.lsn > watermark]
        added = 0
        if fresh:
            added, _ = _update_catalog(spark, paths.catalog, [], fresh, source=source, end_lsn=fresh[-1].lsn)
        log.info("decode %s: nothing new in bronze (silver is at %s)%s", source, watermark,
                 f"; {added} catalog version(s) from the bootstrap read" if fresh else "")
        return DecodeResult(files_decoded=0, changes_written=0, end_lsn=watermark, catalog_versions_added=added)
    end = todo[-1].end_lsn
    started = time.monotonic()
    held = MAX_HELD_ROWS
    with tempfile.TemporaryDirectory(prefix="slotlake-decode-") as stage:
        # An s3a lake's small batch is decoded as a local lake's is, from local copies of its bronze files.
        local = _staged_bronze(todo, stage) if storage.is_s3(paths.root) else todo
        n, added, warnings, ddl_events = _decode_files(spark, paths, source, todo, local, boots, end, held)
    secs = time.monotonic() - started
    for w in warnings:
        log.warning("decode %s: %s", source, w)
    log.info("decode %s: %d bronze files, %d changes, %d new catalog versions, %d DDL events, silver now at %s "
             "(%.1fs, %.0f rows/s)", source, len(todo), n, added, ddl_events, end, secs, n / secs if secs else 0)
    return DecodeResult(files_decoded=len(todo), changes_written=n, end_lsn=end, catalog_versions_added=added,
                        ddl_events=ddl_events, warnings=tuple(warnings))


def _decode_files(spark, paths: LakePaths, source: str, todo: list[BronzeFile], local: list[BronzeFile] | None,
                  boots: list[BootstrapCatalog], end: Lsn, held: int) -> tuple[int, int, list[str], int]:
    """`run_decode`'s commits for the bronze files `todo` (`local`: the same files on the local file system, else
    None): `_catalog`, `_ddl_log` and silver. Returns (changes written, catalog versions added, warnings, DDL
    events)."""
    # Spark's reading of bronze, built only when used: local files with the extract's frame summaries in their
    # footers are summarized, and read by the decode's tasks, without it.
    bronze = cache(partial(_bronze, spark, todo))
    footer = _footer_summary(local, held) if local is not None else None  # with the extract's frame summaries
    summary = footer or _summarize(bronze(), held)
    meta_rows = _catalog_rows(None, summary, local) if footer is not None and local is not None \
        else _catalog_rows(bronze(), summary)
    added, warnings = _update_catalog(spark, paths.catalog, meta_rows, [b for b in boots if b.lsn <= end],
                                      source=source, end_lsn=end)
    ddl_events = write_ddl_log(spark, ddl_log_path(paths), [r for r in meta_rows if r["kind"] == KIND_DDL],
                               source=source, end_lsn=end)
    # Test-only failpoint: the process dies after the catalog and DDL log commits, before the silver commit.
    failpoints.die_at(failpoints.DECODE_AFTER_CATALOG)
    if local is not None and (silver_write.writes_directly(paths.changes) or storage.is_s3(paths.changes)):
        # a local lake's files by its tasks; an s3a lake's small batch here, each file then placed on S3
        n = _write_silver_directly(spark, local, summary, held, paths.changes, source, end)
    else:
        changes = _silver_changes(bronze(), summary, held)
        _executor_errors(lambda: changes.write.format("delta").mode("append").options(**contracts.SILVER_PROPERTIES)
                         .option("txnAppId", app_id(source)).option("txnVersion", end.value)
                         .option("userMetadata", CommitMeta(STAGE_DECODE, end).json())
                         .save(paths.changes))
        n = _rows_written(spark, paths.changes, end)
    return n, added, warnings, ddl_events


def _staged_bronze(files: list[BronzeFile], folder: str, max_bytes: int | None = None,
                   whole: bool = True) -> list[BronzeFile] | None:
    """The bronze `files` of an s3a lake copied into the local `folder` (same names), when they hold at most
    `max_bytes` (default `IN_DRIVER_BRONZE_BYTES`) in all: a small batch is then decoded in the driver from its
    frame summaries, without a Spark job (on S3 such a job and Spark's writer took 8 of a 1,000-change sync's 28 s:
    bench/README.md, "bench/s3_sync.py"). None for a bigger batch (Spark reads and writes it) or a local lake;
    with `whole` False, the longest prefix of `files` within `max_bytes` instead (`decode_in_process`'s slice)."""
    if not files or not storage.is_s3(files[0].path):
        return None
    store = storage.files_for(files[0].path)
    limit = IN_DRIVER_BRONZE_BYTES if max_bytes is None else max_bytes
    total = 0
    taken: list[BronzeFile] = []
    for f in files:  # sizes asked first (and only until past the limit): nothing big is downloaded
        total += store.size(f.path)
        if total > limit:
            if whole:
                return None
            break
        taken.append(f)
    out: list[BronzeFile] = []
    for f in taken:
        local = os.path.join(folder, f.name)
        store.get_file(f.path, local)
        out.append(dataclasses.replace(f, path=local))
    return out


SLICE_MAX_ROWS = 1_250_000
"""Bronze rows (pgoutput messages) one in-process slice holds at most, beside `spark.in_process_bytes`: the changes
the in-process merge then holds are bounded too (`merge.in_process.MAX_CHANGES`; a 1,000,000-change slice peaked at
~650 MB RSS). One extract call's file holds `extract.upto_nchanges` (1,000,000) rows and the rest of the
transaction that reached it, so a file of a busy OLTP stream fits; a bigger transaction's file goes to Spark."""


def in_process_slice(files: list[BronzeFile], max_bytes: int,
                     max_rows: int | None = SLICE_MAX_ROWS) -> list[BronzeFile]:
    """The slice of pending local bronze `files` (in LSN order) that one in-process decode takes: the longest prefix
    of at most `max_bytes` and `max_rows` rows (None: any) in all; empty when the first file alone is bigger (Spark
    decodes it)."""
    import pyarrow.parquet as pq

    size = rows = 0
    for i, f in enumerate(files):
        path = storage.local_path(f.path)
        size += path.stat().st_size
        if max_rows is not None:
            rows += pq.ParquetFile(path).metadata.num_rows
        if size > max_bytes or (max_rows is not None and rows > max_rows):
            return files[:i]
    return list(files)


def first_slice_fits(paths: LakePaths, max_bytes: int) -> bool:
    """Whether the first bronze file past silver's decode watermark holds at most `max_bytes` and `SLICE_MAX_ROWS`
    rows (the first slice `decode_in_process` may take; on an s3a lake its size alone, asked with a HEAD); True
    when no file is pending."""
    end = delta_log.stage_end(paths.changes, STAGE_DECODE) if delta_log.is_delta_table(paths.changes) else None
    todo = pending_files(list_bronze(paths.root), end)
    if todo and storage.is_s3(todo[0].path):
        return storage.files_for(todo[0].path).size(todo[0].path) <= max_bytes
    return not todo or bool(in_process_slice(todo[:1], max_bytes))


def decode_in_process(cfg: Config, source: str, max_bytes: int) -> DecodeResult | None:
    """`run_decode` of one slice without Spark, in the caller's process (`slotlake sync`): the longest run of bronze
    files past silver's watermark of at most `max_bytes` and `SLICE_MAX_ROWS` rows (`in_process_slice`; the caller
    decodes a bigger backlog slice by slice, merging each), when the slice does not change the catalog (no new
    table definition, no DDL event, no bootstrap read). Their changes are written as `_write_silver_directly` writes
    them in the driver, one silver commit per slice; on an s3a lake from local copies of the slice's bronze files
    (`_staged_bronze`). None, nothing written, when nothing is pending or for any other slice: the Spark decode
    does it."""
    cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    s3 = storage.is_s3(paths.root)
    if not (s3 or silver_write.writes_directly(paths.changes)) or not delta_log.readable(paths.changes):
        return None
    watermark = None
    if delta_log.is_delta_table(paths.changes):
        watermark = delta_log.stage_end(paths.changes, STAGE_DECODE)
        if watermark is None:
            return None  # a silver table without a decode commit: `decode_watermark` asks Spark's history
    pending = pending_files(list_bronze(paths.root), watermark)
    if not pending:
        return _bootstrap_here(paths, source, watermark)
    if not s3:
        return _decode_slice_here(paths, source, pending, in_process_slice(pending, max_bytes), max_bytes)
    with tempfile.TemporaryDirectory(prefix="slotlake-decode-") as stage:
        local = _staged_bronze(pending, stage, max_bytes, whole=False) or []
        return _decode_slice_here(paths, source, pending, in_process_slice(local, max_bytes), max_bytes)


def _decode_slice_here(paths: LakePaths, source: str, pending: list[BronzeFile], todo: list[BronzeFile],
                       max_bytes: int) -> DecodeResult | None:
    """`decode_in_process`'s decode of the local bronze files `todo` (the slice of `pending` it takes)."""
    if not todo:
        if pending:
            _declined(source, f"bronze file {pending[0].name} alone holds more than {max_bytes:,} bytes or "
                      f"{SLICE_MAX_ROWS:,} rows")
        return None
    end = todo[-1].end_lsn
    # The bootstrap reads up to the batch's end, as `run_decode` applies them: one the catalog lacks is a change.
    boots = [b for b in list_bootstrap(paths.root) if b.lsn <= end]
    started = time.monotonic()
    held = MAX_HELD_ROWS
    summary = _footer_summary(todo, held)
    if summary is None:
        _declined(source, "a bronze file without the extract's frame summary")
        return None
    meta_rows = _catalog_rows(None, summary, todo)
    if any(r["kind"] == KIND_DDL for r in meta_rows):
        _declined(source, "a DDL event")
        return None
    try:  # a first sync's bootstrap definitions are written here; any other catalog change is Spark's
        added, _ = _update_catalog(None, paths.catalog, meta_rows, boots, source=source, end_lsn=end)
    except CatalogChange as why:
        _declined(source, str(why))
        return None
    # Test-only failpoint, as `run_decode`'s (its DDL log has nothing to write here).
    failpoints.die_at(failpoints.DECODE_AFTER_CATALOG)
    n = _write_silver_directly(None, todo, summary, held, paths.changes, source, end, in_driver=True)
    secs = time.monotonic() - started
    log.info("decode %s in this process: %d bronze files, %d changes, %d new catalog versions, silver now at %s "
             "(%.1fs, %.0f rows/s)", source, len(todo), n, added, end, secs, n / secs if secs else 0)
    return DecodeResult(files_decoded=len(todo), changes_written=n, end_lsn=end, catalog_versions_added=added)


def _bootstrap_here(paths: LakePaths, source: str, watermark: Lsn | None) -> DecodeResult | None:
    """`run_decode` without bronze files to decode, in this process: the bootstrap definitions archived at slot
    creation past silver's watermark put in `_catalog` (`_update_catalog` without a session: new tables only).
    None when they are in it already (nothing to do) or for a change Spark's decode writes (logged)."""
    fresh = [b for b in list_bootstrap(paths.root) if watermark is None or b.lsn > watermark]
    if not fresh:
        return None
    try:
        added, _ = _update_catalog(None, paths.catalog, [], fresh, source=source, end_lsn=fresh[-1].lsn)
    except CatalogChange as why:
        _declined(source, str(why))
        return None
    if not added:
        return None
    log.info("decode %s in this process: nothing new in bronze (silver is at %s); %d catalog version(s) from the "
             "bootstrap read", source, watermark, added)
    return DecodeResult(files_decoded=0, changes_written=0, end_lsn=watermark, catalog_versions_added=added)


def _declined(source: str, why: str) -> None:
    log.info("decode %s in this process declined (%s): Spark decodes", source, why)


def _write_silver_directly(spark, files: list[BronzeFile], summary: BronzeSummary, held: int, changes_path: str,
                           source: str, end: Lsn, in_driver: bool | None = None) -> int:
    """The silver commit of the local bronze `files`: each task decodes its bronze file and writes its changes as
    Parquet files, one table per file (`decode/silver_write.py`); one delta-rs commit adds them with the same
    idempotent-write transaction and userMetadata as Spark's writer. On an s3a lake the files are decoded here,
    written into a local folder and each placed under silver's folder on S3 (a conditional PUT) before that commit
    (conditional PUTs of the log, `storage.delta_rs_options`). Returns the rows added."""
    written = place_files(spark, files, summary, held, changes_path, in_driver=in_driver)
    if not silver_write.commit(changes_path, written, app_id=app_id(source), version=end.value,
                               user_metadata=CommitMeta(STAGE_DECODE, end).json(),
                               properties=contracts.SILVER_PROPERTIES):
        log.info("decode %s: silver already holds the commit up to %s (its files written now are not used)",
                 source, end)
        return _rows_written(spark, changes_path, end)
    return sum(int(f["rows"]) for f in written)


def place_files(spark, files: list[BronzeFile], summary: BronzeSummary, held: int, changes_path: str,
                window: tuple[int | None, int] | None = None, in_driver: bool | None = None) -> list[dict]:
    """`_write_files` into the folder of the silver-shaped table `changes_path`, not committed: on a local lake
    directly; on an s3a lake decoded here into a local temporary folder, each file then placed under the table's
    folder with a conditional PUT. Their descriptions (for `silver_write.commit` / `replace_files`)."""
    if not storage.is_s3(changes_path):
        return _write_files(spark, files, summary, held, changes_path, window=window, in_driver=in_driver)
    with tempfile.TemporaryDirectory(prefix="slotlake-silver-") as stage:
        written = _write_files(spark, files, summary, held, changes_path, window=window, in_driver=True,
                               folder=stage)
        store = storage.files_for(changes_path)
        for f in written:
            store.put_new_file(storage.join(changes_path, f["path"]), os.path.join(stage, f["path"]))
    return written


def _write_files(spark, files: list[BronzeFile], summary: BronzeSummary, held: int, changes_path: str,
                 window: tuple[int | None, int] | None = None, in_driver: bool | None = None,
                 folder: str | None = None) -> list[dict]:
    """The decode's tasks write the changes of the local bronze `files` (within `window`, see
    `silver_write.write_task`) as Parquet files into the folder of the local Delta table `changes_path` (or into
    the local `folder`, whose files the caller places there); their descriptions, not committed. A task per file,
    which reads it itself (`_read_bronze_files`); in this process when `in_driver` (None: for files of at most
    `IN_DRIVER_BRONZE_BYTES`)."""
    out = Path(folder) if folder is not None else storage.local_path(changes_path)
    out.mkdir(parents=True, exist_ok=True)
    task = partial(silver_write.write_task, folder=str(out), rows_per_file=_ROWS_PER_FILE, window=window,
                   decode=partial(decode_partition, known_ends=summary.big_ends, max_held_rows=held))
    reader = partial(_read_bronze_files, paths=[str(storage.local_path(f.path)) for f in files], task=task,
                     batch_rows=_BRONZE_BATCH_ROWS)
    if in_driver or (in_driver is None and _in_driver(files)):
        # A small batch: its files decoded one after the other here, by the same function the tasks run (a Spark
        # job and its Python worker's start cost more than the decode: bench/README.md, "Small batches decode in
        # the driver").
        import pyarrow as pa

        ids_batch = pa.RecordBatch.from_pydict({"id": pa.array(range(len(files)), pa.int64())})
        return [row for out in reader(iter([ids_batch])) for row in out.to_pylist()]
    ids = spark.range(0, len(files), 1, len(files))  # one id per partition: file `id` is task `id`'s
    return [r.asDict() for r in _executor_errors(lambda: ids.mapInArrow(reader, silver_write.FILES_DDL).collect())]


IN_DRIVER_BRONZE_BYTES = 4 << 20
"""Bronze files of at most this many bytes in all (~100,000 pgbench changes) are decoded in the driver, not by a
Spark job of a task per file (decoding them takes less than the job's start, its Python worker's included)."""


def _in_driver(files: list[BronzeFile]) -> bool:
    """Whether the decode of the local bronze `files` runs in this process: at most `IN_DRIVER_BRONZE_BYTES` in all
    (read when called)."""
    return len(in_process_slice(files, IN_DRIVER_BRONZE_BYTES, max_rows=None)) == len(files)


def _read_bronze_files(ids: Iterator, *, paths: list[str], task: Callable[[Iterator], Iterator],
                       batch_rows: int) -> Iterator:
    """mapInArrow function over `spark.range` ids: the bronze rows of file `paths[id]`, read in the task with
    pyarrow in file order as (lsn, xid, data, ord, file) batches, are handed to `task` (what Spark's Parquet
    reader would hand it). Spark's reader decoded the frames' Parquet in the JVM and converted them to Arrow for
    the Python worker: half of the decode's CPU time (bench/README.md, "2026-11-29, evening")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = contracts.arrow_schema(_BRONZE_ROWS)
    columns = [n for n, _ in contracts.BRONZE]

    def rows() -> Iterator:
        for batch in ids:
            for i in batch.column("id").to_pylist():
                name = os.path.basename(paths[i])
                with pq.ParquetFile(paths[i]) as f:
                    for rb in f.iter_batches(batch_size=batch_rows, columns=columns):
                        cols = [c if c.type == t else c.cast(t) for c, t in zip(rb.columns, schema.types)]
                        yield pa.RecordBatch.from_arrays([*cols, pa.repeat(name, rb.num_rows)], schema=schema)

    # read a batch ahead: pyarrow reads and decompresses it while the task decodes the previous one
    with ReadAhead(rows(), name="slotlake-bronze-read") as ahead:
        yield from task(iter(ahead))


def _rows_written(spark, changes_path: str, end: Lsn) -> int:
    """The rows of the newest decode commit of `changes_path` (ending at `end`), from its write metrics: the JSON
    commit of a local lake, else Delta's history (looked back as `decode_watermark` does: OPTIMIZE/VACUUM commits
    may sit on top)."""
    from delta.tables import DeltaTable

    metrics: dict = {}
    if delta_log.readable(changes_path):
        last = delta_log.latest_slotlake_commit(changes_path, "decode")
        if last is not None and last.end_lsn == str(end):
            metrics = dict(last.metrics)
    else:
        for row in DeltaTable.forPath(spark, changes_path).history(100).orderBy("version", ascending=False).collect():
            meta = CommitMeta.parse(row["userMetadata"])
            if meta is not None and meta.stage == STAGE_DECODE:
                if meta.end_lsn == end:
                    metrics = dict(row["operationMetrics"] or {})
                break
    if "numOutputRows" not in metrics:  # a write without new rows (a no-op append, an empty overwrite)
        return 0
    return int(metrics["numOutputRows"])


def files_for_range(files: list[BronzeFile], after: Lsn | None, upto: Lsn) -> list[BronzeFile]:
    """The bronze files that can hold commits with `after < commit_end_lsn`, `commit_lsn <= upto` (after None: from
    the start).

    A file holds the commits whose end LSN is in (start, end], and a commit's LSN is at least the previous
    commit's end, so a file with end <= after or start > upto holds none of them.
    """
    return [f for f in files if (after is None or f.end_lsn > after) and f.start_lsn <= upto]


def decode_range(spark, cfg: Config, source: str, after: Lsn | None, upto: Lsn, changes_path: str) -> DecodeResult:
    """Re-decode the archived changes with `after < commit_end_lsn`, `commit_lsn <= upto` from bronze into a new
    silver table.

    For replays and checks: `changes_path` is overwritten (one Delta commit whose userMetadata records `upto`
    as its decode end, so the merge reads it like silver); `_catalog`, `_ddl_log` and the live silver table
    are not touched. Every change keeps the column description of the Relation message in force when it was
    written (the catalog version valid at its LSN), whatever the table looks like today.
    """
    from pyspark.sql import functions as F

    cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    todo = files_for_range(list_bronze(paths.root), after, upto)
    started = time.monotonic()
    meta = CommitMeta(STAGE_DECODE, upto, {"after_lsn": str(after) if after else None}).json()
    held = MAX_HELD_ROWS
    bronze = cache(partial(_bronze, spark, todo))  # built only when used, as in `run_decode`
    summary = (_footer_summary(todo, held) or _summarize(bronze(), held)) if todo else None
    # A local lake: the tasks write the files and one delta-rs commit replaces the table's (as the sync's decode).
    direct = (summary is not None and silver_write.overwrites_directly(changes_path)
              and silver_write.commit(changes_path, _write_files(spark, todo, summary, held, changes_path,
                                                                 window=(after.value if after else None, upto.value)),
                                      app_id=None, version=None, user_metadata=meta,
                                      properties=contracts.SILVER_PROPERTIES, overwrite=True))
    if not direct:  # an s3a lake, no bronze file, or a table of another shape (Spark overwrites its schema)
        if summary is not None:
            cond = F.col("commit_lsn") <= int(upto)
            if after is not None:
                cond = cond & (F.col("commit_end_lsn") > int(after))  # `after` is an end position (merge/job.py)
            changes = _silver_changes(bronze(), summary, held, where=cond)
        else:
            changes = spark.createDataFrame([], SILVER_DDL)
        _executor_errors(lambda: changes.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                         .options(**contracts.SILVER_PROPERTIES).option("userMetadata", meta).save(changes_path))
    n = _rows_written(spark, changes_path, upto)
    log.info("decode %s: re-decoded %d change(s) with %s < commit LSN <= %s from %d bronze file(s) into %s (%.1fs)",
             source, n, after, upto, len(todo), changes_path, time.monotonic() - started)
    return DecodeResult(files_decoded=len(todo), changes_written=n, end_lsn=upto)


_EXECUTOR_DECODE_ERROR = re.compile(r"slotlake\.errors\.DecodeError: (.+)")


def _executor_errors(action):
    """Run a Spark action; a DecodeError raised on an executor comes back as one DecodeError, not a JVM trace."""
    try:
        return action()
    except Exception as e:  # PythonException / Py4JJavaError wrapping the executor's traceback
        m = _EXECUTOR_DECODE_ERROR.search(str(e))
        if m:
            raise DecodeError(m.group(1).strip()) from None
        raise


class CatalogChange(Exception):
    """A change of `_catalog` the in-process decode leaves to Spark's (`_update_catalog` without a session)."""


def _update_catalog(spark, path: str, rows: list, boots: list[BootstrapCatalog], *, source: str,
                    end_lsn: Lsn) -> tuple[int, list[str]]:
    """Version `_catalog` from the bootstrap reads and this run's Relation, Type and DDL-event rows.

    Returns (versions changed, warnings). The warning: a schema change seen only through a Relation message
    (no DDL event described it), where a renamed column cannot be told from a dropped one plus an added one.
    Without a session (`spark` None: `decode_in_process`) the commit is delta-rs's, and only for the bootstrap
    definitions of tables the catalog does not hold yet (a new source's first sync); any other change raises
    CatalogChange, nothing written: Spark's decode writes it.
    """
    from slotlake.source.ddl import parse_ddl_event

    types = {r["rel_oid"]: f"{r['schema_name']}.{r['table_name']}" for r in rows if r["kind"] == KIND_TYPE}
    definitions = [table_def_definition(b.lsn.value, b.lsn.value, t, "bootstrap") for b in boots for t in b.tables]
    for r in rows:
        if r["kind"] == KIND_RELATION:
            keys = set(r["key_columns"])
            cols = tuple(Column(name=n, type_oid=t, typmod=m, is_key=n in keys)
                         for n, t, m in zip(r["columns"], r["type_oids"], r["typmods"]))
            rel = Relation(oid=r["rel_oid"], schema=r["schema_name"], name=r["table_name"],
                           replica_identity=ReplicaIdentity(r["replica_identity"]), columns=cols)
            definitions.append(relation_definition(r["commit_lsn"], r["lsn"], rel, types))
        elif r["kind"] == KIND_DDL:
            event = parse_ddl_event(bytes(r["content"]))
            if event.is_error:
                log.warning("DDL event at %s could not capture the definition (%s); the catalog follows the "
                            "Relation messages for it", Lsn(r["commit_lsn"]), event.error)
            for table in event.tables:
                definitions.append(table_def_definition(r["commit_lsn"], r["lsn"],
                                                        as_published(table, boots, r["commit_lsn"]), "ddl"))
            for gone in event.dropped:
                definitions.append(drop_definition(r["commit_lsn"], r["lsn"], gone.oid, gone.schema, gone.name))
    current = read_catalog(spark, path)
    versions, changed = apply_definitions(current, definitions)
    if changed:
        if spark is None and not only_new_tables(current, versions):
            raise CatalogChange("a table definition `_catalog` does not hold yet")
        write_catalog(spark, path, versions, source=source, end_lsn=end_lsn)
    before = {(v.rel_oid, v.version) for v in current}
    blind = sorted({f"{v.schema_name}.{v.table_name}" for v in versions
                    if v.origin == "relation" and v.version > 1 and (v.rel_oid, v.version) not in before})
    warnings = []
    if blind:
        warnings.append(f"schema change of {', '.join(blind)} seen only through pgoutput Relation messages (no DDL "
                        "capture): a renamed column looks like a dropped column plus an added one, and defaults "
                        "of added columns are unknown; install sql/ddl_capture.sql as a superuser "
                        "(slotlake.source.ddl.install_ddl_capture) to capture DDL")
    return changed, warnings


# ---- the DDL log <lake>/<source>/_ddl_log ----

DDL_LOG_DDL = contracts.ddl(contracts.DDL_LOG)


def ddl_log_path(paths: LakePaths) -> str:
    return paths.ddl_log


def ddl_log_app_id(source: str) -> str:
    return f"slotlake-ddl-{source}"


def write_ddl_log(spark, path: str, rows: list, *, source: str, end_lsn: Lsn) -> int:
    """Append this run's `slotlake.ddl` events to `_ddl_log` in one idempotent Delta commit; returns the count.

    Same idempotence as silver (txnAppId `slotlake-ddl-<source>`, txnVersion = the decode's end LSN), written
    before the silver commit: a crash in between re-decodes and the repeated append is skipped by Delta.
    """
    from slotlake.source.ddl import parse_ddl_event

    if not rows:
        return 0
    out = []
    for r in sorted(rows, key=lambda r: (r["commit_lsn"], r["lsn"])):
        content = bytes(r["content"])
        event = parse_ddl_event(content)
        out.append((r["commit_lsn"], r["commit_end_lsn"], r["commit_ts"], r["xid"], r["lsn"], event.event,
                    event.command_tag,
                    event.query, event.query_truncated, event.object_identity,
                    [t.qualified_name for t in event.tables], [f"{d.schema}.{d.name}" for d in event.dropped],
                    content.decode("utf-8"), r["bronze_file"]))
    (spark.createDataFrame(out, DDL_LOG_DDL).write.format("delta").mode("append")
     .option("txnAppId", ddl_log_app_id(source)).option("txnVersion", end_lsn.value)
     .option("userMetadata", CommitMeta(STAGE_DDL_LOG, end_lsn).json())
     .save(path))
    return len(out)
