"""Config validation: a good config parses with its defaults; each kind of bad config names the key."""
from __future__ import annotations

import copy

import pytest

from slotlake.config import SchemaChanges, load_config, parse_config
from slotlake.errors import ConfigError

pytestmark = pytest.mark.unit

GOOD = {
    "lake": "./lake",
    "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": 4}},
    "sources": {
        "shop": {"dsn": "postgresql://u@127.0.0.1:5432/shop", "tables": ["public.orders", "public.customers"]},
        "crm": {"conn_id": "crm_pg", "slot": "crm_slot", "delete_mode": "soft", "history": True},
    },
}


def with_change(path: str, value) -> dict:
    """GOOD with the dotted key `path` set to `value` (or removed when value is DELETE)."""
    raw = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return raw


DELETE = object()


def test_good_config_and_defaults(tmp_path):
    cfg = parse_config(GOOD, base_dir=str(tmp_path))
    assert cfg.lake == str(tmp_path / "lake")
    assert cfg.spark.master == "local[2]" and cfg.spark.conf == {"spark.sql.shuffle.partitions": "4"}
    shop = cfg.source("shop")
    assert shop.slot == "slotlake_shop" and shop.publication == "slotlake_shop"
    assert shop.tables == ("public.orders", "public.customers")
    assert (shop.schedule, shop.delete_mode, shop.history, shop.on_bad_value) == ("0 * * * *", "hard", False,
                                                                                  "quarantine")
    crm = cfg.source("crm")
    assert crm.dsn is None and crm.conn_id == "crm_pg" and crm.slot == "crm_slot" and crm.tables is None
    assert crm.delete_mode == "soft" and crm.history is True
    assert cfg.extract.upto_nchanges > 0


@pytest.mark.parametrize(
    "path, value, fragment",
    [
        ("lake", DELETE, "lake: required"),
        ("colour", "x", "config.colour: unknown key"),
        ("spark.mastr", "local", "spark.mastr: unknown key; did you mean 'master'"),
        ("spark.conf", ["a"], "spark.conf: must be a mapping"),
        ("sources", {}, "sources: required"),
        ("sources.shop.dsn", "mysql://x/y", "sources.shop.dsn: must be a URI starting postgresql://"),
        ("sources.shop.conn_id", "also", "sources.shop: set exactly one of dsn"),
        ("sources.shop.slot", "Bad-Slot", "sources.shop.slot"),
        ("sources.shop.tables", ["orders"], "sources.shop.tables: 'orders' must be written schema.table"),
        ("sources.shop.tables", [], "sources.shop.tables: must be a non-empty list"),
        ("sources.shop.tables", ["public.a", "public.a"], "sources.shop.tables: lists a table twice"),
        ("sources.shop.schedule", "hourly", "sources.shop.schedule"),
        ("sources.shop.delete_mode", "purge", "sources.shop.delete_mode: 'purge' must be hard or soft"),
        ("sources.shop.history", "yes", "sources.shop.history: must be true or false"),
        ("sources.shop.on_bad_value", "ignore", "sources.shop.on_bad_value"),
        ("sources.shop.tabels", ["public.a"], "sources.shop.tabels: unknown key; did you mean 'tables'"),
        ("sources.crm.slot", "slotlake_shop", "two sources use the same slot"),
        ("extract", {"upto_nchanges": 0}, "extract.upto_nchanges: must be a positive integer"),
        ("snapshot", {"workers": -1}, "snapshot.workers: must be a positive integer"),
        ("snapshot", {"parts": 4}, "snapshot.parts: unknown key; did you mean 'part_pages'"),
    ],
    ids=["no-lake", "unknown-top-key", "misspelt-spark-key", "spark-conf-list", "no-sources", "bad-dsn-scheme",
         "dsn-and-conn-id", "bad-slot-name", "table-without-schema", "empty-tables", "duplicate-table",
         "bad-schedule", "bad-delete-mode", "history-not-bool", "bad-on-bad-value", "misspelt-source-key",
         "shared-slot", "zero-upto-nchanges", "negative-snapshot-workers", "misspelt-snapshot-key"],
)
def test_bad_config_names_the_key(path, value, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(with_change(path, value))
    assert fragment in str(err.value)


def test_unknown_source_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown source 'nope': the config defines crm, shop"):
        parse_config(GOOD).source("nope")


def test_env_reference_must_be_set(monkeypatch):
    monkeypatch.delenv("SLOTLAKE_TEST_LAKE", raising=False)
    with pytest.raises(ConfigError, match=r"lake: environment variable SLOTLAKE_TEST_LAKE is not set"):
        parse_config(with_change("lake", "${SLOTLAKE_TEST_LAKE}/x"))
    monkeypatch.setenv("SLOTLAKE_TEST_LAKE", "s3a://bucket")
    assert parse_config(with_change("lake", "${SLOTLAKE_TEST_LAKE}/x")).lake == "s3a://bucket/x"


def test_load_config_file_errors_name_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SLOTLAKE_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="pass --config FILE or set SLOTLAKE_CONFIG"):
        load_config(None)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("lake: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(str(bad))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("lake: ./l\nsources: {shop: {dsn: 'postgresql://u@h/db', delete_mode: nope}}\n")
    with pytest.raises(ConfigError, match=r"wrong.yaml: sources.shop.delete_mode"):
        load_config(str(wrong))
    good = tmp_path / "good.yaml"
    good.write_text("lake: ./l\nsources: {shop: {dsn: 'postgresql://u@h/db'}}\n")
    monkeypatch.setenv("SLOTLAKE_CONFIG", str(good))
    assert load_config().lake == str(tmp_path / "l")


def test_snapshot_settings_default_and_set():
    assert parse_config(with_change("extract", {})).snapshot.workers == 2
    cfg = parse_config(with_change("snapshot", {"workers": 4, "part_pages": 1024}))
    assert (cfg.snapshot.workers, cfg.snapshot.part_pages) == (4, 1024)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ({"widen": "alter"}, "sources.shop.schema_changes.widen: 'alter' must be rewrite"),
        ({"rename": "alter"}, "sources.shop.schema_changes.rename: 'alter' must be rewrite"),
        ({"widn": "rewrite"}, "sources.shop.schema_changes.widn: unknown key; did you mean 'widen'"),
        ("rewrite", "sources.shop.schema_changes: must be a mapping"),
    ],
    ids=["bad-widen-mode", "bad-rename-mode", "misspelt-widen", "not-a-mapping"],
)
def test_bad_schema_changes_names_the_key_and_the_values(value, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(with_change("sources.shop.schema_changes", value))
    assert fragment in str(err.value) and "\n" not in str(err.value)
    if "widen:" in fragment:
        assert "or type_widening" in str(err.value)
    if "rename:" in fragment:
        assert "or column_mapping" in str(err.value)


def test_schema_changes_default_to_rewrite_and_delta_features_are_opt_in():
    assert parse_config(GOOD).source("shop").schema_changes == SchemaChanges("rewrite", "rewrite")
    assert parse_config(with_change("sources.shop.schema_changes", {})).source("shop").schema_changes.widen == "rewrite"
    cfg = parse_config(with_change("sources.shop.schema_changes", {"widen": "type_widening"}))
    assert cfg.source("shop").schema_changes == SchemaChanges("type_widening", "rewrite")
    assert cfg.source("crm").schema_changes == SchemaChanges()
    cfg = parse_config(with_change("sources.shop.schema_changes", {"rename": "column_mapping"}))
    assert cfg.source("shop").schema_changes == SchemaChanges("rewrite", "column_mapping")
