"""A keyed batch into a gold table with deletion vectors, without Spark: gold's changed rows are marked deleted, not
rewritten (config `deletion_vectors`, README "Big gold tables").

delta-rs reads such tables but does not write them, so this module writes the commit itself, as Delta's MERGE with
deletion vectors would (PROTOCOL.md, "Deletion Vectors"):

1. `plan_marks`: from the table's log (`delta_log.snapshot`) the live files and their deletion vectors; the files
   whose key statistics may hold a key of the batch; in each, the key columns (only those) read with pyarrow, the
   rows already deleted left out, joined with the batch's keys: the rows each key's last event replaces or deletes.
   Unchanged TOAST values are read from gold's matched rows (only those columns, only those files). `plan_append`:
   a batch of new rows only (a table without a key, FULL-identity rows gold does not hold), nothing marked.
2. `commit_marks`: one `deletion_vector_<uuid>.bin` with each touched file's new vector (its old rows and the new
   ones), one Parquet file with the rows the batch writes (updates' new versions, inserts), then the log entry,
   written only if its version is free (`Files.put_new`: a hard link locally, a conditional PUT on S3): per touched
   file a `remove` of it with its old vector and an `add` with the new one (a file left without a live row: only the
   `remove`), the new file's `add`, the idempotent-write `txn` and a `commitInfo` with the MERGE's metrics.

A file's `stats` are kept (`tightBounds` false: some of its rows are deleted); the new file's hold `numRecords`,
`nullCount`, and `minValues`/`maxValues` of its integer, date and short string columns. Anything else this module
does not write exactly raises `CannotMark` before anything is written: the caller leaves the batch to Spark.

The same log writing serves `overwrite` and `compact` (a table's whole content rewritten, its vectors dropped) and
`create`: a new table's version 0 with a table property delta-rs's writers refuse (`slotlake.snapshot`, the load of
an initial copy without Spark, `merge/snapshot_in_process.py`).
"""
from __future__ import annotations

import bisect
import datetime as dt
import io
import json
import logging
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from slotlake import delta_log, storage
from slotlake.contracts import COMMIT_TS_COL, LSN_COL
from slotlake.errors import MergeError
from slotlake.merge import dv_codec
from slotlake.merge.plan import TablePlan

log = logging.getLogger(__name__)

# What this writer honours: a table with another feature (row tracking, in-commit time stamps, v2 checkpoints,
# clustering, column mapping, type widening ...) is left to Spark.
_READER_FEATURES = frozenset({"deletionVectors", "timestampNtz"})
_WRITER_FEATURES = frozenset({"deletionVectors", "timestampNtz", "appendOnly", "invariants", "checkConstraints",
                              "changeDataFeed", "generatedColumns", "identityColumns"})
_SCHEMA_MARKERS = ("delta.generationExpression", "delta.identity", "delta.invariants", "delta.columnMapping")
_STRING_STAT_CHARS = 32  # Spark's prefix length for string statistics: longer values get none here
ENGINE = "slotlake (deletion vectors, without Spark)"
CHECKPOINT_INTERVAL = 10  # Delta's default `delta.checkpointInterval`: a commit at a multiple writes a checkpoint


class CannotMark(Exception):
    """The batch is not one this module writes exactly (the reason): Spark's MERGE takes it."""


@dataclass
class Marks:
    """What `commit_marks` writes for one table."""
    version: int  # the snapshot the marks were planned on
    touched: dict[str, Any] = field(default_factory=dict)  # path -> pyroaring BitMap: the file's whole new vector
    live: dict[str, int] = field(default_factory=dict)  # path -> physical rows of the file
    adds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # path -> its add action (snapshot's)
    rows: Any = None  # pyarrow Table in gold's schema: the rows the batch writes (None: none)
    metrics: dict[str, int] = field(default_factory=dict)
    checkpoint_interval: int = CHECKPOINT_INTERVAL  # the table's `delta.checkpointInterval`
    operation: str = "MERGE"  # or WRITE: an append (no file touched)


