"""The pure parts of `slotlake transactions` and `slotlake undo`: counting, value rendering, the script's shape."""
from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.recover.transactions import TransactionList, summarize
from slotlake.recover.undo import (
    Column,
    TableUndo,
    TransactionRef,
    key_moves,
    render_script,
    sql_literal,
    type_sql,
    value_text,
)

pytestmark = pytest.mark.unit

TS = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
REF = TransactionRef("src", 777, Lsn.parse("0/1A2B3C"), Lsn.parse("0/1A2B70"), TS)


@pytest.mark.parametrize("value, text", [
    (True, "true"), (False, "false"), (42, "42"), (-7, "-7"),
    (1.1, "1.1"), (float("nan"), "NaN"), (float("inf"), "Infinity"), (float("-inf"), "-Infinity"),
    (Decimal("1.50"), "1.50"), (Decimal("1E+3"), "1000"), (Decimal("NaN"), "NaN"),
    (b"\x00\xff'", "\\x00ff27"),
    (date(2020, 2, 29), "2020-02-29"),
    (TS, "2026-01-02 03:04:05.678901+00:00"),
    (datetime(2026, 1, 2, 3, 4, 5), "2026-01-02 03:04:05"),
    ("it's", "it's"),
    (["a'b", 'c"d', None, "e\\f", ""], '{"a\'b","c\\"d",NULL,"e\\\\f",""}'),
    ([1, 2, None], '{"1","2",NULL}'),
], ids=["true", "false", "int", "negative", "float", "nan", "inf", "-inf", "decimal scale kept", "decimal exp",
        "decimal nan", "bytea", "date", "timestamptz", "timestamp", "text", "text array", "int array"])
def test_value_text_is_postgres_input_syntax(value, text):
    assert value_text(value) == text


def test_sql_literal_quotes_and_casts():
    assert sql_literal("it's", Column("c", "text")) == "'it''s'::\"text\""
    assert sql_literal(None, Column("c", "int4")) == 'NULL::"int4"'
    assert sql_literal(5, Column("c", None)) == "'5'"
    assert type_sql('"My Schema".mood') == '"My Schema"."mood"'
    assert type_sql("_int4") == '"_int4"'


def test_summarize_counts_per_transaction_and_table():
    t1, t2 = datetime(2026, 1, 1), datetime(2026, 1, 2)
    rows = [
        {"commit_lsn": 200, "commit_end_lsn": 210, "commit_ts": t2, "xid": 9, "schema_name": "public",
         "table_name": "b", "op": "T", "n": 1},
        {"commit_lsn": 100, "commit_end_lsn": 110, "commit_ts": t1, "xid": 8, "schema_name": "public",
         "table_name": "a", "op": "I", "n": 3},
        {"commit_lsn": 100, "commit_end_lsn": 110, "commit_ts": t1, "xid": 8, "schema_name": "public",
         "table_name": "a", "op": "I", "n": 2},  # the same group from another record batch
        {"commit_lsn": 100, "commit_end_lsn": 110, "commit_ts": t1, "xid": 8, "schema_name": "public",
         "table_name": "a", "op": "U", "n": 1},
        {"commit_lsn": 100, "commit_end_lsn": 110, "commit_ts": t1, "xid": 8, "schema_name": "Odd",
         "table_name": "x y", "op": "D", "n": 4},
    ]
    got = summarize(rows)
    assert [(t.xid, t.commit_lsn, t.commit_end_lsn) for t in got] == [(8, Lsn(100), Lsn(110)), (9, Lsn(200), Lsn(210))]
    assert got[0].commit_ts == t1.replace(tzinfo=UTC)
    assert [c.as_dict() for c in got[0].tables] == [
        {"table": '"Odd"."x y"', "inserted": 0, "updated": 0, "deleted": 4, "truncated": 0},
        {"table": "public.a", "inserted": 5, "updated": 1, "deleted": 0, "truncated": 0}]
    assert [c.as_dict() for c in got[1].tables] == [
        {"table": "public.b", "inserted": 0, "updated": 0, "deleted": 0, "truncated": 1}]
    only_b = summarize(rows, [TableName("public", "b")])
    assert [t.xid for t in only_b] == [9]


def _keyed(removed, added) -> TableUndo:
    cols = (Column("id", "int4"), Column("v", "text"), Column("doc", "json"))
    return TableUndo(TableName("public", "t"), cols, ("id",), tuple(removed), tuple(added))


def test_script_checks_first_then_deletes_updates_inserts_in_one_transaction():
    script = render_script(REF, [_keyed(
        removed=[{"id": 1, "v": "old", "doc": None}, {"id": 2, "v": "gone", "doc": '{"a": 1}'}],
        added=[{"id": 1, "v": "new", "doc": None}, {"id": 3, "v": "added", "doc": None}])])
    lines = script.splitlines()
    assert lines.count("BEGIN;") == 1 and lines[-1] == "COMMIT;"
    body = script[script.index("BEGIN;"):]
    do, delete = body.index("DO $slotlake_undo$"), body.index('DELETE FROM "public"."t" WHERE "id" = \'3\'::"int4";')
    update = body.index('UPDATE "public"."t" SET "v" = \'old\'::"text" WHERE "id" = \'1\'::"int4";')
    insert = body.index('INSERT INTO "public"."t" ("id", "v", "doc") OVERRIDING SYSTEM VALUE VALUES '
                        '(\'2\'::"int4", \'gone\'::"text", \'{"a": 1}\'::"json");')
    assert body.index('LOCK TABLE "public"."t" IN EXCLUSIVE MODE;') < do < delete < update < insert
    # after-images checked column by column (json through its text: it has no equality operator); a row the
    # transaction deleted must still be absent
    assert ('"id" = \'1\'::"int4" AND "v" = \'new\'::"text" AND "doc" IS NULL) <> 1' in script)
    assert "\"doc\"::text = " not in script  # NULL json: IS NULL is enough
    assert "FROM \"public\".\"t\" WHERE \"id\" = '2'::\"int4\") <> 0" in script
    assert "public.t row (\"id\")=(3) changed since transaction 777 (commit 0/1A2B3C)" in script


