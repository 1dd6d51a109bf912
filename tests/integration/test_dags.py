"""The Airflow front end: the DAG file parses cleanly, and one real `airflow dags test` run syncs a real database."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from demo import ROUND_1, ROUND_2, SCHEMA, TABLES  # noqa: E402

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake.config import SPARK_SERVER_ENV  # noqa: E402
from slotlake_dev.airflow_local import dags_test, local_airflow_env, migrate, run_airflow  # noqa: E402


def write_config(path: Path, dsn: str, sources: tuple[str, ...] = ("shop",)) -> Path:
    body = "".join(f"  {s}:\n    dsn: {dsn}\n    tables: [{', '.join(TABLES)}]\n    schedule: \"15 * * * *\"\n"
                   f"    slot: slotlake_{s}\n" for s in sources)
    path.write_text(f"lake: ./lake\nspark: {{master: \"local[2]\"}}\nsources:\n{body}")
    return path


def json_output(stdout: str) -> list:
    """The JSON document of an `airflow ... -o json` command (its warnings go to stdout too)."""
    return json.loads(next(line for line in reversed(stdout.splitlines()) if line.startswith("[")))


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    """One migrated SQLite metadata DB for the module (migrating takes seconds)."""
    home = tmp_path_factory.mktemp("airflow")
    cfg = write_config(home / "placeholder.yaml", "postgresql://nobody@127.0.0.1:1/none")
    migrate(local_airflow_env(home, cfg))
    return home


@pytest.mark.integration
@pytest.mark.airflow
def test_dag_file_parses_without_import_errors(airflow_home, tmp_path):
    cfg = write_config(tmp_path / "slotlake.yaml", "postgresql://nobody@127.0.0.1:1/none", ("shop", "billing"))
    env = local_airflow_env(airflow_home, cfg)
    errors = run_airflow(env, "dags", "list-import-errors", "--local", "-o", "json")
    assert json_output(errors.stdout) == []
    listed = run_airflow(env, "dags", "list", "--local", "-o", "json")
    ids = {d["dag_id"] for d in json_output(listed.stdout)}
    assert {"slotlake_sync__shop", "slotlake_sync__billing"} <= ids


# Loads dags/ with Airflow's DagBag in a child process (so this test process keeps no Airflow state) and prints
# what the tests check as JSON.
_PROBE = """
import json
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": {}}
for dag_id, dag in bag.dags.items():
    tasks = {t.task_id: {"type": type(t).__name__, "application": getattr(t, "application", None),
                         "args": getattr(t, "application_args", None), "conf": getattr(t, "conf", None),
                         "env": getattr(t, "env_vars", None), "conn_id": getattr(t, "_conn_id", None),
                         "op_args": getattr(t, "op_args", None)}
             for t in dag.tasks}
    out["dags"][dag_id] = {"timetable": type(dag.timetable).__name__,
                           "params": {k: dag.params.get_param(k).schema for k in dag.params},
                           "cron": getattr(dag.timetable, "expression", None),
                           "tz": str(getattr(dag.timetable, "timezone", None)),
                           "max_active_runs": dag.max_active_runs, "catchup": dag.catchup,
                           "order": [t.task_id for t in dag.topological_sort()], "tasks": tasks,
                           "downstream": {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks}}
