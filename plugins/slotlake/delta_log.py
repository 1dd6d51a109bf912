"""Read the commit records (`commitInfo`) of a Delta table's log without Spark.

The pipeline report and `slotlake status` only need what each commit says about itself: its version, time,
operation metrics and the `userMetadata` slotlake writes with every decode and merge commit
(`{"slotlake": {"end_lsn": "X/Y", "stage": "merge"}}`, see docs/internals.md). Those live in the JSON commit
files `_delta_log/<version>.json`, so a few small file reads answer the question in milliseconds, where a Spark
session would take seconds. Table *data* is never read here (that needs a full log replay: use Spark); the one
table-level fact read here is the table's properties (`table_properties`: the newest `metaData` action).
The log's files are read through slotlake.storage: on a local lake and on an s3a:// lake alike (a few GETs).
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slotlake import contracts, storage
from slotlake.contracts import CommitMeta
from slotlake.lake import LakePaths, name_of_segment
from slotlake.lsn import Lsn
from slotlake.names import TableName

log = logging.getLogger(__name__)
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(\.\d{10}\.\d{10})?\.parquet$")  # classic, single or multi-part


@dataclass(frozen=True)
class DeltaCommit:
    version: int
    timestamp: datetime  # commitInfo.timestamp (UTC)
    operation: str  # WRITE, MERGE, DELETE, TRUNCATE, ...
    metrics: Mapping[str, int] = field(default_factory=dict)  # operationMetrics, as ints
    meta: CommitMeta | None = None  # the "slotlake" object of userMetadata, when present
    engine: str = ""  # commitInfo.engineInfo: who wrote it ("Apache-Spark/... Delta-Lake/...", "delta-rs:...")

    @property
    def slotlake(self) -> Mapping[str, Any] | None:
        return self.meta.fields() if self.meta is not None else None

    @property
    def end_lsn(self) -> str | None:
        return str(self.meta.end_lsn) if self.meta is not None and self.meta.end_lsn is not None else None

    @property
    def stage(self) -> str | None:
        return self.meta.stage if self.meta is not None else None


def delta_rs_table(path: str, version: int | None = None) -> Any:
    """The lake table at `path` opened with delta-rs (`deltalake.DeltaTable`, as of `version`, else its latest), on
    a local lake or an s3a one (`storage.delta_rs_table_args`: the URI and storage options). Every delta-rs read
    of a lake table opens it here."""
    from deltalake import DeltaTable

    uri, options = storage.delta_rs_table_args(path)
    return DeltaTable(uri, version=version, storage_options=options or None)


def create_empty(path: str, columns: contracts.Columns) -> None:
    """An empty Delta table of `columns` at `path` (a local or s3a:// lake), written by delta-rs with protocol
    (1, 2), as Spark's writer creates one; nothing when a table is there already. Without a JVM: Spark's
    `createDataFrame([]).write` of the same table took a Spark merge ~1 s per table it had to create."""
    import pyarrow as pa
    from deltalake import write_deltalake

    uri, options = storage.delta_rs_table_args(path)
    write_deltalake(uri, pa.Table.from_pylist([], schema=contracts.arrow_schema(columns)), mode="ignore",
                    storage_options=options or None)


def local_path(path: str) -> Path:
    """A local lake path as a Path (`storage.local_path`)."""
    return storage.local_path(path)


def has_deletion_vectors(table: Any) -> bool:
    """Whether the delta-rs table `table` (`delta_rs_table`) has the `deletionVectors` reader feature: its files may
    carry deletion vectors, which delta-rs reads (its query engine) but does not write (`merge/dv_merge.py` does)."""
    return "deletionVectors" in (table.protocol().reader_features or [])


def readable(path: str) -> bool:
    """True when this module can read the log at `path`: a local lake or an s3a:// one (through slotlake.storage)."""
    return storage.supported(path)


def _log_dir(table_path: str) -> str:
    return storage.join(table_path, "_delta_log")


def _read_text(path: str) -> str | None:
    """A log file's text; None when it is gone (log cleanup)."""
    try:
        return storage.files_for(path).read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        return None


def _log_names(table_path: str) -> list[str]:
    """The names in the table's `_delta_log` ([] when there is none)."""
    log_dir = _log_dir(table_path)
    return storage.files_for(log_dir).list_names(log_dir)


def is_delta_table(path: str) -> bool:
    return "_delta_log" in storage.files_for(path).list_names(path)


def has_commits(path: str) -> bool:
    """True when the log holds a commit or a checkpoint (a bare `_delta_log` folder is no table yet)."""
    return any(_COMMIT_FILE.match(n) or ".checkpoint" in n for n in _log_names(path))


def _spark_metric(name: str) -> str:
    """A commit metric under Spark's name: delta-rs writes `num_target_rows_inserted` where Spark writes
    `numTargetRowsInserted` (and `num_added_rows` for an append's `numOutputRows`)."""
    if "_" not in name:
        return name
    if name == "num_added_rows":
        return "numOutputRows"
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _parse_commit(version: int, text: str) -> DeltaCommit:
    info: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith('{"commitInfo"'):
            info = json.loads(line)["commitInfo"]
            break
    else:  # commitInfo is usually first, but the protocol does not promise it
        for line in text.splitlines():
            action = json.loads(line) if line.strip() else {}
            if "commitInfo" in action:
                info = action["commitInfo"]
                break
    metrics = {}
    for k, v in (info.get("operationMetrics") or {}).items():
        k = _spark_metric(k)
        try:
            metrics[k] = int(v)
        except (TypeError, ValueError):
            continue  # durations like "executionTimeMs" are ints too; anything else is not a count
    meta = CommitMeta.parse(info.get("userMetadata"))  # None for someone else's free-text metadata
    ts = datetime.fromtimestamp(int(info.get("timestamp", 0)) / 1000, tz=UTC)
    return DeltaCommit(version=version, timestamp=ts, operation=str(info.get("operation", "")), metrics=metrics,
                       meta=meta, engine=str(info.get("engineInfo") or ""))


def commits(table_path: str, *, newest_first: bool = True) -> Iterator[DeltaCommit]:
    """The table's commits that still have a JSON file (log cleanup removes old ones after checkpoints)."""
    log_dir = _log_dir(table_path)
    versions = sorted((int(m.group(1)) for m in map(_COMMIT_FILE.match, _log_names(table_path)) if m),
                      reverse=newest_first)
    for v in versions:
        text = _read_text(storage.join(log_dir, f"{v:020d}.json"))
        if text is None:
            continue  # removed by log cleanup while we listed
        yield _parse_commit(v, text)


def latest_slotlake_commit(table_path: str, stage: str | None = None) -> DeltaCommit | None:
    """The newest commit slotlake made (optionally of one stage), skipping OPTIMIZE/VACUUM and the like."""
    for c in commits(table_path):
        if c.meta is not None and (stage is None or c.stage == stage):
            return c
    return None


def stage_end(table_path: str, stage: str) -> Lsn | None:
    """The end LSN the newest commit of `stage` records (a stage's watermark); None without one."""
    last = latest_slotlake_commit(table_path, stage)
    return Lsn.parse(last.end_lsn) if last is not None and last.end_lsn else None


def gold_tables(source_root: str) -> list[TableName]:
    """Every gold Delta table under `<lake>/<source>/gold/`, sorted; folder names decoded (`LakePaths.gold`).
    Folders slotlake would not have named so are skipped with a warning."""
    gold = LakePaths(source_root).gold_root
    files = storage.files_for(gold)
    out = []
    for schema_dir in files.list_names(gold):
        for table_dir in files.list_names(storage.join(gold, schema_dir)):
            t = storage.join(gold, schema_dir, table_dir)
            if not is_delta_table(t):
                continue
            schema, table = name_of_segment(schema_dir), name_of_segment(table_dir)
            if schema is None or table is None:
                log.warning("%s: not a gold table folder slotlake writes (names are encoded, see slotlake.lake); "
                            "skipped", t)
                continue
            out.append(TableName(schema, table))
    return sorted(out)


def schema_at(table_path: str, version: int) -> dict | None:
    """The table's schema (the parsed `schemaString` of the newest metaData action) as of `version`; None when the
    JSON commits do not say (log cleanup left only a checkpoint for it): ask Spark."""
    log_dir = _log_dir(table_path)
    for v in range(version, -1, -1):
        text = _read_text(storage.join(log_dir, f"{v:020d}.json"))
        if text is None:
            return None
        for line in text.splitlines():
            if line.startswith('{"metaData"'):
                return json.loads(json.loads(line)["metaData"]["schemaString"])
    return None


def _log_files(table_path: str) -> tuple[list[int], dict[int, list[str]]] | None:
    """The versions of the table's JSON commits, and its classic checkpoints' parts by version; None when the log
    holds a kind of checkpoint this module does not read (v2: UUID-named, with sidecars)."""
    log_dir = _log_dir(table_path)
    commits_: list[int] = []
    checkpoints: dict[int, list[str]] = {}
    for name in _log_names(table_path):
        if m := _COMMIT_FILE.match(name):
            commits_.append(int(m.group(1)))
        elif m := _CHECKPOINT_FILE.match(name):
            checkpoints.setdefault(int(m.group(1)), []).append(storage.join(log_dir, name))
        elif ".checkpoint." in name and not name.endswith(".crc"):
            return None
    return commits_, checkpoints


def table_properties(table_path: str) -> dict[str, str] | None:
    """The table's properties (`metaData.configuration` of the newest metaData action); None when the log does not
    say (no table, or a checkpoint kind this reader does not parse: ask Spark).

    Reads the JSON commits after the newest classic checkpoint, newest first, then that checkpoint's `metaData`
    column: at most a checkpoint interval of small files, however long the history.
    """
    log_dir = _log_dir(table_path)
    listed = _log_files(table_path)
    if listed is None:
        return None
    commits_, checkpoints = listed
    if not commits_ and not checkpoints:
        return None
    newest_checkpoint = max(checkpoints, default=-1)
    for v in sorted((v for v in commits_ if v > newest_checkpoint), reverse=True):
        text = _read_text(storage.join(log_dir, f"{v:020d}.json"))
        if text is None:
            return None  # log cleanup while we read: let Spark answer
        for line in text.splitlines():
            if line.startswith('{"metaData"'):
                return dict(json.loads(line)["metaData"].get("configuration") or {})
    if newest_checkpoint < 0:
        return None if 0 not in commits_ else {}
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in checkpoints[newest_checkpoint]:
        data = storage.files_for(part).read_bytes(part)
        for meta in pq.read_table(pa.BufferReader(data), columns=["metaData"]).column("metaData").to_pylist():
            if meta is not None:
                conf = meta.get("configuration") or {}
                return dict(conf) if not isinstance(conf, dict) else conf  # a Parquet map comes as (key, value) pairs
    return None


@dataclass(frozen=True)
class Snapshot:
    """A table's state from its log: the version, its protocol and metaData actions, and its live files (each one's
    `add` action as the log holds it: path, size, partitionValues, stats, deletionVector ...), by path."""
    version: int
    protocol: Mapping[str, Any]
    metadata: Mapping[str, Any]
    files: Mapping[str, Mapping[str, Any]]


def _as_json_action(value: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint row's action as its JSON commit holds it: no null fields, maps as objects."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        if v is None:
            continue
        if isinstance(v, list) and k in ("partitionValues", "tags", "configuration"):
            v = dict(v)
        elif isinstance(v, dict) and k in ("deletionVector", "format"):
            v = {a: b for a, b in v.items() if b is not None}
        out[k] = v
    return out


def snapshot(table_path: str, version: int | None = None) -> Snapshot | None:
    """The table's `Snapshot` as of `version` (None: its latest), replayed from the newest classic checkpoint at or
    before it and the JSON commits after that (per commit its removes, then its adds: a file given a new deletion
    vector is removed and added in one commit). None when this reader cannot say (no table, no such version, a v2
    checkpoint, a commit gone from the log)."""
    log_dir = _log_dir(table_path)
    listed = _log_files(table_path)
    if listed is None or not listed[0]:
        return None
    commits_, checkpoints = listed
    newest = max(commits_) if version is None else version
    if newest not in commits_:
        return None
    base = max((v for v in checkpoints if v <= newest), default=-1)
    protocol: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    files: dict[str, dict[str, Any]] = {}
    if base >= 0:
        parts = checkpoints[base]
        m = _CHECKPOINT_FILE.match(parts[0].rsplit("/", 1)[-1])
        if m and m.group(2) and len(parts) != int(m.group(2)[12:]):
            return None  # a multi-part checkpoint with parts missing
        import pyarrow as pa
        import pyarrow.parquet as pq

        for part in parts:
            data = pq.read_table(pa.BufferReader(storage.files_for(part).read_bytes(part)))
            cols = set(data.column_names)
            for kind in ("protocol", "metaData", "add"):
                if kind not in cols:
                    continue
                for value in data.column(kind).to_pylist():
                    if value is None:
                        continue
                    value = _as_json_action(value)
                    if kind == "protocol":
                        protocol = value
                    elif kind == "metaData":
                        metadata = value
                    else:
                        files[value["path"]] = value
    for v in range(base + 1, newest + 1):
        text = _read_text(storage.join(log_dir, f"{v:020d}.json"))
        if text is None:
            return None  # cleaned up: only a checkpoint says what came before
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        for a in actions:
            if "remove" in a:
                files.pop(a["remove"]["path"], None)
            elif "protocol" in a:
                protocol = a["protocol"]
            elif "metaData" in a:
                metadata = a["metaData"]
        for a in actions:
            if "add" in a:
                files[a["add"]["path"]] = a["add"]
    return Snapshot(newest, protocol, metadata, files)
