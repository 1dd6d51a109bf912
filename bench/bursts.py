"""Benchmark: repeated pgbench bursts through one long-lived Spark server, as hourly syncs of a busy database run.

    .venv/bin/python bench/bursts.py                          # pgbench -i -s 5; 6 bursts of ~310,000 row changes
    .venv/bin/python bench/bursts.py --rounds 4 --changes 100000
    .venv/bin/python bench/bursts.py --conf spark.sql.codegen.cache.maxEntries=100    # A/B of a Spark setting

Starts a throw-away LocalPostgres, `pgbench -i -s 5` (pgbench_history REPLICA IDENTITY FULL: it has no key) and a
`slotlake spark-server` (the config's `spark.server`), a first sync (slot + initial copy: timed, not counted), then
`--rounds` times: a tpcb-like burst (`pgbench -c 4 -j 2`, 4 row changes per transaction), the raw pull of the slot
(the baseline: COPY of `pg_logical_slot_peek_binary_changes` read into nothing), then the sync's stages timed apart
through the functions the CLI and the DAG run (preflight + extract in this process; decode and merge in the server).
For decode and merge it also prints the server JVM's CPU seconds, read from /proc: its JIT compiler threads (C2,
C1), GC threads and the rest (task threads, driver, py4j): where a warm sync's CPU goes besides the work itself.

The issue's own check is one burst through `slotlake sync` (bench/e2e.py --changes 310000 --scale 5); this one
shows what a server that has already run syncs does with the next ones: the first round still warms the JVM.
At the end gold is compared with PostgreSQL (bench/e2e.py's comparison: small tables row by row, the big ones by
count and column sums). Linux only (/proc).
"""
from __future__ import annotations

import argparse
import collections
import glob
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from e2e import CHANGES_PER_TXN, TABLES, _config, compare, decoded_rows  # noqa: E402
from extract import baseline  # noqa: E402

from slotlake import delta_log  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.pgbench import pgbench, pgbench_db  # noqa: E402
from sparkserver import free_port, spark_server  # noqa: E402

KINDS = ("JIT C2", "JIT C1", "GC", "the rest")


def server_jvm(server_pid: int) -> int:
    """The pid of the Spark server's JVM: the descendant of the `slotlake spark-server` process running SparkSubmit
    (other Spark JVMs on the machine are not counted)."""
    todo, seen = [server_pid], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += [int(c) for c in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                text=True).stdout.split()]
    for pid in seen:
        try:
            if b"org.apache.spark.deploy.SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise SystemExit(f"no Spark JVM under the spark-server process {server_pid}")


def cpu_by_kind(pid: int) -> collections.Counter:
    """CPU seconds (user + system) of the JVM so far: its JIT compiler and GC threads (they live as long as the
    JVM), and the rest of the process (task threads, driver, py4j). The rest is the process's total minus those:
    Spark's task threads end when idle, and a thread that ended is no longer in /proc/<pid>/task."""
    tick = os.sysconf("SC_CLK_TCK")

    def cpu(stat: str) -> float:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    out: collections.Counter = collections.Counter()
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            name = Path(task, "comm").read_text().strip()
            seconds = cpu(f"{task}/stat")
        except OSError:  # the thread ended
            continue
        kind = ("JIT C2" if name.startswith("C2 Compiler") else "JIT C1" if name.startswith("C1 Compiler")
                else "GC" if "GC" in name or name.startswith("G1") else None)
        if kind:
            out[kind] += seconds
    out["the rest"] = cpu(f"/proc/{pid}/stat") - sum(out.values())
    return out


