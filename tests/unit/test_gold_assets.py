"""Gold tables as Airflow Assets: the URI (slotlake.lake.gold_asset_uri), the events' extra and which tables of a run
get one (slotlake.pipeline.merged_tables / gold_event_extra). The run itself: tests/integration/test_assets.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlake.config import parse_config
from slotlake.lake import LakePaths, gold_asset_uri
from slotlake.names import TableName
from slotlake.pipeline import TableMerge, gold_event_extra, merged_tables

pytestmark = pytest.mark.unit

URIS = [
    (("shop", "public", "orders"), "slotlake://shop/public/orders"),
    (("Shop_2", "Public", "Orders"), "slotlake://Shop_2/Public/Orders"),  # case kept: quoted names are distinct
    (("shop", "Sales Dept", "Order Items"), "slotlake://shop/Sales%20Dept/Order%20Items"),
    (("shop", "a/b", "c?d#e%f"), "slotlake://shop/a%2Fb/c%3Fd%23e%25f"),
    (("shop", "a.b", 'say "hi"'), "slotlake://shop/a.b/say%20%22hi%22"),
    (("shop", "..", "."), "slotlake://shop/%2E%2E/%2E"),
    (("shop", "ventes", "commandes_été"), "slotlake://shop/ventes/commandes_%C3%A9t%C3%A9"),
    (("shop", "s", "t$2"), "slotlake://shop/s/t%242"),
]


@pytest.mark.parametrize("parts,uri", URIS, ids=[u for _, u in URIS])
def test_gold_asset_uri(parts, uri):
    assert gold_asset_uri(*parts) == uri


def test_airflow_keeps_every_gold_uri_as_written():
    """Airflow normalises an Asset URI (no normaliser is registered for slotlake://, so only its generic rules:
    scheme lowered, trailing slashes, fragment and query order): ours come out unchanged, so name == URI."""
    from airflow.sdk import Asset

    from slotlake.airflow.assets import gold_asset

    for _, uri in URIS:
        assert Asset(uri).uri == uri
    asset = gold_asset("shop", TableName.parse('"Sales Dept"."Order Items"'))
    assert asset.name == asset.uri == "slotlake://shop/Sales%20Dept/Order%20Items"


def test_gold_event_extra_is_the_merge_result_as_json():
    t = TableMerge(table='"Sales Dept".orders', applied_lsn="0/1A2B3C", gold_version=7, inserted=2, updated=3,
                   deleted=1)
    extra = gold_event_extra("shop", t)
    assert extra == {"source": "shop", "table": '"Sales Dept".orders', "applied_lsn": "0/1A2B3C", "gold_version": 7,
                     "inserted": 2, "updated": 3, "deleted": 1}
    assert json.loads(json.dumps(extra)) == extra


def _commit(table: Path, version: int, operation: str, metrics: dict, end_lsn: str | None) -> None:
    log_dir = table / "_delta_log"
    log_dir.mkdir(parents=True, exist_ok=True)
    info = {"timestamp": 1_700_000_000_000 + version, "operation": operation,
            "operationMetrics": {k: str(v) for k, v in metrics.items()}}
    if end_lsn:
        info["userMetadata"] = json.dumps({"slotlake": {"end_lsn": end_lsn, "stage": "merge"}})
    (log_dir / f"{version:020d}.json").write_text(json.dumps({"commitInfo": info}) + "\n")


@pytest.mark.delta_readers(skip="hand-written commit logs only, not readable Delta tables")
def test_only_tables_the_run_changed_are_merged_tables(tmp_path):
    """Counts from the commits after the versions the extract recorded; a table without a commit since gets none."""
    cfg = parse_config({"lake": str(tmp_path), "sources": {"shop": {"dsn": "postgresql://u@127.0.0.1/shop"}}})
    paths = LakePaths.of(cfg.lake, "shop")
    orders, customers, items = (Path(paths.gold(*t)) for t in (("public", "orders"), ("public", "customers"),
                                                                 ("Sales Dept", "Order Items")))
    _commit(orders, 0, "WRITE", {"numOutputRows": 10}, "0/100")  # the initial copy, before this run
    _commit(orders, 1, "MERGE", {"numTargetRowsInserted": 2, "numTargetRowsUpdated": 3, "numTargetRowsDeleted": 1},
            "0/200")
    _commit(orders, 2, "OPTIMIZE", {"numRemovedFiles": 4}, None)
    _commit(customers, 0, "WRITE", {"numOutputRows": 5}, "0/100")  # nothing since
    _commit(items, 0, "WRITE", {"numOutputRows": 4}, "0/200")  # new in this run
    extracted = {"lake_versions": {"gold": {"public.orders": 0, "public.customers": 0}}}
    assert merged_tables(cfg, "shop", extracted) == (
        TableMerge('"Sales Dept"."Order Items"', "0/200", 0, inserted=4, updated=0, deleted=0),
        TableMerge("public.orders", "0/200", 1, inserted=2, updated=3, deleted=1),
    )
