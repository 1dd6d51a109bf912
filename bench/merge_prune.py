"""Benchmark: a copy-on-write MERGE of 1,000 keys into a big Delta table, with and without the batch's keys in its
condition (what `merge/job.py:_key_filter` adds for a small batch into a big gold table).

    .venv/bin/python bench/merge_prune.py                      # 10 M rows in files of 100,000, sorted by key
    .venv/bin/python bench/merge_prune.py --rows 2000000 --keys random

Builds a table like a gold table that grew by syncs (rows in key order, files of `--file-rows`), then per key set
(`recent`: the newest 1,000 keys, `new`: 1,000 keys past the newest, `random`: 1,000 keys drawn from all) runs the
same MERGE (update if matched, insert if not) on a fresh copy of the table, `--rounds` times: with the key equality
alone (the baseline), with `key IN (the keys)` added and with `key BETWEEN least AND greatest` added. Prints each
MERGE's seconds, files removed and rows copied (Delta's commit metrics). In process, local[2], no JVM start counted.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))

from slotlake.spark.session import get_spark  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the table (default 10,000,000)")
    ap.add_argument("--file-rows", type=int, default=100_000, help="rows per file (default 100,000)")
    ap.add_argument("--keys", choices=("recent", "new", "random", "all"), default="all")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every MERGE (the first is colder)")
    args = ap.parse_args()
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    spark = get_spark("slotlake-bench-merge-prune", "local[2]", {"spark.sql.shuffle.partitions": "2"})
    n = args.rows
    rng = random.Random(1)
    key_sets = {"recent": list(range(n - 999, n + 1)), "new": list(range(n + 1, n + 1001)),
                "random": rng.sample(range(1, n + 1), 1000)}
    chosen = list(key_sets) if args.keys == "all" else [args.keys]
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-prune-") as tmp:
        base = f"{tmp}/base"
        rows = spark.range(1, n + 1).select(F.col("id").cast("int").alias("aid"),
                                            (F.col("id") % 100).cast("int").alias("bid"),
                                            F.lit(0).alias("abalance"), F.lit(" " * 84).alias("filler"))
        (rows.repartition(1).sortWithinPartitions("aid")
         .write.format("delta").option("maxRecordsPerFile", args.file_rows).save(base))
        files = len(DeltaTable.forPath(spark, base).toDF().inputFiles())
        print(f"table: {n:,} rows in {files} files of up to {args.file_rows:,} rows, sorted by key")
        print(f"{'round':>5} {'keys':<7} {'filter':<8} {'s':>7} {'files removed':>14} {'rows copied':>12}")
        for rnd in range(1, args.rounds + 1):
            for name in chosen:
                keys = key_sets[name]
                src = spark.createDataFrame([(k, 1) for k in keys], "k int, v int")
                for label, extra in (("none", ""), ("IN", " AND t.aid IN (" + ",".join(map(str, sorted(keys))) + ")"),
                                     ("BETWEEN", f" AND t.aid BETWEEN {min(keys)} AND {max(keys)}")):
                    path = f"{tmp}/merged"
                    shutil.rmtree(path, ignore_errors=True)
                    shutil.copytree(base, path)
                    t = time.perf_counter()
                    (DeltaTable.forPath(spark, path).alias("t").merge(src.alias("s"), "t.aid = s.k" + extra)
                     .whenMatchedUpdate(set={"abalance": "s.v"})
                     .whenNotMatchedInsert(values={"aid": "s.k", "bid": "0", "abalance": "s.v", "filler": "''"})
                     .execute())
                    s = time.perf_counter() - t
                    m = DeltaTable.forPath(spark, path).history(1).collect()[0]["operationMetrics"]
                    print(f"{rnd:>5} {name:<7} {label:<8} {s:>7.2f} {m.get('numTargetFilesRemoved'):>14} "
                          f"{int(m.get('numTargetRowsCopied', 0)):>12,}", flush=True)


if __name__ == "__main__":
    main()
