"""The history table (`history: true`) with real PostgreSQL, Spark and Delta: the workload of test_recover.py
(inserts, updates with unchanged TOAST, a key change, deletes, TRUNCATE, ADD/DROP COLUMN, FULL duplicates) with
each table's exact state recorded at several points. History as-of queries, read with Spark and with delta-rs,
must equal the recorded states row by row; recover must read them from history (and still equal them when
bronze is gone); a sync killed between the history and the gold commit must neither lose nor repeat a version.

History starts at the first merge with changes, from the gold rows the initial copy loaded: the path of enabling
`history` on a table whose gold already exists.
"""
from __future__ import annotations

import collections
import shutil
import subprocess

import psycopg
import pytest

from clirun import slotlake
from integration.test_recover import (
    TABLES,
    Lake,
    _record,
    _recover,
    _sql,
    assert_pg_tables_equal,
    workload_lake,
)
from oracle import assert_gold_equals_pg, pg_columns
from slotlake import delta_log
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.history_job import history_as_of, history_coverage
from slotlake.merge.plan import VALID_FROM_LSN_COL, VALID_TO_LSN_COL
from slotlake.names import spark_ident
from slotlake.recover.point_job import resolve_as_of

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def hlake(pg_server, spark, tmp_path_factory) -> Lake:
    yield from workload_lake(pg_server, spark, tmp_path_factory.mktemp("history"), "    history: true\n")


def _paths(lake: Lake) -> LakePaths:
    return LakePaths.of(lake.cfg.lake, "src")