def _unsupported(snap: delta_log.Snapshot) -> str | None:
    readers = set(snap.protocol.get("readerFeatures") or ())
    writers = set(snap.protocol.get("writerFeatures") or ())
    if int(snap.protocol.get("minWriterVersion", 0)) < 7 or "deletionVectors" not in writers:
        return "the table's protocol has no deletion vectors"
    if readers - _READER_FEATURES or writers - _WRITER_FEATURES:
        return f"table features {sorted((readers - _READER_FEATURES) | (writers - _WRITER_FEATURES))}"
    conf = dict(snap.metadata.get("configuration") or {})
    if conf.get("delta.appendOnly") == "true" or conf.get("delta.enableChangeDataFeed") == "true" \
            or any(k.startswith("delta.constraints.") for k in conf):
        return "append-only, change data feed or CHECK constraints"
    if snap.metadata.get("partitionColumns"):
        return "a partitioned table"
    schema = str(snap.metadata.get("schemaString") or "")
    if any(m in schema for m in _SCHEMA_MARKERS):
        return "generated, identity or constrained columns"
    return None


def check_writable(gold: str) -> None:
    """CannotMark (with the reason) when this module does not write `gold`, a table with deletion vectors: what
    `overwrite` and the marks would find before any write, for a caller that has work to do first."""
    _writable_snapshot(gold)


def _writable_snapshot(gold: str) -> delta_log.Snapshot:
    snap = delta_log.snapshot(gold)
    if snap is None:
        raise CannotMark("gold's log cannot be replayed here")
    why = _unsupported(snap)
    if why:
        raise CannotMark(why)
    return snap


def _interval(snap: delta_log.Snapshot) -> int:
    conf = dict(snap.metadata.get("configuration") or {})
    return int(conf.get("delta.checkpointInterval", CHECKPOINT_INTERVAL))


def plan_append(gold: str, rows: Any) -> Marks:
    """An append of `rows` (gold's schema) to `gold`: one new file, no row marked (a table without a key, or a
    FULL-identity batch of rows gold does not hold)."""
    snap = _writable_snapshot(gold)
    return Marks(snap.version, adds=snap.files, rows=rows if rows.num_rows else None, operation="WRITE",
                 checkpoint_interval=_interval(snap),
                 metrics={"numFiles": 1 if rows.num_rows else 0, "numOutputRows": rows.num_rows})


