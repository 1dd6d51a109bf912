"""Benchmark: a sync of updates that leave a TOASTed column unchanged, of primary-key changes and of a REPLICA
IDENTITY FULL table's updates and deletes, merged in the sync's own process (`slotlake.merge.in_process`, the
default) next to the same changes through the Spark apps (`spark.in_process_bytes: 0`, where such batches always
went before 2026-12-06), in one run.

    .venv/bin/python bench/merge_cases.py                       # 20,000 rows per table, ~80,000 row changes
    .venv/bin/python bench/merge_cases.py --rows 50000 --rounds 20

Starts a throw-away PostgreSQL with three tables: `docs` (id bigint key, title, n, body: ~3 kB of text PostgreSQL
stores out of line, so an update that does not set it sends it as "unchanged TOAST"), `accts` (id int key, v) and
`tags` (no key, REPLICA IDENTITY FULL: (kind, qty), every row twice), and two sources on it, `here` and `spark`,
each with its own slot, publication, lake and config. Each is synced once (slot + initial copy, untimed). Then
`--rounds` rounds, each: a tenth of the documents updated twice without their body (unchanged TOAST: the merge takes
it from gold's row), and a tenth of the accounts moved to a key 1,000,000 higher (even rounds) or every moved
account moved back (odd rounds): key changes, each a delete at the old key and the row at the new one, and a
twentieth of the tags updated (both copies of each) and another twentieth deleted. Then one `slotlake sync` of each
source, in a new process timed from outside (interpreter start and imports included; its peak RSS is the process's
own, a spark-submit's JVM is another process), next to the raw pull of the same slot (`COPY (SELECT ...
pg_logical_slot_peek_binary_changes ...) TO STDOUT` read into nothing), measured first. changes/s = silver rows the
sync decoded / sync seconds. At the end both lakes' gold tables are compared with PostgreSQL row by row (delta-rs).
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
sys.path.append(str(ROOT / "tests"))  # oracle.py

import psycopg  # noqa: E402
from variants import VARIANTS, write_config  # noqa: E402

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402

TABLES = ["public.docs", "public.accts", "public.tags"]
# The CLI's own main in a new interpreter, printing its peak RSS (kB) on the way out.
RUN_CLI = ("import resource, sys\nfrom slotlake.cli import main\ntry:\n    rc = main(sys.argv[1:])\nfinally:\n"
           "    print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
           "sys.exit(rc)")


def sync(cfg: Path, source: str) -> tuple[float, dict, int]:
    """(seconds, the sync's --json report, peak RSS in MB) of one `slotlake sync` in a new process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    env.pop("SLOTLAKE_SPARK_SERVER", None)  # spark-submit, as a deployment without a Spark server
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", RUN_CLI, "--config", str(cfg), "sync", source, "--json"],
                         capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"sync {source} failed ({out.returncode}): {out.stderr[-3000:]}")
    rss = next(int(x.split()[1]) for x in out.stderr.splitlines() if x.startswith("peak_rss_kb"))
    return seconds, json.loads(out.stdout), rss // 1024


def raw_pull(dsn: str, source: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as c:
        t = time.perf_counter()
        with c.cursor().copy(
                f"COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes('slotlake_{source}', "
                f"pg_current_wal_flush_lsn(), NULL, 'proto_version', '1', 'publication_names', 'slotlake_{source}'"
                ")) TO STDOUT") as copy:
            for _ in copy:
                pass
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000, help="documents and accounts (default 20,000)")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of changes (default 10)")
    args = ap.parse_args()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-toast-") as tmp, LocalPostgres() as pg:
        pg.psql("CREATE DATABASE bench")
        dsn = pg.dsn("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, title text, n int, body text)")
            conn.execute("CREATE TABLE accts (id int PRIMARY KEY, v int)")
            conn.execute(f"INSERT INTO docs SELECT g, 'doc ' || g, 0, (SELECT string_agg(md5(g::text || s::text), '')"
                         f" FROM generate_series(1, 100) s) FROM generate_series(1, {args.rows}) g")
            conn.execute(f"INSERT INTO accts SELECT g, g FROM generate_series(1, {args.rows}) g")
            conn.execute("CREATE TABLE tags (kind text, qty int)")
            conn.execute("ALTER TABLE tags REPLICA IDENTITY FULL")
            conn.execute(f"INSERT INTO tags SELECT 'k' || (g / 2), g / 2 FROM generate_series(1, {args.rows}) g")
        cfgs = {s: write_config(Path(tmp), dsn, s, TABLES, b) for s, b in VARIANTS.items()}
        for s, cfg in cfgs.items():
            sync(cfg, s)  # slot + initial copy
        with psycopg.connect(dsn, autocommit=True) as conn:
            for r in range(args.rounds):
                part = r % 10
                conn.execute(f"UPDATE docs SET title = 'round {r}', n = n + 1 WHERE id % 10 = {part}")
                conn.execute(f"UPDATE docs SET n = n + 1 WHERE id % 10 = {part}")
                if r % 2 == 0:
                    conn.execute(f"UPDATE accts SET id = id + 1000000, v = v + 1 WHERE id % 10 = {part}")
                else:
                    conn.execute("UPDATE accts SET id = id - 1000000 WHERE id > 1000000")
                conn.execute(f"UPDATE tags SET qty = qty + 1 WHERE qty % 20 = {2 * part}")
                conn.execute(f"DELETE FROM tags WHERE qty % 20 = {(2 * part + 11) % 20}")
        pulls = {s: raw_pull(dsn, s) for s in VARIANTS}
        results = {s: sync(cfg, s) for s, cfg in cfgs.items()}
        load_end = os.getloadavg()
        print(f"\n{'variant':<42} {'changes':>9} {'sync s':>7} {'changes/s':>10} {'peak RSS':>9} {'raw pull s':>11}")
        for s, (seconds, report, rss) in results.items():
            changes = report["decoded_changes"]
            label = "in process (default)" if VARIANTS[s] is None else "Spark apps (in_process_bytes: 0)"
            print(f"{label:<42} {changes:>9,} {seconds:>7.1f} {changes / seconds:>10,.0f} {rss:>6} MB "
                  f"{pulls[s]:>11.1f}")
            print(f"  steps: {json.dumps(report.get('step_seconds'))}")
        print("load average (1/5/15 min): start " + "/".join(f"{x:.1f}" for x in load_start)
              + ", end " + "/".join(f"{x:.1f}" for x in load_end) + f" on {os.cpu_count()} CPUs", flush=True)
        for t in TABLES:
            schema, name = t.split(".")
            golds = [str(Path(tmp) / s / "lake" / s / "gold" / schema / name) for s in VARIANTS]
            for s, g in zip(VARIANTS, golds):
                print(f"gold == PostgreSQL ({s}): {t}: {assert_gold_equals_pg(g, dsn, t)} rows equal")


if __name__ == "__main__":
    main()
