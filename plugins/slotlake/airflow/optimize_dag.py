"""`slotlake_optimize__<source>`: gold's compaction on a schedule (see slotlake.merge.optimize).

Each small sync adds a file (and, with deletion vectors, vectors) to every gold table it changes; readers pay per
file. One task runs `slotlake optimize` as the CLI does (`pipeline.optimize`): in the task's own process without a
JVM, under the source's run lock (a sync waits for it), one `OPTIMIZE` commit per table with files to fold, no data
changed (the rows, watermarks and time travel stay). The source's `optimize_schedule` (default daily at 03:30 UTC;
null: no scheduled runs) drives it; a manual run may name `tables`. The task's XCom (`return_value`) and log hold
one entry per table: what was folded, or why it was left as it is.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from airflow.sdk import DAG, CronTriggerTimetable, Param, task

from slotlake import pipeline
from slotlake.airflow.tasks import source_dag_kwargs, table_items
from slotlake.config import Config

log = logging.getLogger(__name__)


def build_optimize_dag(cfg: Config, source_name: str) -> DAG:
    source = cfg.source(source_name)
    schedule = None if source.optimize_schedule is None else \
        CronTriggerTimetable(source.optimize_schedule, timezone="UTC")
    with DAG(**source_dag_kwargs(
        cfg, source_name, dag_id=f"slotlake_optimize__{source_name}",
        description=f"Compact source {source_name}'s gold tables (small files, deletion vectors); no data changed",
        extra_tags=["optimize"],
        schedule=schedule,
        params={
            # Nullable: a non-null array is a required field in the UI's forms, and empty means every table.
            "tables": Param(None, type=["null", "array"], items=table_items(source), uniqueItems=True,
                            description="schema.table names to compact; empty: every gold table of the source"),
        },
        doc_md=__doc__,
    )) as dag:
        @task(task_id="optimize")
        def optimize(params=None) -> list[dict[str, Any]]:
            return optimize_tables(cfg, source_name, (params or {}).get("tables"))

        optimize()
    return dag


def optimize_tables(cfg: Config, source_name: str, tables: Sequence[str] | None) -> list[dict[str, Any]]:
    """The `optimize` task: `pipeline.optimize` of `tables` (None or empty: every gold table); one dict per table."""
    done = pipeline.optimize(cfg, source_name, tables)
    if not done:
        log.info("optimize %s: no gold table yet", source_name)
    return [t.as_dict() for t in done]
