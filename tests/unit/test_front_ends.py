"""Pure parts of the front ends: the spark-submit command, failure summaries, Delta commit records, the CLI."""
from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from slotlake import delta_log
from slotlake.cli import COMMANDS, build_parser, one_line
from slotlake.config import parse_config
from slotlake.errors import ConfigError
from slotlake.lsn import Lsn
from slotlake.pipeline import plain
from slotlake.spark.code import code_zip
from slotlake.spark.session import spark_conf
from slotlake.spark.submit import (
    SUBMIT_DRIVER_JAVA_OPTIONS,
    failure_line,
    is_local_master,
    on_master,
    spark_app,
    spark_submit_command,
)

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def config(master: str = "local[2]", conf: dict | None = None, path: str | None = "/etc/slotlake.yaml"):
    raw = {"lake": "/lake", "spark": {"master": master, "conf": conf or {}},
           "sources": {"shop": {"dsn": "postgresql://u@127.0.0.1/shop"}}}
    return parse_config(raw, path=path)


@pytest.mark.parametrize("master,local", [("local", True), ("local[2]", True), ("local[*]", True),
                                          ("local[4,2]", True), ("spark://m:7077", False), ("yarn", False),
                                          ("k8s://https://k:443", False)], ids=str)
def test_is_local_master(master, local):
    assert is_local_master(master) is local


def test_local_command_has_master_jars_app_and_args_and_no_py_files(monkeypatch):
    monkeypatch.setenv("SLOTLAKE_CDS", "off")  # the class-data-sharing archive's option: tests/unit/test_cds.py
    app = spark_app(config(), "shop", "merge", tables=["public.a", "public.b"])
    cmd = spark_submit_command(app)
    assert cmd[0] == str(Path(sys.prefix) / "bin" / "spark-submit")
    assert cmd[1:5] == ["--master", "local[2]", "--name", "slotlake-merge-shop"]
    assert "--py-files" not in cmd
    assert cmd[-7:] == [str(ROOT / "plugins" / "slotlake" / "spark_apps" / "merge.py"), "--config",
                        "/etc/slotlake.yaml", "--source", "shop",
                        "--tables", "public.a,public.b"]
    confs = dict(c.split("=", 1) for c in cmd[cmd.index("--conf") + 1::2][: len(app.conf)])
    assert "delta-spark" in confs["spark.jars"] and "spark.master" not in confs
    assert app.env["SLOTLAKE_UNDER_SPARK_SUBMIT"] == "1" and app.env["PYSPARK_PYTHON"] == sys.executable
    # the app's driver JVM lives one run: C1 only; a long-lived session (spark-server, in-process) keeps the JIT
    assert confs["spark.driver.extraJavaOptions"] == SUBMIT_DRIVER_JAVA_OPTIONS == \
        "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
    assert "spark.driver.extraJavaOptions" not in spark_conf("local[2]")


