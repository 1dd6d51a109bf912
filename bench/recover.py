"""Benchmark: `slotlake recover` of a 1 M-row table as of a point 100k changes back, next to a plain COPY.

    .venv/bin/python bench/recover.py                    # pgbench -i -s 10 (1 M accounts), history on and off
    .venv/bin/python bench/recover.py --history off      # only the replay path

Starts a throw-away LocalPostgres, `pgbench -i -s 10` (pgbench_accounts: 1,000,000 rows) and two sources over the
same table, `plain` (history off: recover replays) and `hist` (`history: true`: recover reads gold_history), each
with its own slot and lake. Each is synced once (slot + initial copy), then `--changes` row updates (transactions
of 10,000) are written, the point P is recorded (`pg_current_wal_lsn()`, with the table's count and column sums),
`--changes` more updates follow, and every source is synced again. So P lies `--changes` changes back, inside one
gold version step: recover must rebuild it.
Timed, each as `.venv/bin/slotlake recover` in a new process (interpreter, spark-submit and JVM start included),
with the peak RSS of its largest process (os.wait4: the Spark driver JVM):
  recover --as-of P --to <dir>                       (Delta)
  recover --as-of P --to postgresql://... --into-schema rec_<source>
next to `COPY (SELECT * FROM pgbench_accounts) TO STDOUT` read with psycopg into nothing, in the same run. Each
result is checked against P's count and column sums.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support

import psycopg

from slotlake_dev.localpg import LocalPostgres
from slotlake_dev.pgbench import pgbench_db

TABLE = "public.pgbench_accounts"
SUMS = "count(*), sum(aid), sum(bid), sum(abalance)"
TXN_ROWS = 10_000


def reaped(config: Path, *args: str) -> tuple[float, float, str]:
    """(seconds, peak RSS MB, stdout) of one `slotlake` command in a new process; the RSS is wait4's ru_maxrss,
    the largest of the child and the descendants it waited for (the spark-submit JVM)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "slotlake"), "--config", str(config), *args],
                                stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise SystemExit(f"slotlake {' '.join(args)} failed:\n{err.read()[-3000:]}")
        return seconds, usage.ru_maxrss / 1024, out.read()


def sums(dsn: str, table: str) -> tuple[int, ...]:
    with psycopg.connect(dsn) as conn:
        return tuple(int(v or 0) for v in conn.execute(f"SELECT {SUMS} FROM {table}").fetchone())


def update_rows(dsn: str, first: int, count: int) -> None:
    """`count` row changes in transactions of TXN_ROWS updates, aid first .. first+count-1."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo in range(first, first + count, TXN_ROWS):
            hi = min(lo + TXN_ROWS, first + count) - 1
            conn.execute(f"UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN {lo} AND {hi}")


def copy_seconds(dsn: str) -> tuple[float, int]:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        t = time.perf_counter()
        n = 0
        with cur.copy(f"COPY (SELECT * FROM {TABLE}) TO STDOUT") as copy:
            for block in copy:
                n += len(block)
        return time.perf_counter() - t, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=10, help="pgbench -s (100,000 accounts per unit; default 10)")
    ap.add_argument("--changes", type=int, default=100_000, help="row changes before and after the point")
    ap.add_argument("--history", choices=("both", "on", "off"), default="both")
    args = ap.parse_args()
    sources = {"both": ["plain", "hist"], "on": ["hist"], "off": ["plain"]}[args.history]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-recover-") as tmp, LocalPostgres() as pg:
        dsn = pgbench_db(pg, args.scale, full_history=False)
        config = Path(tmp) / "slotlake.yaml"
        config.write_text(json.dumps({"lake": str(Path(tmp) / "lake"), "spark": {"master": "local[2]"}, "sources": {
            s: {"dsn": dsn, "tables": [TABLE], "history": s == "hist"} for s in sources}}))  # JSON is YAML
        for s in sources:
            print(f"{s}: first sync (slot + initial copy) {reaped(config, 'sync', s)[0]:.1f}s", flush=True)
        rows = args.scale * 100_000
        update_rows(dsn, 1, min(args.changes, rows))
        with psycopg.connect(dsn) as conn:
            point = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        want = sums(dsn, TABLE)
        update_rows(dsn, rows // 2 + 1, min(args.changes, rows // 2))
        for s in sources:
            print(f"{s}: sync of {2 * args.changes:,} changes {reaped(config, 'sync', s)[0]:.1f}s", flush=True)

        copy_s, copy_bytes = copy_seconds(dsn)
        results = []
        for s in sources:
            dest = Path(tmp) / f"recovered_{s}"
            for kind, to in (("delta", str(dest)), ("postgres", dsn)):
                extra = ["--into-schema", f"rec_{s}"] if kind == "postgres" else []
                seconds, rss, out = reaped(config, "recover", s, "--as-of", point, "--table", TABLE, "--to", to,
                                           *extra, "--json")
                result = json.loads(out)
                if kind == "postgres":
                    got = sums(dsn, f"rec_{s}.pgbench_accounts")
                else:
                    from deltalake import DeltaTable

                    t = DeltaTable(str(dest / "public" / "pgbench_accounts")).to_pyarrow_table(
                        columns=["aid", "bid", "abalance"])
                    import pyarrow.compute as pc

                    got = (t.num_rows, *(int(pc.sum(t[c]).as_py() or 0) for c in ("aid", "bid", "abalance")))
                if got != want:
                    raise SystemExit(f"{s} recover --to {kind}: {got} != the table at {point}: {want}")
                path = "history" if TABLE in result.get("from_history", []) else "replay"
                results.append((s, kind, path, seconds, rss, result["tables"][0]["rows"]))
        load_end = os.getloadavg()
        print(f"\npgbench_accounts: {rows:,} rows; point {point}: {args.changes:,} changes back "
              f"(transactions of {TXN_ROWS:,} updates)")
        print(f"{'run':<34} {'path':<8} {'s':>7} {'x COPY':>7} {'peak RSS MB':>12} {'rows':>10}")
        for s, kind, path, seconds, rss, n in results:
            print(f"{'recover ' + s + ' --to ' + kind:<34} {path:<8} {seconds:>7.1f} {seconds / copy_s:>7.1f} "
                  f"{rss:>12.0f} {n:>10,}")
        print(f"{'COPY (SELECT *) TO STDOUT':<34} {'':<8} {copy_s:>7.2f} {1.0:>7.1f} {'':>12} {rows:>10,}"
              f"   ({copy_bytes / 1e6:.1f} MB read into nothing)")
        print("every result equals the table at the point (count and column sums)")
        print("load average (1/5/15 min): start " + "/".join(f"{x:.1f}" for x in load_start)
              + ", end " + "/".join(f"{x:.1f}" for x in load_end) + f" on {os.cpu_count()} CPUs", flush=True)


if __name__ == "__main__":
    main()
