"""A Delta table's slotlake watermark: the end LSN its newest slotlake commit records (docs/internals.md "Gold").

Read from the JSON commits of a local table without a Spark job, else from the Delta history with Spark. Also
silver's file statistics (`silver_file_stats`), read with delta-rs.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from slotlake import delta_log, storage
from slotlake.decode.layouts import LayoutGroup, combine, read_layout_summary
from slotlake.lsn import Lsn
from slotlake.merge.plan import (
    newest_watermark,
)
from slotlake.merge.silver_stats import SilverFileStats, files_of
from slotlake.names import TableName
from slotlake.spark.session import error_summary

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

_RECENT_COMMITS = 20


@dataclass(frozen=True)
class DeltaState:
    """What a Delta table's history says: its latest version and the newest slotlake watermark."""

    version: int | None  # None: no Delta table at the path
    watermark: Lsn | None
    marked_version: int | None = None  # the version of the newest commit with a watermark


def delta_state(spark: SparkSession, path: str) -> DeltaState:
    """Latest version and watermark (end LSN of the newest commit with slotlake userMetadata) of `path`."""
    from delta.tables import DeltaTable

    if delta_log.readable(path):
        local = _local_delta_state(path)
        if local is not None:
            return local
    if not DeltaTable.isDeltaTable(spark, path):
        return DeltaState(None, None)
    table = DeltaTable.forPath(spark, path)

    # The newest commits first: every slotlake write carries the watermark, so the full history (a month of
    # hourly commits) is read only when the recent ones are all someone else's (OPTIMIZE, VACUUM, ...).
    def history(limit: int | None) -> list[tuple[int, str | None]]:
        h = table.history(limit) if limit else table.history()
        return [(r["version"], r["userMetadata"]) for r in h.select("version", "userMetadata").collect()]

    rows = history(_RECENT_COMMITS)
    newest = newest_watermark(rows)
    if newest is None and len(rows) >= _RECENT_COMMITS:
        rows = history(None)
        newest = newest_watermark(rows)
    return DeltaState(max(v for v, _ in rows), newest[1] if newest else None, newest[0] if newest else None)


def _local_delta_state(path: str) -> DeltaState | None:
    """`delta_state` from the JSON commits of a local table, without a Spark job (each history() call is one or
    more, several per table and run); None when the log holds no JSON commit (only a checkpoint): ask Spark."""
    if not delta_log.is_delta_table(path):
        return DeltaState(None, None)
    version = None
    for c in delta_log.commits(path):
        if version is None:
            version = c.version
        if c.end_lsn is not None:
            try:
                return DeltaState(version, Lsn.parse(c.end_lsn), c.version)
            except (ValueError, TypeError):
                pass  # not a watermark (as `watermark_of` skips it)
    return DeltaState(version, None, None) if version is not None else None


def delta_watermark(spark: SparkSession, path: str) -> Lsn | None:
    """The end LSN recorded by the newest slotlake commit of the Delta table at `path` (None: none/no table)."""
    return delta_state(spark, path).watermark


def silver_file_stats(path: str) -> tuple[SilverFileStats, ...] | None:
    """Every file of the silver-shaped Delta table at `path` with its statistics (`merge/silver_stats.py`), read
    from its log with delta-rs (no Spark job); None when that is not possible here (no table, an object store
    delta-rs is not set up for, a log it cannot read): the caller then asks Spark, as before."""
    actions = _add_actions(path, "silver file statistics", "tables are checked with Spark")
    if actions is None:
        return None

    def column(name: str) -> list:
        return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows

    return tuple(SilverFileStats(*row) for row in zip(
        column("min.schema_name"), column("max.schema_name"), column("min.table_name"), column("max.table_name"),
        column("min.commit_lsn"), column("max.commit_end_lsn"), column("path"), column("max.commit_lsn"),
        column("min.commit_end_lsn"), strict=True))


def table_bytes(path: str) -> int | None:
    """The size of the current files of the Delta table at `path` (what Spark's `DESCRIBE DETAIL` calls
    sizeInBytes), read from its log with delta-rs (no Spark job); None when that is not possible here (as
    `silver_file_stats`): the caller then asks Spark."""
    import pyarrow.compute as pc

    actions = _add_actions(path, "size", "asking Spark")
    return None if actions is None else int(pc.sum(actions.column("size_bytes")).as_py() or 0)


def _add_actions(path: str, what: str, instead: str) -> pa.Table | None:
    """The add actions (current files, flattened statistics) of the Delta table at `path`, read with delta-rs;
    None, logged as `what` not read and done `instead`, when that is not possible here (no table, an object store
    delta-rs is not set up for, a log or reader feature it cannot read)."""
    import pyarrow as pa

    if not delta_log.readable(path):
        return None
    try:
        return pa.table(delta_log.delta_rs_table(path).get_add_actions(flatten=True))
    except Exception as e:  # any reason: the caller's Spark query is always right
        log.info("%s not read from %s with delta-rs (%s); %s", what, path, error_summary(e), instead)
        return None


def table_columns(path: str) -> list[str] | None:
    """The column names of the Delta table at `path`, read from its log with delta-rs; None when there is no table
    with commits there, or it cannot be read here (ask Spark)."""
    schema = _logged_schema(path, "columns")
    return None if schema is None else [f["name"] for f in schema["fields"]]


def spark_schema(path: str) -> StructType | None:
    """The Spark schema of the Delta table at `path` (the `schemaString` Spark's own load parses), read from its
    log with delta-rs; None when there is no table with commits there, or it cannot be read here (ask Spark)."""
    from pyspark.sql.types import StructType

    schema = _logged_schema(path, "schema")
    return None if schema is None else StructType.fromJson(schema)


