"""Shared fixtures: a real PostgreSQL server per test session, a fresh database per test."""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))

from slotlake.localpg import LocalPostgres  # noqa: E402


@pytest.fixture(scope="session")
def pg_server():
    server = LocalPostgres().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_db(pg_server):
    """A new database (random name) on the session server; returns its DSN. Slots in it are dropped after."""
    name = "t_" + uuid.uuid4().hex[:10]
    pg_server.psql(f"CREATE DATABASE {name}")
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.psql(
            f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{name}' AND NOT active"
        )
        pg_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def spark():
    """One Spark session (one JVM) for the whole pytest session, for tests that use Spark in-process.

    Modules may still define their own `spark` fixture; `get_spark` is get-or-create, so those share this JVM too.
    Tiny test tables: a few partitions instead of Spark's and Delta's production defaults (200 / 50).
    """
    from slotlake.spark.session import get_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    yield get_spark("slotlake-tests", "local[2]", {
        "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"})


# The longest test files (real waits for minute boundaries, a scheduler, crash-and-rerun cycles), started first so
# that with `pytest -n 2 --dist loadfile` (scripts/test.sh) they overlap with the many short ones instead of
# running alone at the end. Measured on 2 idle cores: replay_airflow 380 s, faults 260 s, e2e 200 s, dags 115 s,
# replay 100 s, cli 95 s; everything else under a minute per file.
LONG_FIRST = ["test_replay_airflow.py", "test_faults.py", "test_e2e_workload.py", "test_dags.py", "test_replay.py",
              "test_cli.py", "test_schema_evolution.py", "test_catalog_versions.py", "test_snapshot.py"]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    order = {id(item): n for n, item in enumerate(items)}

    def key(item):
        path = Path(str(item.fspath))
        return (rank.get(path.name, len(rank)) if path.parent.name == "integration" else len(rank), order[id(item)])

    items.sort(key=key)
