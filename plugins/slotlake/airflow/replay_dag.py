"""`slotlake_replay__<source>`: the Airflow backfill target (see slotlake.recover.replay for what a replay does).

One run = one data interval of the source's schedule (hourly by default): the commits with `data_interval_start <=
commit_ts < data_interval_end` are re-decoded from bronze with the historical catalog and the tables rebuilt, in
place unless the `dest` Param names a folder (then each run writes the state at its interval's end to
`<dest>/<interval end as YYYYmmddTHHMMSSZ>/<schema>/<table>`). Runs go in order (`depends_on_past`, one active run)
and nothing is replayed by the schedule itself: `catchup=False`, and the `gate` task skips runs the scheduler
creates (run type `scheduled`), so only backfills and manual runs do work: a user picks a date range in the UI's
Backfill form, or runs `airflow backfill create --dag-id slotlake_replay__<source> --from-date ... --to-date ...`.
The `in_process` task does the replay without a JVM where it can (`slotlake.recover.replay_in_process`); else
the `replay` task runs `spark_apps/replay.py` as `slotlake replay` does: a SparkSubmitOperator, or with
`spark.server` configured a task sending it to the Spark server (`tasks.spark_task`).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from contextlib import nullcontext
from functools import partial
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowSkipException

from slotlake.airflow.tasks import source_dag_kwargs, spark_conn_id, spark_task
from slotlake.config import Config
from slotlake.spark.submit import spark_app

log = logging.getLogger(__name__)

INTERVAL_START = "{{ data_interval_start.isoformat() }}"
INTERVAL_END = "{{ data_interval_end.isoformat() }}"
# With a `dest`, each run writes the state at its interval's end to its own folder, so a backfill keeps them all.
DEST = ("{{ (params.dest.rstrip('/') ~ '/' ~ data_interval_end.strftime('%Y%m%dT%H%M%SZ')) "
        "if params.dest else '' }}")


def build_replay_dag(cfg: Config, source_name: str) -> DAG:
    app = spark_app(cfg, source_name, "replay")  # spark_apps/replay.py
    app = dataclasses.replace(app, args=(
        *app.args, "--from", INTERVAL_START, "--to", INTERVAL_END,
        "--tables", "{{ (params.tables or []) | join(',') }}", "--dest", DEST))
    with DAG(**source_dag_kwargs(
        cfg, source_name, dag_id=f"slotlake_replay__{source_name}",
        description=f"Re-derive source {source_name}'s lake for each data interval from the archived changes",
        extra_tags=["replay"],
        default_args={"depends_on_past": True},
        params={
            # Nullable: a non-null array is a required field in the UI's forms, and empty means every table.
            "tables": Param(None, type=["null", "array"], items={"type": "string"},
                            description="schema.table names to rebuild; empty: every table of the source"),
            "dest": Param(None, type=["null", "string"],
                          description="a folder: write <dest>/<interval end, "
                                      "YYYYmmddTHHMMSSZ>/<schema>/<table>, the state at the interval's end, "
                                      "instead of rebuilding the lake in place"),
        },
        doc_md=__doc__,
    )) as dag:
        @task(task_id="gate")
        def gate(dag_run=None) -> None:
            # An in-place replay of every hour as it passes would only repeat the sync: backfills and manual runs.
            if dag_run is not None and str(dag_run.run_type).lower().endswith("scheduled"):
                raise AirflowSkipException("scheduled run: slotlake_replay runs only as a backfill or manual run")

        here = PythonOperator(task_id="in_process", python_callable=partial(replay_here, cfg),
                              op_args=list(app.args))  # templated as the Spark app's arguments are
        gate() >> here >> spark_task(app, "replay", spark_conn_id(cfg), cfg.source(source_name),
                                     due=_spark_due)
    return dag


def replay_here(cfg: Config, *args: str) -> bool:
    """The `in_process` task: the replay of the run's interval without a JVM where
    `slotlake.recover.replay_in_process` can do it exactly (then the `replay` task skips); False when it declines
    (the reason logged): the `replay` task runs the Spark app. `args`: the Spark app's, rendered."""
    from slotlake.names import TableName
    from slotlake.recover.replay import request
    from slotlake.recover.replay_in_process import replay_in_process
    from slotlake.source.lock import source_lock
    from slotlake.spark_apps.apps import parse_app_args

    a = parse_app_args("replay", list(args))
    tables = [str(t) for t in TableName.parse_list(a.tables)] or None
    req = request(a.source, a.from_, a.to, tables, a.dest or None)
    # in place: under the source's run lock, as the Spark task's (taken again by that task if it runs)
    with source_lock(cfg.source(a.source), "replay") if req.dest is None else nullcontext():
        return replay_in_process(cfg, req) is not None


def _spark_due(context: Mapping[str, Any]) -> str:
    if context["ti"].xcom_pull(task_ids="in_process"):
        raise AirflowSkipException("replayed without a JVM by the in_process task")
    return "the replay runs in the Spark app"
