"""Decoding by version, the bootstrap catalog and the DDL log, with a real slot, real extracts, Spark and Delta.

A table gets a column added (with a default), renamed, retyped and dropped between extracts; after the live
schema has moved on again, every archived bronze file is decoded again into a fresh silver table, and every
historical change must come out with the columns of its time: the `_catalog` version valid at its LSN.
"""
from __future__ import annotations

import json
import os
import sys

import psycopg
import pytest

from slotlake.catalog import read_catalog, version_at
from slotlake.config import parse_config
from slotlake.decode.job import ddl_log_path, decode_range, run_decode
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.source.catalog_read import archive_bootstrap, list_bootstrap
from slotlake.source.ddl import install_ddl_capture
from slotlake.source.extract import extract

pytestmark = [pytest.mark.integration, pytest.mark.spark]

INT4, INT8, TEXT, VARCHAR = 23, 20, 25, 1043


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    yield get_spark("slotlake-test-catalog", "local[2]", {"spark.sql.shuffle.partitions": "2"})


def _sql(dsn: str, *statements: str) -> None:
    # synchronous_commit on: the extract reads up to the flushed WAL position
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        for s in statements:
            conn.execute(s)


# (DDL run before the batch, DML of the batch); each batch is extracted and decoded on its own.
STEPS = [
    (None, ["INSERT INTO t VALUES (1, 10, 'one'), (2, 20, 'two')", "UPDATE t SET a = 11 WHERE id = 1"]),
    ("ALTER TABLE t ADD COLUMN c text DEFAULT 'dflt'",
     ["INSERT INTO t VALUES (3, 30, 'three', 'c3')", "UPDATE t SET a = 21 WHERE id = 2"]),
    ("ALTER TABLE t RENAME a TO a2", ["INSERT INTO t VALUES (4, 40, 'four', 'c4')", "DELETE FROM t WHERE id = 1"]),
    ("ALTER TABLE t ALTER a2 TYPE bigint, ALTER b TYPE text",
     ["INSERT INTO t VALUES (5, 5000000000, 'longer than ten characters', 'c5')", "UPDATE t SET c = 'x' WHERE id = 3"]),
    ("ALTER TABLE t DROP COLUMN c", ["INSERT INTO t VALUES (6, 60, 'six')", "UPDATE t SET b = 'FOUR' WHERE id = 4"]),
]
# The column list (name, type OID, typmod) each batch's changes must carry.
SHAPES = [
    [("id", INT4, -1), ("a", INT4, -1), ("b", VARCHAR, 14)],
    [("id", INT4, -1), ("a", INT4, -1), ("b", VARCHAR, 14), ("c", TEXT, -1)],
    [("id", INT4, -1), ("a2", INT4, -1), ("b", VARCHAR, 14), ("c", TEXT, -1)],
    [("id", INT4, -1), ("a2", INT8, -1), ("b", TEXT, -1), ("c", TEXT, -1)],
    [("id", INT4, -1), ("a2", INT8, -1), ("b", TEXT, -1)],
]


