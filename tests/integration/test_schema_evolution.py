"""Schema evolution in gold with a real PostgreSQL, Spark and Delta, through preflight -> extract -> decode -> merge.

The DDL sequence of issue 3 with changes between every step and syncs at several points (some syncs see several
column layouts of one table in one batch): add a column with a constant default, rename, widen, add a column with
a volatile default, drop columns, a table created mid-stream, a table dropped. At the end every gold table equals
PostgreSQL (kept dropped columns are checked apart). Run with the DDL capture and without it (renames are then a
drop plus an add, and the run says so).
"""
from __future__ import annotations

import os
import sys

import psycopg
import pytest

from oracle import assert_gold_equals_pg
from slotlake.config import parse_config
from slotlake.decode.job import run_decode
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.merge.job import run_merge
from slotlake.merge.report import MergeReport
from slotlake.merge.watermarks import delta_watermark
from slotlake.source.ddl import install_ddl_capture
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return get_spark("slotlake-test-evolution", "local[2]", {
        "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"})


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        for s in statements:
            conn.execute(s)


def _sync(spark, cfg) -> MergeReport:
    run_preflight(cfg, cfg.source("src"))
    extract(cfg, cfg.source("src"))
    run_decode(spark, cfg, "src")
    return run_merge(spark, cfg, "src")


def _gold(spark, path: str):
    return spark.read.format("delta").load(path)


def _compare_without(spark, tmp_path, gold: str, dsn: str, table: str, gold_drop: list[str], view_cols: str,
                     tag: str) -> int:
    """Gold minus `gold_drop` columns against a view of `table` with `view_cols` (schema `cmp` is not published)."""
    path = str(tmp_path / f"cmp_{tag}")
    _gold(spark, gold).drop(*gold_drop).write.format("delta").mode("overwrite").save(path)
    _sql(dsn, "CREATE SCHEMA IF NOT EXISTS cmp", f"CREATE OR REPLACE VIEW cmp.{tag} AS SELECT {view_cols} FROM {table}")
    return assert_gold_equals_pg(path, dsn, f"cmp.{tag}")