def plan_marks(gold: str, plan: TablePlan, source: Any, target: Any) -> Marks:
    """The marks and rows of a `_keyed_source` table `source` (one row per key: `__k{j}`, `__action` D|U, `__v{i}`,
    `__lsn`, `__ts`, `__u{i}`: keep gold's value) against `gold`, whose Arrow schema is `target`. Reads only key
    columns (and the kept columns of matched rows), in the files whose statistics may hold a key of the batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    snap = _writable_snapshot(gold)
    cols = plan.shape.columns
    knames = [cols[k] for k in plan.key_positions]
    extra = set(target.names) - set(cols) - {LSN_COL, COMMIT_TS_COL}
    if extra:
        raise CannotMark(f"gold has columns the batch does not write: {sorted(extra)}")
    keys = pa.table([source.column(f"__k{j}").cast(target.field(c).type) for j, c in enumerate(knames)],
                    names=[f"k{j}" for j in range(len(knames))])
    keys = keys.append_column("__src", pa.array(np.arange(source.num_rows, dtype=np.int64)))
    marks = Marks(snap.version, adds=snap.files, checkpoint_interval=_interval(snap))
    fs, root = storage.arrow_files(gold)
    dv_files: dict[str, bytes] = {}
    matched = []
    for path in _candidates(snap.files, knames, keys):
        add = snap.files[path]
        where = f"{root.rstrip('/')}/{unquote(path)}"
        found = pq.read_table(where, columns=knames, filesystem=fs, coerce_int96_timestamp_unit="us")
        n = found.num_rows
        try:  # (a Parquet type may differ from the table's: INT96 time stamps, say)
            found = pa.table([found.column(c).cast(keys.column(f"k{j}").type) for j, c in enumerate(knames)],
                             names=[f"k{j}" for j in range(len(knames))])
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:
            raise CannotMark(f"{path}: key columns not read as the table's types ({e})") from None
        found = found.append_column("__row", pa.array(np.arange(n, dtype=np.int64)))
        old = _old_vector(gold, add.get("deletionVector"), dv_files)
        if old is not None and len(old):
            deleted = np.zeros(n, dtype=bool)
            deleted[np.fromiter(old, dtype=np.int64, count=len(old))] = True
            found = found.filter(pa.array(~deleted))
        try:
            hit = found.join(keys, [f"k{j}" for j in range(len(knames))], join_type="inner", use_threads=False)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:
            raise CannotMark(f"keys pyarrow does not join ({e})") from None
        if not hit.num_rows:
            continue
        from pyroaring import BitMap

        rows = hit.column("__row").to_numpy()
        marks.touched[path] = (old | BitMap(rows.tolist())) if old is not None else BitMap(rows.tolist())
        marks.live[path] = n
        matched.append(pa.table({"__path": pa.array([path] * hit.num_rows), "__row": hit.column("__row"),
                                 "__src": hit.column("__src")}))
    hits = pa.concat_tables(matched) if matched else pa.table({"__path": pa.array([], pa.string()),
                                                                "__row": pa.array([], pa.int64()),
                                                                "__src": pa.array([], pa.int64())})
    src_hits = np.bincount(hits.column("__src").to_numpy(), minlength=source.num_rows) if hits.num_rows \
        else np.zeros(source.num_rows, dtype=np.int64)
    if (src_hits > 1).any():
        raise CannotMark("gold holds a key of the batch more than once")
    is_update = pc.equal(source.column("__action"), "U").to_numpy(zero_copy_only=False)
    was_there = src_hits == 1
    kept = {int(n[3:]): source.column(n).to_numpy(zero_copy_only=False) for n in source.column_names
            if n.startswith("__u")}
    for i, mask in kept.items():
        if (mask & ~was_there).any():
            raise CannotMark(f"an unchanged TOAST value of a row gold does not hold ({cols[i]})")
    values = {c: source.column(f"__v{i}") for i, c in enumerate(cols)}
    if kept and hits.num_rows:
        values = _with_kept(values, cols, kept, hits, source.num_rows, gold, fs, root)
    values[LSN_COL] = source.column("__lsn")
    values[COMMIT_TS_COL] = source.column("__ts")
    chosen = pa.array(np.flatnonzero(is_update))
    try:
        marks.rows = pa.table([values[f.name].take(chosen).cast(f.type) for f in target], schema=target) \
            if len(chosen) else None
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:
        raise CannotMark(f"the batch's values are not gold's types ({e})") from None
    n_updated = int((is_update & was_there).sum())
    marks.metrics = {
        "numSourceRows": source.num_rows, "numTargetRowsInserted": int((is_update & ~was_there).sum()),
        "numTargetRowsUpdated": n_updated, "numTargetRowsDeleted": int((~is_update & was_there).sum()),
        "numTargetRowsCopied": 0, "numOutputRows": len(chosen),
        "numTargetFilesAdded": 1 if len(chosen) else 0,
        "numTargetFilesRemoved": sum(1 for p, v in marks.touched.items() if len(v) == marks.live[p]),
        "numTargetDeletionVectorsAdded": sum(1 for p, v in marks.touched.items() if len(v) < marks.live[p]),
        "numTargetDeletionVectorsRemoved": sum(1 for p in marks.touched if snap.files[p].get("deletionVector")),
    }
    return marks


def _candidates(files: Mapping[str, Mapping[str, Any]], knames: Sequence[str], keys: Any) -> list[str]:
    """The files whose statistics may hold one of `keys` (k0..: a value within the file's [min, max] on each
    integer key column); every file whose statistics do not say. String statistics are not used: writers cut them
    to a prefix (Spark: 32 characters, its maximum then extended by a tie-breaking character), which a key past
    that prefix need not sort below."""
    import pyarrow as pa

    sorted_keys = []
    for j in range(len(knames)):
        col = keys.column(f"k{j}")
        if pa.types.is_integer(col.type):
            sorted_keys.append((knames[j], sorted(v for v in col.to_pylist() if v is not None)))
    out = []
    for path, add in files.items():
        stats = json.loads(add["stats"]) if add.get("stats") else {}
        lo, hi = stats.get("minValues") or {}, stats.get("maxValues") or {}
        may = True
        for name, values in sorted_keys:
            if name not in lo or name not in hi or lo[name] is None or hi[name] is None:
                continue
            at = bisect.bisect_left(values, lo[name])
            if at == len(values) or values[at] > hi[name]:
                may = False
                break
        if may:
            out.append(path)
    return sorted(out)


def _old_vector(gold: str, descriptor: Mapping[str, Any] | None, cache: dict[str, bytes]) -> Any:
    """The rows a file's deletion vector marks (None: none)."""
    if not descriptor:
        return None
    kind = descriptor.get("storageType")
    if kind == "i":
        return dv_codec.read_inline(descriptor)
    if kind != "u":
        raise CannotMark(f"a deletion vector stored as {kind!r}")
    where = storage.join(gold, dv_codec.relative_path(descriptor))
    if where not in cache:
        cache[where] = storage.files_for(where).read_bytes(where)
    try:
        return dv_codec.read_from_file(cache[where], descriptor)
    except ValueError as e:
        raise CannotMark(f"{where}: {e}") from None


