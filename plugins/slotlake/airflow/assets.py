"""Gold tables as Airflow Assets: `slotlake://<source>/<schema>/<table>` (`slotlake.lake.gold_asset_uri`).

The sync DAG's merge task has one outlet, the AssetAlias `slotlake_gold__<source>`, and adds through it, after
its Spark app succeeded, one event per gold table the run changed (`pipeline.merged_tables`, the report's own
counts) with `pipeline.gold_event_extra` as the event's extra. An alias, not one static Asset per table: the
tables are not known when the DAG is parsed (a source without `tables:` syncs whatever its publication holds, and
parsing reads no database or lake), and Airflow records an event for every static outlet of a successful task,
changed or not. A skipped merge (nothing due) records nothing.

A downstream DAG schedules on a table with `schedule=[Asset("slotlake://shop/public/orders")]` (its name is the
URI), or on every gold table of a source with `schedule=[AssetAlias("slotlake_gold__shop")]`.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset, AssetAlias

from slotlake import pipeline
from slotlake.airflow.tasks import After
from slotlake.config import Config
from slotlake.lake import gold_asset_uri
from slotlake.names import TableName

log = logging.getLogger(__name__)


def gold_alias(source_name: str) -> AssetAlias:
    """The alias the sync DAG's merge task emits its gold tables' events through."""
    return AssetAlias(name=f"slotlake_gold__{source_name}")


def gold_asset(source_name: str, table: TableName) -> Asset:
    """A gold table as an Asset: name and URI are both `gold_asset_uri`."""
    uri = gold_asset_uri(source_name, table.schema, table.name)
    return Asset(name=uri, uri=uri)


def gold_events(cfg: Config, source_name: str) -> After:
    """The merge task's `after` (`tasks.spark_task`): one event per gold table the run changed, through the alias."""
    def emit(context: Mapping[str, Any]) -> None:
        extracted = context["ti"].xcom_pull(task_ids="extract") or {}
        events = context["outlet_events"][gold_alias(source_name)]
        merged = pipeline.merged_tables(cfg, source_name, extracted)
        for t in merged:
            events.add(gold_asset(source_name, TableName.parse(t.table)),
                       extra=pipeline.gold_event_extra(source_name, t))
        log.info("asset events for %d gold table(s): %s", len(merged),
                 ", ".join(f"{t.table} (+{t.inserted} ~{t.updated} -{t.deleted} at {t.applied_lsn})" for t in merged)
                 or "none changed")

    return emit