print("PROBE" + json.dumps(out, default=str))
"""


def _asset_events(home: Path) -> list[tuple[str, str]]:
    """(asset URI, source task id) of every asset event in the module's metadata DB, oldest first."""
    import sqlite3

    with sqlite3.connect(home / "airflow.db") as conn:
        return conn.execute("SELECT a.uri, e.source_task_id FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                            "ORDER BY e.id").fetchall()


def load_dagbag(env: dict[str, str]) -> dict:
    import subprocess

    p = subprocess.run([sys.executable, "-c", _PROBE % str(ROOT / "dags")], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("PROBE"))
    return json.loads(line[len("PROBE"):])


@pytest.mark.integration
@pytest.mark.airflow
@pytest.mark.spark_submit  # the SparkSubmitOperator tasks a config without spark.server gets
def test_dag_shape_schedule_and_spark_submit(airflow_home, tmp_path):
    cfg = write_config(tmp_path / "slotlake.yaml", "postgresql://nobody@127.0.0.1:1/none")
    bag = load_dagbag(local_airflow_env(airflow_home, cfg))
    assert bag["errors"] == {}
    dag = bag["dags"]["slotlake_sync__shop"]
    assert dag["max_active_runs"] == 1 and dag["catchup"] is False
    assert (dag["timetable"], dag["cron"], dag["tz"]) == ("CronDataIntervalTimetable", "15 * * * *", "UTC")
    assert dag["order"] == ["preflight", "extract", "in_process", "decode", "merge", "report"]
    assert dag["tasks"]["in_process"]["type"] == "_BranchPythonDecoratedOperator"
    assert dag["downstream"]["in_process"] == ["decode", "merge", "report"]  # what the branch can follow
    for stage in ("decode", "merge"):
        t = dag["tasks"][stage]
        assert t["type"] == "SparkSubmitOperator"
        assert t["application"] == str(ROOT / "plugins" / "slotlake" / "spark_apps" / f"{stage}.py")
        assert t["args"] == ["--config", str(cfg.resolve()), "--source", "shop"]
        assert any("delta-spark" in j and j.endswith(".jar") for j in t["conf"]["spark.jars"].split(","))
        python = Path(t["env"]["PYSPARK_PYTHON"])  # this venv's interpreter (python or python3)
        assert python.parent == ROOT / ".venv" / "bin" and python.name.startswith("python")
        assert t["conn_id"] == "slotlake_spark"
    assert bag["dags"]["slotlake_replay__shop"]["order"] == ["gate", "in_process", "replay"]
    replay = bag["dags"]["slotlake_replay__shop"]["tasks"]["replay"]
    here = bag["dags"]["slotlake_replay__shop"]["tasks"]["in_process"]
    assert here["type"] == "PythonOperator" and here["op_args"] == replay["args"], here  # the same rendered args
    assert replay["type"] == "SparkSubmitOperator"
    assert replay["application"] == str(ROOT / "plugins" / "slotlake" / "spark_apps" / "replay.py")
    assert replay["args"][:4] == ["--config", str(cfg.resolve()), "--source", "shop"]
    assert replay["args"][4:6] == ["--from", "{{ data_interval_start.isoformat() }}"]
    optimize = bag["dags"]["slotlake_optimize__shop"]  # gold's compaction: one Python task, daily by default
    assert optimize["order"] == ["optimize"] and optimize["tasks"]["optimize"]["type"] == "_PythonDecoratedOperator"
    assert (optimize["timetable"], optimize["cron"], optimize["tz"]) == ("CronTriggerTimetable", "30 3 * * *", "UTC")
    assert optimize["max_active_runs"] == 1 and optimize["catchup"] is False
    assert optimize["params"]["tables"]["items"] == {"type": "string", "enum": TABLES}  # the form offers them
    assert bag["dags"]["slotlake_recover__shop"]["params"]["tables"]["items"] == {"type": "string", "enum": TABLES}


@pytest.mark.integration
@pytest.mark.airflow
def test_with_a_spark_server_the_spark_tasks_send_their_apps_there(airflow_home, tmp_path):
    """`spark.server` configured: decode, merge and replay are Python tasks with the same (templated) arguments."""
    cfg = write_config(tmp_path / "slotlake.yaml", "postgresql://nobody@127.0.0.1:1/none")
    cfg.write_text(cfg.read_text().replace('spark: {master: "local[2]"}',
                                           'spark: {master: "local[2]", server: "127.0.0.1:7079"}'))
    bag = load_dagbag(local_airflow_env(airflow_home, cfg))
    assert bag["errors"] == {}
    for dag_id, task_id in (("slotlake_sync__shop", "decode"), ("slotlake_sync__shop", "merge"),
                            ("slotlake_replay__shop", "replay")):
        t = bag["dags"][dag_id]["tasks"][task_id]
        assert t["type"] == "PythonOperator", (dag_id, task_id, t)
        assert t["op_args"][:4] == ["--config", str(cfg.resolve()), "--source", "shop"], t
    replay_args = bag["dags"]["slotlake_replay__shop"]["tasks"]["replay"]["op_args"]
    assert replay_args[4:8] == ["--from", "{{ data_interval_start.isoformat() }}",
                                "--to", "{{ data_interval_end.isoformat() }}"], replay_args


@pytest.mark.integration
@pytest.mark.airflow
def test_missing_config_gives_no_dags_and_no_import_error(airflow_home, tmp_path):
    env = local_airflow_env(airflow_home, tmp_path / "unused.yaml")
    del env["SLOTLAKE_CONFIG"]
    bag = load_dagbag(env)
    assert bag["errors"] == {} and not [d for d in bag["dags"] if d.startswith("slotlake_")]


@pytest.mark.integration
@pytest.mark.airflow
def test_bad_config_is_an_import_error_naming_the_key(airflow_home, tmp_path):
    cfg = tmp_path / "slotlake.yaml"
    cfg.write_text("lake: ./lake\nsources:\n  shop:\n    dsn: postgresql://x@127.0.0.1/shop\n    delete_mod: soft\n")
    bag = load_dagbag(local_airflow_env(airflow_home, cfg))
    [message] = bag["errors"].values()
    assert "sources.shop.delete_mod: unknown key; did you mean 'delete_mode'?" in message
    # a cron field Airflow's croniter refuses: an import error naming the key, not a failure at the first run
    cfg.write_text("lake: ./lake\nsources:\n  shop:\n    dsn: postgresql://x@127.0.0.1/shop\n"
                   "    schedule: \"0 25 * * *\"\n")
    [message] = load_dagbag(local_airflow_env(airflow_home, cfg))["errors"].values()
    assert "sources.shop.schedule: '0 25 * * *' must be a 5-field cron expression" in message


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.slow
def test_sync_dag_runs_gold_equals_postgres(pg_db, airflow_home, tmp_path):
    """Run 1 finds rows already in the tables (initial copy under the slot's snapshot); run 2 streams updates,
    deletes, key changes and a TRUNCATE; run 3 plain inserts, updates and deletes.
    After each, every gold table equals PostgreSQL row by row.

    Run 1 (the bootstrap catalog and the initial copies), run 2's decode and all of run 3 are the `in_process`
    task's, without a JVM, and the branch skips the Spark tasks it did; run 2's key change of a row with unchanged
    TOAST is Spark's to merge: its merge task runs in this worker's `slotlake spark-server` (`SLOTLAKE_SPARK_SERVER`,
    the deployment-wide setting, which `spark.server` in the config overrides the same way: the DAG's task types
    for it are in test_with_a_spark_server_the_spark_tasks_send_their_apps_there), never spark-submit. The
    SparkSubmitOperators of a config without a server run end to end in
    tests/integration/test_standalone_cluster.py and are skipped in
    test_sync_dag_with_nothing_new_skips_decode_and_merge."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        for s in ROUND_1:
            conn.execute(s)
    cfg = write_config(tmp_path / "slotlake.yaml", pg_db)
    env = local_airflow_env(airflow_home, cfg)
    # (plain changes: merged by the in_process task)
    round_3 = ["UPDATE orders SET status = 'delivered', notes = 'at the door' WHERE id % 2 = 0",
               "UPDATE customers SET balance = balance + 1 WHERE id % 2 = 1",
               "INSERT INTO customers (id, name, balance) VALUES (20, 'customer 20', 1.25)",
               "DELETE FROM products WHERE sku = 'SKU-4'",
               "INSERT INTO order_items VALUES (4, 'SKU-1', 1, 24.90), (4, 'SKU-1', 1, 24.90)"]
    expected = {  # per run: what the in_process task did, whether Spark merged, the task announcing gold's changes
        1: ("1 slice(s) decoded and 1 merged; nothing left for Spark", False, "in_process"),
        2: ("1 slice(s) decoded and 0 merged; for Spark: merge due", True, "merge"),
        3: ("1 slice(s) decoded and 1 merged; nothing left for Spark", False, "in_process"),
    }
    # run 2: the demo's second round and a key change of an order whose TOASTed notes it leaves unchanged, which
    # only Spark's merge follows across keys (the rest of the round the in_process task would merge)
    round_2 = [*ROUND_2, "UPDATE orders SET id = 1006 WHERE id = 6"]
    for run, changes in enumerate((None, round_2, round_3), start=1):
        if changes:
            with psycopg.connect(pg_db, autocommit=True) as conn:
                for s in changes:
                    conn.execute(s)
        events_before = _asset_events(airflow_home)
        out = dags_test(env, "slotlake_sync__shop")
        here, spark, announcer = expected[run]
        events = _asset_events(airflow_home)[len(events_before):]
        assert sorted(uri for uri, _ in events) == sorted(f"slotlake://shop/{t.replace('.', '/')}" for t in TABLES)
        assert {task for _, task in events} == {announcer}, (run, events)
        assert "sync shop: archived" in out, f"run {run}: no report summary line"
        assert f"sync shop in this process: {here}" in out, f"run {run}:\n{out[-3000:]}"
        assert ("finished on the Spark server" in out) is spark and "Spark-Submit cmd" not in out, \
            f"run {run}:\n{out[-3000:]}"
        for table in TABLES:
            schema, name = table.split(".")
            assert_gold_equals_pg(str(tmp_path / "lake" / "shop" / "gold" / schema / name), pg_db, table)


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.airflow
@pytest.mark.slow
@pytest.mark.spark_submit  # the DAG's SparkSubmitOperators, skipped (the first run uses the server itself)
def test_sync_dag_with_nothing_new_skips_decode_and_merge(pg_db, airflow_home, tmp_path, warm_spark_server):
    """A DAG run after which nothing is due skips its SparkSubmit tasks before spark-submit (no JVM) and still
    reports; gold stays equal to PostgreSQL.

    The first run, which puts the bootstrap catalog in `_catalog` and loads the initial copies, does both in its
    `in_process` task without a JVM, although its environment names this worker's warm server (the DAG of a
    deployment with `SLOTLAKE_SPARK_SERVER`); the second is the DAG of a config without a server, whose decode and
    merge are SparkSubmitOperators. Those operators' spark-submits run end to end in
    tests/integration/test_standalone_cluster.py."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        for s in ROUND_1:
            conn.execute(s)
    cfg = write_config(tmp_path / "slotlake.yaml", pg_db)
    env = local_airflow_env(airflow_home, cfg)
    # the initial copies are loaded by the in_process task: nothing is left for the Spark tasks
    first = dags_test({**env, SPARK_SERVER_ENV: warm_spark_server}, "slotlake_sync__shop")
    assert "sync shop in this process: 1 slice(s) decoded and 1 merged; nothing left for Spark" in first, \
        first[-3000:]
    assert "finished on the Spark server" not in first and "Spark-Submit cmd" not in first, first[-3000:]
    second = dags_test(env, "slotlake_sync__shop")
    assert "decode and merge skipped: nothing new" in second
    assert "Spark-Submit cmd" not in second  # neither SparkSubmitOperator reached spark-submit
    assert "sync shop: archived 0 messages" in second and "decode and merge skipped" in second
    for table in TABLES:
        schema, name = table.split(".")
        assert_gold_equals_pg(str(tmp_path / "lake" / "shop" / "gold" / schema / name), pg_db, table)