def _with_kept(values: dict[str, Any], cols: Sequence[str], kept: Mapping[int, Any], hits: Any, n: int, gold: str,
               fs: Any, root: str) -> dict[str, Any]:
    """`values` with gold's own value where a source row keeps it (`__u{i}`), read from the matched rows' files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = [cols[i] for i in sorted(kept)]
    old: dict[str, list] = {c: [None] * n for c in wanted}
    for path in sorted(set(hits.column("__path").to_pylist())):
        mine = hits.filter(pc.equal(hits.column("__path"), path))
        data = pq.read_table(f"{root.rstrip('/')}/{unquote(path)}", columns=wanted, filesystem=fs,
                             coerce_int96_timestamp_unit="us")
        taken = data.take(mine.column("__row"))
        for c in wanted:
            for s, v in zip(mine.column("__src").to_pylist(), taken.column(c).to_pylist()):
                old[c][s] = v
    out = dict(values)
    for i in sorted(kept):
        c = cols[i]
        mask = pa.array(np.asarray(kept[i], dtype=bool))
        out[c] = pc.if_else(mask, pa.array(old[c], type=values[c].type), values[c])
    return out


def commit_marks(gold: str, marks: Marks, *, app_id: str, txn_version: int, user_metadata: str) -> int:
    """Write `marks` into `gold` as one commit (module doc) at the version after the planned snapshot; its version.
    A MergeError when another writer took that version first (nothing of this commit is live: run again)."""
    now = int(time.time() * 1000)
    files = storage.files_for(gold)
    partial = [p for p, v in sorted(marks.touched.items()) if len(v) < marks.live[p]]
    actions: list[dict[str, Any]] = []
    descriptors: dict[str, dict[str, Any]] = {}
    written = 0
    if partial:
        file_id = uuid.uuid4()
        content, descs = dv_codec.build_file([marks.touched[p] for p in partial], file_id)
        files.put_new(storage.join(gold, dv_codec.file_name(file_id)), content)
        written += len(content)
        descriptors = dict(zip(partial, descs))
    for path in sorted(marks.touched):
        add = marks.adds[path]
        actions.append({"remove": _remove(add, now, marks.live[path])})
        if path in descriptors:
            again = {k: v for k, v in add.items() if v is not None}
            again["dataChange"] = True
            again["deletionVector"] = descriptors[path]
            if add.get("stats"):
                stats = json.loads(add["stats"])
                stats["tightBounds"] = False
                again["stats"] = json.dumps(stats, separators=(",", ":"))
            actions.append({"add": again})
    if marks.rows is not None and marks.rows.num_rows:
        add = _put_file(gold, marks.rows, now)
        written += add["size"]
        actions.append({"add": add})
    if marks.operation == "WRITE":
        parameters = {"mode": "Append", "partitionBy": "[]"}
        metrics = {**marks.metrics, "numOutputBytes": written}
    else:
        parameters = {"predicate": json.dumps(["the key columns are equal"]),
                      "matchedPredicates": json.dumps([{"actionType": "delete"}, {"actionType": "update"}]),
                      "notMatchedPredicates": json.dumps([{"actionType": "insert"}])}
        metrics = {**marks.metrics, "numTargetBytesAdded": written}
    info = {"timestamp": now, "operation": marks.operation, "operationParameters": parameters,
            "readVersion": marks.version, "isolationLevel": "Serializable",
            "isBlindAppend": marks.operation == "WRITE",
            "operationMetrics": {k: str(v) for k, v in metrics.items()}, "engineInfo": ENGINE,
            "txnId": str(uuid.uuid4()), "userMetadata": user_metadata}
    lines = [{"commitInfo": info}, {"txn": {"appId": app_id, "version": txn_version, "lastUpdated": now}}, *actions]
    return _put_entry(gold, marks.version + 1, lines, marks.checkpoint_interval,
                      "run the sync again (it resumes from gold's watermark)")


def _remove(add: Mapping[str, Any], now: int, records: int | None) -> dict[str, Any]:
    """The `remove` action of a live file (`add`: its add action), with its deletion vector; `records`: its
    physical rows, for the statistics (None: unknown)."""
    remove = {"path": add["path"], "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
              "partitionValues": dict(add.get("partitionValues") or {}), "size": add.get("size")}
    if add.get("stats") and records is not None:
        remove["stats"] = json.dumps({"numRecords": records}, separators=(",", ":"))
    if add.get("tags"):
        remove["tags"] = add["tags"]
    if add.get("deletionVector"):
        remove["deletionVector"] = {k: v for k, v in add["deletionVector"].items() if v is not None}
    return remove


def _put_file(gold: str, rows: Any, now: int) -> dict[str, Any]:
    """`rows` (a pyarrow Table in gold's schema) written as a new Parquet file of `gold`; its `add` action."""
    import pyarrow.parquet as pq

    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    buf = io.BytesIO()
    pq.write_table(rows, buf, compression="snappy")
    data = buf.getvalue()
    storage.files_for(gold).put_new(storage.join(gold, name), data)
    return {"path": name, "partitionValues": {}, "size": len(data), "modificationTime": now, "dataChange": True,
            "stats": json.dumps(file_stats(rows), separators=(",", ":"))}


def _put_entry(gold: str, version: int, lines: Sequence[Mapping[str, Any]], checkpoint_interval: int,
               what_to_do: str) -> int:
    """The log entry `version` of `gold` := `lines`, only if that version is free (a MergeError naming
    `what_to_do` if another writer took it: nothing of this commit is live); a checkpoint at a multiple of the
    table's interval after version 0, as Spark writes one after its own commit. Returns `version`."""
    entry = storage.join(gold, "_delta_log", f"{version:020d}.json")
    try:
        storage.files_for(gold).put_new(
            entry, "\n".join(json.dumps(a, separators=(",", ":")) for a in lines).encode() + b"\n")
    except FileExistsError:
        raise MergeError(f"{gold}: another writer committed version {version} meanwhile; {what_to_do}") from None
    if version and version % max(checkpoint_interval, 1) == 0:
        try:
            delta_log.delta_rs_table(gold).create_checkpoint()  # (delta-rs writes each file's vector into it)
        except Exception as e:  # the commit stands; the next checkpoint covers it
            log.warning("%s: no checkpoint at version %d (%s: %s)", gold, version, type(e).__name__, e)
    return version


def file_stats(rows: Any) -> dict[str, Any]:
    """A new file's Delta statistics: numRecords, nullCount of every top-level column, minValues/maxValues of its
    integer, date and string (values of at most 32 characters) columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for f in rows.schema:
        col = rows.column(f.name)
        if pa.types.is_nested(f.type):
            continue
        nulls[f.name] = col.null_count
        if col.null_count == len(col):
            continue
        if pa.types.is_integer(f.type):
            mm = pc.min_max(col).as_py()
            lo[f.name], hi[f.name] = mm["min"], mm["max"]
        elif pa.types.is_date32(f.type):
            mm = pc.min_max(col).as_py()
            lo[f.name], hi[f.name] = (d.isoformat() if isinstance(d, dt.date) else d for d in (mm["min"], mm["max"]))
        elif pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            if pc.max(pc.utf8_length(col)).as_py() <= _STRING_STAT_CHARS:
                mm = pc.min_max(col).as_py()
                lo[f.name], hi[f.name] = mm["min"], mm["max"]
    return {"numRecords": rows.num_rows, "minValues": lo, "maxValues": hi, "nullCount": nulls}


OVERWRITE_FILE_ROWS = 1_000_000  # rows per Parquet file an `overwrite` writes


class LiveRows:
    """A table with deletion vectors as of `version` (None: its latest), read without Spark: each live file with
    pyarrow, the rows its vector deletes left out, cast to the table's Arrow schema (delta-rs's). The methods of a
    `pyarrow.dataset.Dataset` the in-process paths use (`schema`, `scanner`, `to_table`, `to_batches`), a batch of
    a file in memory at a time. CannotMark for a table this module does not read (column mapping, partitions, a vector
    kind or a log it does not know)."""

    def __init__(self, path: str, version: int | None = None, schema: Any = None,
                 only: Collection[str] | None = None) -> None:
        """`schema`: the table's Arrow schema at that version, if the caller has it (else read with delta-rs);
        `only`: read only these of its live files (paths as the log holds them)."""
        import pyarrow as pa

        snap = delta_log.snapshot(path, version)
        if snap is None:
            raise CannotMark(f"the log of {path} cannot be replayed here")
        conf = dict(snap.metadata.get("configuration") or {})
        if conf.get("delta.columnMapping.mode", "none") != "none" or snap.metadata.get("partitionColumns"):
            raise CannotMark("column mapping or partitions")
        wanted = None if only is None else set(only)
        files = snap.files if wanted is None else {p: a for p, a in snap.files.items() if p in wanted}
        self.path, self.version, self._files = path, snap.version, files
        self.schema = schema if schema is not None else pa.schema(
            delta_log.delta_rs_table(path, snap.version).schema().to_arrow())

    def _tables(self) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        fs, root = storage.arrow_files(self.path)
        cache: dict[str, bytes] = {}
        for path in sorted(self._files):
            add = self._files[path]
            file = pq.ParquetFile(f"{root.rstrip('/')}/{unquote(path)}", filesystem=fs,
                                  coerce_int96_timestamp_unit="us")
            gone = _old_vector(self.path, add.get("deletionVector"), cache)
            keep = None
            if gone is not None and len(gone):  # row indexes count from the file's first row
                keep = np.ones(file.metadata.num_rows, dtype=bool)
                keep[np.fromiter(gone, dtype=np.int64, count=len(gone))] = False
            at = 0
            for batch in file.iter_batches(batch_size=65_536, use_threads=False):  # a batch at a time in memory
                n = batch.num_rows
                if keep is not None:
                    batch = batch.filter(pa.array(keep[at:at + n]))
                at += n
                try:  # a column added after the file was written reads as NULL
                    yield pa.table([batch.column(f.name).cast(f.type) if f.name in batch.schema.names
                                    else pa.nulls(batch.num_rows, f.type) for f in self.schema], schema=self.schema)
                except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:
                    raise CannotMark(f"{path}: not read as the table's types ({e})") from None

    def scanner(self, columns: Any = None, filter: Any = None, batch_size: int = 65_536) -> _LiveScanner:  # noqa: A002
        return _LiveScanner(self, columns, filter, batch_size)

    def to_table(self, columns: Any = None, filter: Any = None) -> Any:  # noqa: A002
        return self.scanner(columns, filter).to_table()

    def to_batches(self, columns: Any = None, filter: Any = None) -> Any:  # noqa: A002
        return self.scanner(columns, filter).to_batches()


class _LiveScanner:
    """`LiveRows.scanner`: pyarrow's own scanner (projection, filter) over each file's live rows in turn."""

    def __init__(self, rows: LiveRows, columns: Any, where: Any, batch_size: int) -> None:
        import pyarrow.dataset as ds

        self._rows, self._args = rows, {"columns": columns, "filter": where, "batch_size": batch_size}
        self.projected_schema = ds.dataset(rows.schema.empty_table()).scanner(**self._args).projected_schema

    def to_batches(self) -> Any:
        import pyarrow.dataset as ds

        for table in self._rows._tables():
            yield from ds.dataset(table).scanner(**self._args).to_batches()

    def to_reader(self) -> Any:
        import pyarrow as pa

        return pa.RecordBatchReader.from_batches(self.projected_schema, self.to_batches())

    def to_table(self) -> Any:
        import pyarrow as pa

        return pa.Table.from_batches(list(self.to_batches()), schema=self.projected_schema)


def overwrite(gold: str, data: Any, user_metadata: str) -> int:
    """`gold` (a table with deletion vectors) := the rows of `data` (a pyarrow RecordBatchReader in gold's
    columns), one commit as Spark's overwrite writes it: every live file removed with its vector, the new rows in
    new files of at most `OVERWRITE_FILE_ROWS` (history kept: time travel reads the old version). CannotMark for
    a table this module does not write or rows not of gold's types, and a MergeError when another writer took the
    version: the log entry is not written then (data files already written stay unreferenced, as after a crash,
    for `VACUUM`). Returns the new version."""
    import pyarrow as pa

    snap = _writable_snapshot(gold)
    target = pa.schema(delta_log.delta_rs_table(gold, snap.version).schema().to_arrow())
    if sorted(data.schema.names) != sorted(target.names):
        raise CannotMark(f"the rows' columns {data.schema.names} are not gold's {target.names}")
    now = int(time.time() * 1000)
    actions, rows, written = _put_files(gold, data, target, now)
    removes = _removes(snap.files.values(), now)
    metrics = {"numFiles": len(actions), "numOutputRows": rows, "numOutputBytes": written,
               "numRemovedFiles": len(removes)}
    info = {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Overwrite", "partitionBy": "[]"},
            "readVersion": snap.version, "isolationLevel": "Serializable", "isBlindAppend": False,
            "operationMetrics": {k: str(v) for k, v in metrics.items()}, "engineInfo": ENGINE,
            "txnId": str(uuid.uuid4()), "userMetadata": user_metadata}
    return _put_entry(gold, snap.version + 1, [{"commitInfo": info}, *removes, *actions], _interval(snap),
                      "run the replay again")


def _removes(adds: Iterable[Mapping[str, Any]], now: int, data_change: bool = True) -> list[dict[str, Any]]:
    """The `remove` actions of whole live files (`adds`: their add actions), each with its vector and its
    statistics' record count."""
    out = []
    for add in adds:
        stats = json.loads(add["stats"]) if add.get("stats") else {}
        out.append({"remove": {**_remove(add, now, stats.get("numRecords")), "dataChange": data_change}})
    return out


