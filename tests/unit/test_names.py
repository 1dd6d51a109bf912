"""Table names as PostgreSQL reads them, and their folders in the lake (slotlake.names, slotlake.lake)."""
from __future__ import annotations

import pytest

from slotlake import delta_log
from slotlake.config import parse_config
from slotlake.errors import ConfigError, MergeError
from slotlake.lake import LakePaths, name_of_segment, path_segment
from slotlake.merge.plan import needs_column_mapping, parse_tables
from slotlake.names import TableName
from slotlake.recover.replay import request
from slotlake.source.connection import table_ident
from slotlake.source.copies import copy_folder, snapshot_dir, table_of_copy_folder

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text,schema,name,canonical", [
    ("public.orders", "public", "orders", "public.orders"),
    ("Public.Orders", "public", "orders", "public.orders"),
    ("  public . orders ", "public", "orders", "public.orders"),
    ("s1.t$2", "s1", "t$2", "s1.t$2"),
    ("_x._y", "_x", "_y", "_x._y"),
    ('"Sales Dept"."Order Items"', "Sales Dept", "Order Items", '"Sales Dept"."Order Items"'),
    ('public."OrderItems"', "public", "OrderItems", 'public."OrderItems"'),
    ('"public"."orders"', "public", "orders", "public.orders"),
    ('public."select"', "public", "select", "public.select"),
    ('"a.b"."c.d"', "a.b", "c.d", '"a.b"."c.d"'),
    ('"say ""hi"""."x""y"', 'say "hi"', 'x"y', '"say ""hi"""."x""y"'),
    ('"a/b"."50%"', "a/b", "50%", '"a/b"."50%"'),
    ("Straße.Ärger", "straße", "Ärger", '"straße"."Ärger"'),
    ('"1st".t', "1st", "t", '"1st".t'),
], ids=["plain", "unquoted-folds", "spaces-around", "dollar", "underscore", "quoted-spaces", "quoted-mixed-case",
        "quoted-plain", "reserved-word", "dots-inside-quotes", "embedded-quotes", "slash-percent",
        "non-ascii-not-folded", "leading-digit"])
def test_parse_and_canonical_form(text, schema, name, canonical):
    t = TableName.parse(text)
    assert (t.schema, t.name) == (schema, name)
    assert str(t) == canonical
    assert TableName.parse(str(t)) == t  # the canonical form reads back to the same name


@pytest.mark.parametrize("text,message", [
    ("orders", "'orders' must be written schema.table"),
    ("", "must be written schema.table"),
    ("public.", "must be written schema.table (found 'the end'"),
    ("a.b.c", "'a.b.c' must be written schema.table"),
    ('"Sales Dept.x', "a double quote is not closed"),
    ('"".t', "is an empty name"),
    ("Sales Dept.t", "unexpected 'D' after sales; write names with spaces"),
    ("1a.t", "found '1' where a name should start"),
    ("s." + "x" * 64, "longer than 63 bytes"),
    ('public."a"b', "unexpected 'b' after a"),
], ids=["no-schema", "empty", "no-table", "three-parts", "unclosed-quote", "empty-quoted", "unquoted-space",
        "leading-digit-unquoted", "too-long", "junk-after-quote"])
def test_parse_errors_are_one_line(text, message):
    with pytest.raises(ConfigError) as err:
        TableName.parse(text)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_parse_list_keeps_commas_inside_quotes():
    assert TableName.parse_list('public.a, "x,y"."b,""c"  ,') == (("public", "a"), ("x,y", 'b,"c'))
    assert TableName.parse_list("") == ()
    assert parse_tables('"S D"."O, I",public.a') == (("S D", "O, I"), ("public", "a"))
    with pytest.raises(MergeError, match="--tables: "):
        parse_tables('public.a,"b')


def test_sql_quotes_every_part():
    from psycopg import sql

    t = TableName.parse('"Sales Dept"."Order ""Items"""')
    assert table_ident(t) == sql.Identifier("Sales Dept", 'Order "Items"')
    assert table_ident(t).as_string(None) == '"Sales Dept"."Order ""Items"""'


def test_config_tables_take_postgresql_names():
    cfg = parse_config({"lake": "/tmp/l", "sources": {"shop": {
        "dsn": "postgresql://u@h/db", "tables": ['"Sales Dept"."Order Items"', "Public.Orders", 'public."Orders"']}}})
    assert cfg.sources["shop"].tables == ('"Sales Dept"."Order Items"', "public.orders", 'public."Orders"')
    with pytest.raises(ConfigError, match=r"sources.shop.tables: lists a table twice"):
        parse_config({"lake": "/tmp/l", "sources": {"shop": {"dsn": "postgresql://u@h/db",
                                                              "tables": ["public.orders", 'PUBLIC."orders"']}}})
    with pytest.raises(ConfigError, match=r"^sources.shop.tables: 'Sales Dept.x': unexpected 'D'"):
        parse_config({"lake": "/tmp/l",
                      "sources": {"shop": {"dsn": "postgresql://u@h/db", "tables": ["Sales Dept.x"]}}})