@pytest.mark.integration
@pytest.mark.airflow
def test_optimize_dag_compacts_gold_and_the_syncs_go_on(pg_db, airflow_home, tmp_path):
    """`slotlake_optimize__<source>` after a few small syncs (a file each into every table they change): one
    `airflow dags test` run folds each gold table's files in the task's process (no JVM), one OPTIMIZE commit per
    table with files to fold and no data changed (gold == PostgreSQL, the watermarks as they were); a manual run
    naming one table compacts only it; the next sync goes on from the compacted tables."""
    from clirun import launched_apps, sync_ok
    from slotlake import delta_log
    from slotlake.lake import LakePaths

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        for s in ROUND_1:
            conn.execute(s)
    cfg = write_config(tmp_path / "slotlake.yaml", pg_db)
    sync_ok(cfg, "shop")
    for i in range(3):  # small batches of inserts, in this process: each adds a file to the tables it changes
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(f"INSERT INTO customers (id, name, balance) VALUES ({50 + i}, 'small {i}', {i}.25)")
            conn.execute(f"INSERT INTO orders (id, customer_id, status, total) VALUES ({100 + i}, 1, 'new', {i}.50)")
        assert launched_apps(sync_ok(cfg, "shop").stderr) == []
    paths = LakePaths.of(str(tmp_path / "lake"), "shop")
    golds = {t: paths.gold(*t.split(".")) for t in TABLES}
    files = {t: len(delta_log.snapshot(p).files) for t, p in golds.items()}
    marks = {t: delta_log.latest_slotlake_commit(p) for t, p in golds.items()}
    assert files["public.customers"] >= 4 and files["public.orders"] >= 4, files
    env = local_airflow_env(airflow_home, cfg)

    # a manual run naming one table: only it is compacted
    out = dags_test(env, "slotlake_optimize__shop", conf={"tables": ["public.orders"]})
    assert "Spark-Submit cmd" not in out and "on the Spark server" not in out, out[-3000:]
    assert "public.orders: " in out and "file(s) compacted into 1" in out, out[-3000:]
    assert len(delta_log.snapshot(golds["public.orders"]).files) == 1
    assert len(delta_log.snapshot(golds["public.customers"]).files) == files["public.customers"]

    out = dags_test(env, "slotlake_optimize__shop")  # every gold table
    for t, p in golds.items():
        assert delta_log.latest_slotlake_commit(p) == marks[t], t  # no data changed: the watermark as it was
        if files[t] > 1:
            assert next(delta_log.commits(p)).operation == "OPTIMIZE", t
            assert len(delta_log.snapshot(p).files) == 1, (t, files[t])
        schema, name = t.split(".")
        assert_gold_equals_pg(str(tmp_path / "lake" / "shop" / "gold" / schema / name), pg_db, t)
    assert "public.customers: " in out and "file(s) compacted into 1" in out, out[-3000:]

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for s in ROUND_2:
            conn.execute(s)
    sync_ok(cfg, "shop")
    for t in TABLES:
        schema, name = t.split(".")
        assert_gold_equals_pg(str(tmp_path / "lake" / "shop" / "gold" / schema / name), pg_db, t)
