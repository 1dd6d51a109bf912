"""numeric without precision, end to end (issue 8 item 5): real PostgreSQL, Spark and Delta, in the pipeline's
order (preflight with the slot's initial copy, extract, decode, merge), gold compared with PostgreSQL row by row.

`numeric.unconstrained: string` must land every value exactly as PostgreSQL prints it, in the initial copy and in
the change stream (inserts, updates, key changes, deletes), and replay must map it the same way. In `decimal` mode
the values decimal(38,18) cannot hold are NULL in gold and their `_quarantine` rows carry the row's key (the whole
row for REPLICA IDENTITY FULL). Changing the setting for an existing gold table is refused with the resync to run,
and the resync then rebuilds it with the new mapping.
"""
from __future__ import annotations

import psycopg
import pytest

from oracle import assert_gold_equals_pg
from slotlake.config import parse_config
from slotlake.decode.job import run_decode
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.merge.job import run_merge
from slotlake.merge.watermarks import delta_watermark
from slotlake.recover.replay import request
from slotlake.recover.replay_job import run_replay
from slotlake.source import resync
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SRC = "src"
TABLES = ["public.ledger", "public.entries"]
BIG = "1" + "0" * 40  # 1e40: 41 integer digits
TINY = "0.0000000000000000000001"  # 1e-22: past decimal(38,18)'s 18 fraction digits
LONG = "123456789012345678901234567890.123456789012345678901"
NEG = "-98765432109876543210987654321.000000000000000000000000001"
SETUP = [
    # `fixed` has a precision: the setting does not touch it. `amounts` is an array of unconstrained numerics.
    "CREATE TABLE ledger (id numeric PRIMARY KEY, amount numeric, amounts numeric[], fixed numeric(12,2), note text)",
    "CREATE TABLE entries (tag text, amount numeric)",
    "ALTER TABLE entries REPLICA IDENTITY FULL",
    # rows that exist before the slot: they reach gold through the initial copy
    f"""INSERT INTO ledger VALUES (11, {BIG}, '{{{BIG},NaN}}', 1.5, 'big'), (2, {TINY}, NULL, NULL, 'tiny'),
        (3, {LONG}, '{{1.50,-Infinity}}', -3.25, 'long'), (4, 'NaN', '{{}}', 0, 'nan'),
        (5, {NEG}, '{{{TINY}}}', 7, 'negative'), (6, 'Infinity', NULL, 1, 'inf'), (7, '-Infinity', NULL, 2, 'minf'),
        (8, 12.50, '{{12.50}}', 12.5, 'fits'), (1.0, 0, NULL, NULL, 'one point zero')""",
    f"INSERT INTO entries VALUES ('a', {BIG}), ('a', {BIG}), ('b', 'NaN'), ('c', 1.25)",
]
CHANGES = [
    # inserts
    f"INSERT INTO ledger VALUES (10, -{BIG}, '{{NaN,{LONG}}}', 9.99, 'new'), ({TINY}, 'NaN', NULL, NULL, 'tiny key')",
    f"INSERT INTO entries VALUES ('d', {NEG}), ('d', {NEG})",
    # updates: values in and out of what decimal(38,18) holds, an unchanged-TOAST row, a key change
    f"UPDATE ledger SET amount = {TINY} * 3 WHERE id = 11",
    "UPDATE ledger SET amount = 'Infinity', amounts = '{-Infinity}' WHERE id = 2",
    "UPDATE ledger SET note = repeat('x', 5000) WHERE id = 3",
    "UPDATE ledger SET fixed = 5 WHERE id = 3",
    "UPDATE ledger SET amount = 1.000 WHERE id = 4",
    f"UPDATE ledger SET id = {LONG} WHERE id = 5",
    "UPDATE ledger SET id = 1.00 WHERE id = 1.0",  # equal numerics, another text: pgoutput sends it as a key change
    "UPDATE entries SET amount = '-Infinity' WHERE tag = 'b'",
    # deletes
    "DELETE FROM ledger WHERE id = 6",
    "DELETE FROM entries WHERE ctid = (SELECT min(ctid) FROM entries WHERE tag = 'a')",
]
TEXT_COLUMNS = {"public.ledger": {"id", "amount", "amounts"}, "public.entries": {"amount"}}


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _config(lake, dsn: str, numeric: dict | None):
    source = {"dsn": dsn, "tables": TABLES, **({"numeric": numeric} if numeric is not None else {})}
    return parse_config({"lake": str(lake), "sources": {SRC: source}})


def _sync(spark, cfg) -> None:
    extract(cfg, cfg.source(SRC))
    run_decode(spark, cfg, SRC)
    run_merge(spark, cfg, SRC)


def _quarantine(spark, paths: LakePaths) -> list[tuple]:
    return sorted((r["table_name"], r["column_name"], r["raw_value"], tuple(sorted(r["row_key"].items())),
                   r["xid"] is None) for r in spark.read.format("delta").load(paths.quarantine).collect())


