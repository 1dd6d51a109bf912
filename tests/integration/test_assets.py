"""Gold tables as Airflow Assets, end to end: one `airflow dags test` of the sync DAG changes two tables of a source
without a `tables:` list (a third stays as it was), its in_process task (which merges them without a JVM: nothing
is left for the Spark merge task, which records the events of the runs it merges, tests/integration/test_dags.py)
records one asset event per changed table through the alias `slotlake_gold__src`, and a real scheduler (+ API
server) starts the downstream DAG scheduled on `Asset("slotlake://src/public/orders")` only, whose task sees the
event's extra.

The initial copy is loaded in-process beforehand (the pytest session's Spark), so the one DAG run's counts are
exactly the rows changed in PostgreSQL.
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from deltalake import DeltaTable

from slotlake.config import load_config
from slotlake.decode.job import run_decode
from slotlake.lake import LakePaths
from slotlake.merge.job import run_merge
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight
from slotlake_dev.airflow_local import (
    AirflowServers,
    dags_test,
    free_port,
    local_airflow_env,
    migrate,
    run_airflow,
    server_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.airflow, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CONSUMER = "orders_consumer"
ORDERS_URI = "slotlake://src/public/orders"

# The downstream DAG a user would write; its task writes the triggering events it was given to a file.
CONSUMER_DAG = '''
import json
from airflow.sdk import DAG, Asset, task

ORDERS = Asset("{uri}")

with DAG("{dag_id}", schedule=[ORDERS], catchup=False, tags=["slotlake-test"]):
    @task
    def consume(triggering_asset_events=None):
        events = [{{"uri": ORDERS.uri, "extra": dict(e.extra), "source_dag_id": e.source_dag_id,
                    "source_task_id": e.source_task_id, "aliases": [a.name for a in e.source_aliases]}}
                  for e in triggering_asset_events[ORDERS]]
        with open({out!r}, "w") as f:
            json.dump(events, f)

    consume()
'''


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _watermark(path: str) -> tuple[str, int]:
    """A gold table's applied LSN and version as delta-rs reads them (the newest commit's slotlake userMetadata)."""
    table = DeltaTable(path)
    [last] = table.history(1)
    return json.loads(last["userMetadata"])["slotlake"]["end_lsn"], table.version()


def _events(db: Path) -> dict[str, dict]:
    """Every asset event in the metadata DB, by asset URI (one each expected), with its source and aliases."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT a.uri, e.extra, e.source_dag_id, e.source_task_id, "
            "(SELECT group_concat(al.name) FROM asset_alias_asset_event x JOIN asset_alias al ON al.id = x.alias_id "
            " WHERE x.event_id = e.id) FROM asset_event e JOIN asset a ON a.id = e.asset_id ORDER BY e.id").fetchall()
    uris = [r[0] for r in rows]
    assert len(uris) == len(set(uris)), f"more than one event for an asset: {uris}"
    return {uri: {"extra": json.loads(extra), "source": (dag_id, task_id), "aliases": aliases}
            for uri, extra, dag_id, task_id, aliases in rows}


def _consumer_runs(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT run_type, state FROM dag_run WHERE dag_id = ?", (CONSUMER,)).fetchall()


@pytest.mark.timeout(1800)
def test_changed_gold_tables_trigger_the_downstream_dag(spark, pg_db, tmp_path):
    cfg_path = tmp_path / "slotlake.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "lake": str(tmp_path / "lake"),
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "sources": {"src": {"dsn": pg_db}}}))  # no tables: every table, known only at run time
    cfg = load_config(str(cfg_path))
    paths = LakePaths.of(cfg.lake, "src")
    _sql(pg_db,
         "CREATE TABLE orders (id int PRIMARY KEY, item text, qty int)",
         "CREATE TABLE customers (id int PRIMARY KEY, name text)",
         "CREATE TABLE products (id int PRIMARY KEY, name text)",
         "INSERT INTO orders SELECT g, 'item ' || g, g FROM generate_series(1, 10) g",
         "INSERT INTO customers SELECT g, 'customer ' || g FROM generate_series(1, 5) g",
         "INSERT INTO products SELECT g, 'product ' || g FROM generate_series(1, 5) g")
    run_preflight(cfg, cfg.source("src"))  # slot + initial copy, loaded here: the DAG run's counts are the changes
    extract(cfg, cfg.source("src"))
    run_decode(spark, cfg, "src")
    run_merge(spark, cfg, "src")
    _sql(pg_db,
         "INSERT INTO orders VALUES (11, 'new', 1), (12, 'new', 2)",  # 2 inserted
         "UPDATE orders SET qty = qty + 100 WHERE id IN (1, 2, 3)",  # 3 updated
         "DELETE FROM orders WHERE id = 10",  # 1 deleted
         "UPDATE customers SET name = 'renamed' WHERE id = 1")  # the consumer does not depend on customers

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "slotlake_dags.py").symlink_to(ROOT / "dags" / "slotlake_dags.py")
    out = tmp_path / "consumer-events.json"
    (dags / "orders_consumer.py").write_text(CONSUMER_DAG.format(uri=ORDERS_URI, dag_id=CONSUMER, out=str(out)))
    home = tmp_path / "airflow"
    env = server_env(local_airflow_env(home, cfg_path), free_port())
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    db = home / "airflow.db"
    migrate(env)
    run_airflow(env, "dags", "reserialize")
    run_airflow(env, "dags", "unpause", CONSUMER)  # a paused DAG is not queued by asset events

    started = time.monotonic()
    dags_test(env, "slotlake_sync__src")
    sync_seconds = time.monotonic() - started
    events = _events(db)
    assert set(events) == {ORDERS_URI, "slotlake://src/public/customers"}  # products: unchanged, no event
    for table, counts in (("orders", (2, 3, 1)), ("customers", (0, 1, 0))):
        lsn, version = _watermark(paths.gold("public", table))
        event = events[f"slotlake://src/public/{table}"]
        assert event["extra"] == {"source": "src", "table": f"public.{table}", "applied_lsn": lsn,
                                  "gold_version": version, "inserted": counts[0], "updated": counts[1],
                                  "deleted": counts[2]}, table
        assert event["source"] == ("slotlake_sync__src", "in_process") and event["aliases"] == "slotlake_gold__src"
    assert events[ORDERS_URI]["extra"]["applied_lsn"] == events["slotlake://src/public/customers"]["extra"][
        "applied_lsn"]  # every table of a run reaches the same end LSN

    # The scheduler turns the queued event into a run of the consumer; the API server serves its task.
    started = time.monotonic()
    with AirflowServers(env):
        deadline = time.monotonic() + 600
        while not any(state in ("success", "failed") for _, state in _consumer_runs(db)):
            assert time.monotonic() < deadline, f"no finished {CONSUMER} run in 10 min: {_consumer_runs(db)}"
            time.sleep(3)
    consumer_seconds = time.monotonic() - started
    assert _consumer_runs(db) == [("asset_triggered", "success")], home / "processes.log"
    [seen] = json.loads(out.read_text())
    assert seen == {"uri": ORDERS_URI, "extra": events[ORDERS_URI]["extra"], "source_dag_id": "slotlake_sync__src",
                    "source_task_id": "in_process", "aliases": ["slotlake_gold__src"]}
    print(f"sync DAG run {sync_seconds:.0f}s, consumer run (servers up to success) {consumer_seconds:.0f}s")
