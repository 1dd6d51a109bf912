"""Tables and columns whose names need quotes, through the real CLI: initial copy, changes, schema change.

`"Sales Dept"."Order Items"` has a key with a space, a reserved word, mixed case, a dot in a column name and a
TOASTed mixed-case text column; `Log."Entries"` in the same schema (a dot and quotes in its name) is REPLICA
IDENTITY FULL. After every sync each gold table equals its PostgreSQL table row by row.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import functions as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402

SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")

ITEMS = '"Sales Dept"."Order Items"'
LOG = '"Sales Dept"."Log.""Entries"""'
BIG = "repeat(md5(random()::text), 300)"  # ~9.6 KB: stored out of line, sent as unchanged TOAST when untouched

SCHEMA = f"""
CREATE SCHEMA "Sales Dept";
CREATE TABLE {ITEMS} (
    "Item ID" int PRIMARY KEY,
    "select" text,
    "Qty" int NOT NULL,
    "LongNote" text,
    "unit.price" numeric(8, 2)
);
ALTER TABLE {ITEMS} ALTER COLUMN "LongNote" SET STORAGE EXTERNAL;
CREATE TABLE {LOG} ("At Time" timestamptz, "Msg" text, "Level" int);
ALTER TABLE {LOG} REPLICA IDENTITY FULL;
INSERT INTO {ITEMS} SELECT i, 'sel ' || i, i * 10, {BIG}, i + 0.5 FROM generate_series(1, 6) i;
INSERT INTO {LOG} VALUES ('2026-01-01 00:00+00', 'boot', 1), ('2026-01-01 00:00+00', 'boot', 1),
                         ('2026-01-02 00:00+00', 'ready', 2);
"""

ROUND_1 = [
    f"INSERT INTO {ITEMS} VALUES (7, 'seven', 70, {BIG}, 7.25), (8, NULL, 80, NULL, NULL)",
    f'UPDATE {ITEMS} SET "Qty" = "Qty" + 1 WHERE "Item ID" IN (1, 2)',  # "LongNote" untouched: unchanged TOAST
    f'UPDATE {ITEMS} SET "select" = \'changed\' WHERE "Item ID" = 3',
    f'UPDATE {ITEMS} SET "Item ID" = 100 WHERE "Item ID" = 4',  # key change, "LongNote" unchanged TOAST
    f'DELETE FROM {ITEMS} WHERE "Item ID" = 5',
    f'UPDATE {ITEMS} SET "LongNote" = \'short now\' WHERE "Item ID" = 6',
    f"INSERT INTO {LOG} VALUES ('2026-01-03 00:00+00', 'boot', 1)",
    f"""DELETE FROM {LOG} WHERE ctid = (SELECT min(ctid) FROM {LOG} WHERE "Msg" = 'boot')""",
    f"""UPDATE {LOG} SET "Level" = 3 WHERE "Msg" = 'ready'""",
]

ROUND_2 = [  # a new column whose name needs quotes and column mapping in Delta, then changes around it
    f'ALTER TABLE {ITEMS} ADD COLUMN "Unit Price (EUR)" numeric(8, 2)',
    f'UPDATE {ITEMS} SET "Unit Price (EUR)" = 9.99, "Qty" = 0 WHERE "Item ID" = 100',  # moved row, TOAST again
    f"INSERT INTO {ITEMS} VALUES (9, 'nine', 90, {BIG}, 9.5, 1.25)",
    f'UPDATE {ITEMS} SET "Item ID" = 101 WHERE "Item ID" = 1',
    f'DELETE FROM {ITEMS} WHERE "Item ID" = 2',
]


def slotlake(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SLOTLAKE, "--config", str(config), *args], capture_output=True, text=True, timeout=900)


def run_sql(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def write_config(path: Path, dsn: str) -> Path:
    # As a user writes it in YAML: single-quoted entries, PostgreSQL's double quotes inside.
    path.write_text(f"lake: ./lake\nspark: {{master: \"local[2]\"}}\nsources:\n  shop:\n    dsn: {dsn}\n"
                    f"    tables: ['{ITEMS}', '{LOG}']\n")
    return path


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
def test_quoted_tables_and_columns_sync_end_to_end(pg_db, tmp_path, spark):
    run_sql(pg_db, [SCHEMA])
    cfg = write_config(tmp_path / "slotlake.yaml", pg_db)
    paths = LakePaths(str(tmp_path / "lake" / "shop"))
    items_gold, log_gold = paths.gold("Sales Dept", "Order Items"), paths.gold("Sales Dept", 'Log."Entries"')
    assert items_gold.endswith("/gold/Sales!20Dept/Order!20Items")
    assert log_gold.endswith("/gold/Sales!20Dept/Log!2E!22Entries!22")

    def sync_and_compare() -> dict[str, int]:
        p = slotlake("sync", "shop", config=cfg)
        assert p.returncode == 0, p.stderr[-3000:]
        return {ITEMS: assert_gold_equals_pg(items_gold, pg_db, ITEMS),
                LOG: assert_gold_equals_pg(log_gold, pg_db, LOG)}

    assert sync_and_compare() == {ITEMS: 6, LOG: 3}  # the initial copy

    run_sql(pg_db, ROUND_1)
    assert sync_and_compare() == {ITEMS: 7, LOG: 3}
    silver = spark.read.format("delta").load(paths.changes).where(F.col("table_name") == "Order Items")
    # the unchanged-TOAST path really ran (the updates of 1, 2, 3 and the key change of 4 left "LongNote" alone)
    assert silver.where(F.size("unchanged") > 0).count() == 4
    notes = {r[0]: r[1] for r in spark.read.format("delta").load(items_gold)
             .select("`Item ID`", F.length("LongNote")).collect()}
    assert notes[1] == notes[2] == notes[100] == 9600 and notes[6] == len("short now")

    run_sql(pg_db, ROUND_2)
    assert sync_and_compare() == {ITEMS: 7, LOG: 3}
    props = spark.sql(f"DESCRIBE DETAIL delta.`{items_gold}`").collect()[0]["properties"]
    assert props.get("delta.columnMapping.mode") == "name"

    status = slotlake("status", "shop", "--json", config=cfg)
    assert status.returncode == 0, status.stderr[-3000:]
    assert {t["table"] for t in json.loads(status.stdout)["tables"]} == {ITEMS, LOG}
