"""Benchmark: what a merge run's fixed cost does as the lake ages (one more silver file per table and one more
`_runs` file per run), the merge's current queries next to the forms they replaced, measured in the same run.

    .venv/bin/python bench/aged_lake.py                 # 2,000 runs of 4 tables (~83 days of hourly syncs)
    .venv/bin/python bench/aged_lake.py --runs 8760     # a year of hourly syncs (slower to build)

Builds, in a temp dir and one local[2] SparkSession, a silver-shaped table (`commit_lsn`, `schema_name`,
`table_name`, a value; one Parquet file per run and table, as the decode writes them: `--runs` x `--tables` files)
and a `_runs` table (`contracts.RUNS`, one file per run), then times, best and every one of `--repeat` rounds:
  table names, all of silver     the query a run over every table of a source without a table list used to find
                                 its tables: every silver row up to the run end (the baseline)
  table names, since last run    `merge.job._table_names` without silver's statistics: `_runs`'s tables of the
                                 last complete run plus the tables with changes since (Delta skips the older files
                                 by their statistics)
  table names, silver's file statistics   `merge.job._table_names` now: the same, the tables with changes since
                                 read off silver's file statistics with delta-rs (`silver_file_stats`, timed too)
  _runs MERGE, join only         the `_runs` MERGE condition before: (run end, schema, table) (the baseline)
  _runs MERGE, pruned            `merge.job.record_runs` until 2026-11-27: the same plus the literal
                                 `run_end_lsn = <end>`
  _runs write now                `merge.job.record_runs` now: the run's rows `_runs` lacks (read with delta-rs),
                                 appended
  replay's _runs reads, per table   a replay's reads of `_runs` before: its table names, then each table's
                                 recorded ends (1 + tables reads; the baseline)
  replay's _runs reads, once     `recover.replay_job.recorded_runs` now: every table's recorded ends in one read
Both table-name forms are checked to give the same tables.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))

from slotlake.config import parse_config  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402


def timed(rounds: int, fn: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000, help="earlier merge runs in the lake (default 2,000)")
    ap.add_argument("--tables", type=int, default=4, help="tables with changes in every run (default 4)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of each query (default 3)")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from slotlake.merge.job import _table_names, record_runs
    from slotlake.merge.watermarks import silver_file_stats
    from slotlake.recover.replay_job import recorded_runs
    from slotlake.spark.session import get_spark

    spark = get_spark("slotlake-bench-aged-lake", "local[2]", {})
    load_start = os.getloadavg()
    runs_n, tables = args.runs, args.tables
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-aged-") as tmp:
        silver_path, runs_path = f"{tmp}/silver", f"{tmp}/runs"
        t = time.perf_counter()
        # Run r's changes have commit_lsn 1000 r .. 1000 r + 49: 50 rows per table and run, a file per table and run.
        rows = spark.range(runs_n * tables * 50).select(
            ((F.col("id") / (tables * 50)).cast("long") * 1000 + F.col("id") % 50).alias("commit_lsn"),
            ((F.col("id") / (tables * 50)).cast("long") * 1000 + F.col("id") % 50 + 8).alias("commit_end_lsn"),
            F.lit("public").alias("schema_name"),
            F.concat(F.lit("t"), ((F.col("id") / 50).cast("long") % tables).cast("string")).alias("table_name"),
            F.col("id").alias("value"))
        (rows.repartitionByRange(runs_n * tables, "commit_lsn", "table_name")
         .write.format("delta").save(silver_path))
        runs = spark.range(runs_n * tables).select(
            ((F.col("id") / tables).cast("long") * 1000 + 999).alias("run_end_lsn"),
            F.lit("public").alias("schema_name"),
            F.concat(F.lit("t"), (F.col("id") % tables).cast("string")).alias("table_name"),
            F.lit(1).cast("long").alias("gold_version"), F.current_timestamp().alias("finished_at"),
            F.current_timestamp().alias("started_at"), F.lit(50).cast("long").alias("changes"),
            F.current_timestamp().alias("last_commit_ts"))
        runs.repartitionByRange(runs_n, "run_end_lsn").write.format("delta").save(runs_path)
        build_s = time.perf_counter() - t
        silver = spark.read.format("delta").load(silver_path)
        files = (len(silver.inputFiles()), len(spark.read.format("delta").load(runs_path).inputFiles()))
        src = parse_config({"lake": tmp, "sources": {"s": {"dsn": "postgresql://u@127.0.0.1:1/db"}}}).source("s")
        since = Lsn((runs_n - 1) * 1000 + 999)  # the last complete run's end
        end = Lsn(runs_n * 1000 + 999)  # this run's end: one more run's changes (none written: same tables)

        def names_all() -> list:
            return _table_names(spark, silver, src, end, None, runs_path=runs_path, since=None)

        def names_since() -> list:
            return _table_names(spark, silver, src, end, None, runs_path=runs_path, since=since)

        def names_stats() -> list:
            stats = silver_file_stats(silver_path)
            if stats is None:
                raise SystemExit(f"delta-rs could not read the statistics of {silver_path}")
            return _table_names(spark, silver, src, end, None, runs_path=runs_path, since=since, files=stats)

        if not names_all() == names_since() == names_stats():
            raise SystemExit(f"the forms disagree: {names_all()}, {names_since()}, {names_stats()}")
        next_end = [int(end)]

        def run_rows():
            next_end[0] += 1000
            return runs.limit(tables).withColumn("run_end_lsn", F.lit(next_end[0]).cast("long")), next_end[0]

        def merge_join_only() -> None:
            df, e = run_rows()
            (DeltaTable.forPath(spark, runs_path).alias("t")
             .merge(df.alias("s"), "t.run_end_lsn = s.run_end_lsn AND t.schema_name = s.schema_name "
                                   "AND t.table_name = s.table_name")
             .whenNotMatchedInsertAll().execute())

        def merge_pruned() -> None:
            df, e = run_rows()
            (DeltaTable.forPath(spark, runs_path).alias("t")
             .merge(df.alias("s"), f"t.run_end_lsn = {e} AND t.run_end_lsn = s.run_end_lsn "
                                   "AND t.schema_name = s.schema_name AND t.table_name = s.table_name")
             .whenNotMatchedInsertAll().execute())

        def record_now() -> None:
            next_end[0] += 1000
            now = datetime.now(UTC)
            rows = [(next_end[0], "public", f"t{i}", 1, now, now, 50, now) for i in range(tables)]
            record_runs(spark, runs_path, rows, Lsn(next_end[0]), complete=True)

        def replay_reads_per_table() -> None:
            df = spark.read.format("delta").load(runs_path)
            names = df.select("schema_name", "table_name").distinct().collect()
            for r in names:
                df.where((F.col("schema_name") == r[0]) & (F.col("table_name") == r[1])) \
                    .select("run_end_lsn", "gold_version").collect()

        def replay_reads_once() -> None:
            recorded_runs(spark, runs_path)

        results = {}
        for _ in range(2):  # alternated twice: the first of each pair warms the JVM for the second
            results.setdefault("table names, all of silver (baseline)", []).extend(timed(args.repeat, names_all))
            results.setdefault("table names, since last run", []).extend(timed(args.repeat, names_since))
            results.setdefault("table names, silver's file statistics", []).extend(timed(args.repeat, names_stats))
            results.setdefault("_runs MERGE, join only (baseline)", []).extend(timed(args.repeat, merge_join_only))
            results.setdefault("_runs MERGE, pruned", []).extend(timed(args.repeat, merge_pruned))
            results.setdefault("_runs write now (read with delta-rs, append)", []).extend(
                timed(args.repeat, record_now))
            results.setdefault("replay's _runs reads, per table (baseline)", []).extend(
                timed(args.repeat, replay_reads_per_table))
            results.setdefault("replay's _runs reads, once", []).extend(timed(args.repeat, replay_reads_once))
        print(f"\n{runs_n:,} earlier runs of {tables} tables: silver {files[0]:,} files, _runs {files[1]:,} files "
              f"(built in {build_s:.1f}s)")
        print(f"{'query':<44} {'median s':>9}   every round")
        for name, xs in results.items():
            print(f"{name:<44} {statistics.median(xs):>9.2f}   " + ", ".join(f"{x:.2f}" for x in xs))
        load_end = os.getloadavg()
        print("load average (1/5/15 min): start " + "/".join(f"{x:.1f}" for x in load_start)
              + ", end " + "/".join(f"{x:.1f}" for x in load_end) + f" on {os.cpu_count()} CPUs", flush=True)


if __name__ == "__main__":
    main()
