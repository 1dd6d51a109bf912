"""Build the Airflow DAGs for every configured source (the file in dags/ only calls `build_dags`).

`slotlake_sync__<source>`: preflight -> extract -> in_process -> decode -> merge -> report. preflight, extract,
in_process and report are Python tasks calling `slotlake.pipeline`; decode and merge are `SparkSubmitOperator`s fed
with the same `SparkApp` the CLI submits (with `spark.server` configured: Python tasks sending that app to the
long-lived `slotlake spark-server`, `slotlake.spark_apps.server`, as the CLI does). Building a DAG touches no
database and starts no Spark: it only reads the config.
`in_process` (a branch) decodes and merges what the extract left due without a JVM where that is exact, as the
CLI's sync does (`pipeline.task_in_process`), then follows only to the Spark tasks still due: decode and merge
when a decode is left, merge alone when only a merge is (one that died halfway, or a batch only Spark merges),
neither when nothing is (the idle run: no JVM, no task process for them). The report always runs.
The task that merged the run's last changes (merge, or in_process when nothing was left for Spark) emits an
Airflow asset event for each gold table the run changed, through the AssetAlias `slotlake_gold__<source>`
(`slotlake.airflow.assets`): downstream DAGs schedule on `Asset("slotlake://<source>/<schema>/<table>")`.
Beside it, per source: `slotlake_replay__<source>` (backfills), `slotlake_recover__<source>` (point-in-time
recovery) and `slotlake_optimize__<source>` (gold's compaction on `optimize_schedule`).
"""
from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, TriggerRule, get_current_context, task

from slotlake import pipeline
from slotlake.airflow.assets import gold_alias, gold_events
from slotlake.airflow.optimize_dag import build_optimize_dag
from slotlake.airflow.recover_dag import build_recover_dag
from slotlake.airflow.replay_dag import build_replay_dag
from slotlake.airflow.tasks import source_dag_kwargs, spark_conn_id, spark_task
from slotlake.config import Config, check_schedules
from slotlake.spark.submit import spark_app


def build_sync_dag(cfg: Config, source_name: str) -> DAG:
    source = cfg.source(source_name)
    conn_id = spark_conn_id(cfg)
    with DAG(**source_dag_kwargs(
        cfg, source_name, dag_id=f"slotlake_sync__{source_name}",
        description=f"Sync PostgreSQL source {source_name} into the Delta lake (slot {source.slot})",
        doc_md=__doc__,
    )) as dag:

        @task(task_id="preflight")
        def preflight() -> dict[str, Any]:
            return pipeline.task_preflight(cfg, source_name)

        @task(task_id="extract")
        def extract() -> dict[str, Any]:
            return pipeline.task_extract(cfg, source_name)

        # Its outlet is the alias too: when nothing is left for Spark, the gold tables changed are its to announce.
        @task.branch(task_id="in_process", outlets=[gold_alias(source_name)])
        def in_process(extracted: dict[str, Any]) -> list[str]:
            return in_process_branch(cfg, source_name, extracted)

        # Runs after a skipped decode/merge too (nothing was due), never after a failed one.
        @task(task_id="report", trigger_rule=TriggerRule.NONE_FAILED)
        def report(extracted: dict[str, Any]) -> dict[str, Any]:
            here = get_current_context()["ti"].xcom_pull(task_ids="in_process", key=IN_PROCESS_KEY) or {}
            return pipeline.task_report(cfg, source_name, extracted, here.get("steps"))

        decode = spark_task(spark_app(cfg, source_name, "decode"), "decode", conn_id, source)
        # A skipped decode does not skip the merge: a merge can be due alone (in_process follows to it directly).
        # Its outlet is an alias: which gold tables changed is known only once the merge ran (slotlake.airflow.assets).
        merge = spark_task(spark_app(cfg, source_name, "merge"), "merge", conn_id, source,
                           after=gold_events(cfg, source_name), outlets=[gold_alias(source_name)],
                           trigger_rule=TriggerRule.NONE_FAILED)
        extracted = extract()
        here = in_process(extracted)  # type: ignore[arg-type]  # TaskFlow resolves the XComArg at run time
        done = report(extracted)  # type: ignore[arg-type]
        preflight() >> extracted >> here >> decode >> merge >> done
        here >> [merge, done]  # the branch's choices: decode, merge and report are each its direct downstream
    return dag


IN_PROCESS_KEY = "in_process"  # the in_process task's XCom key for `pipeline.task_in_process`'s result


def in_process_branch(cfg: Config, source_name: str, extracted: dict[str, Any]) -> list[str]:
    """The `in_process` task: `pipeline.task_in_process` (its result under the XCom key `in_process`, for the
    report), then the task ids to follow: decode, merge and report when a decode is left for Spark, merge and report
    when only a merge is, report alone when nothing is (then this task announces the gold tables the run changed)."""
    context = get_current_context()
    result = pipeline.task_in_process(cfg, source_name, extracted)
    context["ti"].xcom_push(key=IN_PROCESS_KEY, value=result)
    left = pipeline.pending_of(result)
    if left.decode is not None:
        return ["decode", "merge", "report"]
    if left.merge is not None:
        return ["merge", "report"]
    if "merge" in result["steps"]:  # it merged the run's changes (an idle run changed no gold table)
        gold_events(cfg, source_name)(context)
    return ["report"]


def build_dags(cfg: Config) -> dict[str, DAG]:
    """Every DAG for every configured source, by dag_id."""
    dags: dict[str, DAG] = {}
    for name in cfg.sources:
        check_schedules(cfg.source(name))
        for dag in (build_sync_dag(cfg, name), build_replay_dag(cfg, name), build_recover_dag(cfg, name),
                    build_optimize_dag(cfg, name)):
            dags[dag.dag_id] = dag
    return dags
