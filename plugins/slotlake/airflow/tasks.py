"""What every slotlake DAG is built from: the Spark connection, the Spark tasks (spark-submit, or a Python task
sending the app to the Spark server) with the source's run lock and an optional skip rule, and the `DAG(...)`
arguments the per-source DAGs share. Used by `dag_factory` (sync), `replay_dag` and `recover_dag`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import CronDataIntervalTimetable

from slotlake.config import Config, SourceConfig
from slotlake.spark.code import code_zip
from slotlake.spark.submit import SparkApp, on_master, run_spark_app

log = logging.getLogger(__name__)

DEFAULT_SPARK_CONN_ID = "slotlake_spark"


def spark_conn_id(cfg: Config) -> str:
    """The Spark connection the operators use: the configured `spark.conn_id`, else one built from `spark.master`.

    SparkSubmitHook takes the master from a connection (defaulting to yarn when it finds none), so without a
    configured one we define `slotlake_spark` through the environment (AIRFLOW_CONN_<ID>, JSON form). Every
    process that parses this DAG file (scheduler, worker, `airflow dags test`) defines it the same way.
    """
    if cfg.spark.conn_id:
        return cfg.spark.conn_id
    os.environ[f"AIRFLOW_CONN_{DEFAULT_SPARK_CONN_ID.upper()}"] = json.dumps(
        {"conn_type": "spark", "host": cfg.spark.master})
    return DEFAULT_SPARK_CONN_ID


def connection_master(conn_id: str) -> str:
    """The master a SparkSubmitOperator on `conn_id` submits to, resolved by the provider's own hook (host and
    port of the connection; yarn when the connection does not exist)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    return str(SparkSubmitHook(conn_id=conn_id)._resolve_connection()["master"])


def _target_connection(app: SparkApp, conn_id: str, context: Mapping[str, Any]) -> None:
    # Just before submitting (not at parse time: no connection lookups while parsing): the task's settings for the
    # master its Spark connection names, which may differ from `spark.master` (a cluster's executors get the
    # package as a --py-files zip and no path of this machine).
    task = context["task"]
    app = on_master(app, connection_master(conn_id))
    task.conf = dict(app.conf)
    if app.ship_code:
        task.py_files = code_zip()


_HELD: dict[tuple[str, str], ExitStack] = {}  # (run_id, task_id) -> the run lock a SparkSubmit task holds


def _replay_to_dest(args: list[str]) -> bool:
    """A `--dest` replay only reads the lake: it runs without the source's run lock."""
    return "--dest" in args[:-1] and bool(args[args.index("--dest") + 1].strip())


def _take_lock(source: SourceConfig, context: Mapping[str, Any]) -> None:
    # pre_execute: the task's own process holds the source's run lock while spark-submit runs, as the CLI does
    # around its Spark apps; released by post_execute / on_failure_callback (or by PostgreSQL if the process dies).
    from slotlake.source.lock import source_lock

    task = context["task"]  # its app's arguments, rendered: a SparkSubmitOperator's or a server task's (spark_task)
    if _replay_to_dest(list(getattr(task, "application_args", None) or getattr(task, "op_args", None) or [])):
        return
    stack = ExitStack()
    stack.enter_context(source_lock(source, task.task_id))
    _HELD[(str(context.get("run_id")), task.task_id)] = stack


def _release_lock(context: Mapping[str, Any], *_: Any) -> None:
    stack = _HELD.pop((str(context.get("run_id")), context["task"].task_id), None)
    if stack is not None:
        stack.close()


Due = Callable[[Mapping[str, Any]], str]  # (task context) -> why the app runs; AirflowSkipException: skip it
After = Callable[[Mapping[str, Any]], None]  # (task context) -> records what the app did (asset events)


def _post_execute(after: After | None) -> Callable[..., None]:
    """The post_execute of a Spark task: `after` (still under the run lock, so it reads what this app wrote and
    nothing a later run wrote), then the lock's release. A failing `after` fails the task; clearing it re-runs a
    no-op app and `after` again."""
    def run(context: Mapping[str, Any], *_: Any) -> None:
        try:
            if after is not None:
                after(context)
        finally:
            _release_lock(context)

    return run