def test_replay_table_arguments_round_trip_through_the_spark_app_arguments():
    r = request("shop", "0/10", "0/20", ['"Sales Dept"."Order, Items"', "public.orders"])
    assert r.tables == (("Sales Dept", "Order, Items"), ("public", "orders"))
    tables_arg = r.args()[r.args().index("--tables") + 1]
    assert TableName.parse_list(tables_arg) == r.tables
    with pytest.raises(ConfigError, match="^--table 'orders' must be written schema.table"):
        request("shop", "0/10", "0/20", ["orders"])


@pytest.mark.parametrize("name,segment", [
    ("orders", "orders"),
    ("order_items", "order_items"),
    ("_prisma_migrations", "_prisma_migrations"),
    ("t$1", "t$1"),
    ("OrderItems", "OrderItems"),
    ("Order Items", "Order!20Items"),
    ("a/b", "a!2Fb"),
    ("50%", "50!25"),
    ("a.b", "a!2Eb"),
    (".hidden", "!2Ehidden"),
    ("..", "!2E!2E"),
    ("_delta_log", "!5Fdelta_log"),
    ("x!y", "x!21y"),
    ('say "hi"', "say!20!22hi!22"),
    ("Ärger", "!C3!84rger"),
    ("a`b:c", "a!60b!3Ac"),
], ids=["plain", "underscore", "leading-underscore", "dollar", "mixed-case", "space", "slash", "percent", "dot",
        "leading-dot", "dot-dot", "delta-log", "escape-char", "quotes", "non-ascii", "backtick-colon"])
def test_path_segment_round_trip(name, segment):
    assert path_segment(name) == segment
    assert name_of_segment(segment) == name


@pytest.mark.parametrize("segment", ["a b", "a%20b", "!2e", "!2", "a!ZZ", "!FF", "", "!6F", "_delta_log"],
                         ids=["raw-space", "percent", "lower-hex", "short-escape", "bad-hex", "bad-utf8", "empty",
                              "needless-escape", "raw-delta-log"])
def test_segments_slotlake_would_not_write_are_refused(segment):
    assert name_of_segment(segment) is None


def test_plain_names_keep_their_gold_paths_and_others_are_encoded():
    paths = LakePaths("/lake/shop")
    assert paths.gold("public", "orders") == "/lake/shop/gold/public/orders"
    assert paths.gold("Sales Dept", "Order Items") == "/lake/shop/gold/Sales!20Dept/Order!20Items"
    assert paths.gold("a", "b/../../c") == "/lake/shop/gold/a/b!2F!2E!2E!2F!2E!2E!2Fc"



def test_every_lake_path_comes_from_lake_paths():
    paths = LakePaths.of("s3a://bucket/lake/", "shop")
    assert paths.root == "s3a://bucket/lake/shop"
    assert (paths.bronze, paths.snapshots, paths.catalog, paths.changes, paths.ddl_log, paths.quarantine,
            paths.runs, paths.gold_root) == tuple(f"s3a://bucket/lake/shop/{p}" for p in (
                "bronze", "bronze/snapshot", "_catalog", "silver/changes", "_ddl_log", "_quarantine", "_runs", "gold"))
    assert paths.gold_history("public", "orders") == "s3a://bucket/lake/shop/gold_history/public/orders"
    one, two = paths.scratch("replay"), paths.scratch("replay")
    assert one.startswith("s3a://bucket/lake/shop/_replay/") and one != two
    assert copy_folder("public.orders") == "public.orders"
    assert snapshot_dir("/lake/shop/") == "/lake/shop/bronze/snapshot"
    assert snapshot_dir(paths.root) == paths.snapshots  # on S3 too: read and written through slotlake.storage


def test_gold_tables_decodes_folder_names(tmp_path):
    names = [TableName("public", "orders"), TableName("Sales Dept", "Order Items"), TableName("a.b", "c/d"),
             TableName("_delta_log", ".x")]
    for t in names:
        (tmp_path / "gold" / path_segment(t.schema) / path_segment(t.name) / "_delta_log").mkdir(parents=True)
    (tmp_path / "gold" / "public" / "not encoded" / "_delta_log").mkdir(parents=True)  # not slotlake's: skipped
    assert delta_log.gold_tables(str(tmp_path)) == sorted(names)
    for t in delta_log.gold_tables(str(tmp_path)):
        want = tmp_path / "gold" / path_segment(t.schema) / path_segment(t.name)
        assert LakePaths(str(tmp_path)).gold(*t) == str(want)


@pytest.mark.parametrize("table,folder", [
    ("public.orders", "public.orders"),
    ('"a.b".c', "a!2Eb.c"),
    ('a."b.c"', "a.b!2Ec"),
    ('"Sales Dept"."Order Items"', "Sales!20Dept.Order!20Items"),
], ids=["plain", "dot-in-schema", "dot-in-table", "spaces"])
def test_copy_folders_are_unambiguous(table, folder):
    assert copy_folder(table) == folder
    assert table_of_copy_folder(folder) == table


@pytest.mark.parametrize("columns,needed", [
    (["id", "Qty", "select", "a.b", "x`y"], False),
    (["Item ID"], True), (["a,b"], True), (["f(x)"], True), (["a=b"], True), (["a;b"], True), (["a\tb"], True),
], ids=["allowed", "space", "comma", "parens", "equals", "semicolon", "tab"])
def test_column_names_delta_allows_only_with_column_mapping(columns, needed):
    assert needs_column_mapping(columns) is needed