@pytest.mark.parametrize("capture", [True, False], ids=["ddl-capture", "relation-messages-only"])
def test_ddl_sequence_evolves_gold(spark, pg_db, tmp_path, capture):
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"src": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "src")
    t_gold = paths.gold("public", "t")
    _sql(pg_db,
         "CREATE TABLE t (id int PRIMARY KEY, a int, b varchar(10), f real)",
         "CREATE TABLE gone (id int PRIMARY KEY, v text)",
         "INSERT INTO t SELECT g, g * 10, 'b' || g, g / 4.0 FROM generate_series(1, 6) g",
         "INSERT INTO gone VALUES (1, 'x'), (2, 'y')",
         "CREATE PUBLICATION slotlake_src FOR ALL TABLES",
         "CREATE SCHEMA recorded")
    if capture:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            install_ddl_capture(conn)
    _sync(spark, cfg)  # slot + initial copy of t and gone

    # sync 1: changes, ADD COLUMN with a constant default, more changes: two layouts in one batch
    _sql(pg_db, "INSERT INTO t VALUES (7, 70, 'b7', 1.5)", "UPDATE t SET a = 11 WHERE id = 1",
         "ALTER TABLE t ADD COLUMN c text DEFAULT 'dflt'",
         "INSERT INTO t VALUES (8, 80, 'b8', 2.5, 'c8')", "UPDATE t SET c = 'c2' WHERE id = 2",
         "UPDATE gone SET v = 'x1' WHERE id = 1")
    r1 = _sync(spark, cfg)
    t1 = next(t for t in r1.tables if t.table_name == "t")
    assert "added c" in t1.schema_changes
    if capture:
        assert_gold_equals_pg(t_gold, pg_db, "public.t")  # old rows got 'dflt', as PostgreSQL gave them
    else:
        assert any("c was added" in n and "default slotlake could not see" in n for n in r1.notes), r1.notes
        assert [r["c"] for r in _gold(spark, t_gold).where("id = 3").collect()] == [None]

    # sync 2: RENAME, changes, widen (int -> bigint, real -> double, varchar(10) -> text), changes
    _sql(pg_db, "ALTER TABLE t RENAME a TO a2", "INSERT INTO t VALUES (9, 90, 'b9', 3.5, 'c9')",
         "DELETE FROM t WHERE id = 4",
         "ALTER TABLE t ALTER a2 TYPE bigint, ALTER f TYPE double precision, ALTER b TYPE text",
         "INSERT INTO t VALUES (10, 5000000000, 'longer than ten', 0.1, 'c10')",
         "UPDATE t SET a2 = a2 + 1 WHERE id = 5")
    r2 = _sync(spark, cfg)
    t2 = next(t for t in r2.tables if t.table_name == "t")
    types = {f.name: f.dataType.simpleString() for f in _gold(spark, t_gold).schema.fields}
    assert types["a2"] == "bigint" and types["f"] == "double" and types["b"] == "string"
    if capture:
        assert "renamed a to a2" in t2.schema_changes and "a" not in types
        assert_gold_equals_pg(t_gold, pg_db, "public.t")
        # the rename moved the data: a row untouched since the initial copy keeps its value under the new name
        assert [r["a2"] for r in _gold(spark, t_gold).where("id = 6").collect()] == [60]
    else:
        assert "added a2" in t2.schema_changes and "a" in types  # drop + add: the old column is kept
        assert any("rename looks like a drop plus an add" in n for n in r2.notes), r2.notes

    # sync 3: a volatile default (PostgreSQL rewrites the table; the rewrite is not streamed), a constant one,
    # a table created mid-stream
    _sql(pg_db, "ALTER TABLE t ADD COLUMN e timestamptz DEFAULT now()", "ALTER TABLE t ADD COLUMN d int DEFAULT 7",
         "UPDATE t SET b = 'B6' WHERE id = 6",
         "CREATE TABLE newt (k int PRIMARY KEY, s text)", "INSERT INTO newt VALUES (1, 'one'), (2, 'two')")
    r3 = _sync(spark, cfg)
    if capture:
        assert any("non-constant default now()" in n for n in r3.notes), r3.notes
    assert_gold_equals_pg(paths.gold("public", "newt"), pg_db, "public.newt")

    # sync 4: DROP COLUMN (kept in gold, NULL from then on), changes, the table dropped
    _sql(pg_db, "ALTER TABLE t DROP COLUMN c, DROP COLUMN e", "UPDATE t SET a2 = 0 WHERE id = 8",
         "INSERT INTO t VALUES (11, 110, 'b11', 1.25, 11)", "INSERT INTO newt VALUES (3, 'three')",
         "DELETE FROM newt WHERE k = 1",
         # recorded with a key: FOR ALL TABLES publishes it too (harmless: it is synced like any table)
         "CREATE TABLE recorded.gone (id int PRIMARY KEY, v text)", "INSERT INTO recorded.gone SELECT * FROM gone",
         "DROP TABLE gone")
    r4 = _sync(spark, cfg)
    t4 = next(t for t in r4.tables if t.table_name == "t")
    assert any(s.startswith("kept dropped column c") for s in t4.schema_changes), t4.schema_changes
    if capture:
        assert any(d.startswith("public.gone (dropped at") for d in r4.dropped_tables), r4.dropped_tables
        assert "public.gone" in r4.summary() or "public.gone (dropped" in r4.summary()

    gold = _gold(spark, t_gold)
    rows = {r["id"]: r for r in gold.collect()}
    # dropped column c: rows written after the drop have NULL, rows untouched since keep their last value
    assert rows[8]["c"] is None and rows[11]["c"] is None
    assert rows[2]["c"] == "c2" and rows[9]["c"] == "c9"
    assert_gold_equals_pg(paths.gold("public", "newt"), pg_db, "public.newt")
    assert_gold_equals_pg(paths.gold("public", "gone"), pg_db, "recorded.gone")  # kept as it was
    if capture:
        assert rows[3]["c"] == "dflt"  # filled from the DDL event's default, never written by a change
        _compare_without(spark, tmp_path, t_gold, pg_db, "t", ["c", "e"], "*", "t_capture")
    else:
        # Without capture, a2 (the renamed a) starts empty for rows not written since, and d's default is unseen.
        assert rows[3]["a"] == 30 and rows[3]["a2"] is None and rows[3]["d"] is None
        assert rows[10]["a2"] == 5000000000 and rows[10]["a"] is None
        _compare_without(spark, tmp_path, t_gold, pg_db, "t", ["c", "e", "a", "a2", "d"], "id, b, f", "t_blind")

    # a re-run changes nothing (same end LSN: every table up to date)
    before = {p: delta_watermark(spark, p) for p in (t_gold, paths.gold("public", "newt"))}
    again = run_merge(spark, cfg, "src")
    assert all(t.up_to_date or t.changes == 0 for t in again.tables)
    assert {p: delta_watermark(spark, p) for p in before} == before


def test_on_drop_column_drop_removes_the_gold_column(spark, pg_db, tmp_path):
    cfg = parse_config({"lake": str(tmp_path / "lake"),
                        "sources": {"src": {"dsn": pg_db, "tables": ["public.t"], "on_drop_column": "drop"}}})
    paths = LakePaths.of(cfg.lake, "src")
    _sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, a int, z text)", "INSERT INTO t VALUES (1, 1, 'z1')")
    _sync(spark, cfg)
    _sql(pg_db, "UPDATE t SET a = 2 WHERE id = 1", "ALTER TABLE t DROP COLUMN z", "INSERT INTO t VALUES (2, 20)")
    report = _sync(spark, cfg)
    assert "dropped z" in report.tables[0].schema_changes
    assert "z" not in _gold(spark, paths.gold("public", "t")).columns
    assert_gold_equals_pg(paths.gold("public", "t"), pg_db, "public.t")


