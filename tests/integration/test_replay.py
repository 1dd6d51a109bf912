"""Replay with real PostgreSQL, Spark and Delta: each recorded LSN range rebuilt into --dest equals the table as
PostgreSQL held it at the range's end; an in-place replay leaves the lake equal to PostgreSQL and is idempotent.

The PostgreSQL states are recorded at the end of every sync as `CREATE TABLE recorded.<table>_<i> AS SELECT *`
(the `recorded` schema is not published, so recording adds no change to the stream).
"""
from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

import psycopg
import pytest

from oracle import assert_gold_equals_pg
from slotlake.config import parse_config
from slotlake.decode.job import decode_watermark, run_decode
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.job import run_merge
from slotlake.merge.watermarks import delta_watermark, row_count, runs_ends
from slotlake.recover.replay import request
from slotlake.recover.replay_job import run_replay
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TABLES = ["public.acct", "public.ev"]
SETUP = [
    "CREATE TABLE acct (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), note text)",
    "CREATE TABLE ev (kind text, qty int)",
    "ALTER TABLE ev REPLICA IDENTITY FULL",
    "CREATE SCHEMA recorded",
    # rows that exist before the slot: they reach gold through the initial copy
    "INSERT INTO acct SELECT g, 'owner ' || g, g * 10, NULL FROM generate_series(1, 8) g",
    "INSERT INTO ev VALUES ('a', 1), ('a', 1)",
]
PHASES = [
    ["INSERT INTO acct SELECT g, 'owner ' || g, g * 10, 'new' FROM generate_series(9, 20) g",
     "UPDATE acct SET balance = balance + 1 WHERE id <= 5",
     "INSERT INTO ev VALUES ('a', 1), ('b', NULL)"],
    ["UPDATE acct SET id = 100 WHERE id = 1", "DELETE FROM acct WHERE id IN (2, 12)",
     "UPDATE acct SET note = repeat('x', 5000) WHERE id = 3",
     "DELETE FROM ev WHERE ctid = (SELECT min(ctid) FROM ev WHERE kind = 'a')",
     "DELETE FROM acct WHERE id = 4", "INSERT INTO acct VALUES (4, 'back again', 0, NULL)"],
    ["UPDATE acct SET owner = 'renamed' WHERE id > 15", "TRUNCATE ev", "INSERT INTO ev VALUES ('c', 3)",
     "UPDATE acct SET balance = NULL WHERE id = 100"],
]


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return get_spark("slotlake-test-replay", "local[2]", {
        "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"})


def _sql(dsn: str, *statements: str) -> datetime:
    """Run each statement in its own transaction; returns the server clock after the last commit."""
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        for s in statements:
            conn.execute(s)
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def _sync(spark, cfg, name: str) -> Lsn:
    extract(cfg, cfg.source(name))
    run_decode(spark, cfg, name)
    run_merge(spark, cfg, name)
    return decode_watermark(spark, LakePaths.of(cfg.lake, name).changes, name)