def test_script_full_identity_counts_identical_rows():
    cols = (Column("k", "text"), Column("q", "int4"))
    t = TableUndo(TableName("public", "ev"), cols, (), removed=({"k": "a", "q": 1},),
                  added=({"k": "z", "q": 2}, {"k": "z", "q": 2}), after_counts=(1, 3))
    script = render_script(REF, [t])
    assert "WHERE \"k\" = 'a'::\"text\" AND \"q\" = '1'::\"int4\") <> 1" in script
    assert "WHERE \"k\" = 'z'::\"text\" AND \"q\" = '2'::\"int4\") <> 3" in script
    assert ('DELETE FROM "public"."ev" WHERE ctid IN (SELECT ctid FROM "public"."ev" WHERE "k" = \'z\'::"text" '
            'AND "q" = \'2\'::"int4" LIMIT 2);') in script
    assert script.count('INSERT INTO "public"."ev"') == 1


def test_dollar_quote_tag_avoids_the_values():
    script = render_script(REF, [_keyed(removed=[], added=[{"id": 1, "v": "$slotlake_undo$", "doc": None}])])
    assert "DO $slotlake_undo_1$" in script


def test_key_moves_follow_a_row_through_the_transaction():
    a, b, c, d = ("1",), ("2",), ("3",), ("4",)
    assert key_moves([("U", a, b), ("U", b, c), ("U", d, d), ("I", None, a)]) == ((a, c),)
    assert key_moves([("U", a, b), ("D", b, None)]) == ()  # moved, then deleted: a plain delete
    assert key_moves([("U", a, b), ("U", b, a)]) == ()  # moved back


def test_key_change_is_set_back_by_one_update_when_the_keys_pair():
    t = dataclasses.replace(_keyed(removed=[{"id": 4, "v": "x", "doc": None}],
                                   added=[{"id": 400, "v": "x", "doc": None}]), moved=((("4",), ("400",)),))
    script = render_script(REF, [t])
    assert 'UPDATE "public"."t" SET "id" = \'4\'::"int4" WHERE "id" = \'400\'::"int4";' in script
    assert "DELETE FROM" not in script and "INSERT INTO" not in script
    assert "WHERE \"id\" = '4'::\"int4\") <> 0" in script  # the old key must still be free
    unpaired = render_script(REF, [dataclasses.replace(t, moved=())])
    assert 'DELETE FROM "public"."t" WHERE "id" = \'400\'::"int4";' in unpaired and "INSERT INTO" in unpaired


def test_transaction_list_prints_one_line_per_transaction_and_table():
    ts = datetime(2026, 1, 1, 9, 14)
    rows = [{"commit_lsn": 100, "commit_end_lsn": 110, "commit_ts": ts, "xid": 8, "schema_name": "public",
             "table_name": t, "op": op, "n": n} for t, op, n in (("a", "I", 3), ("orders", "D", 12))]
    lines = TransactionList("src", Lsn(5), Lsn(500), True, summarize(rows)).lines()
    assert lines == [
        "transactions src: 1 commit(s) in [0/5, 0/1F4]",
        "xid  commit_lsn  commit_end_lsn  commit_ts (UTC)             table          ins  upd  del  trunc",
        "8    0/64        0/6E            2026-01-01 09:14:00.000000  public.a         3    0    0      0",
        "                                                             public.orders    0    0   12      0"]
    assert TransactionList("src", Lsn(5), Lsn(500), False, ()).lines() == [
        "transactions src: 0 commit(s) in (0/5, 0/1F4]"]


def test_except_all_is_a_multiset_difference_with_spark_equality():
    """`undo_in_process._except_all`: rows EXCEPT ALL others, duplicates counted, NULL equal to NULL, NaN to NaN,
    lists compared by value; the rows left keep their order."""
    from collections import Counter

    from slotlake.recover.undo_in_process import _except_all, _hashable

    a = [{"k": "a", "v": 1}, {"k": "a", "v": 1}, {"k": "b", "v": None}, {"k": "n", "v": float("nan")},
         {"k": "l", "v": [1, None]}, {"k": "c", "v": 3}]
    b = [{"k": "a", "v": 1}, {"k": "b", "v": None}, {"k": "n", "v": float("nan")}, {"k": "l", "v": [1, None]}]
    assert _except_all(a, Counter(map(_hashable, a)), Counter(map(_hashable, b))) == [{"k": "a", "v": 1},
                                                                                      {"k": "c", "v": 3}]
    assert _except_all(b, Counter(map(_hashable, b)), Counter(map(_hashable, a))) == []
