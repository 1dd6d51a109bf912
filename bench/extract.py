"""Benchmark: extract (peek via ADBC -> Parquet bronze -> advance) against the raw peek baseline.

    .venv/bin/python bench/extract.py                    # ~1.5 M pgoutput rows + a 1 M-row transaction
    .venv/bin/python bench/extract.py --big-txn 10000000 # the flat-memory check from DESIGN.md invariant 5

Starts a throw-away LocalPostgres, creates the publication and slot, writes a pgbench-like workload (batched
inserts, then batched updates), and on the same slot contents measures:
  (a) baseline: `COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(...)) TO STDOUT` read with
      psycopg into nothing (peek does not move the slot, so the slot contents stay the same);
  (b) our extract (all calls, files placed, slot advanced), in a child process so its peak RSS is its own.
Then one transaction of `--big-txn` rows is extracted alone, again in a child, to show memory stays flat.
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import queue
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support

import psycopg  # noqa: E402

from slotlake.config import ExtractSettings, parse_config  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.memory import peak_rss_mb  # noqa: E402

SCHEMA = """
CREATE TABLE accounts (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84));
CREATE TABLE big (id bigint PRIMARY KEY, v text);
CREATE PUBLICATION slotlake_bench FOR TABLE accounts, big;
"""


def _config(lake: str, dsn: str, upto_nchanges: int):
    return parse_config({"lake": lake, "extract": {"upto_nchanges": upto_nchanges},
                         "sources": {"bench": {"dsn": dsn, "tables": ["public.accounts", "public.big"]}}})


def _child_extract(lake: str, dsn: str, upto_nchanges: int, out: mp.Queue) -> None:
    from slotlake.source.extract import extract

    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    cfg = _config(lake, dsn, upto_nchanges)
    t0 = time.perf_counter()
    result = extract(cfg, cfg.source("bench"))
    seconds = time.perf_counter() - t0
    out.put({"rows": result.rows, "bytes": result.bytes, "file_bytes": result.file_bytes, "files": len(result.files),
             "calls": result.calls, "seconds": seconds,
             "max_rss_mb": peak_rss_mb()})


def run_in_child(target, *args) -> dict:
    """`target(*args, queue)` in a spawned child (a fresh interpreter: its VmHWM is that stage's own peak); what it
    put on the queue. A child that exits without putting anything stops the bench with its exit code."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out))
    proc.start()
    while True:
        try:
            result = out.get(timeout=1.0)
            break
        except queue.Empty:
            if not proc.is_alive() and out.empty():
                raise SystemExit(f"{target.__name__} child exited with code {proc.exitcode} and no result") from None
    proc.join()
    if proc.exitcode:
        raise SystemExit(f"{target.__name__} child failed with exit code {proc.exitcode}")
    return result


def run_extract_in_child(lake: str, dsn: str, upto_nchanges: int) -> dict:
    return run_in_child(_child_extract, lake, dsn, upto_nchanges)


def baseline(dsn: str) -> dict:
    """Raw peek through COPY text, read block by block into nothing."""
    with psycopg.connect(dsn, autocommit=True) as c:
        t0 = time.perf_counter()
        nbytes = 0
        with c.cursor().copy(
                "COPY (SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes('slotlake_bench', "
                "pg_current_wal_flush_lsn(), NULL, 'proto_version', '1', 'publication_names', 'slotlake_bench', "
                "'messages', 'true')) TO STDOUT") as copy:
            for block in copy:
                nbytes += len(block)
        return {"seconds": time.perf_counter() - t0, "copy_bytes": nbytes}


def workload(dsn: str, target_rows: int) -> None:
    """Batched inserts of 1000 accounts, then batched updates of 1000: ~1002 pgoutput rows per transaction."""
    txns = max(2, target_rows // 1002)
    inserts = txns // 2
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(inserts):
            c.execute("INSERT INTO accounts SELECT g, g %% 100, 0, '' FROM generate_series(%s::int, %s::int) g",
                      (i * 1000, i * 1000 + 999))
        for i in range(txns - inserts):
            lo = (i % inserts) * 1000
            c.execute("UPDATE accounts SET abalance = abalance + 1 WHERE aid BETWEEN %s::int AND %s::int",
                      (lo, lo + 999))
        c.execute("SET synchronous_commit = on")
        c.execute("SELECT txid_current()")  # flush: a peek never reads past the flushed WAL


def big_transaction(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET synchronous_commit = on")
        c.execute("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, %s::bigint) g", (n,))


def slot_ready(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(SCHEMA)
        c.execute("SELECT pg_create_logical_replication_slot('slotlake_bench', 'pgoutput')")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_500_000, help="pgoutput rows of the throughput workload (0: skip)")
    ap.add_argument("--big-txn", type=int, default=1_000_000, help="rows in the one big transaction (0: skip)")
    ap.add_argument("--upto-nchanges", type=int, default=ExtractSettings().upto_nchanges,
                    help="rows per peek call (default: the config default)")
    args = ap.parse_args()

    with LocalPostgres() as server, tempfile.TemporaryDirectory(prefix="slotlake-bench-") as tmp:
        dsn = server.dsn()
        slot_ready(dsn)
        table = []
        base = ours = big = None
        if args.rows:
            t0 = time.perf_counter()
            workload(dsn, args.rows)
            print(f"workload written in {time.perf_counter() - t0:.1f} s", flush=True)
            baseline(dsn)  # warm-up: the first read of fresh WAL pays for cold caches; measure the second
            base = baseline(dsn)
            ours = run_extract_in_child(f"{tmp}/lake", dsn, args.upto_nchanges)
            rows, mb = ours["rows"], ours["bytes"] / 1e6
            table += [
                ("baseline: COPY peek -> psycopg -> nothing", rows, mb, base["seconds"], None, None),
                ("extract: ADBC peek -> Parquet, advance", rows, mb, ours["seconds"], ours["max_rss_mb"],
                 f"{ours['files']} files, {ours['file_bytes'] / 1e6:.0f} MB Parquet"),
            ]
        if args.big_txn:
            t0 = time.perf_counter()
            big_transaction(dsn, args.big_txn)
            print(f"big transaction of {args.big_txn:,} rows written in {time.perf_counter() - t0:.1f} s", flush=True)
            big = run_extract_in_child(f"{tmp}/lake", dsn, args.upto_nchanges)
            table.append((f"extract: one transaction of {args.big_txn:,} rows", big["rows"], big["bytes"] / 1e6,
                          big["seconds"], big["max_rss_mb"], f"{big['files']} file(s)"))

    print()
    print(f"{'measurement':<46} {'rows':>11} {'MB':>8} {'s':>7} {'rows/s':>10} {'MB/s':>7} {'peak RSS MB':>11}  note")
    for name, r, m, s, rss, note in table:
        rss_text = f"{rss:.0f}" if rss is not None else "-"
        print(f"{name:<46} {r:>11,} {m:>8.1f} {s:>7.2f} {r / s:>10,.0f} {m / s:>7.1f} {rss_text:>11}  {note or ''}")
    print()
    if base and ours:
        print(f"extract throughput / baseline = {base['seconds'] / ours['seconds']:.2f}x  (target >= 0.5x)  "
              f"[extract takes {ours['seconds'] / base['seconds']:.2f}x the baseline's time]")
    if big:
        print(f"peak RSS for the {args.big_txn:,}-row transaction = {big['max_rss_mb']:.0f} MB  (target < 500 MB)")


if __name__ == "__main__":
    main()
