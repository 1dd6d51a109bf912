"""Silver's files written by the decode's own Python tasks, committed with delta-rs (a lake on a local file system).

The decode's tasks already hold each bronze file's changes as Arrow batches (`decode_partition`). Handing them to
Spark to write costs more than the decode: Arrow to rows, a shuffle to lay them out by table, Spark's row-wise
Parquet writer, each on wide rows (bench/README.md, "the silver write without Spark's writer"). Here each task
writes its changes with pyarrow, one Parquet file per table (`rows_per_file` at most), with the Delta statistics of
silver's indexed columns, and returns only the files' descriptions; the driver commits them all in one Delta
commit, with the same idempotent-write transaction (`txnAppId`/`txnVersion`, which Spark honours) and userMetadata
a Spark write carries. A task that dies leaves files no commit names (as Spark's own writer does; VACUUM removes
them). Silver is the same Delta table either way, read by Spark and delta-rs alike.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from slotlake import contracts, delta_log, storage
from slotlake.decode.decoded import KIND_CHANGE
from slotlake.decode.layouts import META_LAYOUTS, LayoutScan

FILES: contracts.Columns = (("path", "string"), ("size", "long"), ("rows", "long"), ("stats", "string"))
"""What each task returns per file it wrote (`path` relative to the table; `stats` Delta's statistics JSON)."""
FILES_DDL = contracts.ddl(FILES)

ROW_GROUP_ROWS = 65_536
"""Changes of a table a task holds before writing them as one Parquet row group (~24 MB of pgbench rows in
memory): fewer, bigger row groups than the decoder's batches. Row groups of 131,072 or 262,144 did not read
measurably faster in the merge (bench/README.md, "the merge's reads of the tasks' files")."""
MAX_HELD_ROWS = 4 * ROW_GROUP_ROWS
"""Changes a task holds over all its tables at most (many tables, none with a full row group): memory stays flat
(~95 MB of pgbench rows)."""
DICTIONARY_COLUMNS = ("seq", "rel_oid", "schema_name", "table_name", "op", "replica_identity", "old_kind",
                      "truncate_options", "bronze_file")
"""Silver's columns written dictionary-encoded: the scalars whose values repeat from change to change. The LSNs,
xid, time stamps, arrays and values are written plain, as Spark's writer ends up writing most of them (pyarrow's
dictionaries of unique LSNs cost the merge's reads; bench/README.md, "the merge's reads of the tasks' files")."""
STATS_COLUMNS = [name for name, _ in contracts.SILVER[:contracts.SILVER_STATS_COLUMNS]]
"""Silver's columns whose Parquet statistics are written (row group min/max and NULLs, which Spark's reader skips
row groups by): those Delta keeps statistics for. Readers filter only those; the arrays' and values' statistics
cost the write and are never read."""
MAX_OPEN_FILES = 64
"""Parquet files a task keeps open; past it the oldest is closed (its table's next changes go to a new file)."""
MAX_WRITES_QUEUED = 2
"""Row groups a task's writer thread may have queued (the decode goes on while one is written: pyarrow's Parquet
writer and the statistics release the GIL); past it the decode waits, so memory stays bounded."""


def writes_directly(changes_path: str) -> bool:
    """Whether the decode's tasks write silver's files themselves: a lake on a local file system (the executors
    write where the driver commits). An s3a lake keeps Spark's writer for them (its credentials and committer are
    Spark's); only a small batch decoded in the driver is written there directly (`decode.job._staged_bronze`)."""
    return not storage.is_s3(changes_path)


def overwrites_directly(changes_path: str) -> bool:
    """Whether a replay's re-decode can write its files itself and replace the table at `changes_path` with one
    delta-rs commit: a local lake, and no table there or one with silver's columns (asked before any file is
    written: another shape is rewritten by Spark's schema overwrite, and files written first would be left over)."""
    if not writes_directly(changes_path):
        return False
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(changes_path)
    except TableNotFoundError:
        return True
    return _holds_silver(table)


class _OpenFile:
    """One Parquet file being written, with the statistics Delta keeps for silver's indexed columns."""

    def __init__(self, folder: str, schema: Any) -> None:
        import pyarrow.parquet as pq

        self.name = f"part-{uuid.uuid4()}.snappy.parquet"
        self.path = os.path.join(folder, self.name)
        self.writer = pq.ParquetWriter(self.path, schema, compression="snappy",
                                      use_dictionary=list(DICTIONARY_COLUMNS), write_statistics=STATS_COLUMNS)
        self.rows = 0
        self.lo: dict[str, Any] = {}
        self.hi: dict[str, Any] = {}
        self.nulls: dict[str, int] = {}
        self.layouts = LayoutScan()

    def write(self, table: Any) -> None:
        import pyarrow.compute as pc

        self.writer.write_table(table)
        self.rows += table.num_rows
        self.layouts.add(table)
        for name, _ in contracts.SILVER[:contracts.SILVER_STATS_COLUMNS]:
            col = table.column(name)
            self.nulls[name] = self.nulls.get(name, 0) + col.null_count
            mm = pc.min_max(col).as_py()
            if mm["min"] is not None:
                self.lo[name] = mm["min"] if name not in self.lo else min(self.lo[name], mm["min"])
                self.hi[name] = mm["max"] if name not in self.hi else max(self.hi[name], mm["max"])

    def close(self) -> dict[str, Any]:
        summary = self.layouts.summary()
        if summary is not None:  # what the merge's first pass would count of this file (decode/layouts.py)
            self.writer.add_key_value_metadata({META_LAYOUTS: summary.json()})
        self.writer.close()
        stats = {"numRecords": self.rows, "minValues": {k: _stat(v) for k, v in self.lo.items()},
                 "maxValues": {k: _stat(v) for k, v in self.hi.items()}, "nullCount": self.nulls}
        return {"path": self.name, "size": os.path.getsize(self.path), "rows": self.rows,
                "stats": json.dumps(stats, separators=(",", ":"))}


def _stat(v: Any) -> Any:
    """A statistic as Delta writes it: time stamps in UTC to the millisecond (Delta widens a maximum by 1 ms when
    it reads one back), others as they are."""
    if hasattr(v, "isoformat"):
        v = v.astimezone(dt.UTC)
        return v.strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z"
    return v


def write_task(batches: Iterator, *, decode: Callable[[Iterator], Iterator], folder: str,
               rows_per_file: int, window: tuple[int | None, int] | None = None) -> Iterator:
    """mapInArrow function: bronze rows of whole files in, decoded by `decode` (`decode_partition` with its
    settings), silver Parquet files written into `folder` (one table per file, at most `rows_per_file` rows),
    their descriptions (`FILES_DDL`) out. `window` (after, upto): only the changes with `after < commit_end_lsn`
    (after None: from the start) and `commit_lsn <= upto` (a replay's re-decode). The files are written by a thread
    of their own while the decode goes on (`MAX_WRITES_QUEUED`): that alone took the in-process decode of the issue's
    310,000-change burst from 1.50 to 1.23 s (bench/README.md, "The silver write beside the decode")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = contracts.arrow_schema(contracts.SILVER)
    names = schema.names
    open_files: dict[int | None, _OpenFile] = {}  # insertion order: the oldest is closed first past MAX_OPEN_FILES
    held: dict[int | None, list] = {}  # per table, changes not yet written
    counts: dict[int | None, int] = {}
    done: list[dict[str, Any]] = []
    writing: deque[Future] = deque()  # flushes handed to the writer thread, oldest first

    def write(oid: int | None, parts: list) -> None:
        """In the writer thread (the only one touching `open_files` and `done`): a table's held changes written."""
        part = pa.concat_tables(parts)
        at = 0
        while at < part.num_rows:
            f = open_files.get(oid)
            if f is None:
                if len(open_files) >= MAX_OPEN_FILES:
                    done.append(open_files.pop(next(iter(open_files))).close())
                f = open_files[oid] = _OpenFile(folder, schema)
            take = min(part.num_rows - at, rows_per_file - f.rows)
            f.write(part.slice(at, take))
            at += take
            if f.rows >= rows_per_file:
                done.append(open_files.pop(oid).close())

    def flush(oid: int | None) -> None:
        counts.pop(oid)
        writing.append(writer.submit(write, oid, held.pop(oid)))
        while len(writing) > MAX_WRITES_QUEUED:  # memory stays bounded when writing is slower than decoding
            writing.popleft().result()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="silver-write") as writer:
        try:
            for out in decode(batches):
                keep = pc.equal(out.column("kind"), KIND_CHANGE)
                if window is not None:
                    after, upto = window
                    keep = pc.and_(keep, pc.less_equal(out.column("commit_lsn"), upto))
                    if after is not None:
                        keep = pc.and_(keep, pc.greater(out.column("commit_end_lsn"), after))
                for oid, part in _by_table(pa.Table.from_batches([out]), keep):
                    part = part.select(names).cast(schema)
                    held.setdefault(oid, []).append(part)
                    counts[oid] = counts.get(oid, 0) + part.num_rows
                    if counts[oid] >= ROW_GROUP_ROWS:
                        flush(oid)
                if sum(counts.values()) >= MAX_HELD_ROWS:  # many tables, none with a full row group: write them all
                    for oid in list(held):
                        flush(oid)
            for oid in list(held):
                flush(oid)
            while writing:
                writing.popleft().result()
        finally:  # a failed decode or write: the writes not started are dropped; no file is committed (a failed task's
            # files are left as Spark's own writer leaves them, for VACUUM)
            for w in writing:
                w.cancel()
    done.extend(f.close() for f in open_files.values())
    yield pa.RecordBatch.from_pylist(done, schema=contracts.arrow_schema(FILES))


