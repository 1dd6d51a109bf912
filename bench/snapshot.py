"""Benchmark: the initial copy (slot + exported snapshot -> parallel ADBC -> Parquet) against a plain COPY.

    .venv/bin/python bench/snapshot.py                   # 2 M rows of a pgbench-like table, 2 connections
    .venv/bin/python bench/snapshot.py --rows 10000000 --workers 2 --part-pages 16384

Starts a throw-away LocalPostgres, fills `accounts` (aid int PK, bid int, abalance int, filler char(84)) and
measures, each in a child process so its peak RSS is its own:
  (a) baseline: `COPY (SELECT * FROM accounts) TO STDOUT` read with psycopg into nothing (one connection);
  (b) our snapshot: `create_slot_with_snapshot` (slot with exported snapshot, `--workers` connections, ctid
      ranges of `--part-pages` blocks, Parquet files of PostgreSQL text + manifests).
Rates are rows/s and MB/s of the text COPY's bytes (the same amount of data for both), plus the Parquet size.
"""
from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support

import psycopg  # noqa: E402

from slotlake.config import parse_config  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.memory import peak_rss_mb  # noqa: E402

SCHEMA = """
CREATE TABLE accounts (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84));
CREATE PUBLICATION slotlake_bench FOR TABLE accounts;
"""


def _baseline(dsn: str, out: mp.Queue) -> None:
    t0 = time.monotonic()
    total = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with cur.copy("COPY (SELECT * FROM accounts) TO STDOUT") as copy:
            for chunk in copy:
                total += len(chunk)
    out.put({"seconds": time.monotonic() - t0, "bytes": total,
             "peak_rss_mb": peak_rss_mb()})


def _snapshot(dsn: str, lake: str, workers: int, part_pages: int, out: mp.Queue) -> None:
    from slotlake.source.snapshot import create_slot_with_snapshot

    logging.basicConfig(level=logging.WARNING)
    cfg = parse_config({"lake": lake, "sources": {"bench": {"dsn": dsn, "tables": ["public.accounts"],
                                                            "publication": "slotlake_bench"}}})
    t0 = time.monotonic()
    report = create_slot_with_snapshot(cfg, cfg.source("bench"), workers=workers, part_pages=part_pages)
    out.put({"seconds": time.monotonic() - t0, "rows": report.rows,
             "parquet_bytes": sum(c.bytes for c in report.copies), "parts": sum(c.parts for c in report.copies),
             "peak_rss_mb": peak_rss_mb()})


def _child(target, *args) -> dict:
    q: mp.Queue = mp.Queue()
    p = mp.get_context("fork").Process(target=target, args=(*args, q))
    p.start()
    result = q.get()
    p.join()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--part-pages", type=int, default=4096)
    args = ap.parse_args()
    with LocalPostgres() as pg, tempfile.TemporaryDirectory() as lake:
        dsn = pg.dsn("postgres")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(SCHEMA)
            c.execute("INSERT INTO accounts SELECT g, g %% 100, 0, '' FROM generate_series(1, %s) g", (args.rows,))
            c.execute("VACUUM ANALYZE accounts")
            size = c.execute("SELECT pg_relation_size('accounts')").fetchone()[0]
        print(f"table accounts: {args.rows} rows, heap {size / 1e6:.0f} MB")
        # Warm the cache for both runs alike.
        _child(_baseline, dsn)
        base = _child(_baseline, dsn)
        snap = _child(_snapshot, dsn, lake, args.workers, args.part_pages)
        mb = base["bytes"] / 1e6
        b_rate, s_rate = args.rows / base["seconds"], snap["rows"] / snap["seconds"]
        print(f"plain COPY (1 connection, into nothing): {base['seconds']:.2f} s, {b_rate:,.0f} rows/s, "
              f"{mb / base['seconds']:.1f} MB/s, peak RSS {base['peak_rss_mb']:.0f} MB")
        print(f"snapshot ({args.workers} connections, {snap['parts']} parts -> Parquet "
              f"{snap['parquet_bytes'] / 1e6:.0f} "
              f"MB): {snap['seconds']:.2f} s, {s_rate:,.0f} rows/s, {mb / snap['seconds']:.1f} MB/s (of COPY text), "
              f"peak RSS {snap['peak_rss_mb']:.0f} MB")
        print(f"snapshot / plain COPY throughput: {s_rate / b_rate:.2f}x (target >= 0.5x)")
        assert snap["rows"] == args.rows, f"copied {snap['rows']} rows, expected {args.rows}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
