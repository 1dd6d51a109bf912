"""Benchmark: a backfill of a day of archived changes, interval by interval, against the day's own syncs.

    .venv/bin/python bench/backfill_day.py                     # 24 "hours" of ~40,000 row changes each
    .venv/bin/python bench/backfill_day.py --hours 6 --changes 100000

Issue 9 asks that a replay (backfill) of a day of archived changes run at the same rate per change as a sync. A day
of an hourly schedule is 24 intervals; here an "hour" is one tpcb-like pgbench burst (4 row changes per
transaction over the 4 pgbench tables, `pgbench_history` REPLICA IDENTITY FULL) followed by one `slotlake sync`, so
the intervals are the bursts' own time windows (read from PostgreSQL's clock between them) and the bench takes
minutes, not a day. Starts a throw-away PostgreSQL with `pgbench -i -s 1` and a source with its own slot and lake;
a first sync (slot + initial copy, untimed); then `--hours` times: a burst and a timed sync. Then the day again,
as the replay DAG's backfill runs it, one `slotlake replay SOURCE --from <interval start> --to <interval end>` per
interval in order, each a new process (what each DAG run's task is), and timed from outside:
  --dest      each interval's state written to its own folder (`--dest <dir>/<interval end>`), as a backfill with
              the DAG's `dest` Param keeps one table set per interval
  in place    silver re-derived and gold rebuilt in the lake (the DAG's default)
and one replay of the whole day in one run, in place. changes/s = the day's silver rows / seconds. At the end
gold is compared with PostgreSQL row by row (delta-rs), and the last interval's --dest tables with gold.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support
sys.path.append(str(ROOT / "tests"))  # oracle.py

import psycopg  # noqa: E402
from e2e import same_rows  # noqa: E402  (bench/e2e.py)
from variants import write_config  # noqa: E402

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake.config import load_config  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.pgbench import pgbench, pgbench_db  # noqa: E402

SOURCE = "day"
TABLES = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]
CHANGES_PER_TXN = 4


def cli(cfg: Path, *args: str) -> tuple[float, str]:
    """(seconds, stdout) of one `slotlake` command in a new process, as cron or an Airflow task runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    env.pop("SLOTLAKE_SPARK_SERVER", None)
    t = time.perf_counter()
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "slotlake"), "--config", str(cfg), *args],
                         capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"slotlake {' '.join(args)} failed ({out.returncode}): {out.stderr[-3000:]}")
    return seconds, out.stdout + out.stderr


def where(output: str) -> str:
    """Whether a replay ran in process or by the Spark app, from its log lines (a decline's reason printed)."""
    for line in output.splitlines():
        if "declined" in line:
            print(f"  {line.strip()[:300]}", flush=True)
    return "Spark" if "Spark replays" in output else "in process"


def now(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', "
                        "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')").fetchone()
    assert row is not None
    return row[0]


def report(label: str, seconds: list[float], changes: int, sync_rate: float | None = None) -> float:
    total = sum(seconds)
    rate = changes / total
    vs = f"   {rate / sync_rate:.2f}x the syncs' rate" if sync_rate else ""
    print(f"{label:<34} {len(seconds):>4} {total:>8.1f} {statistics.median(seconds):>8.2f} {max(seconds):>7.2f} "
          f"{rate:>11,.0f}{vs}", flush=True)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=int, default=24, help="intervals in the day (default 24)")
    ap.add_argument("--changes", type=int, default=40_000, help="row changes per interval (default 40,000)")
    ap.add_argument("--no-dest", dest="dest", action="store_false", help="skip the --dest backfill")
    args = ap.parse_args()
    txns = max(1, args.changes // CHANGES_PER_TXN // 2)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-day-") as tmp, LocalPostgres() as pg:
        dsn = pgbench_db(pg, 1)
        cfg = write_config(Path(tmp), dsn, SOURCE, TABLES, None)
        cli(cfg, "sync", SOURCE)  # slot + initial copy
        pgbench(pg, "-n", "-c", "1", "-t", "1")  # silver and _runs get an end before the day: its replay base
        cli(cfg, "sync", SOURCE)
        bounds = [now(dsn)]
        syncs, changes = [], 0
        for _ in range(args.hours):
            pgbench(pg, "-n", "-c", "2", "-j", "2", "-t", str(txns))
            seconds, out = cli(cfg, "sync", SOURCE, "--json")
            syncs.append(seconds)
            changes += json.loads(out[out.index("{"):out.rindex("}") + 1])["decoded_changes"]
            bounds.append(now(dsn))
        intervals = list(zip(bounds, bounds[1:]))
        print(f"\n{args.hours} intervals, {changes:,} row changes ({changes // args.hours:,} per interval)", flush=True)
        dest_runs: list[float] = []
        dest_where: set[str] = set()
        if args.dest:
            for start, end in intervals:
                d = Path(tmp) / "dest" / end.replace(":", "")
                seconds, out = cli(cfg, "replay", SOURCE, "--from", start, "--to", end, "--dest", str(d))
                dest_runs.append(seconds)
                dest_where.add(where(out))
        in_place, place_where = [], set()
        for start, end in intervals:
            seconds, out = cli(cfg, "replay", SOURCE, "--from", start, "--to", end)
            in_place.append(seconds)
            place_where.add(where(out))
        whole_s, out = cli(cfg, "replay", SOURCE, "--from", bounds[0], "--to", bounds[-1])
        load_end = os.getloadavg()
        print(f"{'':<34} {'runs':>4} {'total s':>8} {'median':>8} {'max':>7} {'changes/s':>11}")
        sync_rate = report("hourly syncs (slotlake sync)", syncs, changes)
        if dest_runs:
            report(f"backfill --dest ({'/'.join(sorted(dest_where))})", dest_runs, changes, sync_rate)
        report(f"backfill in place ({'/'.join(sorted(place_where))})", in_place, changes, sync_rate)
        report(f"whole day in one replay ({where(out)})", [whole_s], changes, sync_rate)
        print("load average (1/5/15 min): start " + "/".join(f"{x:.1f}" for x in load_start)
              + ", end " + "/".join(f"{x:.1f}" for x in load_end) + f" on {os.cpu_count()} CPUs", flush=True)
        paths = LakePaths.of(load_config(str(cfg)).lake, SOURCE)
        for t in TABLES:
            schema, name = t.split(".")
            print(f"gold == PostgreSQL: {t}: {assert_gold_equals_pg(paths.gold(schema, name), dsn, t)} rows equal")
        if dest_runs:
            for line in same_rows(paths, Path(tmp) / "dest" / intervals[-1][1].replace(":", "")):
                print(f"last interval's --dest == gold: {line}", flush=True)


if __name__ == "__main__":
    main()