def test_user_conf_overrides_and_cluster_master_ships_code(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOTLAKE_WORK_DIR", str(tmp_path))
    app = spark_app(config("spark://m:7077", {"spark.executor.memory": "3g", "spark.log.level": "INFO",
                                              "spark.driver.extraJavaOptions": "-Xss4m"}), "shop", "decode")
    cmd = spark_submit_command(app)
    assert "spark.executor.memory=3g" in cmd and "spark.log.level=INFO" in cmd
    assert "spark.driver.extraJavaOptions=-Xss4m" in cmd and f"={SUBMIT_DRIVER_JAVA_OPTIONS}" not in " ".join(cmd)
    zip_path = cmd[cmd.index("--py-files") + 1]
    names = zipfile.ZipFile(zip_path).namelist()
    assert "slotlake/pipeline.py" in names and "slotlake/spark/submit.py" in names
    assert code_zip() == zip_path  # same sources: the same zip, not rebuilt


def test_a_cluster_master_gets_no_local_paths_and_its_cores_bound_the_partitions():
    local = spark_conf("local[3]")
    assert local["spark.executorEnv.PYTHONPATH"] == str(ROOT / "plugins")
    assert local["spark.sql.shuffle.partitions"] == "3"
    cluster = spark_conf("spark://m:7077")
    assert "spark.executorEnv.PYTHONPATH" not in cluster  # the executors get the package zip, not this path
    assert "spark.sql.shuffle.partitions" not in cluster  # Spark's default (adaptive execution coalesces)
    bounded = spark_conf("spark://m:7077", {"spark.cores.max": "4"})
    assert bounded["spark.sql.shuffle.partitions"] == bounded["spark.databricks.delta.snapshotPartitions"] == "4"


def test_executor_python_keeps_the_driver_on_this_venv():
    app = spark_app(config("spark://m:7077", {"spark.pyspark.python": "/opt/py/bin/python"}), "shop", "merge")
    assert app.conf["spark.pyspark.python"] == "/opt/py/bin/python"
    assert app.conf["spark.pyspark.driver.python"] == sys.executable
    assert "spark.pyspark.driver.python" not in spark_app(config(), "shop", "merge").conf


def test_an_app_moved_to_its_connections_master_is_built_for_it():
    """The Airflow Spark connection may name another master than `spark.master`: the settings follow it."""
    app = spark_app(config("local[2]", {"spark.executor.memory": "3g"}), "shop", "decode")
    assert on_master(app, "local[2]") is app
    moved = on_master(app, "spark://m:7077")
    assert moved.master == "spark://m:7077" and moved.ship_code and not app.ship_code
    assert "spark.executorEnv.PYTHONPATH" in app.conf and "spark.executorEnv.PYTHONPATH" not in moved.conf
    assert moved.conf["spark.executor.memory"] == "3g" and "spark.master" not in moved.conf
    assert moved.args == app.args and moved.env == app.env
    back = on_master(moved, "local[2]")
    assert dict(back.conf) == dict(app.conf) and not back.ship_code


def test_an_s3a_lakes_jars_follow_the_master(monkeypatch):
    """On a local master the S3 jars go after Spark's own on the driver's class path (SPARK_DIST_CLASSPATH, so
    the class-data-sharing archive still maps); moved to a cluster master they travel in spark.jars instead."""
    from slotlake.spark.session import DIST_CLASSPATH_ENV, s3_jars

    monkeypatch.delenv(DIST_CLASSPATH_ENV, raising=False)
    raw = {"lake": "s3a://bucket/lake", "storage": {"endpoint": "http://127.0.0.1:9000", "path_style": True},
           "spark": {"master": "local[2]"}, "sources": {"shop": {"dsn": "postgresql://u@127.0.0.1/shop"}}}
    app = spark_app(parse_config(raw, path="/etc/slotlake.yaml"), "shop", "merge")
    assert app.env[DIST_CLASSPATH_ENV] == ":".join(s3_jars()) and "spark.driver.extraClassPath" not in app.conf
    assert "hadoop-aws" not in app.conf["spark.jars"]
    moved = on_master(app, "spark://m:7077")
    assert DIST_CLASSPATH_ENV not in moved.env and all(j in moved.conf["spark.jars"].split(",") for j in s3_jars())
    assert dict(on_master(moved, "local[2]").env) == dict(app.env)


def test_config_not_from_a_file_is_refused():
    with pytest.raises(ConfigError, match="from a file"):
        spark_app(config(path=None), "shop", "decode")


@pytest.mark.parametrize("lines,expected", [
    (["x", "slotlake decode shop: bronze file 0000 is unreadable", "py4j shutting down"],
     "slotlake decode shop: bronze file 0000 is unreadable"),
    (["Traceback (most recent call last):", '  File "a.py", line 1', "slotlake.errors.MergeError: no key",
      "log4j: stopping"], "slotlake.errors.MergeError: no key"),
    (["Exception in thread main java.lang.OutOfMemoryError: heap", "\tat org.x"],
     "Exception in thread main java.lang.OutOfMemoryError: heap"),
    (["just this", ""], "just this"),
    ([], "(no output)"),
], ids=["app-message", "python-exception", "jvm-exception", "last-line", "empty"])
def test_failure_line(lines, expected):
    assert failure_line(lines) == expected


def _commit(log_dir: Path, version: int, info: dict, *actions: dict) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"commitInfo": info}), *(json.dumps(a) for a in actions)]
    (log_dir / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


@pytest.mark.delta_readers(skip="a hand-written commit log only, not a readable Delta table")
def test_delta_commits_newest_first_with_slotlake_metadata(tmp_path):
    table = tmp_path / "gold" / "public" / "orders"
    meta = json.dumps({"slotlake": {"end_lsn": "0/1A2B", "stage": "merge"}})
    _commit(table / "_delta_log", 0, {"timestamp": 1_700_000_000_000, "operation": "WRITE",
                                      "operationMetrics": {"numOutputRows": "5"}, "userMetadata": meta})
    _commit(table / "_delta_log", 1, {"timestamp": 1_700_000_100_000, "operation": "OPTIMIZE",
                                      "operationMetrics": {"numRemovedFiles": "3"}, "userMetadata": "free text"},
            {"add": {"path": "x.parquet"}})
    (table / "_delta_log" / "00000000000000000001.checkpoint.parquet").write_bytes(b"")  # not a commit file
    commits = list(delta_log.commits(str(table)))
    assert [c.version for c in commits] == [1, 0]
    assert commits[0].slotlake is None and commits[0].metrics == {"numRemovedFiles": 3}
    last = delta_log.latest_slotlake_commit(str(table), "merge")
    assert (last.version, last.end_lsn, last.metrics["numOutputRows"]) == (0, "0/1A2B", 5)
    assert last.timestamp.isoformat() == "2023-11-14T22:13:20+00:00"
    assert delta_log.latest_slotlake_commit(str(table), "decode") is None
    assert delta_log.gold_tables(str(tmp_path)) == [("public", "orders")]
    assert list(delta_log.commits(str(tmp_path / "missing"))) == []


def test_delta_log_reads_local_and_s3a_lakes_only():
    assert delta_log.readable("/lake") and delta_log.readable("file:///lake") and delta_log.readable("s3a://b/lake")
    assert not delta_log.readable("abfss://c@a.dfs.core.windows.net/lake")
    with pytest.raises(Exception, match="the lake must be a local path or s3a://bucket/prefix"):
        delta_log.local_path("abfss://c@a.dfs.core.windows.net/lake")


def test_plain_makes_lsns_text_and_tuples_lists():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class R:
        lsn: Lsn
        files: tuple[str, ...]

    assert plain(R(Lsn.parse("16/B374D848"), ("a", "b"))) == {"lsn": "16/B374D848", "files": ["a", "b"]}


def test_cli_parser_knows_every_command_and_requires_a_source():
    parser = build_parser()
    required = {"replay": ["--from", "0/1", "--to", "0/2"],  # a command's own required options
                "transactions": ["--from", "0/1", "--to", "0/2"], "undo": ["--xid", "1"],
                "recover": ["--as-of", "0/1", "--table", "a.b", "--to", "/tmp/r"]}
    for c in COMMANDS:
        if c.name == "spark-server":  # serves every source: no SOURCE argument
            continue
        args = parser.parse_args(["--config", "c.yaml", c.name, "shop", *required.get(c.name, [])])
        assert args.run is c.run and args.source == "shop" and args.config == "c.yaml"
    with pytest.raises(SystemExit):
        parser.parse_args(["sync"])
    args = parser.parse_args(["--config", "c.yaml", "spark-server", "--listen", "127.0.0.1:7079"])
    assert args.run.__name__ == "run_spark_server" and args.listen == "127.0.0.1:7079"


def test_one_line_collapses_multiline_messages():
    assert one_line(ValueError("first\n  second\tthird ")) == "first second third"


def test_every_stage_has_an_app_file_and_an_entry():
    import typing

    from slotlake.spark.submit import Stage
    from slotlake.spark_apps.apps import APPS

    stages = set(typing.get_args(Stage))
    assert stages == set(APPS)
    for stage in stages:
        text = (ROOT / "plugins" / "slotlake" / "spark_apps" / f"{stage}.py").read_text()
        assert f'main("{stage}")' in text


def test_app_with_a_bad_config_says_why_in_one_line_and_exits_1(tmp_path, capsys):
    from slotlake.spark_apps.apps import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("lake: /tmp/x\nsources: {shop: {dsn: 'postgresql://u@h/db', delete_mode: sometimes}}\n")
    assert main("merge", ["--config", str(bad), "--source", "shop"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("slotlake merge shop: ") and "delete_mode" in err[0]
    assert failure_line(["noise", err[0]]) == err[0]


@pytest.mark.parametrize("master,cores", [("local", 1), ("local[2]", 2), ("local[3,2]", 3),
                                          ("local[*]", os.cpu_count()),
                                          ("spark://m:7077", None), ("yarn", None), ("k8s://https://k:443", None)])
def test_local_cores(master, cores):
    from slotlake.spark.session import local_cores

    assert local_cores(master) == cores


def test_partitions_follow_local_cores_and_the_user_overrides(tmp_path, monkeypatch):
    from slotlake.spark.session import spark_conf

    (tmp_path / "delta-spark_2.13-4.4.0.jar").write_text("")
    monkeypatch.setenv("SLOTLAKE_JARS_DIR", str(tmp_path))
    local = spark_conf("local[2]")
    assert local["spark.sql.shuffle.partitions"] == local["spark.databricks.delta.snapshotPartitions"] == "2"
    cluster = spark_conf("spark://m:7077")
    assert "spark.sql.shuffle.partitions" not in cluster and "spark.databricks.delta.snapshotPartitions" not in cluster
    assert spark_conf("local[2]", {"spark.sql.shuffle.partitions": "64"})["spark.sql.shuffle.partitions"] == "64"
    # a long-lived driver keeps many syncs' compiled query classes (Spark's default of 100 is less than one sync's)
    assert local["spark.sql.codegen.cache.maxEntries"] == cluster["spark.sql.codegen.cache.maxEntries"] == "10000"
    assert spark_conf("local[2]", {"spark.sql.codegen.cache.maxEntries": "500"})[
        "spark.sql.codegen.cache.maxEntries"] == "500"


@pytest.mark.parametrize("run_type,skipped", [("scheduled", True), ("backfill", False), ("manual", False)])
def test_replay_dags_gate_skips_only_scheduled_runs(tmp_path, run_type, skipped):
    """The replay DAG's first task: a run the scheduler creates from the cron (an in-place replay of each interval
    as it passes would only repeat the sync) is skipped; backfills and manual runs go on to the replay. The gate's
    own function, called with a real (unsaved) DagRun of each type."""
    from airflow.models.dagrun import DagRun
    from airflow.sdk.exceptions import AirflowSkipException
    from airflow.utils.types import DagRunType

    from slotlake.airflow.replay_dag import build_replay_dag
    from slotlake.config import load_config

    path = tmp_path / "slotlake.yaml"
    path.write_text(f"lake: {tmp_path / 'lake'}\nsources:\n  src:\n    dsn: postgresql://u@127.0.0.1:1/d\n"
                    "    tables: [public.t]\n")
    dag = build_replay_dag(load_config(str(path)), "src")
    run = DagRun(dag_id=dag.dag_id, run_id=f"{run_type}__x", run_type=DagRunType(run_type))
    gate = dag.get_task("gate").python_callable  # type: ignore[attr-defined]
    if skipped:
        with pytest.raises(AirflowSkipException, match="runs only as a backfill or manual run"):
            gate(dag_run=run)
    else:
        assert gate(dag_run=run) is None