def _logged_schema(path: str, what: str) -> dict | None:
    """The Delta schema (its JSON, as a dict) of the table at `path` from its log with delta-rs; None when there is
    no table with commits there, or it cannot be read here (logged, naming `what` was not read)."""
    import json

    if not delta_log.readable(path):
        return None
    try:
        if not delta_log.is_delta_table(path) or not delta_log.has_commits(path):
            return None
        return json.loads(delta_log.delta_rs_table(path).schema().to_json())
    except Exception as e:  # any reason: Spark's answer is always right
        log.info("the %s of %s not read from its log (%s); Spark reads them", what, path, error_summary(e))
        return None


def local_files(table_path: str, files: Sequence[str]) -> list[str] | None:
    """The local paths of a Delta table's `files` (relative and URL-encoded, as its log names them); None when the
    table is not on a local file system."""
    if storage.is_s3(table_path) or not delta_log.readable(table_path):
        return None
    root = storage.local_path(table_path)
    return [os.path.join(root, unquote(rel)) for rel in files]


def table_files(table_path: str, files: Sequence[str]) -> tuple[Any, list[str]] | None:
    """(pyarrow file system, paths on it) of a Delta table's `files` (relative and URL-encoded, as its log names
    them), on a local lake (file system None) or an s3a one (`storage.arrow_files`); None when the table is on
    neither."""
    if not delta_log.readable(table_path):
        return None
    fs, root = storage.arrow_files(table_path)
    return fs, [f"{root.rstrip('/')}/{unquote(rel)}" for rel in files]


def silver_layouts(changes_path: str, files: Sequence[str]) -> list[LayoutGroup] | None:
    """The layout summaries (decode/layouts.py) in the footers of silver's `files` (paths relative to the table),
    added up per layout; None when one has none or cannot be read (the caller runs its Spark pass)."""
    import pyarrow.parquet as pq

    found = table_files(changes_path, files)
    if found is None:
        return None
    fs, where = found
    groups: list[LayoutGroup] = []
    try:
        for path in where:
            summary = read_layout_summary(pq.read_metadata(path, filesystem=fs).metadata)
            if summary is None:
                return None
            groups.extend(summary.groups)
    except OSError as e:
        log.info("silver layout summaries not read from %s (%s); the merge counts with Spark", changes_path,
                 error_summary(e))
        return None
    return combine(groups)


def _runs_columns(runs_path: str, columns: Sequence[str], where=None) -> dict[str, list] | None:
    """`columns` of `_runs`'s rows (those matching the pyarrow expression `where`: Parquet statistics skip the
    other files), read with delta-rs (no Spark job); empty lists when there is no `_runs` table yet; None when it
    cannot be read here (the caller asks Spark)."""

    if not delta_log.readable(runs_path):
        return None
    try:
        if not delta_log.is_delta_table(runs_path) or not delta_log.has_commits(runs_path):
            return {c: [] for c in columns}
        rows = delta_log.delta_rs_table(runs_path).to_pyarrow_dataset().to_table(columns=list(columns), filter=where)
    except Exception as e:  # any reason: Spark's read is always right
        log.info("_runs not read from %s (%s); read with Spark", runs_path, error_summary(e))
        return None
    return {c: rows.column(c).to_pylist() for c in columns}


def runs_tables_at(runs_path: str, end: Lsn) -> set[tuple[str, str]] | None:
    """The (schema, table) pairs `_runs` holds rows for at `run_end_lsn = end` (`_runs_columns`: None when it
    cannot be read here)."""
    import pyarrow.dataset as ds

    got = _runs_columns(runs_path, ["schema_name", "table_name"], ds.field("run_end_lsn") == int(end))
    return None if got is None else set(zip(got["schema_name"], got["table_name"], strict=True))


def runs_ends(runs_path: str) -> dict[tuple[str, str], list[tuple[Lsn, int]]] | None:
    """Every (run end LSN, gold version) pair `_runs` holds, per (schema, table) (`_runs_columns`: None when it
    cannot be read here)."""
    got = _runs_columns(runs_path, ["schema_name", "table_name", "run_end_lsn", "gold_version"])
    if got is None:
        return None
    out: dict[tuple[str, str], list[tuple[Lsn, int]]] = {}
    for s, t, end, version in zip(*got.values(), strict=True):
        out.setdefault((s, t), []).append((Lsn(end), version))
    return out


def row_count(path: str) -> int | None:
    """The rows of the Delta table at `path`, from its files' statistics read with delta-rs (no Spark job; with
    deletion vectors, each file's count less its vector's, from the log: `dv_merge.live_row_count`); None when they
    cannot tell (no statistics, a path delta-rs cannot open here)."""

    if not delta_log.readable(path):
        return None
    try:
        table = delta_log.delta_rs_table(path)
        if delta_log.has_deletion_vectors(table):
            from slotlake.merge.dv_merge import live_row_count

            return live_row_count(path)
        files = table.get_add_actions(flatten=True)
        records = files.column("num_records")
        if records.null_count:
            return None
        return sum(records.to_pylist())
    except Exception as e:
        log.info("rows of %s not counted from its statistics (%s); counted with Spark", path, error_summary(e))
        return None


def footer_groups(changes_path: str, files: Sequence[SilverFileStats] | None, table: TableName, mark: Lsn | None,
                   end: Lsn) -> list[LayoutGroup] | None:
    """`_spark_groups`' answer from the layout summaries of the table's silver files, when every file holding the
    table's changes in (mark, end] lies wholly in that window and has one; else None."""
    if files is None:
        return None
    chosen = files_of(files, table, int(mark) if mark is not None else None, int(end))
    if not chosen:
        return None
    return silver_layouts(changes_path, chosen)
