"""Pure merge planning: key strategy, gold schema, watermarks and commit settings."""
from __future__ import annotations

import json

import pytest
from pyspark.sql.types import (
    BooleanType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from slotlake.errors import MergeError
from slotlake.lsn import Lsn
from slotlake.merge.plan import (
    KeyStrategy,
    TableShape,
    gold_schema,
    history_schema,
    merge_commit_conf,
    newest_watermark,
    parse_tables,
    plan_table,
    rewrite_note,
    schema_mismatch,
    stage_metadata,
    watermark_of,
)
from slotlake.names import TableName
from slotlake.spark.schemas import struct_of

pytestmark = pytest.mark.unit


def shape(ri: str = "d", keys: tuple[str, ...] = ("id",), columns=("id", "amount", "note")) -> TableShape:
    oids = {"id": 23, "amount": 1700, "note": 25, "_slotlake_x": 25}
    return TableShape("public", "orders", tuple(columns), tuple(oids[c] for c in columns),
                      tuple(((12 << 16) | 2) + 4 if c == "amount" else -1 for c in columns), keys, ri)


@pytest.mark.parametrize("ri,keys,strategy,positions", [
    ("d", ("id",), KeyStrategy.KEYED, (0,)),
    ("i", ("note", "id"), KeyStrategy.KEYED, (2, 0)),
    ("f", ("id", "amount", "note"), KeyStrategy.FULL_ROW, ()),
    ("n", (), KeyStrategy.INSERT_ONLY, ()),
], ids=["default_pk", "using_index", "full", "nothing"])
def test_plan_table_strategy(ri, keys, strategy, positions):
    plan = plan_table(shape(ri, keys), "hard")
    assert (plan.strategy, plan.key_positions, plan.soft_delete) == (strategy, positions, False)


def test_gold_schema_follows_the_columns_numeric_setting():
    s = TableShape("public", "ledger", ("id", "amount", "fee", "price"), (23, 1700, 1700, 1700),
                   (-1, -1, -1, ((12 << 16) | 2) + 4), ("id",), "d")
    plan = plan_table(s, "hard", lambda c: "string" if c in ("amount", "price") else "decimal")
    assert plan.unconstrained_numeric == ("decimal", "string", "decimal", "string")
    types = {f.name: f.dataType for f in struct_of(plan.gold_schema).fields}
    assert types["amount"] == StringType() and types["fee"] == DecimalType(38, 18)
    assert types["price"] == DecimalType(12, 2)  # a precision makes the setting irrelevant
    assert {f.name: f.dataType for f in struct_of(plan_table(s, "hard").gold_schema).fields}["amount"] == \
        DecimalType(38, 18)


@pytest.mark.parametrize("table_shape,message", [
    (shape("d", ()), "no key column"),
    (shape("d", ("nope",)), "key columns \\['nope'\\]"),
    (shape("x"), "unknown replica identity"),
    (shape(columns=("id", "_slotlake_x")), "reserved prefix"),
    (shape(columns=("id", "id")), "duplicate column"),
], ids=["default_without_pk", "key_not_a_column", "bad_identity", "reserved_name", "duplicate_name"])
def test_plan_table_rejects(table_shape, message):
    with pytest.raises(MergeError, match=message):
        plan_table(table_shape, "hard")


def test_keyless_table_is_merged_as_appends_when_the_source_says_so():
    keyless = shape("d", ())
    with pytest.raises(MergeError, match="no key column.*insert_only"):
        plan_table(keyless, "hard")
    plan = plan_table(keyless, "soft", keyless_appends=True)
    assert (plan.strategy, plan.key_positions, plan.soft_delete) == (KeyStrategy.INSERT_ONLY, (), True)
    assert "_slotlake_dup" not in struct_of(plan.gold_schema).fieldNames()
    # a table with a key keeps its key even in a source that appends keyless tables
    assert plan_table(shape("d", ("id",)), "hard", keyless_appends=True).strategy is KeyStrategy.KEYED
    assert plan_table(shape("f", ("id", "amount", "note")), "hard", keyless_appends=True).strategy \
        is KeyStrategy.FULL_ROW


def test_gold_schema_adds_slotlake_columns():
    keyed = struct_of(gold_schema(shape(), KeyStrategy.KEYED, soft_delete=False))
    assert keyed == StructType([
        StructField("id", IntegerType()), StructField("amount", DecimalType(12, 2)), StructField("note", StringType()),
        StructField("_slotlake_lsn", LongType(), False), StructField("_slotlake_commit_ts", TimestampType())])
    full_soft = struct_of(plan_table(shape("f", ("id", "amount", "note")), "soft").gold_schema)
    assert full_soft.fieldNames()[-4:] == ["_slotlake_lsn", "_slotlake_commit_ts", "_slotlake_deleted", "_slotlake_dup"]
    assert full_soft["_slotlake_deleted"].dataType == BooleanType()
    assert full_soft["_slotlake_dup"].dataType == IntegerType()


def test_schema_mismatch_names_the_difference():
    want = gold_schema(shape(), KeyStrategy.KEYED, False)
    assert schema_mismatch(want, want) is None
    narrower = gold_schema(shape(columns=("id", "note")), KeyStrategy.KEYED, False)
    assert "amount" in schema_mismatch(narrower, want)


def test_merge_commit_conf():
    conf = merge_commit_conf("shop", "public", "orders", Lsn.parse("16/B374D848"))
    assert conf == {
        "spark.databricks.delta.write.txnAppId": "slotlake-merge-shop-public.orders",
        "spark.databricks.delta.write.txnVersion": str(0x16B374D848),
        "spark.databricks.delta.commitInfo.userMetadata": '{"slotlake":{"end_lsn":"16/B374D848","stage":"merge"}}',
    }


@pytest.mark.parametrize("meta,want", [
    (None, None), ("", None), ("not json", None), ('{"other": 1}', None), ('{"slotlake": {"stage": "x"}}', None),
    ('{"slotlake": {"end_lsn": "bogus"}}', None), ('{"slotlake": {"end_lsn": "0/1A"}}', Lsn(0x1A)),
    (stage_metadata(Lsn(5), "decode"), Lsn(5)),
], ids=["none", "empty", "not_json", "foreign", "no_end", "bad_lsn", "lsn", "roundtrip"])
def test_watermark_of(meta, want):
    assert watermark_of(meta) == want


def test_newest_watermark_takes_newest_slotlake_commit():
    history = [(0, None), (1, stage_metadata(Lsn(10), "merge")), (3, "OPTIMIZE"), (2, stage_metadata(Lsn(20), "merge"))]
    assert newest_watermark(history) == (2, Lsn(20))
    assert newest_watermark([(0, None)]) is None
    assert json.loads(stage_metadata(Lsn(20), "merge"))["slotlake"]["stage"] == "merge"


@pytest.mark.parametrize("arg,want", [
    (None, None), ("", None), ("public.a", (("public", "a"),)), (" public.a , s.b", (("public", "a"), ("s", "b"))),
], ids=["none", "empty", "one", "two_with_spaces"])
def test_parse_tables(arg, want):
    assert parse_tables(arg) == want


def test_parse_tables_rejects_unqualified():
    with pytest.raises(MergeError, match="schema.table"):
        parse_tables("orders")


def test_history_schema_keeps_the_source_columns_and_dup_then_the_version_columns():
    full_soft = plan_table(shape("f", ("id", "amount", "note")), "soft").gold_schema
    history = history_schema(full_soft)
    assert [f.name for f in history] == ["id", "amount", "note", "_slotlake_dup", "_slotlake_valid_from_lsn",
                                         "_slotlake_valid_to_lsn", "_slotlake_valid_from_ts", "_slotlake_valid_to_ts",
                                         "_slotlake_op"]
    assert history[:4] == tuple(f for f in full_soft if f.name in ("id", "amount", "note", "_slotlake_dup"))
    assert struct_of(history)["_slotlake_valid_to_lsn"].nullable and not struct_of(history)["_slotlake_op"].nullable


def test_rewrite_note_names_deletion_vectors_for_a_merge_that_copied_a_big_table_to_change_a_few_rows():
    accounts = TableName("public", "accounts")
    # 1,000 random-key updates into 10 M rows: Delta's MERGE metrics as a copy-on-write commit records them.
    metrics = {"numTargetRowsCopied": "9999000", "numTargetRowsUpdated": "990", "numTargetRowsDeleted": "10",
               "numTargetRowsInserted": "0"}
    note = rewrite_note(accounts, metrics, deletion_vectors=False)
    assert note is not None and "\n" not in note
    assert "9,999,000 unchanged gold rows" in note and "update/delete 1,000" in note
    assert "deletion_vectors: ['public.accounts']" in note
    # Not for a table that already has them, a small table, or a batch that changes a sizable share of gold.
    assert rewrite_note(accounts, metrics, deletion_vectors=True) is None
    assert rewrite_note(accounts, {**metrics, "numTargetRowsCopied": "999999"}, deletion_vectors=False) is None
    assert rewrite_note(accounts, {**metrics, "numTargetRowsUpdated": "99990"}, deletion_vectors=False) is None
    # An append's metrics (no MERGE counters) and a delete-only MERGE of a big table.
    assert rewrite_note(accounts, {"numOutputRows": "5"}, deletion_vectors=False) is None
    assert rewrite_note(accounts, {"numTargetRowsCopied": "2000000", "numTargetRowsDeleted": "1"},
                        deletion_vectors=False) is not None
