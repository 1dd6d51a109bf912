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
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import yaml

from oracle import assert_gold_equals_pg
from slotlake.config import load_config
from slotlake.decode.job import run_decode
from slotlake.lake import LakePaths
from slotlake.merge.job import run_merge
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight
from slotlake_dev.airflow_local import airflow_bin, local_airflow_env, migrate, run_airflow

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow]

DAG_ID = "slotlake_replay__src"
PHASES = [
    ["INSERT INTO acct SELECT g, 'owner ' || g, g FROM generate_series(11, 20) g",
     "UPDATE acct SET balance = balance * 2 WHERE id <= 5"],
    ["DELETE FROM acct WHERE id IN (3, 13)", "UPDATE acct SET id = 300 WHERE id = 4"],
    ["UPDATE acct SET owner = 'late' WHERE id > 15", "INSERT INTO acct VALUES (99, 'last', NULL)"],
]


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return get_spark("slotlake-test-replay-airflow", "local[2]", {"spark.sql.shuffle.partitions": "2"})


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        for s in statements:
            conn.execute(s)


def _server_now(dsn: str) -> datetime:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0].astimezone(UTC)


def _sleep_past(dsn: str, moment: datetime) -> None:
    """Sleep until the server clock (which stamps the commits) is past `moment` by a second."""
    while (left := (moment - _server_now(dsn)).total_seconds() + 1) > 0:
        time.sleep(min(left, 5))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_sessions(sessions: set[int]) -> None:
    """SIGKILL whatever is left in these sessions (a task's process that outlived the scheduler that started it)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            session = int(stat.read_text().rsplit(")", 1)[1].split()[3])  # fields after "(comm)": state ppid pgrp sid
        except (OSError, IndexError, ValueError):
            continue
        if session in sessions:
            try:
                os.kill(int(stat.parent.name), 9)
            except ProcessLookupError:
                pass


def _wait_until_serving(port: int, proc: subprocess.Popen, log: Path) -> None:
    """Until the API server answers HTTP (any status) on 127.0.0.1:`port`."""
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=30).close()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            pass
        assert proc.poll() is None, f"airflow api-server exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"airflow api-server did not answer in 10 min:\n{log.read_text()[-3000:]}"
        time.sleep(2)


def _runs(env: dict[str, str]) -> list[dict]:
    out = run_airflow(env, "dags", "list-runs", DAG_ID, "-o", "json", check=False).stdout
    for line in reversed(out.splitlines()):  # log lines (also starting with "[") may precede the JSON
        if line.startswith("[{") or line.strip() == "[]":
            return json.loads(line)
    return []


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
    _sql(pg_db, "CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(10,2))",
         "INSERT INTO acct SELECT g, 'owner ' || g, g FROM generate_series(1, 10) g", "CREATE SCHEMA recorded")
    run_preflight(cfg, src)  # slot + initial copy

    # Three minutes of changes; the state at each minute boundary is recorded just after it.
    now = _server_now(pg_db)
    b0 = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    _sleep_past(pg_db, b0)
    for i, phase in enumerate(PHASES, start=1):
        _sql(pg_db, *phase)
        _sleep_past(pg_db, b0 + timedelta(minutes=i))
        _sql(pg_db, f"CREATE TABLE recorded.acct_{i} AS SELECT * FROM acct")
    extract(cfg, src)
    run_decode(spark, cfg, "src")
    run_merge(spark, cfg, "src")
    assert_gold_equals_pg(spark, paths.gold("public", "acct"), pg_db, "public.acct")

    home = tmp_path / "airflow"
    port = _free_port()
    env = local_airflow_env(home, cfg_path)
    env.update({
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": "slotlake-test-only",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
        "AIRFLOW__CORE__PARALLELISM": "2",
        # A task's first call to the execution API can take more than the default 5 s on a loaded 2-core machine
        # (a cold API server on SQLite); the task then fails before it starts.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
    })
    migrate(env)
    run_airflow(env, "dags", "reserialize")
    run_airflow(env, "dags", "unpause", DAG_ID)  # queued runs of a paused DAG never start
    dest = tmp_path / "dest"
    # The backfill is created before the scheduler and API server start: with SQLite as the metadata DB a CLI write
    # racing the scheduler's writes can fail with "database is locked" on a loaded machine.
    run_airflow(env, "backfill", "create", "--dag-id", DAG_ID, "--from-date", b0.isoformat(),
                "--to-date", (b0 + timedelta(minutes=2)).isoformat(), "--reprocess-behavior", "completed",
                "--dag-run-conf", json.dumps({"dest": str(dest)}))
    log = open(home / "processes.log", "w")
    procs: list[subprocess.Popen] = []
    try:
        # The API server first, serving before the scheduler hands it a task (tasks call its execution API).
        for cmd in (["api-server", "--port", str(port)], ["scheduler"]):
            procs.append(subprocess.Popen([airflow_bin(), *cmd], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            if cmd[0] == "api-server":
                _wait_until_serving(port, procs[0], home / "processes.log")
        deadline = time.monotonic() + 1800  # three spark-submits; ~3-6 min each on a loaded 2-core machine
        while True:
            backfill = [r for r in _runs(env) if r["run_id"].startswith("backfill__")]
            if len(backfill) == 3 and all(r["state"] in ("success", "failed") for r in backfill):
                break
            if any(r["state"] == "failed" for r in backfill):
                break  # the gate keeps later intervals waiting on a failed one: they would never finish
            assert time.monotonic() < deadline, f"backfill did not finish: {backfill}"
            time.sleep(10)
    finally:
        for p in procs:
            os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        _kill_sessions({p.pid for p in procs})
        log.close()
    assert sorted((r["logical_date"][:16], r["state"]) for r in backfill) == [
        ((b0 + timedelta(minutes=i)).isoformat()[:16], "success") for i in range(3)], (home / "processes.log")
    for i in range(1, 4):
        end = (b0 + timedelta(minutes=i)).strftime("%Y%m%dT%H%M%SZ")
        out = Path(dest, end, "public", "acct")
        assert out.is_dir(), f"no replay output for the interval ending {end}"
        assert_gold_equals_pg(spark, str(out), pg_db, f"recorded.acct_{i}")