def _columns(dsn: str, recorded: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [c for c, _ in pg_columns(conn, recorded)]


def _commit_lsn(spark, lake: Lake, i: int) -> Lsn:
    return resolve_as_of(spark, _paths(lake).changes, lake.points[i][0])[0]


def assert_history_as_of(spark, lake: Lake, i: int, tmp_path) -> None:
    """History at point i, as Spark and as delta-rs (pyarrow filter) read it, equals the recorded tables."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    lsn = _commit_lsn(spark, lake, i)
    for t in TABLES:
        schema, table = t.split(".")
        recorded = f"recorded.{table}_{i}"
        cols = _columns(lake.dsn, recorded)  # the table's columns at the point (history keeps every column)
        path = _paths(lake).gold_history(schema, table)
        spark_out = str(tmp_path / f"spark_{table}_{i}")
        history_as_of(spark, path, lsn).select(*[spark_ident(c) for c in cols]).write.format("delta").save(spark_out)
        assert_gold_equals_pg(spark_out, lake.dsn, recorded)

        rows = DeltaTable(path).to_pyarrow_table()
        at = pc.and_(pc.less_equal(rows[VALID_FROM_LSN_COL], lsn.value),
                     pc.fill_null(pc.greater(rows[VALID_TO_LSN_COL], lsn.value), True))
        rs_out = str(tmp_path / f"deltars_{table}_{i}")
        write_deltalake(rs_out, rows.filter(at).select(cols))
        assert_gold_equals_pg(rs_out, lake.dsn, recorded)


def assert_versions_consistent(spark, lake: Lake) -> None:
    """No version twice, at most one open version per acct key, FULL copies numbered 1..n per row."""
    acct = spark.read.format("delta").load(_paths(lake).gold_history("public", "acct"))
    assert acct.groupBy("id", VALID_FROM_LSN_COL).count().where("count > 1").count() == 0
    assert acct.where(f"{VALID_TO_LSN_COL} IS NULL").groupBy("id").count().where("count > 1").count() == 0
    ev = spark.read.format("delta").load(_paths(lake).gold_history("public", "ev"))
    open_copies = collections.defaultdict(list)
    for r in ev.where(f"{VALID_TO_LSN_COL} IS NULL").collect():
        open_copies[(r["kind"], r["qty"])].append(r["_slotlake_dup"])
    assert all(sorted(d) == list(range(1, len(d) + 1)) for d in open_copies.values()), open_copies
    for t in TABLES:  # history ends where gold ends
        schema, table = t.split(".")
        gold = delta_log.latest_slotlake_commit(_paths(lake).gold(schema, table), "merge")
        hist = delta_log.latest_slotlake_commit(_paths(lake).gold_history(schema, table), "history")
        assert hist.end_lsn == gold.end_lsn, t


def test_history_as_of_each_point_equals_the_recorded_state(spark, hlake, tmp_path):
    for t in TABLES:  # history started from the copy's rows, at the copy's watermark (before every point)
        coverage = history_coverage(spark, _paths(hlake).gold_history(*t.split(".")))
        assert coverage is not None and coverage.history_from < hlake.points[0][0]
    for i in range(len(hlake.points)):
        assert_history_as_of(spark, hlake, i, tmp_path)
    assert_versions_consistent(spark, hlake)
    # a key change closes the old key's version and opens one under the new key, TOAST note carried over
    acct = spark.read.format("delta").load(_paths(hlake).gold_history("public", "acct"))
    moved = acct.where("id = 100").orderBy(VALID_FROM_LSN_COL).collect()
    old = acct.where("id = 2").orderBy(VALID_FROM_LSN_COL).collect()
    assert old[-1][VALID_TO_LSN_COL] == moved[0][VALID_FROM_LSN_COL] and moved[0]["_slotlake_op"] == "U"
    assert moved[0]["note"] is not None and moved[0]["note"] == old[-1]["note"]


def test_recover_reads_history_and_needs_no_bronze(spark, hlake, tmp_path):
    for i in range(len(hlake.points)):
        dest = str(tmp_path / f"lsn_{i}")
        result = _recover(spark, hlake, str(hlake.points[i][0]), dest)
        assert result.from_history == tuple(TABLES)  # the history path, for every table
        for t in TABLES:
            schema, table = t.split(".")
            assert_gold_equals_pg(f"{dest}/{schema}/{table}", hlake.dsn, f"recorded.{table}_{i}")
    result = _recover(spark, hlake, str(hlake.points[3][0]), hlake.dsn, into_schema="hist_3")
    assert result.from_history == tuple(TABLES)
    for t in ("acct", "ev"):
        assert_pg_tables_equal(hlake.dsn, f"hist_3.{t}", f"recorded.{t}_3")
    # Without bronze a replay cannot re-decode anything: only history can answer (time points skip the
    # archive-coverage check an LSN point makes).
    bronze = _paths(hlake).bronze
    shutil.move(bronze, bronze + ".away")
    try:
        for i in (1, 3):
            dest = str(tmp_path / f"nobronze_{i}")
            result = _recover(spark, hlake, hlake.points[i][1].isoformat(), dest)
            assert result.from_history == tuple(TABLES)
            for t in TABLES:
                schema, table = t.split(".")
                assert_gold_equals_pg(f"{dest}/{schema}/{table}", hlake.dsn, f"recorded.{table}_{i}")
    finally:
        shutil.move(bronze + ".away", bronze)


def _cli_sync(lake: Lake, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    return slotlake(lake.config_path, "sync", "src", failpoint=failpoint)


def test_a_sync_killed_between_history_and_gold_loses_and_repeats_nothing(spark, hlake, tmp_path):
    # runs last in the module: it adds points 5 and 6
    _sql(hlake.dsn, "UPDATE acct SET balance = 7 WHERE id IN (100, 4)",  # TOAST note unchanged on 100 and 4
         "UPDATE acct SET id = 200 WHERE id = 100", "DELETE FROM acct WHERE id = 5",
         "INSERT INTO ev VALUES ('d', 4), ('d', 4)", "DELETE FROM ev WHERE kind = 'c'")
    hlake.points.append(_record(hlake.dsn, 5))
    crashed = _cli_sync(hlake, "merge_after_history")
    assert crashed.returncode != 0, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    ahead = []
    for t in TABLES:
        schema, table = t.split(".")
        gold = delta_log.latest_slotlake_commit(_paths(hlake).gold(schema, table), "merge")
        hist = delta_log.latest_slotlake_commit(_paths(hlake).gold_history(schema, table), "history")
        if Lsn.parse(hist.end_lsn) > Lsn.parse(gold.end_lsn):
            ahead.append(t)
    assert ahead, "the failpoint should leave a history table ahead of its gold table"
    # more changes before the re-run, so it ends later than the crashed run
    _sql(hlake.dsn, "UPDATE acct SET owner = 'again' WHERE id IN (200, 4)", "INSERT INTO ev VALUES ('d', 4)",
         "UPDATE acct SET id = 201 WHERE id = 200")
    hlake.points.append(_record(hlake.dsn, 6))
    ok = _cli_sync(hlake)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-3000:]
    for t in TABLES:  # gold itself is right (acct's gold keeps the dropped column `legacy`: compare the live ones)
        schema, table = t.split(".")
        live = str(tmp_path / f"gold_{table}")
        spark.read.format("delta").load(_paths(hlake).gold(schema, table)).select(
            *[spark_ident(c) for c in _columns(hlake.dsn, t)]).write.format("delta").save(live)
        assert_gold_equals_pg(live, hlake.dsn, t)
    for i in (4, 5, 6):
        assert_history_as_of(spark, hlake, i, tmp_path)
    assert_versions_consistent(spark, hlake)
    result = _recover(spark, hlake, str(hlake.points[5][0]), str(tmp_path / "after_crash"))
    assert result.from_history == tuple(TABLES)
    for t in TABLES:
        schema, table = t.split(".")
        assert_gold_equals_pg(str(tmp_path / "after_crash" / schema / table), hlake.dsn,
                              f"recorded.{table}_5")