def _pre_execute(app: SparkApp, due: Due | None, source: SourceConfig,
                 conn_id: str | None = None) -> Callable[[Mapping[str, Any]], None]:
    """The pre_execute of a Spark task: the skip rule, then (spark-submit tasks: `conn_id`) the settings for the
    connection's master, then the run lock."""
    def run(context: Mapping[str, Any]) -> None:
        if due is not None:
            log.info("%s: %s", app.name, due(context))  # (it raises AirflowSkipException to skip the app)
        if conn_id is not None:
            _target_connection(app, conn_id, context)
        _take_lock(source, context)

    return run


def spark_submit_task(app: SparkApp, task_id: str, conn_id: str, source: SourceConfig, due: Due | None = None,
                      after: After | None = None, **kwargs: Any) -> SparkSubmitOperator:
    """A SparkSubmitOperator running `app` exactly as `slotlake.spark.submit.run_spark_app` would, holding the
    source's run lock (`slotlake.source.lock`) while it runs; with `due`, it skips itself (before spark-submit)
    when `due(context)` raises AirflowSkipException; with `after`, calls it once the app succeeded (post_execute)."""
    return SparkSubmitOperator(
        task_id=task_id,
        application=app.application,
        application_args=list(app.args),
        conf=dict(app.conf),
        conn_id=conn_id,
        name=app.name,
        env_vars=dict(app.env),
        spark_binary=app.spark_submit,
        pre_execute=_pre_execute(app, due, source, conn_id),
        post_execute=_post_execute(after),
        on_failure_callback=_release_lock,
        **kwargs,
    )


def spark_task(app: SparkApp, task_id: str, conn_id: str, source: SourceConfig, due: Due | None = None,
               after: After | None = None, **kwargs: Any):
    """The task running `app`: a SparkSubmitOperator, or with `spark.server` configured a Python task sending it
    to the Spark server (`run_spark_app`: falls back to spark-submit if the server cannot take it), with the same
    run lock, skip rule and `after`."""
    if not app.server:
        return spark_submit_task(app, task_id, conn_id, source, due, after, **kwargs)

    def run_on_spark_server(*args: str) -> None:
        run_spark_app(dataclasses.replace(app, args=tuple(args)))

    return PythonOperator(
        task_id=task_id,
        python_callable=run_on_spark_server,
        op_args=list(app.args),  # templated as a SparkSubmitOperator's application_args are (the replay's interval)
        # No connection to target (conn_id None): the server's driver has the code; a spark-submit fallback
        # (run_spark_app) ships its own zip for a cluster master.
        pre_execute=_pre_execute(app, due, source),
        post_execute=_post_execute(after),
        on_failure_callback=_release_lock,
        **kwargs,
    )


def table_items(source: SourceConfig) -> dict[str, Any]:
    """The JSON schema of one entry of a DAG's `tables` Param: a schema.table string, one of the source's listed
    tables when it lists them (the trigger form then offers them, and refuses another name when submitted)."""
    item: dict[str, Any] = {"type": "string"}
    if source.listed_tables:
        item["enum"] = list(source.listed_tables)
    return item


def _start_date(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)


def source_dag_kwargs(cfg: Config, source_name: str, **extra: Any) -> dict[str, Any]:
    """The `DAG(...)` arguments every per-source DAG shares: the source's cron schedule as data intervals in UTC,
    its start date, no catch-up, one active run at a time, no task retries (every stage is idempotent; the next
    run is the retry), the slotlake tags. `extra` adds or overrides (dag_id, description, more tags, ...)."""
    source = cfg.source(source_name)
    tags = ["slotlake", f"source:{source_name}", *extra.pop("extra_tags", ())]
    default_args = {"retries": 0, **extra.pop("default_args", {})}
    return {
        "schedule": CronDataIntervalTimetable(source.schedule, timezone="UTC"),
        "start_date": _start_date(source.start_date),
        "catchup": False,
        "max_active_runs": 1,
        "tags": tags,
        "default_args": default_args,
        **extra,
    }
