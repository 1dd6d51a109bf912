"""The Spark apps on a real Spark standalone cluster (a master and a 1-core worker started with the venv's
`spark-class` on 127.0.0.1, tests/sparkcluster.py) instead of `local[N]`.

The executors run a Python that has every dependency but not slotlake: a job that imports slotlake on them works
only because the driver shipped the package (the `--py-files` zip of spark-submit, `addPyFile` for an in-process
session). Through the CLI (`spark.master: spark://...`: the initial copy) and then, on the same lake, through the sync
DAG's SparkSubmitOperators (the changes), whose Spark connection names the cluster while `spark.master` says local:
each time gold equals PostgreSQL row by row, the apps FINISHED on the master, and the executors received the zip and
the Delta jar.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from demo import ROUND_1, ROUND_2, SCHEMA, TABLES  # noqa: E402

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake_dev.airflow_local import dags_test, local_airflow_env, migrate  # noqa: E402
from sparkcluster import executor_python, standalone_cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.spark_submit]  # apps submitted to a cluster master

SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")
SOURCE = "shop"
ROUND_3 = [
    "UPDATE customers SET balance = balance + 1, email = NULL WHERE id % 2 = 0",
    "INSERT INTO products VALUES ('SKU-9', 'cup', 4.50, true)",
    "DELETE FROM order_items WHERE order_id = 2",
    "UPDATE orders SET id = id + 1000 WHERE id = 5",  # a key change
    "TRUNCATE products",
    "INSERT INTO products VALUES ('SKU-1', 'kettle', 26.00, false)",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def exec_python(tmp_path_factory) -> str:
    return executor_python(tmp_path_factory.mktemp("executor-venv") / "venv")


def cluster_spark(python: str) -> str:
    """The `spark:` block's settings for the cluster: its executors' Python, one core, small executors."""
    return json.dumps({"spark.pyspark.python": python, "spark.cores.max": "1", "spark.executor.memory": "1g"})


def write_config(path: Path, dsn: str, spark: str) -> Path:
    path.write_text(f"lake: {path.parent / 'lake'}\nspark: {spark}\n"
                    f"sources:\n  {SOURCE}:\n    dsn: {dsn}\n    tables: [{', '.join(TABLES)}]\n"
                    f"    schedule: \"15 * * * *\"\n")
    return path


def run_sql(dsn: str, statements) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def assert_gold(lake: Path, dsn: str) -> None:
    for t in TABLES:
        schema, name = t.split(".")
        assert_gold_equals_pg(str(lake / SOURCE / "gold" / schema / name), dsn, t)


def finished(cluster, since: int) -> list[str]:
    """The names of the apps that completed on the master after the first `since`; every one FINISHED."""
    apps = sorted(cluster.completed_apps(), key=lambda a: a["starttime"])[since:]
    assert all(a["state"] == "FINISHED" for a in apps), [(a["name"], a["state"]) for a in apps]
    return [a["name"] for a in apps]


def assert_code_shipped(cluster) -> None:
    files = cluster.executor_files()
    assert any(f.startswith("slotlake-") and f.endswith(".zip") for f in files), sorted(files)
    assert any(f.startswith("delta-spark") and f.endswith(".jar") for f in files), sorted(files)


def test_cli_and_sync_dag_submit_to_the_cluster(pg_db, tmp_path, cluster, exec_python):
    """One source, one lake, two configs of it: the first sync (the initial copy) through the CLI with `spark.master`
    naming the cluster; the next (updates, deletes, a key change, a TRUNCATE) through the sync DAG, whose config
    says `spark.master: local[2]` while its Spark connection `spark.conn_id` names the cluster. The
    SparkSubmitOperators submit to the connection's master with the settings for it: the package as --py-files, no
    local PYTHONPATH. Gold equals PostgreSQL after each; every app FINISHED on the master."""
    run_sql(pg_db, [SCHEMA, *ROUND_1])
    # in_process_bytes 0: the CLI's first sync and the DAG's in_process task leave the catalog, the copies' load
    # and the decode to Spark (they would do them without a JVM)
    cli_cfg = write_config(tmp_path / "slotlake.yaml", pg_db,
                           f'{{master: "{cluster.master}", in_process_bytes: 0, conf: {cluster_spark(exec_python)}}}')
    dag_cfg = write_config(tmp_path / "slotlake-dag.yaml", pg_db,
                           f'{{master: "local[2]", conn_id: slotlake_cluster, in_process_bytes: 0, '
                           f'conf: {cluster_spark(exec_python)}}}')
    before = len(cluster.completed_apps())

    # 1. the CLI: one spark-submit of the sync app to the cluster's master
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLOTLAKE_SPARK_SERVER")}
    out = subprocess.run([SLOTLAKE, "--config", str(cli_cfg), "sync", SOURCE, "--json"], capture_output=True,
                         text=True, timeout=1500, env=env)
    assert out.returncode == 0, f"the CLI's sync failed:\n{out.stderr[-4000:]}"
    assert f"to {cluster.master}" in out.stderr, out.stderr[-3000:]  # "submitting <app> to <master>"
    report = json.loads(out.stdout)
    assert report["spark_skipped"] is False and report["merged"], report  # it loaded the initial copy into gold
    assert_gold(tmp_path / "lake", pg_db)

    # 2. the sync DAG: decode and merge, each a spark-submit to the connection's master
    home = tmp_path / "airflow"
    home.mkdir()
    env = local_airflow_env(home, dag_cfg)
    env.pop("PYTHONPATH", None)
    env.pop("SLOTLAKE_SPARK_SERVER", None)
    env["AIRFLOW_CONN_SLOTLAKE_CLUSTER"] = json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.port})
    migrate(env)
    run_sql(pg_db, ROUND_2 + ROUND_3)
    out = dags_test(env, f"slotlake_sync__{SOURCE}")
    submits = [line for line in out.splitlines() if "Spark-Submit cmd" in line]
    assert len(submits) == 2, submits  # decode and merge
    for line in submits:
        assert f"--master {cluster.master}" in line and "--py-files" in line, line
        assert "spark.executorEnv.PYTHONPATH" not in line and "spark.sql.shuffle.partitions=1" in line, line
    assert "sync shop: archived" in out, "no report line"
    assert_gold(tmp_path / "lake", pg_db)
    names = finished(cluster, before)
    assert names == [f"slotlake-sync-{SOURCE}", f"slotlake-decode-{SOURCE}", f"slotlake-merge-{SOURCE}"], names
    assert_code_shipped(cluster)


def test_an_in_process_session_on_the_cluster_ships_the_package(tmp_path, cluster, exec_python):
    """`get_spark` with a cluster master (the Spark server's and `undo`'s sessions) adds the package zip, so its
    executors import slotlake from it."""
    script = (
        "import sys\n"
        "from slotlake.spark.session import get_spark\n"
        f"spark = get_spark('slotlake-in-process', {cluster.master!r}, {{'spark.cores.max': '1', "
        "'spark.executor.memory': '1g'})\n"
        "def where(_):\n"
        "    import slotlake.lsn\n"
        "    yield slotlake.lsn.__file__ + ' ' + str(slotlake.lsn.Lsn.parse('1/2A'))\n"
        "print('\\n'.join(spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()))\n"
        "spark.stop()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SLOTLAKE_UNDER_SPARK_SUBMIT", "SPARK_ENV_LOADED")}
    env.update(PYSPARK_PYTHON=exec_python, PYTHONPATH=str(ROOT / "plugins"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    path, lsn = out.stdout.strip().splitlines()[-1].split()
    assert ".zip" in path and "plugins" not in path, path  # imported from the shipped zip, not this checkout
    assert lsn == "1/2A"
    assert "slotlake-in-process" in [a["name"] for a in cluster.completed_apps() if a["state"] == "FINISHED"]
