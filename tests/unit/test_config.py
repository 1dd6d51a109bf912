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


def test_spark_server_address_is_kept(monkeypatch):
    monkeypatch.delenv("SLOTLAKE_SPARK_SERVER", raising=False)
    assert parse_config(GOOD).spark.server is None
    assert parse_config(with_change("spark.server", "127.0.0.1:7079")).spark.server == "127.0.0.1:7079"


def test_spark_server_from_the_environment_unless_the_config_names_one(monkeypatch):
    monkeypatch.setenv("SLOTLAKE_SPARK_SERVER", " 127.0.0.1:7080 ")
    assert parse_config(GOOD).spark.server == "127.0.0.1:7080"
    assert parse_config(with_change("spark.server", "127.0.0.1:7079")).spark.server == "127.0.0.1:7079"
    monkeypatch.setenv("SLOTLAKE_SPARK_SERVER", "")
    assert parse_config(GOOD).spark.server is None
    monkeypatch.setenv("SLOTLAKE_SPARK_SERVER", "7080")
    with pytest.raises(ConfigError, match=r"^SLOTLAKE_SPARK_SERVER: '7080' is not host:port or auto; .* or unset it"):
        parse_config(GOOD)


def test_spark_server_auto_and_its_idle_minutes(monkeypatch):
    monkeypatch.delenv("SLOTLAKE_SPARK_SERVER", raising=False)
    assert parse_config(GOOD).spark.server_idle_minutes == 120
    cfg = parse_config(with_change("spark.server", " Auto "))
    assert cfg.spark.server == "auto" and cfg.spark.server_idle_minutes == 120
    assert parse_config(with_change("spark.server_idle_minutes", 0.5)).spark.server_idle_minutes == 0.5
    monkeypatch.setenv("SLOTLAKE_SPARK_SERVER", "auto")
    assert parse_config(GOOD).spark.server == "auto"
    for bad in (0, -1, "soon", True, 10081):
        with pytest.raises(ConfigError, match=r"^spark.server_idle_minutes: .* is not a number of minutes"):
            parse_config(with_change("spark.server_idle_minutes", bad))


def test_in_process_bytes_default_zero_and_bad_values():
    assert parse_config(GOOD).spark.in_process_bytes == 32 << 20
    assert parse_config(with_change("spark.in_process_bytes", 0)).spark.in_process_bytes == 0
    assert parse_config(with_change("spark.in_process_bytes", 1 << 30)).spark.in_process_bytes == 1 << 30
    for bad in (-1, "4MB", True, 1.5):
        with pytest.raises(ConfigError, match=r"^spark.in_process_bytes: .* is not a number of bytes >= 0"):
            parse_config(with_change("spark.in_process_bytes", bad))