def test_replay_of_each_recorded_range_equals_postgres_at_its_end(spark, pg_db, tmp_path):
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"src": {"dsn": pg_db, "tables": TABLES}}})
    paths = LakePaths.of(cfg.lake, "src")
    _sql(pg_db, *SETUP)
    run_preflight(cfg, cfg.source("src"))  # slot + initial copy
    assert _sync(spark, cfg, "src") is None  # loads the copy; no change decoded yet
    ends: list[Lsn] = [delta_watermark(spark, paths.gold("public", "acct"))]  # the copy's: consistent point - 1
    assert ends[0] == delta_watermark(spark, paths.gold("public", "ev")) is not None
    times: list[datetime] = [_sql(pg_db, "SELECT 1")]
    for t in TABLES:
        _sql(pg_db, f"CREATE TABLE recorded.{t.split('.')[1]}_0 AS SELECT * FROM {t}")
    for i, phase in enumerate(PHASES, start=1):
        _sql(pg_db, *phase)
        ends.append(_sync(spark, cfg, "src"))
        times.append(_sql(pg_db, *[f"CREATE TABLE recorded.{t.split('.')[1]}_{i} AS SELECT * FROM {t}"
                                   for t in TABLES]))
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)

    # The bases come from `_runs` and gold's row counts from file statistics, both read with delta-rs: what
    # Spark reads.
    spark_runs: dict = {}
    for r in spark.read.format("delta").load(paths.runs).collect():
        spark_runs.setdefault((r["schema_name"], r["table_name"]), []).append((Lsn(r["run_end_lsn"]),
                                                                               r["gold_version"]))
    assert {k: sorted(v) for k, v in runs_ends(paths.runs).items()} == {k: sorted(v) for k, v in spark_runs.items()}
    assert len(spark_runs[("public", "acct")]) == len(PHASES)  # one per sync (the initial copy's load is not a run)
    for t in TABLES:
        gold = paths.gold(*t.split("."))
        assert row_count(gold) == spark.read.format("delta").load(gold).count() > 0

    # Every recorded range (L[i-1], L[i]] into its own --dest, by LSN.
    for i in range(1, len(ends)):
        dest = str(tmp_path / f"dest_{i}")
        result = run_replay(spark, cfg, request("src", str(ends[i - 1]), str(ends[i]), None, dest))
        assert (result.from_lsn, result.to_lsn) == (ends[i - 1], ends[i]) and not result.in_place
        assert {(r.schema_name, r.table_name) for r in result.tables} == {tuple(t.split(".")) for t in TABLES}
        with psycopg.connect(pg_db) as conn:
            assert {r.table_name: r.rows for r in result.tables} == {
                t: conn.execute(f"SELECT count(*) FROM recorded.{t}_{i}").fetchone()[0] for t in ("acct", "ev")}
        for t in TABLES:
            schema, name = t.split(".")
            assert_gold_equals_pg(f"{dest}/{schema}/{name}", pg_db, f"recorded.{name}_{i}")

    # By time, between the moments phases 1 and 2 were recorded: one table only.
    dest = str(tmp_path / "dest_by_time")
    since = times[1].astimezone(UTC).replace(tzinfo=None).isoformat()  # naive = UTC
    result = run_replay(spark, cfg, request("src", since, times[2].isoformat(), ["public.acct"], dest))
    assert ends[0] < result.from_lsn < ends[1] < result.to_lsn < ends[2]  # last commits before those moments
    assert [r.table_name for r in result.tables] == ["acct"]
    assert_gold_equals_pg(f"{dest}/public/acct", pg_db, "recorded.acct_2")
    assert not os.path.exists(f"{dest}/public/ev")

    # In place, twice: the lake still equals PostgreSQL; silver's rows and watermark are unchanged.
    silver_before = sorted(map(tuple, spark.read.format("delta").load(paths.changes).collect()))
    for _ in range(2):
        result = run_replay(spark, cfg, request("src", str(ends[1]), str(ends[2]), None, None))
        assert result.in_place and (result.from_lsn, result.to_lsn) == (ends[1], ends[2])
        for t in TABLES:
            assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
        assert sorted(map(tuple, spark.read.format("delta").load(paths.changes).collect())) == silver_before
        assert decode_watermark(spark, paths.changes, "src") == ends[-1]
        for t in TABLES:  # rebuilt: a new gold commit that says so, watermark still the silver end
            last = spark.sql(f"DESCRIBE HISTORY delta.`{paths.gold(*t.split('.'))}` LIMIT 1").collect()[0]
            assert '"replay"' in last["userMetadata"] and str(ends[-1]) in last["userMetadata"]
    assert not os.listdir(f"{paths.root}/_replay")  # scratch tables removed
    # the next sync continues from the replayed gold (its watermark is still the silver end)
    _sql(pg_db, "INSERT INTO acct VALUES (500, 'after replay', 1, NULL)")
    _sync(spark, cfg, "src")
    assert_gold_equals_pg(paths.gold("public", "acct"), pg_db, "public.acct")
