"""Recover's paths with real PostgreSQL, Spark and Delta, each result compared with the recorded state row by row:
history switched on later and only for one table (`history: [public.acct]` after the second sync), and a
`resync` in the middle of the archive.

The workload of test_recover.py runs (points 0-4; syncs after steps 2 and 4). After step 2's sync the config
gains `history: [public.acct]`: acct's history starts at step 4's merge from gold's rows at step 2's end, so
points 0-2 lie before it (replay) and 3-4 after it (acct from history, ev by replay at the same commit LSN).
These recoveries are made before the resync (they are what a user got then) and kept on the Lake. Then
`resync src` (new slot, new copy, gold replaced), more changes and syncs (points 5, 6): every point before and
after the resync must still recover exactly; acct's history restarts from the resync's gold, so points before
the resync are replayed from the old slot's archive.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from oracle import assert_gold_equals_pg
from slotlake.lake import LakePaths
from slotlake.source.snapshot import resync
from slotlake.spark.history_job import history_coverage
from slotlake.spark.snapshot_job import load_snapshots

from integration.test_recover import (
    TABLES,
    Lake,
    _record,
    _recover,
    _sql,
    _sync,
    assert_pg_tables_equal,
    workload_lake,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

ACCT = ("public.acct",)
HISTORY_FROM_STEP = 2  # history is switched on after this step's sync


def _enable_acct_history(i: int, config_path: Path) -> None:
    if i == HISTORY_FROM_STEP:
        config_path.write_text(config_path.read_text() + "    history: [public.acct]\n")


def _assert_recovered(spark, lake: Lake, dest: str, i: int) -> None:
    for t in TABLES:
        schema, table = t.split(".")
        assert_gold_equals_pg(spark, f"{dest}/{schema}/{table}", lake.dsn, f"recorded.{table}_{i}")


@pytest.fixture(scope="module")
def rlake(pg_server, spark, tmp_path_factory) -> Lake:
    home = tmp_path_factory.mktemp("recover_paths")
    workload = workload_lake(pg_server, spark, home, after_sync=_enable_acct_history)
    lake = next(workload)
    try:
        paths = LakePaths.of(lake.cfg.lake, "src")
        lake.history_before_resync = history_coverage(spark, paths.gold_history("public", "acct"))
        lake.before_resync = {}  # point -> (result, Delta dest) of a recovery made before the resync
        for i in range(len(lake.points)):
            dest = str(home / f"before_resync_{i}")
            lake.before_resync[i] = (_recover(spark, lake, str(lake.points[i][0]), dest), dest)
        lake.resync = resync(lake.cfg, lake.cfg.source("src"))
        load_snapshots(spark, lake.cfg, "src")  # what `slotlake resync` runs next (the snapshot app)
        _sql(lake.dsn, "UPDATE acct SET owner = 'post' WHERE id IN (1, 4)",  # TOAST note unchanged on 4
             "DELETE FROM acct WHERE id = 5",
             "UPDATE acct SET id = 300 WHERE id = 100",
             "INSERT INTO acct VALUES (5000, 'new', 2, NULL, 'y')",
             "INSERT INTO ev VALUES ('e', 5), ('e', 5)",
             "DELETE FROM ev WHERE kind = 'd'")
        lake.points.append(_record(lake.dsn, 5))
        _sync(spark, lake.cfg)
        _sql(lake.dsn, "UPDATE acct SET balance = 99 WHERE id = 300",
             "DELETE FROM ev WHERE ctid = (SELECT min(ctid) FROM ev WHERE kind = 'e')")
        lake.points.append(_record(lake.dsn, 6))
        _sync(spark, lake.cfg)
        yield lake
    finally:
        workload.close()  # drops the database


def test_history_enabled_later_and_for_one_table_replays_before_its_start(spark, rlake):
    paths = LakePaths.of(rlake.cfg.lake, "src")
    start = rlake.history_before_resync
    assert start is not None, "acct's history should exist after step 4's sync"
    # it started at the second sync's watermark: after point 2's commits, before point 3's
    assert rlake.points[HISTORY_FROM_STEP][0] <= start.history_from < rlake.points[HISTORY_FROM_STEP + 1][0]
    assert history_coverage(spark, paths.gold_history("public", "ev")) is None  # only acct keeps history
    for i, (result, dest) in rlake.before_resync.items():
        expected = ACCT if i > HISTORY_FROM_STEP else ()
        assert result.from_history == expected, i  # before history's start: replay; after: acct from history
        assert [t.table for t in result.tables] == TABLES
        _assert_recovered(spark, rlake, dest, i)  # acct (history) and ev (replay) at one commit LSN


def test_recover_before_and_after_a_resync_into_delta(spark, rlake, tmp_path):
    generation = rlake.resync.snapshot.generation
    assert rlake.points[4][0] < generation < rlake.points[5][0]
    for i in range(len(rlake.points)):
        dest = str(tmp_path / f"lsn_{i}")
        result = _recover(spark, rlake, str(rlake.points[i][0]), dest)
        # acct's history restarted from the resync's gold: points before the resync are replayed
        assert result.from_history == (ACCT if i > 4 else ()), i
        _assert_recovered(spark, rlake, dest, i)
    for i in (4, 6):  # by time as well
        dest = str(tmp_path / f"time_{i}")
        _recover(spark, rlake, rlake.points[i][1].isoformat(), dest)
        _assert_recovered(spark, rlake, dest, i)


def test_recover_before_and_after_a_resync_into_postgres(spark, rlake):
    for i in (3, 5):
        result = _recover(spark, rlake, str(rlake.points[i][0]), rlake.dsn, into_schema=f"resync_{i}")
        assert result.target == "postgres"
        for t in ("acct", "ev"):
            assert_pg_tables_equal(rlake.dsn, f"resync_{i}.{t}", f"recorded.{t}_{i}")
