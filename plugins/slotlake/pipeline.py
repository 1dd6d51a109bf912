"""One sync of one source: preflight -> extract -> decode -> merge -> report.

`sync()` runs the five steps in this process (the CLI). The Airflow DAG runs the same functions, one per task:
`task_preflight`, `task_extract`, `task_in_process` and `task_report` as Python tasks, decode and merge as
SparkSubmitOperators fed with the same `spark_app()` description that `task_decode`/`task_merge` run here (`sync()`
runs both job functions in one Spark application, `spark_apps/sync.py`, to start one JVM instead of two). Every
task returns a small JSON-able dict (it becomes the task's XCom), never data.

After the extract, `slotlake.pending` decides from the lake's watermarks (no Spark) whether the decode and merge
have anything to do; when nothing is due the Spark app is not started (the DAG skips its decode and merge tasks)
and the report says why. What is due is decoded and merged without a JVM where that is exact (`_slices_here`:
the CLI's `sync()` and the DAG's `in_process` task); Spark does the rest.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slotlake import delta_log, storage
from slotlake.config import Config
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.pending import PendingWork, pending_after_extract, read_watermarks
from slotlake.spark.submit import run_spark_app, spark_app

log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """A dataclass/Lsn/datetime tree as JSON-able values (XCom and the report stay small plain dicts)."""
    if isinstance(value, Lsn):  # before the dataclass case: Lsn is one too
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


@dataclass(frozen=True)
class TableMerge:
    """What the merge did to one gold table in this run (from its Delta commits' metrics)."""

    table: str  # schema.table
    applied_lsn: str | None  # end LSN recorded with the table's last slotlake commit
    gold_version: int | None
    inserted: int
    updated: int
    deleted: int


@dataclass(frozen=True)
class SyncReport:
    source: str
    archived_files: int
    archived_changes: int  # pgoutput messages written to bronze by this run's extract
    archived_bytes: int
    decoded_changes: int | None  # rows appended to silver/changes by this run's decode (None: lake unreadable here)
    merged: tuple[TableMerge, ...]
    quarantined: int | None  # values this run put in _quarantine instead of gold (None: lake unreadable here)
    end_lsn: str | None  # the slot's confirmed position after extract
    slot_lag_bytes: int | None  # WAL the slot still holds back after the run
    wal_status: str | None
    seconds: float
    slot: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # slot_status() after the run, as a dict
    spark: str | None = None  # what the Spark stage did or why it was skipped (PendingWork.describe())
    spark_skipped: bool = False  # nothing was due: no Spark app was started
    # `slotlake sync`: seconds of its steps (preflight, extract, spark: the app's time after the extract, whose
    # JVM start may have overlapped the extract); empty for the DAG's report task
    step_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return plain(self)

    def summary(self) -> str:
        merged = sum(t.inserted + t.updated + t.deleted for t in self.merged)
        lag = "?" if self.slot_lag_bytes is None else f"{self.slot_lag_bytes}"
        decoded = "?" if self.decoded_changes is None else self.decoded_changes
        quarantined = "?" if self.quarantined is None else self.quarantined
        return (f"sync {self.source}: archived {self.archived_changes} messages in {self.archived_files} files "
                f"({self.archived_bytes / 1e6:.1f} MB), decoded {decoded} changes, "
                f"merged {merged} rows into {len(self.merged)} tables, quarantined {quarantined} values, "
                f"end LSN {self.end_lsn}, slot lag {lag} bytes ({self.wal_status}), {self.seconds:.1f}s"
                + (f"; {self.spark}" if self.spark_skipped else "")
                + (" (" + ", ".join(f"{k} {v:.1f}s" for k, v in self.step_seconds.items()) + ")"
                   if self.step_seconds else ""))


def lake_versions(cfg: Config, source_name: str) -> dict[str, Any]:
    """Latest Delta version of every table the run writes, so the report can tell this run's commits apart."""
    paths = LakePaths.of(cfg.lake, source_name)
    if not delta_log.readable(paths.root):
        return {}

    def latest(path: str) -> int:
        return next((c.version for c in delta_log.commits(path)), -1)

    return {
        "changes": latest(paths.changes),
        "quarantine": latest(paths.quarantine),
        "gold": {str(t): latest(paths.gold(*t)) for t in delta_log.gold_tables(paths.root)},
    }


def task_preflight(cfg: Config, source_name: str) -> dict[str, Any]:
    """Check the source is ready (creates the publication/slot when missing); fails fast with the fix to apply."""
    from slotlake.source.lock import source_lock
    from slotlake.source.preflight import run_preflight

    if cfg.storage is not None:
        storage.credentials()  # an s3a lake without AWS_* credentials: one line, before touching the database
    with source_lock(cfg.source(source_name), "preflight"):
        report = run_preflight(cfg, cfg.source(source_name))
    return plain(report)


def task_extract(cfg: Config, source_name: str, on_first_file=None) -> dict[str, Any]:
    """Archive the slot's changes into bronze and advance the slot. Returns what the report needs.
    `on_first_file()`: run once the first file is archived (the CLI's sync starts its Spark app then)."""
    from slotlake.source.extract import extract
    from slotlake.source.lock import source_lock

    with source_lock(cfg.source(source_name), "extract"):
        before = lake_versions(cfg, source_name)
        started = time.time()
        result = extract(cfg, cfg.source(source_name), on_first_file=on_first_file)
    out = plain(result)
    out["files"] = len(result.files)  # the names can be many; XCom keeps small values
    out["lake_versions"] = before
    out["started_at"] = started
    out["pending"] = pending_after_extract(cfg, source_name).as_dict()  # read by the DAG's Spark tasks and the report
    return out


def pending_of(extracted: Mapping[str, Any]) -> PendingWork:
    """The extract's decision on what the Spark stage must do (everything, for an XCom without one)."""
    doc = extracted.get("pending")
    return PendingWork.from_dict(doc) if doc else PendingWork("the extract did not decide", None)


def task_decode(cfg: Config, source_name: str) -> None:
    run_spark_app(spark_app(cfg, source_name, "decode"))


def task_merge(cfg: Config, source_name: str, tables: Sequence[str] | None = None) -> None:
    run_spark_app(spark_app(cfg, source_name, "merge", tables=tables))


def _count(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return len(value)
    return int(value or 0)


def _table_merge(path: str, table: str, since: int) -> TableMerge:
    inserted = updated = deleted = 0
    for c in delta_log.commits(path):
        if c.version <= since:
            break
        m = c.metrics
        if c.operation == "MERGE":
            inserted += m.get("numTargetRowsInserted", 0)
            updated += m.get("numTargetRowsUpdated", 0)
            deleted += m.get("numTargetRowsDeleted", 0)
        elif c.operation in ("DELETE", "TRUNCATE"):
            deleted += m.get("numDeletedRows", 0)
        else:  # WRITE / CREATE TABLE AS SELECT / REPLACE: rows written
            inserted += m.get("numOutputRows", 0)
    last = delta_log.latest_slotlake_commit(path)  # a merge, or the load of the initial copy
    return TableMerge(table=table, applied_lsn=last.end_lsn if last else None,
                      gold_version=last.version if last else None,
                      inserted=inserted, updated=updated, deleted=deleted)


def merged_tables(cfg: Config, source_name: str, extracted: Mapping[str, Any]) -> tuple[TableMerge, ...]:
    """The gold tables this run changed and what it did to each: every table with rows counted or a slotlake commit
    after the Delta version the run's extract recorded (its XCom's `lake_versions`), counted from those commits'
    metrics. Serves the report and the sync DAG's asset events (`slotlake.airflow.assets`). Empty when the lake
    cannot be read without Spark (`delta_log.readable`)."""
    paths = LakePaths.of(cfg.lake, source_name)
    if not delta_log.readable(paths.root):
        return ()
    since_gold: Mapping[str, int] = (extracted.get("lake_versions") or {}).get("gold") or {}
    merged = []
    for schema, table in delta_log.gold_tables(paths.root):
        name = str(TableName(schema, table))
        t = _table_merge(paths.gold(schema, table), name, since_gold.get(name, -1))
        if t.inserted or t.updated or t.deleted or since_gold.get(name, -1) < (t.gold_version or -1):
            merged.append(t)
    return tuple(merged)


def gold_event_extra(source_name: str, merged: TableMerge) -> dict[str, Any]:
    """What a run tells consumers about one gold table it changed (the `extra` of its Airflow asset event):
    source, table (`schema.table`, canonical form), applied_lsn (the table's watermark), gold_version and the rows
    inserted, updated and deleted. JSON values only."""
    return {"source": source_name, **plain(merged)}


def build_report(cfg: Config, source_name: str, extracted: Mapping[str, Any],
                 step_seconds: Mapping[str, float] | None = None) -> SyncReport:
    """Summarise the run from the lake's Delta logs and the slot's state, and log the one summary line."""
    from slotlake.source.status import slot_status

    paths = LakePaths.of(cfg.lake, source_name)
    before = extracted.get("lake_versions") or {}
    decoded: int | None = None
    quarantined: int | None = None
    if delta_log.readable(paths.root):
        decoded = sum(c.metrics.get("numOutputRows", 0) for c in delta_log.commits(paths.changes)
                      if c.version > before.get("changes", -1))
        quarantined = sum(c.metrics.get("numOutputRows", 0) for c in delta_log.commits(paths.quarantine)
                          if c.version > before.get("quarantine", -1))
    else:  # a scheme slotlake.storage cannot read: the Spark apps' own logs carry these counts
        log.info("lake %s cannot be read without Spark: the report leaves out the per-table counts", paths.root)
    merged = merged_tables(cfg, source_name, extracted)
    status = plain(slot_status(cfg.source(source_name)))
    started = float(extracted.get("started_at") or time.time())
    pending = pending_of(extracted)
    report = SyncReport(
        source=source_name,
        archived_files=_count(extracted.get("files")),
        archived_changes=_count(extracted.get("rows")),
        archived_bytes=_count(extracted.get("bytes")),
        decoded_changes=decoded,
        merged=merged,
        quarantined=quarantined,
        end_lsn=extracted.get("end_lsn"),
        slot_lag_bytes=status.get("lag_bytes"),
        wal_status=status.get("wal_status"),
        seconds=round(time.time() - started, 1),
        slot=status,
        spark=pending.describe(),
        spark_skipped=pending.idle,
        step_seconds={k: round(v, 2) for k, v in (step_seconds or {}).items()},
    )
    log.info("%s", report.summary())
    return report


def task_report(cfg: Config, source_name: str, extracted: Mapping[str, Any],
                step_seconds: Mapping[str, float] | None = None) -> dict[str, Any]:
    out = build_report(cfg, source_name, extracted, step_seconds).as_dict()
    out["finished_at"] = datetime.now(UTC).isoformat()
    return out


def task_decode_and_merge(cfg: Config, source_name: str) -> None:
    """Decode then merge in one Spark application (`spark_apps/sync.py`): the same two job functions as the DAG's
    decode and merge tasks, one JVM start instead of two."""
    run_spark_app(spark_app(cfg, source_name, "sync"))


def _in_process_first(cfg: Config, source_name: str) -> bool:
    """Whether this process may decode and merge the first slice of the backlog itself: the first bronze file past
    silver's watermark of at most `spark.in_process_bytes` (False when that cannot be told here)."""
    from slotlake.decode.job import first_slice_fits

    paths = LakePaths.of(cfg.lake, source_name)
    limit = cfg.spark.in_process_bytes
    return bool(limit) and first_slice_fits(paths, limit)


def _slices_here(cfg: Config, source_name: str) -> tuple[dict[str, float], int, int]:
    """Decode and merge the backlog in this process, without a JVM, one slice of at most `spark.in_process_bytes`
    of bronze at a time (`decode_in_process`, then `merge_in_process`: a silver commit and one commit per gold table
    a slice, so memory is bounded by the slice, not the backlog), up to the first slice this process declines (a
    catalog change, a batch only Spark merges exactly; logged why). Returns the seconds of `decode` and `merge`
    (summed over the slices) and the number of slices decoded and merged. Nothing done (0 slices) when the first
    slice's decode is not one this process can do."""
    from slotlake.decode.job import decode_in_process

    steps: dict[str, float] = {}
    slices = merged_slices = 0
    while cfg.spark.in_process_bytes:
        t = time.monotonic()
        decoded = decode_in_process(cfg, source_name, cfg.spark.in_process_bytes)
        if decoded is None:
            break  # nothing left to decode, or a slice the Spark decode must do
        steps["decode"] = steps.get("decode", 0.0) + time.monotonic() - t
        slices += 1
        merged = _merge_in_process(cfg, source_name)
        if merged is None:
            break  # an initial copy to load, or a batch Spark merges (logged why)
        steps["merge"] = steps.get("merge", 0.0) + merged["merge"]
        merged_slices += 1
    return steps, slices, merged_slices


def _sync_in_process(cfg: Config, source_name: str) -> dict[str, float] | None:
    """The CLI sync's decode and merge of the backlog: in this process (`_slices_here`), then from the first slice
    this process declines on, one Spark app does the rest from the watermarks. Returns the seconds of `decode` and
    `merge`, and of `spark` (the sync app: decode and merge) or `merge (Spark)` (the merge app) when one ran; None,
    nothing done, when the first slice's decode is not one this process can do (the caller runs the Spark app for
    everything)."""
    steps, slices, merged_slices = _slices_here(cfg, source_name)
    if not slices:
        return None
    t = time.monotonic()
    due = pending_after_extract(cfg, source_name)
    if due.decode is not None:
        task_decode_and_merge(cfg, source_name)
        steps["spark"] = time.monotonic() - t
    elif due.merge is not None:
        task_merge(cfg, source_name)
        steps["merge (Spark)"] = time.monotonic() - t
    log.info("sync %s: %d slice(s) decoded and %d merged in this process%s", source_name, slices, merged_slices,
             "" if due.idle else f"; the rest by Spark ({due.describe()})")
    return steps


def task_in_process(cfg: Config, source_name: str, extracted: Mapping[str, Any]) -> dict[str, Any]:
    """The sync DAG's `in_process` task: what the extract left due, decoded and merged in this process where it can
    be (`_slices_here`; a merge alone: `merge_in_process`), under the source's run lock. Returns {"pending": what
    the Spark decode and merge must still do (`PendingWork.as_dict`), "steps": seconds of this task's decode and
    merge}; the DAG runs its Spark tasks only for that `pending`."""
    from slotlake.source.lock import source_lock

    pending = pending_of(extracted)
    steps: dict[str, float] = {}
    if not pending.idle:
        with source_lock(cfg.source(source_name), "in_process"):
            if pending.decode is not None:
                steps, slices, merged_slices = _slices_here(cfg, source_name)
                done = f"{slices} slice(s) decoded and {merged_slices} merged"
            else:
                steps = _merge_in_process(cfg, source_name) or {}
                done = "the merge done" if steps else "the merge declined"
            if steps:
                pending = pending_after_extract(cfg, source_name)
        log.info("sync %s in this process: %s; %s", source_name, done,
                 "nothing left for Spark" if pending.idle else f"for Spark: {pending.describe()}")
    return {"pending": pending.as_dict(), "steps": {k: round(v, 2) for k, v in steps.items()}}


def _merge_in_process(cfg: Config, source_name: str) -> dict[str, float] | None:
    """The merge in this process: the initial copies not in gold yet loaded (`load_copies_in_process`), then
    silver's changes merged (`merge_in_process`; none yet: nothing to merge). {"merge": seconds}, or None when
    either declined (what was loaded stays; Spark's merge does the rest)."""
    from slotlake.merge.in_process import merge_in_process
    from slotlake.merge.snapshot_in_process import load_copies_in_process

    if not cfg.spark.in_process_bytes:
        return None
    t = time.monotonic()
    marks = read_watermarks(cfg, source_name)
    if marks is None or (marks.unloaded_copies and load_copies_in_process(cfg, source_name) is None):
        return None
    if marks.silver_end is not None and merge_in_process(cfg, source_name) is None:
        return None
    return {"merge": time.monotonic() - t}


def sync(cfg: Config, source_name: str) -> SyncReport:
    """Bring one source's lake up to date: the same steps, in the same order, as the sync DAG (its decode and
    merge tasks run here as one Spark application, only when something is due). Holds the source's run lock
    throughout (the Spark app runs under it), so another run of the source waits or stops with the holder named
    (`slotlake.source.lock`)."""
    from slotlake.source.lock import source_lock
    from slotlake.spark.early import EarlySyncApp

    steps: dict[str, float] = {}
    with source_lock(cfg.source(source_name), "sync"):
        t = time.monotonic()
        task_preflight(cfg, source_name)
        steps["preflight"] = time.monotonic() - t
        # With spark-submit, the app's JVM starts once the extract has archived a file, and waits for it
        # (slotlake.spark.early); a Spark server is warm already.
        with EarlySyncApp(lambda: spark_app(cfg, source_name, "sync")) as early:
            def first_file() -> None:
                # A batch this process may decode and merge itself needs no JVM (unless it turns out otherwise).
                if not _in_process_first(cfg, source_name):
                    early.start()

            t = time.monotonic()
            extracted = task_extract(cfg, source_name, on_first_file=None if cfg.spark.server else first_file)
            steps["extract"] = time.monotonic() - t
            pending = pending_of(extracted)
            log.info("sync %s: %s", source_name, pending.describe())
            t = time.monotonic()
            in_process = _sync_in_process(cfg, source_name) \
                if pending.decode is not None and early.started is None else None
            if in_process is not None:
                steps.update(in_process)  # no Spark app for the decode: the stages' own times
            elif pending.decode is not None:
                if not early.run():
                    task_decode_and_merge(cfg, source_name)
            elif pending.merge is not None:
                early.close()
                merged = _merge_in_process(cfg, source_name)
                if merged is not None:
                    steps.update(merged)
                    in_process = merged
                else:
                    task_merge(cfg, source_name)
            if not pending.idle and in_process is None:
                steps["spark"] = time.monotonic() - t
    return build_report(cfg, source_name, extracted, steps)


def optimize(cfg: Config, source_name: str, tables: Sequence[str] | None = None) -> list:
    """`slotlake optimize`: each gold table of the source (or of `tables`, schema.table) compacted without Spark
    (`merge.optimize.optimize_table`), under the source's run lock (no sync merges meanwhile). Returns the
    `TableOptimize` of each, in table order; a named table without a gold table is a ConfigError."""
    from slotlake.errors import ConfigError
    from slotlake.merge.optimize import optimize_table
    from slotlake.source.lock import source_lock

    paths = LakePaths.of(cfg.lake, source_name)
    if not delta_log.readable(paths.root):
        raise ConfigError(f"optimize {source_name}: lake {cfg.lake} is not read without Spark here; run Spark SQL's "
                          "OPTIMIZE on its gold tables")
    present = delta_log.gold_tables(paths.root)
    names = sorted({TableName.parse(t) for t in tables}) if tables else present
    missing = [str(n) for n in names if n not in present]
    if missing:
        raise ConfigError(f"optimize {source_name}: no gold table {', '.join(missing)} under {paths.root}; name "
                          "tables as `slotlake status` lists them")
    with source_lock(cfg.source(source_name), "optimize"):
        out = []
        for n in names:
            done = optimize_table(paths.gold(n.schema, n.name), n)
            log.info("optimize %s: %s", source_name, done.line())
            out.append(done)
    return out