def test_string_mode_gold_equals_postgres_exactly_through_copy_changes_and_replay(spark, pg_db, tmp_path):
    cfg = _config(tmp_path / "lake", pg_db, {"unconstrained": "string"})
    paths = LakePaths.of(cfg.lake, SRC)
    _sql(pg_db, *SETUP)
    run_preflight(cfg, cfg.source(SRC))  # slot + initial copy
    _sync(spark, cfg)  # loads the copy; no change decoded yet
    copied = delta_watermark(spark, paths.gold("public", "ledger"))
    gold_schema = spark.read.format("delta").load(paths.gold("public", "ledger")).schema
    types = {f.name: f.dataType.simpleString() for f in gold_schema}
    assert (types["id"], types["amount"], types["amounts"], types["fixed"]) == (
        "string", "string", "array<string>", "decimal(12,2)")
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t, numeric_text=TEXT_COLUMNS[t])

    _sql(pg_db, *CHANGES)
    _sync(spark, cfg)
    counts = {t: assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t, numeric_text=TEXT_COLUMNS[t])
              for t in TABLES}
    assert counts == {"public.ledger": 10, "public.entries": 5}
    assert spark.read.format("delta").load(paths.quarantine).count() == 0  # nothing lost, nothing set aside

    # Replay of the changes after the copy into a new table maps the same way.
    end = delta_watermark(spark, paths.gold("public", "ledger"))
    dest = str(tmp_path / "replayed")
    run_replay(spark, cfg, request(SRC, str(copied), str(end), ["public.ledger"], dest))
    assert_gold_equals_pg(f"{dest}/public/ledger", pg_db, "public.ledger",
                          numeric_text=TEXT_COLUMNS["public.ledger"])


def test_decimal_mode_quarantines_with_the_row_key_and_a_changed_setting_needs_resync(spark, pg_db, tmp_path):
    cfg = _config(tmp_path / "lake", pg_db, None)  # default: decimal
    paths = LakePaths.of(cfg.lake, SRC)
    _sql(pg_db, *SETUP[:3], "INSERT INTO ledger VALUES (1, 1e40, NULL, 1, 'big'), (2, 12.5, '{NaN,1}', 2, 'fits')",
         "INSERT INTO entries VALUES ('a', 'NaN'), ('a', 'NaN'), ('c', 1.25)")
    run_preflight(cfg, cfg.source(SRC))
    _sync(spark, cfg)
    copy = [("entries", "amount", "NaN", (("amount", "NaN"), ("tag", "a")), True)] * 2 + [
        ("ledger", "amount", BIG, (("id", "1"),), True), ("ledger", "amounts", "{NaN,1}", (("id", "2"),), True)]
    assert _quarantine(spark, paths) == sorted(copy)

    _sql(pg_db, f"INSERT INTO ledger VALUES ({LONG}, {TINY}, NULL, NULL, 'long key')",
         f"UPDATE ledger SET amount = {NEG} WHERE id = 2",
         "UPDATE entries SET amount = 'Infinity' WHERE tag = 'c'", "DELETE FROM ledger WHERE id = 1")
    _sync(spark, cfg)
    # The key text is PostgreSQL's, so a key decimal(38,18) cannot hold still finds the row.
    assert _quarantine(spark, paths) == sorted(copy + [
        ("entries", "amount", "Infinity", (("amount", "Infinity"), ("tag", "c")), False),
        ("ledger", "amount", NEG, (("id", "2"),), False),
        ("ledger", "amounts", "{NaN,1}", (("id", "2"),), False),  # every new tuple holding it, again
        ("ledger", "amount", TINY, (("id", LONG),), False),
        ("ledger", "id", LONG, (("id", LONG),), False)])
    rows = sorted((r["note"], r["amount"]) for r in spark.read.format("delta").load(paths.gold("public", "ledger"))
                  .collect())
    assert rows == [("fits", None), ("long key", None)]
    assert sorted((r["tag"], r["amount"]) for r in spark.read.format("delta")
                  .load(paths.gold("public", "entries")).collect()) == [("a", None), ("a", None), ("c", None)]

    # Switching an existing gold table to string is refused, naming the resync; the resync rebuilds it exactly.
    text_cfg = _config(tmp_path / "lake", pg_db, {"unconstrained": "decimal", "tables": {
        "public.ledger": "string", "public.entries": {"columns": {"amount": "string"}}}})
    _sql(pg_db, "UPDATE ledger SET note = 'changed' WHERE id = 2", "INSERT INTO entries VALUES ('e', 1)")
    extract(text_cfg, text_cfg.source(SRC))
    run_decode(spark, text_cfg, SRC)
    with pytest.raises(MergeError) as err:
        run_merge(spark, text_cfg, SRC)
    assert "column amount (numeric without precision) is decimal(38,18) in gold, but numeric.unconstrained: " \
           "string maps it to string" in str(err.value) and "slotlake resync <source>" in str(err.value)
    resync.resync(text_cfg, text_cfg.source(SRC))
    run_merge(spark, text_cfg, SRC)  # loads the new copies
    _sql(pg_db, f"UPDATE ledger SET amount = {BIG} WHERE id = 2")
    _sync(spark, text_cfg)
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t, numeric_text=TEXT_COLUMNS[t])