@pytest.mark.parametrize(
    "path, value, fragment",
    [
        ("lake", DELETE, "lake: required"),
        ("colour", "x", "config.colour: unknown key"),
        ("spark.mastr", "local", "spark.mastr: unknown key; did you mean 'master'"),
        ("spark.conf", ["a"], "spark.conf: must be a mapping"),
        ("spark.server", "7079", "spark.server: '7079' is not host:port"),
        ("spark.server", "localhost:99999", "spark.server: 'localhost:99999' is not host:port"),
        ("sources", {}, "sources: required"),
        ("sources.shop.dsn", "mysql://x/y", "sources.shop.dsn: must be a URI starting postgresql://"),
        ("sources.shop.conn_id", "also", "sources.shop: set exactly one of dsn"),
        ("sources.shop.slot", "Bad-Slot", "sources.shop.slot"),
        ("sources.shop.tables", ["orders"], "sources.shop.tables: 'orders' must be written schema.table"),
        ("sources.shop.tables", [], "sources.shop.tables: must be a non-empty list"),
        ("sources.shop.tables", ["public.a", "public.a"], "sources.shop.tables: lists a table twice"),
        ("sources.shop.schedule", "hourly", "sources.shop.schedule"),
        ("sources.shop.optimize_schedule", "daily", "sources.shop.optimize_schedule: 'daily' must be a 5-field cron"),
        ("sources.shop.delete_mode", "purge", "sources.shop.delete_mode: 'purge' must be hard or soft"),
        ("sources.shop.history", "yes", "sources.shop.history: must be true or false"),
        ("sources.shop.on_bad_value", "ignore", "sources.shop.on_bad_value"),
        ("sources.shop.tabels", ["public.a"], "sources.shop.tabels: unknown key; did you mean 'tables'"),
        ("sources.crm.slot", "slotlake_shop", "two sources use the same slot"),
        ("extract", {"upto_nchanges": 0}, "extract.upto_nchanges: must be a positive integer"),
        ("snapshot", {"workers": -1}, "snapshot.workers: must be a positive integer"),
        ("snapshot", {"parts": 4}, "snapshot.parts: unknown key; did you mean 'part_pages'"),
        ("sources.shop.numeric", "string", "sources.shop.numeric: must be a mapping, e.g. {unconstrained: string}"),
        ("sources.shop.numeric", {"unconstrained": "text"},
         "sources.shop.numeric.unconstrained: 'text' must be decimal (decimal(38,18)"),
        ("sources.shop.numeric", {"unconstrainted": "string"},
         "sources.shop.numeric.unconstrainted: unknown key; did you mean 'unconstrained'"),
        ("sources.shop.numeric", {"tables": ["public.orders"]}, "sources.shop.numeric.tables: must be a mapping"),
        ("sources.shop.numeric", {"tables": {"orders": "string"}},
         "sources.shop.numeric.tables: 'orders' must be written schema.table"),
        ("sources.shop.numeric", {"tables": {"public.order": "string"}},
         "sources.shop.numeric.tables.public.order: not one of the source's tables (public.orders, public.customers)"),
        ("sources.shop.numeric", {"tables": {"public.orders": "float"}},
         "sources.shop.numeric.tables.public.orders: 'float' must be decimal"),
        ("sources.shop.numeric", {"tables": {"public.orders": {"column": {"a": "string"}}}},
         "sources.shop.numeric.tables.public.orders.column: unknown key; did you mean 'columns'"),
        ("sources.shop.numeric", {"tables": {"public.orders": {"columns": {"amount": "exact"}}}},
         "sources.shop.numeric.tables.public.orders.columns.amount: 'exact' must be decimal"),
        ("sources.shop.numeric", {"tables": {"public.orders": {"columns": ["amount"]}}},
         "sources.shop.numeric.tables.public.orders.columns: must be a mapping of column name"),
    ],
    ids=["no-lake", "unknown-top-key", "misspelt-spark-key", "spark-conf-list", "spark-server-no-port",
         "spark-server-bad-port", "no-sources", "bad-dsn-scheme",
         "dsn-and-conn-id", "bad-slot-name", "table-without-schema", "empty-tables", "duplicate-table",
         "bad-schedule", "bad-optimize-schedule", "bad-delete-mode", "history-not-bool", "bad-on-bad-value",
         "misspelt-source-key",
         "shared-slot", "zero-upto-nchanges", "negative-snapshot-workers", "misspelt-snapshot-key",
         "numeric-not-mapping", "numeric-bad-mode", "numeric-misspelt-key", "numeric-tables-list",
         "numeric-table-without-schema", "numeric-table-not-synced", "numeric-table-bad-mode",
         "numeric-table-misspelt-key", "numeric-column-bad-mode", "numeric-columns-list"],
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


def test_schemas_and_insert_only_parse_with_their_publication():
    raw = with_change("sources.crm.schemas", ["sales", "ops"])
    raw["sources"]["crm"]["insert_only"] = ["public.events", "ops.log"]
    crm = parse_config(raw).source("crm")
    assert crm.tables is None and crm.schemas == ("sales", "ops")
    assert crm.insert_only == ("public.events", "ops.log")
    assert crm.insert_only_publication == "slotlake_crm_insert_only"
    assert crm.publications == ("slotlake_crm", "slotlake_crm_insert_only")
    assert crm.listed_tables is None
    # the schemas' tables, the insert-only ones, nothing else
    assert [crm.syncs(t) for t in ("sales.a", "ops.b", "public.events", "public.other")] == [True, True, True, False]
    assert crm.keyless_appends("sales.a") and crm.keyless_appends("public.events")


def test_defaults_without_schemas_or_insert_only():
    cfg = parse_config(GOOD)
    shop, crm = cfg.source("shop"), cfg.source("crm")
    assert shop.schemas is None and shop.insert_only == () and shop.publications == ("slotlake_shop",)
    assert shop.listed_tables == ("public.orders", "public.customers")
    assert shop.syncs("public.orders") and not shop.syncs("public.other")
    assert not shop.keyless_appends("public.orders"), "a listed keyless table is refused, not appended"
    assert crm.syncs("any.table") and crm.keyless_appends("any.table"), "no table list: every published table"


def test_insert_only_tables_join_the_listed_tables():
    shop = parse_config(with_change("sources.shop.insert_only", ["public.history"])).source("shop")
    assert shop.listed_tables == ("public.orders", "public.customers", "public.history")
    assert shop.keyless_appends("public.history") and not shop.keyless_appends("public.orders")
    assert shop.syncs("public.history")


def test_history_per_source_or_per_table():
    cfg = parse_config(with_change("sources.shop.history", ["Public.Orders"]))
    shop, crm = cfg.source("shop"), cfg.source("crm")
    assert shop.keeps_history("public.orders") and not shop.keeps_history("public.customers")
    assert crm.keeps_history("any.table")  # history: true, every table
    assert not parse_config(GOOD).source("shop").keeps_history("public.orders")  # default: off
    with pytest.raises(ConfigError, match=r"sources\.shop\.history: public\.nope is not one of the source's tables"):
        parse_config(with_change("sources.shop.history", ["public.nope"]))


def test_deletion_vectors_per_source_or_per_table():
    shop = parse_config(with_change("sources.shop.deletion_vectors", ["Public.Orders"])).source("shop")
    assert shop.uses_deletion_vectors("public.orders") and not shop.uses_deletion_vectors("public.customers")
    every = parse_config(with_change("sources.shop.deletion_vectors", True)).source("shop")
    assert every.uses_deletion_vectors("public.orders") and every.uses_deletion_vectors("public.customers")
    assert not parse_config(GOOD).source("shop").uses_deletion_vectors("public.orders")  # default: off
    with pytest.raises(ConfigError, match=r"sources\.shop\.deletion_vectors: public\.nope is not one of the "):
        parse_config(with_change("sources.shop.deletion_vectors", ["public.nope"]))
    with pytest.raises(ConfigError, match=r"sources\.shop\.deletion_vectors: must be true or false, or a list"):
        parse_config(with_change("sources.shop.deletion_vectors", "yes"))


@pytest.mark.parametrize("path,value,fragment", [
    ("sources.shop.schemas", ["public"], "sources.shop: set tables or schemas, not both"),
    ("sources.crm.schemas", [], "sources.crm.schemas: must be a non-empty list"),
    ("sources.crm.schemas", "public", "sources.crm.schemas: must be a non-empty list"),
    ("sources.crm.schemas", ["Sales Dept"], "sources.crm.schemas: 'Sales Dept' is not a plain schema name"),
    ("sources.crm.schemas", ["a", "a"], "sources.crm.schemas: lists a schema twice"),
    ("sources.shop.insert_only", "public.h", "sources.shop.insert_only: must be a list"),
    ("sources.shop.insert_only", ["history"], "sources.shop.insert_only: 'history' must be written schema.table"),
    ("sources.shop.insert_only", ["public.h", "public.h"], "sources.shop.insert_only: lists a table twice"),
    ("sources.shop.insert_only", ["public.orders"], "public.orders is listed in both tables and insert_only"),
    ("sources.shop.insert_onyl", ["public.h"], "did you mean 'insert_only'"),
], ids=["tables-and-schemas", "empty-schemas", "schemas-not-a-list", "quoted-schema", "duplicate-schema",
        "insert-only-not-a-list", "insert-only-without-schema", "insert-only-twice", "insert-only-and-tables",
        "misspelt-insert-only"])
def test_bad_schemas_or_insert_only_names_the_key(path, value, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(with_change(path, value))
    assert fragment in str(err.value)


def test_insert_only_publication_name_must_fit():
    raw = with_change("sources.shop.publication", "p" * 55)
    assert parse_config(raw).source("shop").publication == "p" * 55  # fine without insert_only
    raw["sources"]["shop"]["insert_only"] = ["public.h"]
    with pytest.raises(ConfigError, match=r"sources.shop.publication: .* too long to name the insert-only publication"):
        parse_config(raw)


def test_lock_timeout_defaults_to_ten_minutes_and_must_be_whole_seconds():
    assert parse_config(GOOD).source("shop").lock_timeout_s == 600
    assert parse_config(with_change("sources.shop.lock_timeout_s", 0)).source("shop").lock_timeout_s == 0
    for bad in (-1, 2.5, "10m", True):
        with pytest.raises(ConfigError, match="sources.shop.lock_timeout_s: .* must be a whole number of seconds"):
            parse_config(with_change("sources.shop.lock_timeout_s", bad))


def test_numeric_setting_per_source_table_and_column():
    assert parse_config(GOOD).source("shop").numeric.unconstrained_for("public.orders", "amount") == "decimal"
    cfg = parse_config(with_change("sources.shop.numeric", {"unconstrained": "string", "tables": {
        "public.orders": {"unconstrained": "decimal", "columns": {"amount": "string"}},
        "public.customers": {"columns": {"credit": "decimal"}}}}))
    numeric = cfg.source("shop").numeric
    assert numeric.unconstrained_for("public.orders", "amount") == "string"  # the column's entry
    assert numeric.unconstrained_for("public.orders", "fee") == "decimal"  # the table's
    assert numeric.unconstrained_for("public.customers", "credit") == "decimal"
    assert numeric.unconstrained_for("public.customers", "limit") == "string"  # the source's
    assert numeric.unconstrained_for("public.other", "x") == "string"
    short = parse_config(with_change("sources.shop.numeric", {"tables": {"public.orders": "string"}}))
    assert short.source("shop").numeric.unconstrained_for("public.orders", "amount") == "string"
    assert short.source("shop").numeric.unconstrained_for("public.customers", "amount") == "decimal"
    # a source without a table list may name any table
    assert parse_config(with_change("sources.crm.numeric", {"tables": {"sales.x": "string"}})) \
        .source("crm").numeric.unconstrained_for("sales.x", "v") == "string"


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


S3 = {**GOOD, "lake": "s3a://lake-bucket/slotlake",
      "storage": {"endpoint": "http://127.0.0.1:9000", "region": "us-east-1", "path_style": True}}


def test_s3_lake_with_storage():
    from slotlake.storage import StorageSettings

    cfg = parse_config(S3)
    assert cfg.lake == "s3a://lake-bucket/slotlake"
    assert cfg.storage == StorageSettings(endpoint="http://127.0.0.1:9000", region="us-east-1", path_style=True)
    # An s3a lake without storage: AWS S3 with the SDKs' defaults; a local lake has none.
    assert parse_config({**S3, "storage": None}).storage == StorageSettings()
    assert parse_config(GOOD).storage is None


@pytest.mark.parametrize("change, message", [
    ({"lake": "./lake"}, r"^storage: only for a lake on S3 \(lake: s3a://bucket/prefix\), but lake is /.*; remove "
                         r"storage: or set lake to an s3a:// URI$"),
    ({"storage": {"access_key": "AKIA"}}, r"^storage\.access_key: credentials are never read from the config; "
                                          r"remove it and set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the "
                                          r"environment$"),
    ({"storage": {"secret_access_key": "x"}}, r"^storage\.secret_access_key: credentials are never read"),
    ({"storage": {"password": "x"}}, r"^storage\.password: credentials are never read"),
    ({"storage": {"endpoit": "http://h:1"}}, r"^storage\.endpoit: unknown key; did you mean 'endpoint'\?$"),
    ({"storage": {"endpoint": "127.0.0.1:9000"}}, r"^storage\.endpoint: '127\.0\.0\.1:9000' must be http\(s\)://"),
    ({"storage": {"path_style": "yes"}}, r"^storage\.path_style: 'yes' must be true"),
    ({"storage": {"region": "US East"}}, r"^storage\.region: 'US East' must be a region name"),
    ({"storage": "http://h:1"}, r"^storage: must be a mapping"),
    ({"lake": "s3://bucket/x", "storage": None}, r"^lake: 's3://bucket/x': a local path or s3a://bucket/prefix"),
    ({"lake": "s3a://Bad_Bucket/x", "storage": None}, r"^lake: 's3a://Bad_Bucket/x' is not s3a://bucket/prefix"),
])
def test_s3_config_refusals(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**S3, **change})


def test_credentials_in_storage_are_refused_before_anything_else(tmp_path):
    """The refusal is one line and does not echo the value."""
    path = tmp_path / "c.yaml"
    path.write_text("lake: s3a://b-1/x\nstorage: {secret_key: hunter2}\nsources: {s: {dsn: 'postgresql://u@h/d'}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert "hunter2" not in str(e.value) and "\n" not in str(e.value)
    assert "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in str(e.value)


def test_optimize_schedule_default_and_null():
    """`optimize_schedule`: gold's compaction DAG runs daily by default; null leaves it to manual runs."""
    cfg = parse_config(GOOD)
    assert cfg.source("shop").optimize_schedule == "30 3 * * *"
    assert parse_config(with_change("sources.shop.optimize_schedule", None)).source("shop").optimize_schedule is None
    assert parse_config(with_change("sources.shop.optimize_schedule", "0 2 * * 0")).source(
        "shop").optimize_schedule == "0 2 * * 0"


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [("sources.shop.optimize_schedule", "99 3 * * *", "sources.shop.optimize_schedule: '99 3 * * *' must be"),
     ("sources.shop.schedule", "0 25 * * *", "sources.shop.schedule: '0 25 * * *' must be a 5-field cron")],
    ids=["optimize-schedule-bad-minute", "schedule-bad-hour"],
)
def test_cron_fields_are_checked_where_the_dags_are_built(path, value, fragment):
    """A cron expression of 5 fields loads (the CLI schedules nothing); `check_schedules`, which the DAG factory
    calls, refuses a field croniter (Airflow's) rejects, naming the key."""
    from slotlake.config import check_schedules

    source = parse_config(with_change(path, value)).source("shop")
    with pytest.raises(ConfigError) as err:
        check_schedules(source)
    assert fragment in str(err.value)
    check_schedules(parse_config(GOOD).source("shop"))  # the defaults pass