def _put_files(gold: str, data: Any, target: Any, now: int) -> tuple[list[dict[str, Any]], int, int]:
    """The batches of `data` cast to `target` (gold's Arrow schema) and written as new Parquet files of `gold` of
    at most `OVERWRITE_FILE_ROWS` rows each: their `add` actions, the rows and the bytes written. CannotMark for
    rows not of gold's types."""
    import pyarrow as pa

    actions: list[dict[str, Any]] = []
    rows = written = 0
    pending: list[Any] = []

    def flush() -> None:
        nonlocal written
        if pending:
            add = _put_file(gold, pa.Table.from_batches(pending, schema=target), now)
            written += add["size"]
            actions.append({"add": add})
            pending.clear()

    for batch in data:
        try:
            batch = pa.RecordBatch.from_arrays([batch.column(f.name).cast(f.type) for f in target], schema=target)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as e:
            raise CannotMark(f"rows not of gold's types ({e})") from None
        pending.append(batch)
        rows += batch.num_rows
        if sum(b.num_rows for b in pending) >= OVERWRITE_FILE_ROWS:
            flush()
    flush()
    return actions, rows, written


COMPACT_SMALL_BYTES = 64 * 1024 * 1024
"""`compact` folds the files under this size (and every file with a deletion vector)."""