def _by_table(rows: Any, keep: Any) -> Iterator[tuple[int | None, Any]]:
    """(rel_oid, its rows) per table of the `rows` that `keep` (a boolean mask) selects, each table's rows in their
    order: one take of the kept rows ordered by table (a stable sort), then slices of it; not a filter and then a
    filter per table (each a pass over every column, the arrays and values included)."""
    import pyarrow.compute as pc

    kept = pc.indices_nonzero(keep)
    if not len(kept):
        return
    oids = rows.column("rel_oid").take(kept)
    first = oids[0].as_py()
    if first is not None and oids.null_count == 0 and pc.all(pc.equal(oids, first)).as_py():
        yield first, rows.take(kept)  # one table: no sort
        return
    order = pc.sort_indices(oids)  # stable; NULLs last
    ordered = rows.take(kept.take(order))
    runs = pc.run_end_encode(oids.take(order).combine_chunks())
    at = 0
    for oid, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist()):
        yield oid, ordered.slice(at, end - at)
        at = end


def commit(changes_path: str, files: Sequence[Mapping[str, Any]], *, app_id: str | None, version: int | None,
           user_metadata: str, properties: Mapping[str, str], overwrite: bool = False) -> bool:
    """One Delta commit adding `files` to silver (creating the table, with `properties`, when there is none),
    with the idempotent-write transaction (`app_id`, `version`; none when `app_id` is None) and `user_metadata`.
    False when a commit of that transaction is there already (nothing written). `overwrite`: the commit also
    removes every file the table held (a replay's own changes table, rewritten each time); False, writing nothing,
    when that table's schema is not silver's (the caller rewrites it with Spark's schema overwrite)."""
    from deltalake import Schema
    from deltalake.exceptions import TableNotFoundError
    from deltalake.transaction import AddAction, RemoveAction, Transaction, create_table_with_add_actions

    adds, props = _adds_and_props(files, user_metadata, app_transactions=[Transaction(app_id, version)]
                                  if app_id is not None and version is not None else None)
    silver = contracts.arrow_schema(contracts.SILVER)
    try:
        table = delta_log.delta_rs_table(changes_path)  # an s3a lake: conditional PUTs (storage.py)
    except TableNotFoundError:
        uri, options = storage.delta_rs_table_args(changes_path)
        create_table_with_add_actions(uri, Schema.from_arrow(silver), adds, mode="append",
                                      configuration=dict(properties), storage_options=options or None,
                                      commit_properties=props)
        return True
    if overwrite and not _holds_silver(table):
        return False
    if app_id is not None:
        done = table.transaction_version(app_id)
        if done is not None and version is not None and done >= version:
            return False
    actions: list[AddAction | RemoveAction] = list(adds)  # the parameter's type (a list is invariant)
    # delta-rs's overwrite removes every file of the table's current version in the same commit
    table.create_write_transaction(actions, mode="overwrite" if overwrite else "append", schema=table.schema(),
                                   commit_properties=props)
    return True


