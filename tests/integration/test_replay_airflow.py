"""A real Airflow backfill of `slotlake_replay__<source>`: scheduler + API server running, `airflow backfill
create` over several recorded data intervals, each run's --dest output checked against PostgreSQL as it was at
the end of its interval.

Commit timestamps are real time, so the source's schedule (which sets the replay DAG's data intervals) is every
minute here, and the workload changes the table in three consecutive minutes, recording PostgreSQL's state
(`CREATE TABLE recorded.acct_<i> AS ...`, an unpublished schema) just after each minute boundary. Production uses
the default hourly schedule; nothing in the DAG or the replay depends on the interval's length.
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from oracle import assert_gold_equals_pg
from pgclock import run_sql, server_now, sleep_past
from slotlake.config import load_config
from slotlake.decode.job import run_decode
from slotlake.lake import LakePaths
from slotlake.merge.job import run_merge
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight
from slotlake_dev.airflow_local import AirflowServers, free_port, local_airflow_env, migrate, run_airflow, server_env

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]

DAG_ID = "slotlake_replay__src"
PHASES = [
    ["INSERT INTO acct SELECT g, 'owner ' || g, g FROM generate_series(11, 20) g",
     "UPDATE acct SET balance = balance * 2 WHERE id <= 5"],
    ["DELETE FROM acct WHERE id IN (3, 13)", "UPDATE acct SET id = 300 WHERE id = 4"],
    ["UPDATE acct SET owner = 'late' WHERE id > 15", "INSERT INTO acct VALUES (99, 'last', NULL)",
     "TRUNCATE acct", "INSERT INTO acct SELECT g, 'again ' || g, g FROM generate_series(1, 6) g",
     "ALTER TABLE acct ADD COLUMN note text", "INSERT INTO acct VALUES (100, 'noted', 1, 'n')"],
]


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return get_spark("slotlake-test-replay-airflow", "local[2]", {"spark.sql.shuffle.partitions": "2"})


# The backfill's own deadline (below) comes first and says which runs are missing; the test's whole timeout
# (pyproject's 1800 s) would also count the minute-boundary waits, the initial sync and the readers' check.
@pytest.mark.timeout(2700)
def test_backfill_through_airflow_rebuilds_each_interval(spark, pg_db, tmp_path):
    cfg_path = tmp_path / "slotlake.yaml"
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    cfg_path.write_text(yaml.safe_dump({
        "lake": str(tmp_path / "lake"),
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "sources": {"src": {"dsn": pg_db, "tables": ["public.acct"], "schedule": "* * * * *",
                            "start_date": today}}}))
    cfg = load_config(str(cfg_path))
    src = cfg.source("src")
    paths = LakePaths.of(cfg.lake, "src")
    run_sql(pg_db, "CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(10,2))",
         "INSERT INTO acct SELECT g, 'owner ' || g, g FROM generate_series(1, 10) g", "CREATE SCHEMA recorded")
    run_preflight(cfg, src)  # slot + initial copy

    home = tmp_path / "airflow"
    env = server_env(local_airflow_env(home, cfg_path), free_port())
    # Only the backfill's runs: the scheduler creates no cron runs of the unpaused DAG (one a minute here, each
    # skipped by the gate, but each a few task processes while the backfill runs)
    env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "False"

    def airflow_setup() -> None:
        migrate(env)
        run_airflow(env, "dags", "reserialize")
        run_airflow(env, "dags", "unpause", DAG_ID)  # queued runs of a paused DAG never start

    # Airflow's database and DAGs are set up while the test waits for the minute boundaries below.
    with ThreadPoolExecutor(max_workers=1) as pool:
        setup = pool.submit(airflow_setup)
        # Three minutes of changes; the state at each minute boundary is recorded just after it. The first minute
        # is the current one when enough of it is left for phase 1 to commit inside it (one wait less).
        now = server_now(pg_db)
        b0 = now.replace(second=0, microsecond=0)
        if (b0 + timedelta(minutes=1) - now).total_seconds() < 20:
            b0 += timedelta(minutes=1)
            sleep_past(pg_db, b0)
        for i, phase in enumerate(PHASES, start=1):
            run_sql(pg_db, *phase)
            assert server_now(pg_db) < b0 + timedelta(minutes=i), f"phase {i} ran past its minute"
            sleep_past(pg_db, b0 + timedelta(minutes=i))
            run_sql(pg_db, f"CREATE TABLE recorded.acct_{i} AS SELECT * FROM acct")
        extract(cfg, src)
        run_decode(spark, cfg, "src")
        run_merge(spark, cfg, "src")
        assert_gold_equals_pg(paths.gold("public", "acct"), pg_db, "public.acct")
        setup.result()
    dest = tmp_path / "dest"
    # The backfill is created before the scheduler and API server start: with SQLite as the metadata DB a CLI write
    # racing the scheduler's writes can fail with "database is locked" on a loaded machine.
    run_airflow(env, "backfill", "create", "--dag-id", DAG_ID, "--from-date", b0.isoformat(),
                "--to-date", (b0 + timedelta(minutes=2)).isoformat(), "--reprocess-behavior", "completed",
                "--dag-run-conf", json.dumps({"dest": str(dest)}))
    with AirflowServers(env) as servers:
        deadline = time.monotonic() + 1800  # two spark-submits; ~3-6 min each on a loaded 2-core machine
        while True:
            backfill = [r for r in servers.dag_runs(DAG_ID) if r["run_id"].startswith("backfill__")]
            if len(backfill) == 3 and all(r["state"] in ("success", "failed") for r in backfill):
                break
            if any(r["state"] == "failed" for r in backfill):
                break  # the gate keeps later intervals waiting on a failed one: they would never finish
            assert time.monotonic() < deadline, f"backfill did not finish: {backfill}"
            time.sleep(10)
    assert sorted((r["logical_date"][:16], r["state"]) for r in backfill) == [
        ((b0 + timedelta(minutes=i)).isoformat()[:16], "success") for i in range(3)], servers.log_path
    for i in range(1, 4):
        end = (b0 + timedelta(minutes=i)).strftime("%Y%m%dT%H%M%SZ")
        out = Path(dest, end, "public", "acct")
        assert out.is_dir(), f"no replay output for the interval ending {end}"
        assert_gold_equals_pg(str(out), pg_db, f"recorded.acct_{i}")
    # The first two intervals are replayed without a JVM (their Spark task skipped; the second over phase 2's key
    # change); the last re-decodes from the copy's load (the one sync ran after every phase) over phase 3's new
    # column, which only Spark merges (its TRUNCATE the in-process merge would take).
    states = {}
    for r in sorted(backfill, key=lambda r: r["logical_date"]):
        out = run_airflow(env, "tasks", "states-for-dag-run", DAG_ID, r["run_id"], "-o", "json").stdout
        rows = json.loads(next(x for x in reversed(out.splitlines()) if x.startswith("[")))
        states[r["logical_date"][:16]] = {t["task_id"]: t["state"] for t in rows}
    assert [(s["in_process"], s["replay"]) for s in states.values()] == [
        ("success", "skipped"), ("success", "skipped"), ("success", "success")], states