@dataclass(frozen=True)
class Compacted:
    """What one `compact` commit did."""

    version: int
    files_removed: int
    files_added: int
    vectors_removed: int
    rows: int  # the live rows rewritten


def compact(gold: str, small_bytes: int = COMPACT_SMALL_BYTES) -> Compacted | None:
    """Spark's `OPTIMIZE` of a table with deletion vectors, without Spark: the live rows of its files under
    `small_bytes` and of every file with a vector (the rows it deletes left out) rewritten into new files of at
    most `OVERWRITE_FILE_ROWS` rows, one `OPTIMIZE` commit whose actions change no data (`dataChange: false`:
    the table's rows, its watermark and its history are as before). None, nothing written, when there is nothing
    to fold (no vector and fewer than two small files). CannotMark for a table this module does not write, a
    MergeError when another writer took the version (its files stay unreferenced, for `VACUUM`)."""
    import pyarrow as pa

    snap = _writable_snapshot(gold)
    picked = {p: a for p, a in snap.files.items()
              if a.get("deletionVector") or int(a.get("size") or 0) < small_bytes}
    vectors = sum(1 for a in picked.values() if a.get("deletionVector"))
    if not vectors and len(picked) < 2:
        return None
    target = pa.schema(delta_log.delta_rs_table(gold, snap.version).schema().to_arrow())
    now = int(time.time() * 1000)
    live = LiveRows(gold, snap.version, target, only=picked)
    adds, rows, written = _put_files(gold, live.scanner(batch_size=65_536).to_reader(), target, now)
    for a in adds:
        a["add"]["dataChange"] = False
    removes = _removes(picked.values(), now, data_change=False)
    metrics = {"numRemovedFiles": len(removes), "numAddedFiles": len(adds), "numAddedBytes": written,
               "numRemovedBytes": sum(int(a.get("size") or 0) for a in picked.values()),
               "numDeletionVectorsRemoved": vectors}
    info = {"timestamp": now, "operation": "OPTIMIZE",
            "operationParameters": {"predicate": "[]", "zOrderBy": "[]", "auto": "false"},
            "readVersion": snap.version, "isolationLevel": "SnapshotIsolation", "isBlindAppend": False,
            "operationMetrics": {k: str(v) for k, v in metrics.items()}, "engineInfo": ENGINE,
            "txnId": str(uuid.uuid4())}
    version = _put_entry(gold, snap.version + 1, [{"commitInfo": info}, *removes, *adds], _interval(snap),
                         "run the optimize again")
    return Compacted(version, len(removes), len(adds), vectors, rows)


