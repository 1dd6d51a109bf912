"""A source's state as `slotlake status` and the Airflow UI's slotlake view show it: the slot, each gold table's
applied LSN and Delta version, and the last merge runs (`_runs`).

Read-only: nothing here creates a slot, a table or a Spark session, except `runs_status` (the answer for lakes
whose Delta logs this process cannot read without Spark). `gold_table_status` and `run_rows` need no JVM, so the
Airflow API server can call them per page view. Values are plain JSON-able dicts (the CLI prints them as JSON).
The heavier imports (pyarrow, delta-rs, Spark, psycopg) wait for the call, so the `slotlake` command starts fast.
"""
from __future__ import annotations

from typing import Any

from slotlake import delta_log
from slotlake.config import Config
from slotlake.errors import SlotlakeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.names import TableName


def slot_state(cfg: Config, source_name: str) -> dict[str, Any]:
    """The slot's state (`slotlake.source.status.SlotStatus` as plain values); connects to the source."""
    from slotlake.pipeline import plain
    from slotlake.source.status import slot_status

    return plain(slot_status(cfg.source(source_name)))


def gold_table_status(cfg: Config, source_name: str, *, spark: bool = True) -> list[dict[str, Any]]:
    """Per gold table: the LSN it has applied up to, by which stage, its Delta version and when that committed.

    Read from the gold tables' Delta logs (no JVM). A lake whose logs this process cannot read (a scheme other than
    local and s3a) is answered from `_runs` through Spark, or (`spark=False`) refused with a SlotlakeError."""
    from slotlake import delta_log

    cfg.source(source_name)  # an unknown source is a ConfigError naming the configured ones
    paths = LakePaths.of(cfg.lake, source_name)
    if not delta_log.readable(paths.root):
        if not spark:
            raise SlotlakeError(f"lake {paths.root}: its Delta logs cannot be read without Spark here "
                                f"(supported: local paths, s3a://); run `slotlake status {source_name}`")
        return runs_status(cfg, paths.runs)
    tables = []
    for schema, table in delta_log.gold_tables(paths.root):
        # The newest watermarked commit: a merge, or the initial copy's load (applied up to its consistent point).
        last = delta_log.latest_slotlake_commit(paths.gold(schema, table))
        tables.append({"table": str(TableName(schema, table)), "applied_lsn": last.end_lsn if last else None,
                       "applied_by": last.stage if last else None,
                       "gold_version": last.version if last else None,
                       "committed_at": last.timestamp.isoformat() if last else None})
    return tables


def source_status(cfg: Config, source_name: str) -> dict[str, Any]:
    """The slot's state and, per gold table, the LSN it has applied up to and when that merge committed."""
    slot = slot_state(cfg, source_name)
    return {"source": source_name, "slot": slot, "lake": LakePaths.of(cfg.lake, source_name).root,
            "tables": gold_table_status(cfg, source_name)}


def runs_status(cfg: Config, runs_path: str) -> list[dict[str, Any]]:
    """Per gold table, its latest `_runs` row, read with a local Spark session (for lakes on object stores)."""
    from pyspark.sql import SparkSession

    from slotlake.spark.session import get_spark

    ours = SparkSession.getActiveSession() is None  # inside a caller's session (tests), leave it running
    spark = get_spark("slotlake-status", "local[1]", cfg.spark.conf, storage=cfg.storage)
    try:
        from pyspark.sql import functions as F
        from pyspark.sql.utils import AnalysisException

        try:
            runs = spark.read.format("delta").load(runs_path)
        except AnalysisException:
            return []  # no run has finished yet
        latest = (runs.groupBy("schema_name", "table_name")
                  .agg(F.max(F.struct("run_end_lsn", "gold_version", "finished_at")).alias("r"))
                  .select("schema_name", "table_name", "r.*").orderBy("schema_name", "table_name").collect())
    finally:
        if ours:
            spark.stop()
    return [{"table": str(TableName(r.schema_name, r.table_name)), "applied_lsn": str(Lsn(r.run_end_lsn)),
             "gold_version": r.gold_version, "committed_at": r.finished_at.isoformat()} for r in latest]


def run_rows(cfg: Config, source_name: str, last_runs: int = 20) -> list[dict[str, Any]]:
    """The `_runs` rows of the newest `last_runs` merge runs (every table of each), read with delta-rs (no JVM).

    Each row has every column of contracts.RUNS (None where an older `_runs` table has no such column yet) with
    `run_end_lsn` as an Lsn's text and timestamps as aware UTC datetimes. [] when no run has finished yet."""
    import pyarrow.dataset as ds
    from deltalake.exceptions import TableNotFoundError

    from slotlake.contracts import RUNS, names

    cfg.source(source_name)
    path = LakePaths.of(cfg.lake, source_name).runs
    try:
        dataset = delta_log.delta_rs_table(path).to_pyarrow_dataset()
    except TableNotFoundError:
        return []
    ends = sorted(set(dataset.to_table(columns=["run_end_lsn"]).column("run_end_lsn").to_pylist()))[-last_runs:]
    if not ends:
        return []
    present = [c for c in names(RUNS) if c in dataset.schema.names]
    rows = dataset.to_table(columns=present, filter=ds.field("run_end_lsn") >= ends[0]).to_pylist()
    out = []
    for r in rows:
        row = {c: r.get(c) for c in names(RUNS)}
        row["run_end_lsn"] = str(Lsn(r["run_end_lsn"]))
        out.append(row)
    return sorted(out, key=lambda r: (Lsn.parse(r["run_end_lsn"]), r["schema_name"], r["table_name"]))