def timed(fn, pid: int) -> tuple[float, dict[str, float]]:
    before = cpu_by_kind(pid)
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    after = cpu_by_kind(pid)
    return seconds, {k: after[k] - before[k] for k in KINDS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="bursts, each followed by one sync (default 6)")
    ap.add_argument("--changes", type=int, default=310_000, help="row changes per burst (default 310,000)")
    ap.add_argument("--scale", type=int, default=5, help="pgbench -s (default 5: 500,000 accounts)")
    ap.add_argument("--simple-update", action="store_true",
                    help="pgbench -N (the issue's burst: accounts updated, history inserted; tellers and branches "
                         "untouched; 2 row changes per transaction) instead of tpcb-like (4)")
    ap.add_argument("--idle-tables", type=int, default=0, metavar="N",
                    help="N more tables of 100 rows in the source's table list that no burst changes (a source "
                         "where most tables are quiet)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the server (spark.conf), e.g. to compare against a default")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    load_start = os.getloadavg()
    per_txn = 2 if args.simple_update else CHANGES_PER_TXN
    txns = max(1, args.changes // per_txn // 4)
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-bursts-") as tmp, LocalPostgres() as pg:
        dsn = pgbench_db(pg, args.scale)
        with psycopg.connect(dsn, autocommit=True) as conn:
            idle = [f"public.idle_{i:03d}" for i in range(args.idle_tables)]
            for t in idle:
                conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
                conn.execute(f"INSERT INTO {t} SELECT g, 'v' || g FROM generate_series(1, 100) g")
        conf = dict(kv.split("=", 1) for kv in args.conf)
        cfg = _config(str(Path(tmp) / "lake"), dsn, f"127.0.0.1:{free_port()}", conf=conf, tables=TABLES + idle)
        paths = LakePaths.of(cfg.lake, "bench")
        from slotlake.pipeline import sync, task_decode, task_extract, task_merge, task_preflight

        rows = []
        with spark_server(Path(cfg.path), Path(tmp) / "spark-server.log") as server:
            pid = server_jvm(server.pid)
            t = time.perf_counter()
            sync(cfg, "bench")  # slot + initial copy
            first_s = time.perf_counter() - t
            for r in range(args.rounds):
                pgbench(pg, "-n", *(["-N"] if args.simple_update else []), "-c", "4", "-j", "2", "-t", str(txns))
                version = next(delta_log.commits(paths.changes)).version if delta_log.has_commits(paths.changes) \
                    else -1
                raw = baseline(dsn)["seconds"]
                t = time.perf_counter()
                task_preflight(cfg, "bench")
                task_extract(cfg, "bench")
                extract_s = time.perf_counter() - t
                decode_s, decode_cpu = timed(lambda: task_decode(cfg, "bench"), pid)
                merge_s, merge_cpu = timed(lambda: task_merge(cfg, "bench"), pid)
                changes = decoded_rows(paths, version)
                rows.append((r, changes, raw, extract_s, decode_s, merge_s, decode_cpu, merge_cpu))
                total = extract_s + decode_s + merge_s
                print(f"round {r}: {changes:,} changes; raw pull {raw:.1f} s; extract {extract_s:.1f} s, decode "
                      f"{decode_s:.1f} s, merge {merge_s:.1f} s, total {total:.1f} s ({changes / total:,.0f} "
                      f"changes/s)", flush=True)
                for stage, cpu in (("decode", decode_cpu), ("merge", merge_cpu)):
                    print(f"  {stage} JVM CPU s: " + ", ".join(f"{k} {cpu[k]:.1f}" for k in KINDS), flush=True)
            from slotlake.spark.session import get_spark

            spark = get_spark("bench-compare", "local[1]")
            checked = compare(spark, paths, dsn)
            spark.stop()
    load_end = os.getloadavg()
    mode = "pgbench -N" if args.simple_update else "tpcb-like"
    print(f"\nfirst sync (slot + initial copy): {first_s:.1f} s; bursts: {mode}, {args.idle_tables} idle tables; "
          f"Spark settings: {conf or 'the defaults'}")
    later = rows[1:] or rows  # the first round still warms the server's JVM
    med = {name: statistics.median(row[i] for row in later)
           for i, name in ((2, "raw pull"), (3, "extract"), (4, "decode"), (5, "merge"))}
    changes = statistics.median(row[1] for row in later)
    print(f"median of rounds {later[0][0]}..{later[-1][0]} ({changes:,.0f} changes each):")
    for name, s in med.items():
        print(f"  {name:<10} {s:6.1f} s  {changes / s:>10,.0f} changes/s")
    total = med["extract"] + med["decode"] + med["merge"]
    print(f"  {'total':<10} {total:6.1f} s  {changes / total:>10,.0f} changes/s (extract + decode + merge)")
    for i, stage in ((6, "decode"), (7, "merge")):
        print(f"  {stage} JVM CPU s (median): "
              + ", ".join(f"{k} {statistics.median(row[i][k] for row in later):.1f}" for k in KINDS))
    print("gold == PostgreSQL: " + "; ".join(checked))
    print(f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at the end; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
