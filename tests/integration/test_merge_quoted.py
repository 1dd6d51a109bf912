"""The merge job with table and column names that need quotes (silver rows written by hand, exact gold contents).

The gold tables here are created by the merge itself (no initial copy), and the second run joins changes to the
gold rows by quoted key columns: unchanged TOAST taken from gold, a key change, deletes, a FULL multiset.
"""
from __future__ import annotations

import pytest

from integration.test_merge_job import INT4, TEXT, Lake, Tbl
from slotlake.names import spark_ident

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ITEMS = Tbl("Order Items", (("Item ID", INT4, -1, True), ("select", TEXT, -1, False), ("LongNote", TEXT, -1, False),
                            ("unit.price", TEXT, -1, False)), schema="Sales Dept")
LOG = Tbl('Log."Entries"', (("At Time", TEXT, -1, False), ("Msg`s", TEXT, -1, False)), ri="f", schema="Sales Dept")
NOTE = "n" * 5000


def gold(lake: Lake, table: Tbl) -> list[tuple]:
    df = lake.spark.read.format("delta").load(lake.paths.gold(table.schema, table.name))
    return sorted((tuple(r) for r in df.select(*[spark_ident(c[0]) for c in table.columns]).collect()), key=repr)


def test_keyed_and_full_tables_with_quoted_names(spark, tmp_path):
    lake = Lake(spark, tmp_path)
    lake.decode([ITEMS.ins(100, 0, "1", "s1", NOTE + "1", "1.5"), ITEMS.ins(100, 1, "2", "s2", NOTE + "2", "2.5"),
                 ITEMS.ins(100, 2, "3", "s3", NOTE + "3", "3.5"),
                 ITEMS.upd(200, 0, "2", "s2b", None, "2.6", unchanged=(2,)),
                 LOG.ins(100, 3, "t1", "boot"), LOG.ins(100, 4, "t1", "boot"), LOG.ins(100, 5, "t2", "ready")], 300)
    lake.merge()
    assert gold(lake, ITEMS) == [(1, "s1", NOTE + "1", "1.5"), (2, "s2b", NOTE + "2", "2.6"),
                                (3, "s3", NOTE + "3", "3.5")]
    props = spark.sql(f"DESCRIBE DETAIL delta.`{lake.paths.gold(ITEMS.schema, ITEMS.name)}`").collect()[0]
    assert props["properties"].get("delta.columnMapping.mode") == "name"  # "Item ID" needs it in Delta

    # Second run: every change joins a gold row by its quoted key (or, FULL, by every quoted column).
    lake.decode([ITEMS.upd(400, 0, "10", "s1", None, "1.5", old=("1", None, None, None), unchanged=(2,)),
                 ITEMS.upd(500, 0, "3", "s3b", None, "3.5", unchanged=(2,)),
                 ITEMS.dele(600, 0, "2", "s2b", None, "2.6"),
                 LOG.dele(600, 1, "t1", "boot")], 700)
    report = lake.merge()
    assert gold(lake, ITEMS) == [(10, "s1", NOTE + "1", "1.5"), (3, "s3b", NOTE + "3", "3.5")]  # sorted by repr
    assert gold(lake, LOG) == [("t1", "boot"), ("t2", "ready")]
    assert {(r.schema_name, r.table_name) for r in report.tables} == {("Sales Dept", "Order Items"),
                                                                      ("Sales Dept", 'Log."Entries"')}
    assert lake.paths.gold(ITEMS.schema, ITEMS.name).endswith("/gold/Sales!20Dept/Order!20Items")
