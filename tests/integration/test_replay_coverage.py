"""Replay up to "now": every point the extract has covered is replayable, not only the last archived commit.

A sync's extract moves the slot to the WAL position of its start (`upto_lsn`) when nothing published committed
after its last archived commit; an idle run moves it without archiving anything. Both record that coverage
(bronze/_covered), so `replay --to <that position>` and `--to <a time after the last commit>` work and equal
PostgreSQL's state, while a point past the coverage still gets the clear error. Real PostgreSQL, Spark and Delta.
"""
from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from oracle import assert_gold_equals_pg
from slotlake import bronze
from slotlake.config import parse_config
from slotlake.decode.job import decode_watermark, run_decode
from slotlake.lake import LakePaths
from slotlake.merge.job import run_merge
from slotlake.merge.watermarks import delta_watermark
from slotlake.recover.replay import request
from slotlake.recover.replay_job import ReplayError, run_replay
from slotlake.source.connection import connect
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight
from slotlake.source.slot import slot_info

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def test_replay_to_the_covered_position_and_to_now(spark, pg_db, tmp_path):
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"src": {"dsn": pg_db, "tables": ["public.acct"]}}})
    src = cfg.source("src")
    paths = LakePaths.of(cfg.lake, "src")
    _sql(pg_db, "CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2))",
         "CREATE TABLE other (x int)",  # not published: its changes move the WAL, never bronze
         "CREATE SCHEMA recorded",
         "INSERT INTO acct SELECT g, 'owner ' || g, g FROM generate_series(1, 5) g")
    run_preflight(cfg, src)
    extract(cfg, src)
    run_decode(spark, cfg, "src")
    run_merge(spark, cfg, "src")
    assert decode_watermark(spark, paths.changes, "src") is None  # only the initial copy so far
    start = delta_watermark(spark, paths.gold("public", "acct"))  # the copy's: consistent point - 1

    _sql(pg_db, "INSERT INTO acct VALUES (6, 'six', 6)", "UPDATE acct SET balance = 0 WHERE id = 1",
         "DELETE FROM acct WHERE id = 2",
         "INSERT INTO other SELECT generate_series(1, 1000)",  # WAL after the last published commit
         "CREATE TABLE recorded.acct_1 AS SELECT * FROM acct")
    run = extract(cfg, src)
    run_decode(spark, cfg, "src")
    run_merge(spark, cfg, "src")
    archived = bronze.max_archived_end(paths.root)
    assert run.files and archived < run.upto_lsn == run.end_lsn  # the slot passed the last archived commit
    assert bronze.covered_lsn(paths.root) == run.upto_lsn
    assert_gold_equals_pg(paths.gold("public", "acct"), pg_db, "public.acct")

    # An idle run (nothing published since) moves the slot on and records how far it looked.
    _sql(pg_db, "INSERT INTO other SELECT generate_series(1, 1000)")
    idle = extract(cfg, src)
    assert not idle.files and idle.end_lsn > run.end_lsn
    with connect(src) as conn:
        assert slot_info(conn, src.slot).confirmed_flush_lsn == idle.end_lsn
    covered = bronze.covered_lsn(paths.root)
    assert covered == idle.end_lsn and bronze.max_archived_end(paths.root) == archived  # no bronze file for it
    after_last_commit = datetime.now(UTC) + timedelta(seconds=1)

    # --to the WAL position when the last syncs started, and --to a time after the last commit: the state now.
    for i, to in enumerate([str(run.upto_lsn), str(covered), after_last_commit.isoformat()]):
        dest = str(tmp_path / f"dest_{i}")
        result = run_replay(spark, cfg, request("src", str(start), to, None, dest))
        assert not result.in_place and result.to_lsn <= covered
        assert_gold_equals_pg(f"{dest}/public/acct", pg_db, "recorded.acct_1")
    # in place, up to the covered position: the lake still equals PostgreSQL
    result = run_replay(spark, cfg, request("src", str(start), str(covered), None, None))
    assert result.in_place and result.to_lsn == covered
    assert_gold_equals_pg(paths.gold("public", "acct"), pg_db, "public.acct")
    assert not os.listdir(f"{paths.root}/_replay")

    # Past the covered position: not archived yet, so the clear error (for --dest and in place).
    for dest in (str(tmp_path / "dest_past"), None):
        with pytest.raises(ReplayError, match=r"is past what bronze holds \(" + str(covered) + r"\); run `slotlake "
                                              r"sync src` first"):
            run_replay(spark, cfg, request("src", str(start), str(covered + 1), None, dest))

    # The next sync continues exactly from there.
    _sql(pg_db, "UPDATE acct SET owner = 'later' WHERE id = 3")
    extract(cfg, src)
    run_decode(spark, cfg, "src")
    run_merge(spark, cfg, "src")
    assert_gold_equals_pg(paths.gold("public", "acct"), pg_db, "public.acct")