def test_type_change_delta_cannot_widen_fails_with_the_remedy(spark, pg_db, tmp_path):
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"src": {"dsn": pg_db, "tables": ["public.t"]}}})
    _sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, '5')")
    _sync(spark, cfg)
    _sql(pg_db, "ALTER TABLE t ALTER v TYPE int USING v::int", "INSERT INTO t VALUES (2, 7)")
    with pytest.raises(MergeError, match=r"public\.t: column v changed type from string to int.*slotlake replay"):
        _sync(spark, cfg)


@pytest.mark.parametrize("modes", [
    {},  # the defaults: widen and rename by rewriting the table
    # the opt-in keeps Delta type widening and column mapping: delta-rs must refuse that table (checked below; the
    # marker makes the conftest check read it with Spark only)
    pytest.param({"widen": "type_widening", "rename": "column_mapping"},
                 marks=pytest.mark.delta_readers(opt_in={"typeWidening"})),
], ids=["rewrite", "in-place"])
def test_widened_and_renamed_columns_keep_gold_readable_by_delta_rs(spark, pg_db, tmp_path, modes):
    from delta_readers import assert_delta_rs_refuses, protocol, reader_features
    from slotlake import delta_log

    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"src": {
        "dsn": pg_db, "tables": ["public.w"], "schema_changes": modes}}})
    paths = LakePaths.of(cfg.lake, "src")
    gold = paths.gold("public", "w")
    _sql(pg_db, "CREATE TABLE w (id int PRIMARY KEY, a int, s smallint, f real, n numeric(8,2), v varchar(5), b int)",
         "INSERT INTO w SELECT g, g * 10, g, g / 4.0, g * 1.25, 'v' || g, g FROM generate_series(1, 5) g")
    with psycopg.connect(pg_db, autocommit=True) as conn:
        install_ddl_capture(conn)  # renames are seen through DDL events
    _sync(spark, cfg)  # initial copy
    _sql(pg_db, "UPDATE w SET a = 11 WHERE id = 1",
         "ALTER TABLE w ALTER a TYPE bigint, ALTER s TYPE int, ALTER f TYPE double precision, "
         "ALTER n TYPE numeric(12,4), ALTER v TYPE text",
         "ALTER TABLE w RENAME b TO b2",
         "INSERT INTO w VALUES (6, 5000000000, 100000, 0.1, 12345678.1234, 'longer than five', 66)",
         "UPDATE w SET a = a + 3000000000, n = n + 0.0001 WHERE id = 2", "DELETE FROM w WHERE id = 3")
    report = _sync(spark, cfg)
    changes = report.tables[0].schema_changes
    assert {"widened a to bigint", "widened s to int", "widened f to double", "widened n to decimal(12,4)",
            "renamed b to b2"} <= set(changes), changes
    types = {f.name: f.dataType.simpleString() for f in _gold(spark, gold).schema.fields}
    assert (types["a"], types["s"], types["f"], types["n"], types["v"], types["b2"]) == (
        "bigint", "int", "double", "decimal(12,4)", "string", "int") and "b" not in types
    assert_gold_equals_pg(gold, pg_db, "public.w", reader="spark", spark=spark)  # in-place: delta-rs refuses it
    # the watermark is the merge's, in the newest commit (what `slotlake status` and the next merge read)
    newest = next(delta_log.commits(gold))
    assert newest.stage == "merge" and newest.end_lsn == str(report.end_lsn)
    assert delta_watermark(spark, gold) == report.end_lsn
    if not modes:
        assert_gold_equals_pg(gold, pg_db, "public.w")  # and with delta-rs (the conftest check reads it with Spark)
        assert "typeWidening" not in reader_features(gold) and protocol(gold).get("minReaderVersion") == 1
        ops = [(c.operation, c.stage) for c in delta_log.commits(gold, newest_first=False)]
        assert ops[-2:] == [("WRITE", None), ("MERGE", "merge")], ops  # the rewrite: a commit without watermark
        # earlier versions (here: the initial copy's load) keep their names, types and rows (time travel)
        before = spark.read.format("delta").option("versionAsOf", len(ops) - 3).load(gold)
        assert dict(before.dtypes)["a"] == "int" and "b" in before.columns and before.count() == 5
    else:
        assert "typeWidening" in reader_features(gold)
        assert _gold(spark, gold).sparkSession.sql(f"DESCRIBE DETAIL delta.`{gold}`").collect()[0][
            "properties"].get("delta.columnMapping.mode") == "name"
        assert_delta_rs_refuses(gold, {"typeWidening"})

    # a re-run of the merge is a no-op: same version, same watermark
    again = run_merge(spark, cfg, "src")
    assert again.tables[0].up_to_date and next(delta_log.commits(gold)) == newest