def replace_files(changes_path: str, files: Sequence[Mapping[str, Any]], removed: Sequence[str], *,
                  user_metadata: str) -> None:
    """One Delta commit of the existing silver table at `changes_path` that adds `files` (written into its folder,
    as `commit` takes them) and removes the files `removed` (paths relative to the table): an in-place
    replay's re-decoded rows in place of the ones they re-derive. No idempotent-write transaction (a second
    replay rewrites the same rows)."""
    from deltalake.transaction import AddAction, RemoveAction

    adds, props = _adds_and_props(files, user_metadata, removed=len(removed))
    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [*adds, *(RemoveAction(path, True, now) for path in removed)]
    table = delta_log.delta_rs_table(changes_path)
    table.create_write_transaction(actions, mode="append", schema=table.schema(), commit_properties=props)


def _adds_and_props(files: Sequence[Mapping[str, Any]], user_metadata: str, *, app_transactions: Any = None,
                    removed: int | None = None) -> tuple[list[Any], Any]:
    """The AddActions of `files` (written into the table's folder: path, size, stats, rows) and the commit's
    properties: `user_metadata`, the operation metrics (files, rows; `removed`: files removed) and the
    idempotent-write transactions, for `commit` and `replace_files`."""
    from deltalake.transaction import AddAction, CommitProperties

    now = int(time.time() * 1000)
    adds = [AddAction(f["path"], int(f["size"]), {}, now, True, f["stats"]) for f in files]
    metrics = {"numFiles": str(len(adds)), "numOutputRows": str(sum(int(f["rows"]) for f in files))}
    if removed is not None:
        metrics["numRemovedFiles"] = str(removed)
    return adds, CommitProperties(custom_metadata={"userMetadata": user_metadata, "operationMetrics": metrics},
                                  app_transactions=app_transactions)


def _holds_silver(table: Any) -> bool:
    """Whether a delta-rs table has silver's columns (its schema is arro3's: read as pyarrow's)."""
    import pyarrow as pa

    return _same_columns(pa.schema(table.schema().to_arrow()), contracts.arrow_schema(contracts.SILVER))


def _same_columns(have: Any, want: Any) -> bool:
    """Whether a Delta table's Arrow schema has silver's columns and types (nullability and the time stamp's
    unit and zone aside, as Spark and delta-rs each write them)."""
    import pyarrow as pa

    def norm(t: Any) -> Any:
        if pa.types.is_timestamp(t):
            return "timestamp"
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return ("list", norm(t.value_type))
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        return t

    return [(f.name, norm(f.type)) for f in have] == [(f.name, norm(f.type)) for f in want]