def live_row_count(path: str) -> int | None:
    """The live rows of a table with deletion vectors from its log: each file's `numRecords` less its vector's
    cardinality; None when a file has no statistics or the log is not read here."""
    snap = delta_log.snapshot(path)
    if snap is None:
        return None
    total = 0
    for add in snap.files.values():
        stats = json.loads(add["stats"]) if add.get("stats") else {}
        if stats.get("numRecords") is None:
            return None
        total += int(stats["numRecords"]) - int((add.get("deletionVector") or {}).get("cardinality") or 0)
    return total


def create(path: str, schema: Any, batches: Iterable[Any], *, configuration: Mapping[str, str], user_metadata: str,
           what_to_do: str) -> int:
    """A new Delta table at `path` of the Arrow `schema` (every column nullable) holding `batches` (record batches of
    that schema, read once) in one commit, version 0, written as `overwrite` writes its files: Parquet files of at
    most `OVERWRITE_FILE_ROWS` rows with their statistics, then the log entry, only if version 0 is free (a
    MergeError naming `what_to_do` otherwise). An exception from `batches` leaves the files written before it and no
    log entry (the caller removes them). The table's properties are `configuration` (any keys: delta-rs's writers
    refuse keys it does not know, such as `slotlake.snapshot`); the protocol is Spark's for the schema (reader 1,
    writer 2; reader 3, writer 7 with `timestampNtz` for a time stamp without a zone). The commit's userMetadata is
    `user_metadata`. Returns 0."""
    import pyarrow as pa
    from deltalake import Schema

    now = int(time.time() * 1000)
    adds, rows, written = _put_files(path, batches, schema, now)
    ntz = any(pa.types.is_timestamp(f.type) and f.type.tz is None for f in schema)
    protocol: dict[str, Any] = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["timestampNtz"],
                                "writerFeatures": ["timestampNtz"]} if ntz else \
        {"minReaderVersion": 1, "minWriterVersion": 2}
    metadata = {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                "schemaString": Schema.from_arrow(schema).to_json(), "partitionColumns": [],
                "configuration": dict(configuration), "createdTime": now}
    metrics = {"numFiles": len(adds), "numOutputRows": rows, "numOutputBytes": written}
    info = {"timestamp": now, "operation": "CREATE TABLE AS SELECT",
            "operationParameters": {"partitionBy": "[]", "description": None, "isManaged": "false",
                                    "properties": json.dumps(dict(configuration))},
            "isolationLevel": "Serializable", "isBlindAppend": False,
            "operationMetrics": {k: str(v) for k, v in metrics.items()}, "userMetadata": user_metadata,
            "engineInfo": "slotlake (without Spark)", "txnId": str(uuid.uuid4())}
    return _put_entry(path, 0, [{"commitInfo": info}, {"metaData": metadata}, {"protocol": protocol}, *adds], 10,
                      what_to_do)
