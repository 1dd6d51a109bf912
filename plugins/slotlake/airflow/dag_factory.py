"""Build the Airflow DAGs for every configured source (the file in dags/ only calls `build_dags`).

`slotlake_sync__<source>`: preflight -> extract -> decode -> merge -> report. preflight, extract and report are
Python tasks calling `slotlake.pipeline`; decode and merge are `SparkSubmitOperator`s fed with the same
`SparkApp` the CLI submits (with `spark.server` configured: Python tasks sending that app to the long-lived
`slotlake spark-server`, `slotlake.spark_apps.server`, as the CLI does). Building a DAG touches no database and
starts no Spark: it only reads the config.
When the extract finds nothing due (`slotlake.pending`, in its XCom), decode and merge skip themselves before
spark-submit (no JVM) and the report still runs; when only the merge is due (a merge that died halfway), only
the decode is skipped.
The merge emits an Airflow asset event for each gold table the run changed, through the AssetAlias
`slotlake_gold__<source>` (`slotlake.airflow.assets`): downstream DAGs schedule on
`Asset("slotlake://<source>/<schema>/<table>")`.
"""
from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, TriggerRule, task

from slotlake import pipeline
from slotlake.airflow.assets import gold_alias, gold_events
from slotlake.airflow.recover_dag import build_recover_dag
from slotlake.airflow.replay_dag import build_replay_dag
from slotlake.airflow.tasks import decode_due, merge_due, source_dag_kwargs, spark_conn_id, spark_task
from slotlake.config import Config
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

        # Runs after a skipped decode/merge too (nothing was due), never after a failed one.
        @task(task_id="report", trigger_rule=TriggerRule.NONE_FAILED)
        def report(extracted: dict[str, Any]) -> dict[str, Any]:
            return pipeline.task_report(cfg, source_name, extracted)

        decode = spark_task(spark_app(cfg, source_name, "decode"), "decode", conn_id, source, due=decode_due)
        # A skipped decode does not skip the merge: a merge can be due alone (one that died halfway).
        # Its outlet is an alias: which gold tables changed is known only once the merge ran (slotlake.airflow.assets).
        merge = spark_task(spark_app(cfg, source_name, "merge"), "merge", conn_id, source, due=merge_due,
                           after=gold_events(cfg, source_name), outlets=[gold_alias(source_name)],
                           trigger_rule=TriggerRule.NONE_FAILED)
        extracted = extract()
        done = report(extracted)  # type: ignore[arg-type]  # TaskFlow resolves the XComArg at run time
        preflight() >> extracted >> decode >> merge >> done
    return dag


def build_dags(cfg: Config) -> dict[str, DAG]:
    """Every DAG for every configured source, by dag_id."""
    dags: dict[str, DAG] = {}
    for name in cfg.sources:
        for dag in (build_sync_dag(cfg, name), build_replay_dag(cfg, name), build_recover_dag(cfg, name)):
            dags[dag.dag_id] = dag
    return dags