@pytest.mark.parametrize("ddl_capture", [True, False], ids=["ddl-capture", "relation-messages-only"])
def test_archived_changes_decode_with_the_schema_of_their_time(spark, pg_db, tmp_path, ddl_capture):
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"src": {"dsn": pg_db, "tables": ["public.t"]}}})
    src = cfg.source("src")
    paths = LakePaths.of(cfg.lake, "src")
    _sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, a int, b varchar(10))",
         f"CREATE PUBLICATION {src.publication} FOR TABLE t")
    if ddl_capture:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            install_ddl_capture(conn)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        slot_lsn = Lsn.parse(conn.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                                          (src.slot,)).fetchone()[0])
        # No DDL between the slot and this read, so the definitions are those in force at the consistent point.
        archive_bootstrap(conn, paths.root, ["public.t"], slot_lsn)
    assert [b.lsn for b in list_bootstrap(paths.root)] == [slot_lsn]

    # The bootstrap definitions reach the catalog before any change exists.
    first = run_decode(spark, cfg, "src")
    assert first.files_decoded == 0 and first.catalog_versions_added == 1
    boot = read_catalog(spark, paths.catalog)
    assert [(v.version, v.origin, v.valid_from_lsn, v.valid_to_lsn) for v in boot] == [
        (1, "bootstrap", slot_lsn.value, None)]
    assert [(c.name, c.type_oid, c.typmod, c.nullable, c.is_key) for c in boot[0].columns] == [
        ("id", INT4, -1, False, True), ("a", INT4, -1, True, False), ("b", VARCHAR, 14, True, False)]

    batch_ends: list[Lsn] = []
    warnings: list[list[str]] = []
    for ddl, dml in STEPS:
        if ddl:
            _sql(pg_db, ddl)
        _sql(pg_db, *dml)
        got = extract(cfg, src)
        assert len(got.files) == 1
        result = run_decode(spark, cfg, "src")
        assert result.files_decoded == 1
        batch_ends.append(result.end_lsn)
        warnings.append(list(result.warnings))
    # The live schema moves on after the last archived change.
    _sql(pg_db, "ALTER TABLE t ADD COLUMN z int", "ALTER TABLE t RENAME b TO b_now",
         "ALTER TABLE t ALTER id TYPE bigint")

    catalog = read_catalog(spark, paths.catalog)
    fresh = str(tmp_path / "replayed_changes")
    again = decode_range(spark, cfg, "src", None, batch_ends[-1], fresh)
    rows = spark.read.format("delta").load(fresh).orderBy("commit_lsn", "seq").collect()
    live = spark.read.format("delta").load(paths.changes).orderBy("commit_lsn", "seq").collect()
    assert again.changes_written == len(rows) == len(live) == 11
    assert [r.asDict() for r in rows] == [r.asDict() for r in live]

    for r in rows:
        v = version_at(catalog, r.rel_oid, r.commit_lsn)
        assert v is not None, f"no catalog version of {r.table_name} at {Lsn(r.commit_lsn)}"
        assert (list(r.columns), list(r.type_oids), list(r.typmods)) == (
            [c.name for c in v.columns], [c.type_oid for c in v.columns], [c.typmod for c in v.columns])
        batch = next(i for i, end in enumerate(batch_ends) if r.commit_lsn < end.value)
        assert list(zip(r.columns, r.type_oids, r.typmods)) == SHAPES[batch], (batch, r)
        assert list(r.key_columns) == ["id"]
    by_op = [(r.op, r.new or r.old) for r in rows]
    assert by_op[0] == ("I", ["1", "10", "one"])
    assert ("I", ["3", "30", "three", "c3"]) in by_op
    assert ("I", ["5", "5000000000", "longer than ten characters", "c5"]) in by_op
    assert by_op[-1] == ("U", ["4", "40", "FOUR"])

    # One catalog version per shape, contiguous in LSN, the first from the bootstrap read.
    versions = sorted((v for v in catalog if v.table_name == "t"), key=lambda v: v.version)
    assert [[(c.name, c.type_oid, c.typmod) for c in v.columns] for v in versions] == SHAPES
    assert versions[0].origin == "bootstrap" and versions[0].valid_from_lsn == slot_lsn.value
    assert all(a.valid_to_lsn == b.valid_from_lsn for a, b in zip(versions, versions[1:]))
    assert versions[-1].valid_to_lsn is None

    if ddl_capture:
        assert {v.origin for v in versions[1:]} == {"ddl"}
        assert warnings == [[]] * len(STEPS)
        log_rows = spark.read.format("delta").load(ddl_log_path(paths)).orderBy("commit_lsn", "lsn").collect()
        texts = [r.ddl for r in log_rows if r.event == "ddl_command_end"]
        assert texts == [ddl for ddl, _ in STEPS if ddl]
        for r in log_rows:
            assert r.command_tag == "ALTER TABLE" and r.object_identity.startswith("public.t")
            assert r.commit_end_lsn > r.commit_lsn and r.commit_ts is not None and r.xid > 0
            assert json.loads(r.event_json)["command_tag"] == "ALTER TABLE"
            if r.event == "ddl_command_end":
                assert list(r.tables) == ["public.t"]
        # the version a DDL starts is valid from that DDL's commit
        assert [v.valid_from_lsn for v in versions[1:]] == [
            r.commit_lsn for r in log_rows if r.event == "ddl_command_end"]
    else:
        assert {v.origin for v in versions[1:]} == {"relation"}
        # every schema change after the first batch is reported once, in the run that saw it
        assert [len(w) for w in warnings] == [0, 1, 1, 1, 1]
        assert "public.t" in warnings[2][0] and "renamed column looks like a dropped column" in warnings[2][0]
        assert not os.path.exists(ddl_log_path(paths))

    # Re-running the live decode is a no-op; so is a second bootstrap ingest.
    assert run_decode(spark, cfg, "src").files_decoded == 0
    key = lambda v: (v.rel_oid, v.version)  # noqa: E731
    assert sorted(read_catalog(spark, paths.catalog), key=key) == sorted(catalog, key=key)
