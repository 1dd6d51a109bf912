"""A run boundary exactly between two commits whose records touch: the second commit's LSN equals the first one's
end LSN. The first extract stops there (upto_lsn = the first commit's end), so the gold watermark after the first
merge equals the second commit's LSN; the second commit must still be applied by the next run, once."""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake.config import parse_config  # noqa: E402
from slotlake.decode.job import run_decode  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402
from slotlake.merge.job import run_merge  # noqa: E402
from slotlake.source.extract import extract  # noqa: E402
from slotlake.source.preflight import run_preflight  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark]

_COMMIT = struct.Struct(">BQQq")  # flags, commit_lsn, end_lsn, ts


def _commits(dsn: str, slot: str, publication: str) -> list[tuple[int, int]]:
    """(commit_lsn, end_lsn) of every transaction the slot would send now (a peek: the slot does not move)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
            "'publication_names', %s)", (slot, publication)).fetchall()
    return [_COMMIT.unpack_from(bytes(d), 1)[1:3] for (d,) in rows if bytes(d)[:1] == b"C"]


def _touching_commits(dsn: str, slot: str, publication: str, start: int) -> tuple[int, int]:
    """Commit T1 and T2 so that T2's commit record starts right at T1's end: T2 writes its row first (so none of
    its records fall between the two commits), T1 commits, T2 commits at once. Returns (T1 end, T2 commit LSN)."""
    with psycopg.connect(dsn) as t1, psycopg.connect(dsn) as t2:
        for c in (t1, t2):
            c.execute("SET synchronous_commit = on")
        t2.execute("INSERT INTO orders VALUES (%s, 't2')", (start + 1,))
        t1.execute("INSERT INTO orders VALUES (%s, 't1')", (start,))
        t1.commit()
        t2.commit()
    by_end = {end: commit for commit, end in _commits(dsn, slot, publication)}
    ends = sorted(by_end)
    t1_end, t2_commit = ends[-2], by_end[ends[-1]]
    return t1_end, t2_commit


def test_a_commit_starting_at_the_previous_runs_end_is_applied_once(pg_db, tmp_path, spark):
    with psycopg.connect(pg_db, autocommit=True) as c:
        c.execute("CREATE TABLE orders (id int PRIMARY KEY, v text)")
    cfg = parse_config({"lake": str(tmp_path / "lake"),
                        "sources": {"shop": {"dsn": pg_db, "tables": ["public.orders"]}}})
    src = cfg.source("shop")
    run_preflight(cfg, src)  # slot + initial copy (of an empty table)
    # The server may write an unrelated record (a running-xacts snapshot) between the commits: try again then.
    for attempt in range(20):
        t1_end, t2_commit = _touching_commits(pg_db, src.slot, src.publication, 10 * attempt)
        if t1_end == t2_commit:
            break
    assert t1_end == t2_commit, "could not make two commits whose records touch in 20 attempts"

    first = extract(cfg, src, upto_lsn=Lsn(t1_end))
    assert first.end_lsn == Lsn(t1_end)
    run_decode(spark, cfg, "shop")
    run_merge(spark, cfg, "shop")
    gold = LakePaths.of(cfg.lake, "shop").gold("public", "orders")
    # The last T2 is not in this run (gold's watermark is T1's end, which is T2's commit LSN); everything else is.
    with psycopg.connect(pg_db) as c:
        in_pg = {r[0] for r in c.execute("SELECT id FROM orders")}
    in_gold = {r[0] for r in spark.read.format("delta").load(gold).select("id").collect()}
    assert in_gold == in_pg - {10 * attempt + 1}

    extract(cfg, src)
    run_decode(spark, cfg, "shop")
    run_merge(spark, cfg, "shop")
    assert_gold_equals_pg(gold, pg_db, "public.orders")
    assert run_merge(spark, cfg, "shop").tables[0].changes == 0  # a re-run applies nothing again
    assert_gold_equals_pg(gold, pg_db, "public.orders")
