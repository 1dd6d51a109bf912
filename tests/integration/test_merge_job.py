"""The merge job on real Spark + Delta: silver rows written by hand per docs/internals.md, exact gold contents."""
from __future__ import annotations

import datetime as dt
import decimal
import json
from dataclasses import dataclass

import pytest

from slotlake import contracts
from slotlake.config import parse_config
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.job import run_merge

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SRC = "shop"
INT4, TEXT, NUMERIC, DATE, INT4_ARRAY, TSTZ = 23, 25, 1700, 1082, 1007, 1184


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    # Tiny tables: a few partitions instead of Spark's and Delta's production defaults (200 / 50).
    return get_spark("test-merge", master="local[2]", extra={
        "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"})


def ts(lsn: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=lsn)


@dataclass(frozen=True)
class Tbl:
    """A source table as silver describes it; methods build silver rows (values as PostgreSQL text)."""

    name: str
    columns: tuple[tuple[str, int, int, bool], ...]  # name, type oid, typmod, key flag
    ri: str = "d"
    schema: str = "public"

    def _row(self, op, lsn, seq, old_kind=None, old=None, new=None, unchanged=()):
        return (lsn, lsn + 8, ts(lsn), 700 + lsn, seq, lsn + seq, 16384, self.schema, self.name, op, self.ri,
                [c[0] for c in self.columns], [c[0] for c in self.columns if c[3]],
                [c[1] for c in self.columns], [c[2] for c in self.columns], old_kind,
                None if old is None else list(old), None if new is None else list(new), list(unchanged),
                None, f"{lsn:016X}.parquet")

    def ins(self, lsn, seq, *new):
        return self._row("I", lsn, seq, new=new)

    def upd(self, lsn, seq, *new, old=None, unchanged=()):
        kind = None if old is None else ("O" if self.ri == "f" else "K")
        if old is not None and kind == "K":  # a 'K' old tuple has only the key columns (others null)
            old = [v if c[3] else None for v, c in zip(old, self.columns)]
        return self._row("U", lsn, seq, old_kind=kind, old=old,
                         new=[None if i in unchanged else v for i, v in enumerate(new)], unchanged=unchanged)

    def dele(self, lsn, seq, *old):
        kind = "O" if self.ri == "f" else "K"
        if kind == "K":
            old = [v if c[3] else None for v, c in zip(old, self.columns)]
        return self._row("D", lsn, seq, old_kind=kind, old=old)

    def trunc(self, lsn, seq):
        return self._row("T", lsn, seq)


ITEMS = Tbl("items", (("id", INT4, -1, True), ("name", TEXT, -1, False)))
DOCS = Tbl("docs", (("id", INT4, -1, True), ("body", TEXT, -1, False), ("note", TEXT, -1, False)))


class Lake:
    def __init__(self, spark, tmp_path, **source):
        self.spark = spark
        self.cfg = parse_config({"lake": str(tmp_path / "lake"),
                                 "sources": {SRC: {"dsn": "postgresql://u@127.0.0.1:5432/db", **source}}})
        self.paths = LakePaths.of(self.cfg.lake, SRC)

    def decode(self, rows, end_lsn: int) -> None:
        """Append rows as one decode commit marking silver's end LSN, as the decode commits them: a delta-rs commit
        of silver's columns (`contracts.SILVER`) with the table's properties and the commit's userMetadata (a
        Spark write of the same rows cost each test seconds of JVM time, the merge under test none of them)."""
        import pyarrow as pa
        from deltalake import CommitProperties, write_deltalake

        schema = contracts.arrow_schema(contracts.SILVER)
        meta = json.dumps({"slotlake": {"end_lsn": str(Lsn(end_lsn)), "stage": "decode"}})
        write_deltalake(self.paths.changes, pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema),
                        mode="append", configuration=dict(contracts.SILVER_PROPERTIES),
                        commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))

    def merge(self, tables=None):
        return run_merge(self.spark, self.cfg, SRC, tables)

    def gold(self, table: Tbl, *extra: str):
        df = self.spark.read.format("delta").load(self.paths.gold(table.schema, table.name))
        cols = [c[0] for c in table.columns] + list(extra)
        return sorted((tuple(r) for r in df.select(*cols).collect()), key=repr)

    def gold_version(self, table: Tbl) -> int:
        from delta.tables import DeltaTable
        return DeltaTable.forPath(self.spark, self.paths.gold(table.schema, table.name)).history(1).collect()[0][0]


@pytest.fixture
def lake(spark, tmp_path):
    return Lake(spark, tmp_path)


def test_insert_update_delete_by_primary_key(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "a"), ITEMS.ins(100, 1, "2", "b"), ITEMS.ins(100, 2, "3", "c"),
                 ITEMS.upd(200, 0, "2", "b2"), ITEMS.dele(300, 0, "3", "c")], 400)
    report = lake.merge()
    assert lake.gold(ITEMS, "_slotlake_lsn", "_slotlake_commit_ts") == [
        (1, "a", 100, ts(100).replace(tzinfo=None)), (2, "b2", 200, ts(200).replace(tzinfo=None))]
    (res,) = report.tables
    assert (res.schema_name, res.table_name, res.changes, res.rows_inserted) == ("public", "items", 5, 2)
    assert report.end_lsn == Lsn(400)
    lake.decode([ITEMS.upd(500, 0, "1", "a1"), ITEMS.dele(500, 1, "2", "b2")], 600)
    lake.merge()
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(1, "a1", 500)]
    runs = sorted(tuple(r) for r in lake.spark.read.format("delta").load(lake.paths.runs)
                  .select("run_end_lsn", "schema_name", "table_name", "gold_version").collect())
    assert runs == [(400, "public", "items", 1), (600, "public", "items", 2)]


def test_watermark_commit_is_idempotent_and_rerun_is_noop(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "a")], 150)
    lake.merge()
    from delta.tables import DeltaTable
    gold = DeltaTable.forPath(lake.spark, lake.paths.gold("public", "items"))
    last = gold.history(1).collect()[0]
    assert json.loads(last["userMetadata"]) == {"slotlake": {"end_lsn": "0/96", "stage": "merge"}}
    before = gold.history().count()
    report = lake.merge()
    assert report.tables[0].up_to_date
    assert gold.history().count() == before
    assert lake.gold(ITEMS) == [(1, "a")]
    assert lake.spark.read.format("delta").load(lake.paths.runs).count() == 1
    # The same MERGE re-executed with the same txnAppId/txnVersion (a crash before the watermark was seen) is
    # skipped by Delta itself.
    from slotlake.merge.plan import merge_commit_conf
    s = lake.spark.newSession()
    for k, v in merge_commit_conf(SRC, "public", "items", Lsn(150)).items():
        s.conf.set(k, v)
    s.createDataFrame([(9, "z", 1, None)], "id int, name string, _slotlake_lsn long, _slotlake_commit_ts timestamp") \
        .write.format("delta").mode("append").save(lake.paths.gold("public", "items"))
    assert lake.gold(ITEMS) == [(1, "a")]


def test_using_index_key_is_not_the_first_column(lake):
    t = Tbl("codes", (("id", INT4, -1, False), ("code", TEXT, -1, True), ("v", TEXT, -1, False)), ri="i")
    lake.decode([t.ins(100, 0, "1", "A", "x"), t.ins(100, 1, "2", "B", "y")], 150)
    lake.merge()
    lake.decode([t.upd(200, 0, "1", "A", "x2"), t.dele(200, 1, "2", "B", "y"), t.upd(300, 0, "7", "A", "x3")], 350)
    lake.merge()
    assert lake.gold(t) == [(7, "A", "x3")]


def test_full_identity_keeps_identical_rows_and_deletes_one(lake):
    t = Tbl("tags", (("tag", TEXT, -1, True), ("n", INT4, -1, True)), ri="f")
    lake.decode([t.ins(100, 0, "x", "1"), t.ins(100, 1, "x", "1"), t.ins(100, 2, "x", "1"),
                 t.ins(100, 3, "y", None)], 150)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup") == [("x", 1, 1), ("x", 1, 2), ("x", 1, 3), ("y", None, 1)]
    lake.decode([t.dele(200, 0, "x", "1"), t.upd(300, 0, "x", "2", old=("x", "1")),
                 t.upd(300, 1, "z", None, old=("y", None))], 350)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup", "_slotlake_lsn") == [("x", 1, 1, 100), ("x", 2, 1, 300), ("z", None, 1, 300)]
    lake.decode([t.ins(400, 0, "x", "1"), t.dele(500, 0, "x", "2")], 550)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup", "_slotlake_lsn") == [("x", 1, 1, 100), ("x", 1, 2, 400), ("z", None, 1, 300)]


def test_full_identity_unchanged_toast_comes_from_the_old_row(lake):
    t = Tbl("blobs", (("id", INT4, -1, True), ("body", TEXT, -1, True), ("n", INT4, -1, True)), ri="f")
    lake.decode([t.ins(100, 0, "1", "big", "0")], 150)
    lake.merge()
    lake.decode([t.upd(200, 0, "1", None, "1", old=("1", "big", "0"), unchanged=(1,))], 250)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup") == [(1, "big", 1, 1)]


def test_replica_identity_nothing_is_insert_only_and_reports_the_rest(lake):
    t = Tbl("log", (("id", INT4, -1, False), ("msg", TEXT, -1, False)), ri="n")
    lake.decode([t.ins(100, 0, "1", "a"), t.ins(100, 1, "1", "a"), t._row("U", 200, 0, new=["1", "b"]),
                 t._row("D", 300, 0, old_kind=None)], 350)
    report = lake.merge()
    assert lake.gold(t) == [(1, "a"), (1, "a")]
    assert report.tables[0].unapplied == 2 and report.unapplied == 2


def test_key_change_deletes_old_key_and_chains(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "a"), ITEMS.ins(100, 1, "5", "e")], 150)
    lake.merge()
    lake.decode([ITEMS.upd(200, 0, "10", "a", old=("1", "a")),
                 ITEMS.ins(300, 0, "20", "t"), ITEMS.upd(300, 1, "21", "t", old=("20", "t")),
                 ITEMS.upd(400, 0, "22", "t2", old=("21", "t")),
                 # swap: 5 -> 6, and a new row takes key 5
                 ITEMS.upd(500, 0, "6", "e", old=("5", "e")), ITEMS.ins(500, 1, "5", "new5")], 550)
    lake.merge()
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(10, "a", 200), (22, "t2", 400), (5, "new5", 500), (6, "e", 500)]


def test_delete_then_reinsert_in_one_batch_ends_as_reinserted(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "a"), ITEMS.ins(100, 1, "2", "b")], 150)
    lake.merge()
    lake.decode([ITEMS.dele(200, 0, "1", "a"), ITEMS.ins(300, 0, "1", "again"),
                 ITEMS.ins(300, 1, "3", "c"), ITEMS.dele(400, 0, "3", "c")], 450)
    lake.merge()
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(1, "again", 300), (2, "b", 100)]


def test_five_updates_of_one_row_in_one_batch(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "v0")] + [ITEMS.upd(100 + 10 * i, 0, "1", f"v{i}") for i in range(1, 6)], 200)
    lake.merge()
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(1, "v5", 150)]


def test_null_key_column_matches_null_safely(lake):
    t = Tbl("pairs", (("a", INT4, -1, True), ("b", INT4, -1, True), ("v", TEXT, -1, False)), ri="i")
    lake.decode([t.ins(100, 0, "1", None, "x"), t.ins(100, 1, "1", "2", "y")], 150)
    lake.merge()
    lake.decode([t.upd(200, 0, "1", None, "x2")], 250)
    lake.merge()
    assert lake.gold(t) == [(1, 2, "y"), (1, None, "x2")]
    lake.decode([t.dele(300, 0, "1", None, "x2")], 350)
    lake.merge()
    assert lake.gold(t) == [(1, 2, "y")]


def test_unchanged_toast_keeps_the_gold_value(lake):
    lake.decode([DOCS.ins(100, 0, "1", "big body", "n1")], 150)
    lake.merge()
    lake.decode([DOCS.upd(200, 0, "1", None, "n2", unchanged=(1,))], 250)
    lake.merge()
    assert lake.gold(DOCS) == [(1, "big body", "n2")]


def test_unchanged_toast_from_an_earlier_change_in_the_batch(lake):
    lake.decode([DOCS.ins(100, 0, "1", "big", "n1"), DOCS.upd(200, 0, "1", None, "n2", unchanged=(1,)),
                 DOCS.upd(300, 0, "1", None, "n3", unchanged=(1,)), DOCS.ins(300, 1, "2", None, "null body"),
                 DOCS.upd(400, 0, "2", None, "m", unchanged=(1,))], 450)
    lake.merge()
    assert lake.gold(DOCS, "_slotlake_lsn") == [(1, "big", "n3", 300), (2, None, "m", 400)]


def test_unchanged_toast_across_a_key_change(lake):
    lake.decode([DOCS.ins(100, 0, "1", "big", "n1"), DOCS.ins(100, 1, "5", "five", "n5")], 150)
    lake.merge()
    lake.decode([DOCS.upd(200, 0, "2", None, "n2", old=("1", None, None), unchanged=(1,)),
                 DOCS.upd(300, 0, "3", None, "n3", old=("2", None, None), unchanged=(1,)),
                 DOCS.upd(400, 0, "4", None, "n4", old=("3", None, None), unchanged=(1,)),
                 DOCS.upd(500, 0, "4", None, "n5", unchanged=(1,)),
                 DOCS.ins(600, 0, "7", "seven", "n7"), DOCS.upd(600, 1, "8", None, "n8", old=("7",), unchanged=(1,)),
                 DOCS.upd(700, 0, "5", None, "m5", unchanged=(1,))], 750)
    lake.merge()
    assert lake.gold(DOCS) == [(4, "big", "n5"), (5, "five", "m5"), (8, "seven", "n8")]


def test_unchanged_toast_without_any_known_value_fails(lake):
    lake.decode([DOCS.upd(200, 0, "1", None, "n2", unchanged=(1,))], 250)
    with pytest.raises(MergeError, match=r"public\.docs.*\{'id': 1\}.*0/C8.*\['body'\]"):
        lake.merge()


def test_truncate_in_the_middle_of_a_batch(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "a"), ITEMS.ins(100, 1, "2", "b")], 150)
    lake.merge()
    lake.decode([ITEMS.ins(200, 0, "3", "c"), ITEMS.upd(200, 1, "1", "a2"), ITEMS.trunc(300, 0),
                 ITEMS.ins(400, 0, "4", "d"), ITEMS.ins(400, 1, "1", "fresh"), ITEMS.upd(500, 0, "4", "d2")], 550)
    lake.merge()
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(1, "fresh", 400), (4, "d2", 500)]
    from delta.tables import DeltaTable
    assert DeltaTable.forPath(lake.spark, lake.paths.gold("public", "items")).history().count() == 3  # create+2


def test_truncate_alone_empties_the_table(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "a")], 150)
    lake.merge()
    lake.decode([ITEMS.trunc(200, 0)], 250)
    report = lake.merge()
    assert lake.gold(ITEMS) == [] and report.tables[0].truncated


def test_soft_deletes_keep_the_last_state(spark, tmp_path):
    lake = Lake(spark, tmp_path, delete_mode="soft")
    lake.decode([ITEMS.ins(100, 0, "1", "a"), ITEMS.ins(100, 1, "2", "b"), ITEMS.ins(100, 2, "3", "c")], 150)
    lake.merge()
    lake.decode([ITEMS.upd(200, 0, "1", "a2"), ITEMS.dele(300, 0, "1", "a2"), ITEMS.dele(300, 1, "2", "b"),
                 ITEMS.ins(400, 0, "9", "tmp"), ITEMS.dele(500, 0, "9", "tmp"), ITEMS.ins(500, 1, "5", "five")], 550)
    lake.merge()
    assert lake.gold(ITEMS, "_slotlake_deleted", "_slotlake_lsn") == [
        (1, "a2", True, 300), (2, "b", True, 300), (3, "c", False, 100), (5, "five", False, 500),
        (9, "tmp", True, 500)]
    # TRUNCATE: changes before it are void (row 2's re-insert never shows); live rows are marked deleted at its
    # LSN, unless a change after it writes them again.
    lake.decode([ITEMS.ins(600, 0, "2", "back"), ITEMS.trunc(700, 0), ITEMS.ins(800, 0, "3", "c3"),
                 ITEMS.ins(800, 1, "1", "one")], 850)
    lake.decode([ITEMS.ins(900, 0, "4", "d")], 950)  # split in two decode commits; one merge
    lake.merge()
    assert lake.gold(ITEMS, "_slotlake_deleted", "_slotlake_lsn") == [
        (1, "one", False, 800), (2, "b", True, 300), (3, "c3", False, 800), (4, "d", False, 900),
        (5, "five", True, 700), (9, "tmp", True, 500)]


def test_deletion_vectors_turn_on_and_off_for_an_existing_gold_table(spark, tmp_path):
    """Config `deletion_vectors` on an existing gold table: the next merge turns them on (its MERGE marks the
    changed rows instead of rewriting the file), and off again when the config no longer names the table."""
    from delta.tables import DeltaTable

    from slotlake import delta_log
    from slotlake.merge.watermarks import row_count

    def last(lake):
        h = DeltaTable.forPath(spark, lake.paths.gold("public", "items")).history(1).collect()[0]
        return h["operation"], dict(h["operationMetrics"]), h["operationParameters"]["predicate"]

    off = Lake(spark, tmp_path)
    off.decode([ITEMS.ins(100, i, str(i), f"v{i}") for i in range(1, 41)], 150)  # files of several rows
    off.merge()
    gold = off.paths.gold("public", "items")
    rest = [(i, f"v{i}", 100) for i in range(4, 41)]
    assert delta_log.table_properties(gold).get("delta.enableDeletionVectors") is None
    on = Lake(spark, tmp_path, deletion_vectors=["public.items"])
    on.decode([ITEMS.upd(200, 0, "2", "b2"), ITEMS.dele(200, 1, "3", "c")], 250)
    on.merge()
    assert on.gold(ITEMS, "_slotlake_lsn") == sorted([(1, "v1", 100), (2, "b2", 200), *rest], key=repr)
    assert delta_log.table_properties(gold)["delta.enableDeletionVectors"] == "true"
    op, metrics, predicate = last(on)
    # The touched files were marked, not rewritten: no row copied, no file removed; and gold's rows were filtered by
    # the batch's keys before the MERGE's joins (`_key_filter`).
    assert op == "MERGE" and int(metrics["numTargetDeletionVectorsAdded"]) >= 1, metrics
    assert "IN (2,3)" in predicate, predicate
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsCopied"]) == ("0", "0"), metrics
    assert on.merge().tables[0].up_to_date  # the property's commit kept the watermark: a re-run is a no-op
    # A file's statistics count the rows its vector deletes too: the count from the log is each file's less its
    # vector's cardinality (`dv_merge.live_row_count`), what Spark counts.
    assert row_count(gold) == spark.read.format("delta").load(gold).count() == 39
    off.decode([ITEMS.upd(300, 0, "1", "a3")], 350)
    off.merge()
    assert off.gold(ITEMS, "_slotlake_lsn") == sorted([(1, "a3", 300), (2, "b2", 200), *rest], key=repr)
    assert delta_log.table_properties(gold)["delta.enableDeletionVectors"] == "false"
    op, metrics, predicate = last(off)
    assert op == "MERGE" and int(metrics.get("numTargetDeletionVectorsAdded", 0)) == 0, metrics
    assert " IN (" not in predicate, predicate


def test_soft_delete_by_key_change_keeps_the_old_key_and_state(spark, tmp_path):
    """A key change soft-deletes the row under its OLD key with the state it had there; a later update of the new
    key must touch only the one live row (a bug once left the new key on the deleted row: two live copies)."""
    lake = Lake(spark, tmp_path, delete_mode="soft")
    lake.decode([DOCS.ins(100, 0, "4", "b4", "big"), DOCS.ins(100, 1, "5", "b5", "big5")], 150)
    lake.merge()
    lake.decode([DOCS.upd(200, 0, "4", "paid", "big", unchanged=(2,)),
                 DOCS.upd(300, 0, "1004", "paid", "big", old=("4", "paid", "big"), unchanged=(2,)),
                 DOCS.upd(300, 1, "1005", "b5", "big5", old=("5", "b5", "big5"), unchanged=(2,)),
                 DOCS.upd(400, 0, "1004", "cancelled", "big", unchanged=(2,))], 450)
    lake.merge()
    assert lake.gold(DOCS, "_slotlake_deleted", "_slotlake_lsn") == sorted([
        (4, "paid", "big", True, 300), (5, "b5", "big5", True, 300),
        (1004, "cancelled", "big", False, 400), (1005, "b5", "big5", False, 300)], key=repr)
    lake.decode([DOCS.upd(500, 0, "1004", "c2", "big", unchanged=(2,)),
                 DOCS.upd(500, 1, "1005", "c2", "big5", unchanged=(2,))], 550)
    lake.merge()
    assert lake.gold(DOCS, "_slotlake_deleted", "_slotlake_lsn") == sorted([
        (4, "paid", "big", True, 300), (5, "b5", "big5", True, 300),
        (1004, "c2", "big", False, 500), (1005, "c2", "big5", False, 500)], key=repr)


def test_soft_deletes_of_identical_rows_with_full_identity(spark, tmp_path):
    lake = Lake(spark, tmp_path, delete_mode="soft")
    t = Tbl("tags", (("tag", TEXT, -1, True),), ri="f")
    lake.decode([t.ins(100, 0, "x"), t.ins(100, 1, "x")], 150)
    lake.merge()
    lake.decode([t.dele(200, 0, "x")], 250)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup", "_slotlake_deleted", "_slotlake_lsn") == [
        ("x", 1, False, 100), ("x", 2, True, 200)]
    lake.decode([t.ins(300, 0, "x"), t.ins(300, 1, "x")], 350)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup", "_slotlake_deleted", "_slotlake_lsn") == [
        ("x", 1, False, 100), ("x", 2, False, 300), ("x", 3, False, 300)]


def test_bad_values_are_quarantined_and_null_in_gold(lake):
    t = Tbl("m", (("id", INT4, -1, True), ("amount", NUMERIC, -1, False), ("day", DATE, -1, False)))
    lake.decode([t.ins(100, 0, "1", "NaN", "infinity"), t.ins(100, 1, "2", "12.5", "2024-02-29"),
                 t.ins(100, 2, "3", "1" * 21, "2000-01-01 BC")], 150)
    report = lake.merge()
    assert lake.gold(t) == [(1, None, None), (2, decimal.Decimal("12.5"), dt.date(2024, 2, 29)), (3, None, None)]
    assert report.quarantined == 4
    q = sorted(tuple(r) for r in lake.spark.read.format("delta").load(lake.paths.quarantine)
               .select("table_name", "column_name", "type_oid", "raw_value", "commit_lsn", "seq").collect())
    assert q == [("m", "amount", NUMERIC, "1" * 21, 100, 2), ("m", "amount", NUMERIC, "NaN", 100, 0),
                 ("m", "day", DATE, "2000-01-01 BC", 100, 2), ("m", "day", DATE, "infinity", 100, 0)]
    lake.merge()  # a re-run records nothing twice
    assert lake.spark.read.format("delta").load(lake.paths.quarantine).count() == 4


def test_bad_value_fails_the_merge_when_asked(spark, tmp_path):
    lake = Lake(spark, tmp_path, on_bad_value="fail")
    t = Tbl("m", (("id", INT4, -1, True), ("amount", NUMERIC, -1, False)))
    lake.decode([t.ins(100, 0, "1", "NaN")], 150)
    with pytest.raises(MergeError, match=r"public\.m: column amount value 'NaN' at LSN 0/64"):
        lake.merge()


def test_column_added_within_a_batch_evolves_gold(lake):
    # Two layouts of one table in one batch (schema evolution): the earlier row has no value for the new column.
    wider = Tbl("items", ITEMS.columns + (("extra", TEXT, -1, False),))
    lake.decode([ITEMS.ins(100, 0, "1", "a"), wider.ins(200, 0, "2", "b", "x")], 250)
    lake.merge()
    assert lake.gold(wider) == [(1, "a", None), (2, "b", "x")]


def test_tables_merge_in_parallel_to_the_same_end_lsn(lake):
    lake.decode([ITEMS.ins(100, 0, "1", "a"), DOCS.ins(100, 1, "1", "b", "c")], 150)
    lake.merge()
    lake.decode([ITEMS.ins(200, 0, "2", "b")], 250)
    report = lake.merge()
    assert {(r.table_name, r.changes) for r in report.tables} == {("items", 1), ("docs", 0)}
    runs = sorted(tuple(r) for r in lake.spark.read.format("delta").load(lake.paths.runs)
                  .select("run_end_lsn", "table_name", "gold_version").collect())
    assert runs == [(150, "docs", 1), (150, "items", 1), (250, "docs", 1), (250, "items", 2)]
    assert lake.gold(ITEMS) == [(1, "a"), (2, "b")]


def test_a_table_without_changes_in_its_window_is_not_planned(lake, caplog):
    """Silver's file statistics (read with delta-rs) show that no file holds a change of `docs` after its
    watermark: the run reports it with 0 changes without a Spark query for it; `items`, with changes, merges."""
    import logging

    from slotlake.merge.silver_stats import has_changes
    from slotlake.merge.watermarks import silver_file_stats
    from slotlake.names import TableName

    lake.decode([ITEMS.ins(100, 0, "1", "a")], 150)
    lake.decode([DOCS.ins(160, 0, "1", "b", "c")], 170)
    lake.merge()
    lake.decode([ITEMS.ins(200, 0, "2", "b"), ITEMS.upd(210, 0, "1", "a2")], 250)
    files = silver_file_stats(lake.paths.changes)
    assert files is not None and len(files) >= 3  # each decode commit wrote one file or more
    assert not has_changes(files, TableName("public", "docs"), 170, 250)
    assert has_changes(files, TableName("public", "items"), 170, 250)
    with caplog.at_level(logging.DEBUG, logger="slotlake.merge.job"):
        report = lake.merge()
    skipped = [r.getMessage() for r in caplog.records if "no silver file holds a change" in r.getMessage()]
    assert skipped == ["merge public.docs: no silver file holds a change after 0/AA; nothing to do"]
    assert {(r.table_name, r.changes) for r in report.tables} == {("items", 2), ("docs", 0)}
    assert lake.gold(ITEMS) == [(1, "a2"), (2, "b")]
    assert lake.gold(DOCS) == [(1, "b", "c")]
    runs = sorted(tuple(r) for r in lake.spark.read.format("delta").load(lake.paths.runs)
                  .where("run_end_lsn = 250").select("table_name", "gold_version").collect())
    assert runs == [("docs", 1), ("items", 2)]


def test_runs_rows_are_added_once_per_end_and_the_complete_run_marks_its_commit(lake):
    """`_runs` is keyed by (run end, table): a run over chosen tables records them unmarked, the run over every
    table at the same end adds only the others and marks its commit as complete (what slotlake.pending reads), and
    a re-run adds nothing, not even a commit."""
    from slotlake import delta_log
    from slotlake.contracts import STAGE_RUNS

    lake.decode([ITEMS.ins(100, 0, "1", "a"), DOCS.ins(100, 1, "1", "b", "c")], 150)
    lake.merge(["public.items"])
    assert delta_log.stage_end(lake.paths.runs, STAGE_RUNS) is None  # chosen tables: not a complete run

    def runs():
        return sorted((r[0], r[1], r[2]) for r in lake.spark.read.format("delta").load(lake.paths.runs)
                      .select("run_end_lsn", "table_name", "gold_version").collect())

    assert runs() == [(150, "items", 1)]
    lake.merge()
    assert runs() == [(150, "docs", 1), (150, "items", 1)]
    assert delta_log.stage_end(lake.paths.runs, STAGE_RUNS) == Lsn(150)
    versions = next(delta_log.commits(lake.paths.runs)).version
    lake.merge()  # nothing new: every table up to date, its rows and the mark already there
    assert next(delta_log.commits(lake.paths.runs)).version == versions
    assert runs() == [(150, "docs", 1), (150, "items", 1)]
    # Every row present but the mark missing (the chosen-tables run covered every table): the complete run adds
    # no row, only the marked commit.
    lake.decode([ITEMS.ins(200, 0, "2", "b"), DOCS.ins(200, 1, "2", "d", "e")], 250)
    lake.merge(["public.items", "public.docs"])
    assert delta_log.stage_end(lake.paths.runs, STAGE_RUNS) == Lsn(150)
    lake.merge()
    assert delta_log.stage_end(lake.paths.runs, STAGE_RUNS) == Lsn(250)
    from slotlake.contracts import RUNS_COMPLETE_PROPERTY
    assert delta_log.table_properties(lake.paths.runs)[RUNS_COMPLETE_PROPERTY] == str(Lsn(250))
    assert runs() == [(150, "docs", 1), (150, "items", 1), (250, "docs", 2), (250, "items", 2)]


def test_runs_rows_are_delta_rs_appends_that_spark_and_delta_rs_read_alike(lake):
    """A local lake's `_runs` rows are appended with delta-rs (no Spark job at a run's end), the complete run's mark
    in the commit's userMetadata; an older `_runs` without the later columns gets them (ALTER TABLE, Spark) and
    then the same appends. Spark and delta-rs read the same rows."""
    import deltalake

    from slotlake import contracts, delta_log
    from slotlake.contracts import STAGE_RUNS

    # a `_runs` of the first release: its first five columns only
    lake.spark.createDataFrame([], contracts.ddl(contracts.RUNS[:5])).write.format("delta").save(lake.paths.runs)
    lake.decode([ITEMS.ins(100, 0, "1", "a"), DOCS.ins(100, 1, "1", "b", "c")], 150)
    lake.merge()
    lake.decode([ITEMS.upd(200, 0, "1", "b")], 250)
    lake.merge()
    assert delta_log.stage_end(lake.paths.runs, STAGE_RUNS) == Lsn(250)
    newest = next(delta_log.commits(lake.paths.runs))
    assert newest.engine.startswith("delta-rs"), newest
    names = [n for n, _ in contracts.RUNS]
    by_spark = sorted(tuple(r[n] for n in names) for r in lake.spark.read.format("delta").load(lake.paths.runs)
                      .collect())
    by_rs = sorted(tuple(r[n] for n in names) for r in
                   deltalake.DeltaTable(lake.paths.runs).to_pyarrow_table().to_pylist())
    assert [(r[0], r[2], r[3], r[6]) for r in by_spark] == [(150, "docs", 1, 1), (150, "items", 1, 1),
                                                            (250, "docs", 1, 0), (250, "items", 2, 1)]
    # the same instants (Spark reads time stamps as naive UTC here, delta-rs with their zone)
    assert [tuple(v.replace(tzinfo=None) if hasattr(v, "tzinfo") else v for v in r) for r in by_rs] == by_spark


def test_a_run_reads_only_the_silver_files_after_the_last_complete_run(lake):
    """A source without a table list: the tables to merge are `_runs`'s of the last complete run plus those with
    changes since, so the run reads no older silver file (their Parquet files are moved away here as a tripwire: a
    scan of all of silver, which grew with the lake's age, fails on them; they are put back for the readers'
    check of every table after the test)."""
    from pathlib import Path

    lake.decode([ITEMS.ins(100, 0, "1", "a"), DOCS.ins(100, 1, "1", "b", "c")], 150)
    lake.merge()
    silver, aside = Path(lake.paths.changes), Path(lake.paths.changes).parent / "aside"
    first = {p.name for p in silver.glob("*.parquet")}
    lake.decode([ITEMS.ins(200, 0, "2", "b")], 250)
    lake.merge()
    aside.mkdir()
    for name in first:
        (silver / name).rename(aside / name)
    lake.decode([DOCS.upd(300, 0, "1", "b2", "c2")], 350)
    try:
        report = lake.merge()
    finally:
        for name in first:
            (aside / name).rename(silver / name)
    assert {(r.table_name, r.changes) for r in report.tables} == {("items", 0), ("docs", 1)}
    runs = sorted(tuple(r) for r in lake.spark.read.format("delta").load(lake.paths.runs)
                  .where("run_end_lsn = 350").select("table_name", "gold_version").collect())
    assert runs == [("docs", 2), ("items", 2)]
    assert lake.gold(DOCS) == [(1, "b2", "c2")]
    assert lake.gold(ITEMS) == [(1, "a"), (2, "b")]


def test_typed_values_of_every_family(spark):
    from pyspark.sql import functions as F

    from slotlake.merge.typed_values import spark_type, typed_value
    cases = [  # (oid, typmod, text, expected value, bad?)
        (16, -1, "t", True, False), (16, -1, "f", False, False),
        (21, -1, "-32768", -32768, False), (20, -1, "9223372036854775807", 9223372036854775807, False),
        (700, -1, "1.10000002", 1.10000002, False), (701, -1, "NaN", float("nan"), False),
        (701, -1, "-Infinity", float("-inf"), False), (701, -1, "0.1", 0.1, False),
        (1700, (10 << 16 | 2) + 4, "-12345678.90", decimal.Decimal("-12345678.90"), False),
        (1700, -1, "12345678901234567890.123456789012345678000",
         decimal.Decimal("12345678901234567890.123456789012345678"), False),
        (1700, -1, "0.0000000000000000001", None, True), (1700, -1, "Infinity", None, True),
        (1700, (50 << 16 | 2) + 4, "NaN", "NaN", False),
        (17, -1, "\\x00ff10", bytes([0, 255, 16]), False), (17, -1, "\\x", b"", False),
        (1082, -1, "2024-01-31", dt.date(2024, 1, 31), False), (1082, -1, "-infinity", None, True),
        (1114, -1, "2024-01-01 10:00:00.123456", dt.datetime(2024, 1, 1, 10, 0, 0, 123456), False),
        (1114, -1, "infinity", None, True),
        (1184, -1, "2024-01-01 10:00:00.123456+00", dt.datetime(2024, 1, 1, 10, 0, 0, 123456), False),
        (1184, -1, "2024-01-01 10:00:00+05:30", dt.datetime(2024, 1, 1, 4, 30), False),
        (1186, -1, "P1Y2M3DT4H5M6.5S", "P1Y2M3DT4H5M6.5S", False), (1083, -1, "10:00:00", "10:00:00", False),
        (2950, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", False),
        (3802, -1, '{"a": 1}', '{"a": 1}', False), (99999, -1, "happy", "happy", False),
        (1007, -1, "{1,NULL,3}", [1, None, 3], False), (1009, -1, '{"a,b",NULL,"NULL"}', ["a,b", None, "NULL"], False),
        (1007, -1, "{{1,2},{3,4}}", None, True), (1182, -1, "{2024-01-01,infinity}", None, True),
        (1001, -1, '{"\\\\x01"}', [b"\x01"], False), (1231, -1, "{1.5,NaN}", None, True),
        (1000, -1, "{t,f}", [True, False], False), (1000, -1, None, None, False),
    ]
    df = spark.createDataFrame([(i, c[2]) for i, c in enumerate(cases)], "i int, text string")
    for i, (oid, mod, text, want, bad) in enumerate(cases):
        value, reason = typed_value(F.col("text"), oid, mod)
        row = (df.where(F.col("i") == i).select(value.cast(spark_type(oid, mod)).alias("v"), reason.alias("r"))
               .collect()[0])
        got = row["v"]
        if isinstance(want, float) and want != want:
            assert got != got, (oid, text)
        elif isinstance(want, float) and oid == 700:
            assert got == pytest.approx(want, rel=1e-7), (oid, text)
        else:
            assert got == want, (oid, text, got)
        assert (row["r"] is not None) == bad, (oid, text, row["r"])


def test_typed_numbers_bytes_dates_and_times_as_postgres_prints_them(spark, pg_db):
    """The texts come from PostgreSQL itself under the extract's session settings (ISO dates, UTC, hex bytea,
    shortest-exact floats), and under other time zones (offsets with minutes and seconds): every value a gold
    column can hold is read exactly, and the ones it cannot (BC, years past 9999, infinities) are bad values,
    never misread."""
    import struct

    import psycopg
    from pyspark.sql import functions as F

    from slotlake.merge.typed_values import spark_type, typed_value
    from slotlake.source.connection import session_dsn

    D, TS = dt.date, dt.datetime

    def F4(x: float) -> float:  # noqa: N802 - the float4 nearest to x, as Spark returns it
        return struct.unpack("f", struct.pack("f", x))[0]

    cases = [  # (type oid, SQL expression, time zone, the value, or None: a bad value)
        (21, "(-32768)::int2", "UTC", -32768), (23, "(-2147483648)::int4", "UTC", -2147483648),
        (20, "9223372036854775807::int8", "UTC", 9223372036854775807),
        (20, "(-9223372036854775807 - 1)::int8", "UTC", -9223372036854775808),
        (700, "'3.4028235e38'::float4", "UTC", F4(3.4028235e38)), (700, "'-1.1e-40'::float4", "UTC", F4(-1.1e-40)),
        (700, "'0.1'::float4", "UTC", F4(0.1)),
        (701, "'1.7976931348623157e308'::float8", "UTC", 1.7976931348623157e308),
        (701, "'-Infinity'::float8", "UTC", float("-inf")), (701, "(0.1::float8 + 0.2)", "UTC", 0.1 + 0.2),
        (17, "'\\x00ff7f'::bytea", "UTC", b"\x00\xff\x7f"), (17, "''::bytea", "UTC", b""),
        (1082, "'2024-02-29'::date", "UTC", D(2024, 2, 29)), (1082, "'0001-01-01'::date", "UTC", D(1, 1, 1)),
        (1082, "'9999-12-31'::date", "UTC", D(9999, 12, 31)),
        (1082, "'0044-03-15 BC'::date", "UTC", None), (1082, "'10000-01-01'::date", "UTC", None),
        (1082, "'infinity'::date", "UTC", None), (1082, "'-infinity'::date", "UTC", None),
        (1114, "'2024-01-01 10:00:00.123456'::timestamp", "UTC", TS(2024, 1, 1, 10, 0, 0, 123456)),
        (1114, "'0001-01-01 00:00:00'::timestamp", "UTC", TS(1, 1, 1)),
        (1114, "'9999-12-31 23:59:59.999999'::timestamp", "UTC", TS(9999, 12, 31, 23, 59, 59, 999999)),
        (1114, "'0044-03-15 12:00 BC'::timestamp", "UTC", None),
        (1114, "'10000-01-01 00:00'::timestamp", "UTC", None), (1114, "'infinity'::timestamp", "UTC", None),
        (1184, "'2024-01-01 10:00:00.5+05:30'::timestamptz", "UTC", TS(2024, 1, 1, 4, 30, 0, 500000)),
        (1184, "'2024-01-01 10:00:00.5+05:30'::timestamptz", "Asia/Kolkata", TS(2024, 1, 1, 4, 30, 0, 500000)),
        (1184, "'2024-07-01 12:00:00+00'::timestamptz", "America/St_Johns", TS(2024, 7, 1, 12)),
        (1184, "'1900-01-01 00:00:00+00'::timestamptz", "Europe/Amsterdam", TS(1900, 1, 1)),  # LMT: +00:19:32
        (1184, "'0044-03-15 12:00+00 BC'::timestamptz", "UTC", None),
        (1184, "'10000-01-01 00:00+00'::timestamptz", "UTC", None), (1184, "'-infinity'::timestamptz", "UTC", None),
    ]
    texts = []
    with psycopg.connect(session_dsn(pg_db), autocommit=True) as conn:
        for _, expr, zone, _ in cases:
            conn.execute(f"SET TimeZone = '{zone}'")
            texts.append(conn.execute(f"SELECT ({expr})::text").fetchone()[0])
    zones = [zone for _, _, zone, _ in cases]
    assert texts[zones.index("Europe/Amsterdam")].endswith("+00:19:32"), texts  # an offset with seconds
    assert texts[zones.index("America/St_Johns")].endswith("-02:30"), texts  # and one with minutes
    df = spark.createDataFrame(list(enumerate(texts)), "i int, text string")
    for i, ((oid, expr, _, want), text) in enumerate(zip(cases, texts)):
        value, reason = typed_value(F.col("text"), oid, -1)
        row = df.where(F.col("i") == i).select(value.cast(spark_type(oid, -1)).alias("v"), reason.alias("r")).first()
        assert (row["v"], row["r"] is not None) == (want, want is None), (expr, text, row)


# ---- numeric.unconstrained and the quarantine's row key (issue 8 item 5) ------------------------------------

EXACT = ["1" + "0" * 40, "0.0000000000000000000001", "123456789012345678901234567890.123456789012345678901",
         "-98765432109876543210987654321.5", "NaN", "Infinity", "-Infinity", "1.500", "0"]


def test_unconstrained_numeric_as_string_keeps_the_text(spark):
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    from slotlake.merge.typed_values import spark_type, typed_value
    df = spark.createDataFrame([(t,) for t in EXACT] + [(None,)], "text string")
    value, reason = typed_value(F.col("text"), NUMERIC, -1, "string")
    assert spark_type(NUMERIC, -1, "string") == StringType()
    got = [(r["v"], r["r"]) for r in df.select(value.alias("v"), reason.alias("r")).collect()]
    assert got == [(t, None) for t in EXACT] + [(None, None)]
    # the same texts as decimal(38,18): only the ones that fit, never rounded
    value, reason = typed_value(F.col("text"), NUMERIC, -1, "decimal")
    fits = {r["text"]: r["v"] for r in df.select("text", value.alias("v"), reason.alias("r")).collect()
            if r["r"] is None and r["text"] is not None}
    assert fits == {"1.500": decimal.Decimal("1.5"), "0": decimal.Decimal(0)}
    arrays = spark.createDataFrame([("{1.5,NaN,0.0000000000000000000001}",)], "text string")
    value, reason = typed_value(F.col("text"), 1231, -1, "string")
    row = arrays.select(value.alias("v"), reason.alias("r")).collect()[0]
    assert (list(row["v"]), row["r"]) == (["1.5", "NaN", "0.0000000000000000000001"], None)


def test_string_numerics_through_insert_update_delete_and_a_numeric_key(spark, tmp_path):
    lake = Lake(spark, tmp_path, numeric={"unconstrained": "string", "tables": {"public.fx": {"columns": {
        "fee": "decimal"}}}})
    t = Tbl("fx", (("k", NUMERIC, -1, True), ("rate", NUMERIC, -1, False), ("fee", NUMERIC, -1, False)))
    lake.decode([t.ins(100, i, k, v, "1.25") for i, (k, v) in enumerate(zip(["1.0", "1.00", "-3", "NaN"], EXACT))],
                150)
    report = lake.merge()
    assert report.quarantined == 0
    from pyspark.sql.types import DecimalType, StringType
    types = {f.name: f.dataType for f in spark.read.format("delta").load(lake.paths.gold("public", "fx")).schema}
    assert (types["k"], types["rate"], types["fee"]) == (StringType(), StringType(), DecimalType(38, 18))
    d = decimal.Decimal("1.25")
    assert lake.gold(t) == sorted([("1.0", EXACT[0], d), ("1.00", EXACT[1], d), ("-3", EXACT[2], d),
                                   ("NaN", EXACT[3], d)], key=repr)
    # 1.0 and 1.00 are equal numerics but different values to pgoutput (a key change between them sends the old
    # key): the text keys keep them apart exactly as PostgreSQL's replica identity does
    lake.decode([t.upd(200, 0, "1.0", EXACT[4], "2"),
                 t.upd(200, 1, "Infinity", EXACT[5], "3", old=("1.00", None, None)), t.dele(300, 0, "-3", None, None)],
                350)
    lake.merge()
    assert lake.gold(t) == sorted([("1.0", EXACT[4], decimal.Decimal(2)), ("Infinity", EXACT[5], decimal.Decimal(3)),
                                   ("NaN", EXACT[3], d)], key=repr)
    # a fee that does not fit decimal(38,18) is still quarantined, with the row's key
    lake.decode([t.upd(400, 0, "NaN", "7", "NaN")], 450)
    assert lake.merge().quarantined == 1
    q = [(r["column_name"], r["raw_value"], dict(r["row_key"])) for r in
         spark.read.format("delta").load(lake.paths.quarantine).collect()]
    assert q == [("fee", "NaN", {"k": "NaN"})]


def test_quarantine_rows_carry_the_key_or_the_whole_row(lake):
    keyed = Tbl("m", (("region", TEXT, -1, True), ("id", INT4, -1, True), ("amount", NUMERIC, -1, False)), ri="i")
    full = Tbl("f", (("tag", TEXT, -1, True), ("amount", NUMERIC, -1, True), ("body", TEXT, -1, True)), ri="f")
    lake.decode([keyed.ins(100, 0, "eu", "1", "1" + "0" * 40),
                 keyed.ins(100, 1, "us", "1", "12.5"),
                 keyed.upd(200, 0, "us", "1", "0.0000000000000000000001"),
                 full.ins(200, 1, "x", "NaN", "big"),
                 full.upd(300, 0, "x", "Infinity", None, old=("x", "NaN", "big"), unchanged=(2,))], 350)
    report = lake.merge()
    assert report.quarantined == 4
    q = sorted((r["table_name"], r["raw_value"], r["commit_lsn"], tuple(sorted(r["row_key"].items())))
               for r in lake.spark.read.format("delta").load(lake.paths.quarantine).collect())
    assert q == [("f", "Infinity", 300, (("amount", "Infinity"), ("body", "big"), ("tag", "x"))),
                 ("f", "NaN", 200, (("amount", "NaN"), ("body", "big"), ("tag", "x"))),
                 ("m", "0.0000000000000000000001", 200, (("id", "1"), ("region", "us"))),
                 ("m", "1" + "0" * 40, 100, (("id", "1"), ("region", "eu")))]
    assert lake.gold(keyed) == [("eu", 1, None), ("us", 1, None)]


def test_bad_value_error_names_the_row(spark, tmp_path):
    lake = Lake(spark, tmp_path, on_bad_value="fail")
    t = Tbl("m", (("id", INT4, -1, True), ("amount", NUMERIC, -1, False)))
    lake.decode([t.ins(100, 0, "7", "NaN")], 150)
    with pytest.raises(MergeError,
                       match=r"public\.m: column amount value 'NaN' at LSN 0/64 \(xid 800, row \{'id': '7'\}\)"):
        lake.merge()


def test_a_quarantine_table_of_an_older_release_gets_the_row_key_column(lake):
    from pyspark.sql.types import MapType, StringType

    from slotlake.merge.typing_job import QUARANTINE_SCHEMA
    old_schema = QUARANTINE_SCHEMA.__class__([f for f in QUARANTINE_SCHEMA.fields if f.name != "row_key"])
    old_row = ("public", "m", "amount", NUMERIC, "NaN", "old reason", 50, 1, 0, dt.datetime(2024, 1, 1))
    lake.spark.createDataFrame([old_row], old_schema).write.format("delta").save(lake.paths.quarantine)
    t = Tbl("m", (("id", INT4, -1, True), ("amount", NUMERIC, -1, False)))
    lake.decode([t.ins(100, 0, "2", "Infinity")], 150)
    assert lake.merge().quarantined == 1
    df = lake.spark.read.format("delta").load(lake.paths.quarantine)
    assert df.schema["row_key"].dataType == MapType(StringType(), StringType())
    rows = sorted((r["raw_value"], None if r["row_key"] is None else dict(r["row_key"])) for r in df.collect())
    assert rows == [("Infinity", {"id": "2"}), ("NaN", None)]


def _last_operation(lake, table: Tbl) -> tuple[str, dict]:
    from delta.tables import DeltaTable
    row = DeltaTable.forPath(lake.spark, lake.paths.gold(table.schema, table.name)).history(1).collect()[0]
    return row["operation"], json.loads(row["userMetadata"])


def test_insert_only_batches_are_appends_with_the_merge_semantics(lake):
    """Plain inserts are appended (a Delta WRITE with the watermark), giving exactly what the MERGE gives:
    FULL copies numbered 1..n with the last copy's LSN, keyed rows as inserted; a batch whose row or key gold
    already holds, or with a TRUNCATE, keeps the MERGE."""
    t = Tbl("hist", (("a", INT4, -1, True), ("b", TEXT, -1, True)), ri="f")
    lake.decode([t.ins(100, 0, "1", "x"), t.ins(100, 1, "1", "x"), t.ins(200, 0, "1", "x"),
                 t.ins(200, 1, "2", None), ITEMS.ins(100, 2, "1", "a"), ITEMS.ins(200, 2, "2", "b")], 250)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup", "_slotlake_lsn") == [
        (1, "x", 1, 200), (1, "x", 2, 200), (1, "x", 3, 200), (2, None, 1, 200)]
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(1, "a", 100), (2, "b", 200)]
    meta = {"slotlake": {"end_lsn": "0/FA", "stage": "merge"}}
    assert _last_operation(lake, t) == ("WRITE", meta)
    assert _last_operation(lake, ITEMS) == ("WRITE", meta)
    before = lake.gold_version(t)
    assert lake.merge().tables[0].up_to_date and lake.gold_version(t) == before  # re-run: no-op
    # rows gold already has: the MERGE numbers the new copy after the existing ones / updates the key
    lake.decode([t.ins(300, 0, "2", None), ITEMS.ins(300, 1, "2", "b2")], 350)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup", "_slotlake_lsn") == [
        (1, "x", 1, 200), (1, "x", 2, 200), (1, "x", 3, 200), (2, None, 1, 200), (2, None, 2, 300)]
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(1, "a", 100), (2, "b2", 300)]
    assert _last_operation(lake, t)[0] == _last_operation(lake, ITEMS)[0] == "MERGE"
    # a TRUNCATE in the batch: the MERGE empties the table first
    lake.decode([t.trunc(400, 0), t.ins(400, 1, "5", "q")], 450)
    lake.merge()
    assert lake.gold(t, "_slotlake_dup") == [(5, "q", 1)]
    assert _last_operation(lake, t)[0] == "MERGE"


def test_an_append_whose_keys_no_gold_file_can_hold_reads_no_gold(lake, monkeypatch):
    """The append check joins the batch with gold only when a gold file's statistics overlap the batch's key
    ranges: an empty gold or keys past gold's (serial ids, commit times) are appended without the join; keys
    inside gold's range are joined, appended when gold lacks them, merged when gold holds one."""
    import slotlake.merge.job as job

    joins: list[int] = []
    real = job._gold_holds_any
    monkeypatch.setattr(job, "_gold_holds_any", lambda *a: joins.append(1) or real(*a))
    hist = Tbl("hist", (("a", INT4, -1, True), ("b", TEXT, -1, True)), ri="f")
    lake.decode([ITEMS.ins(100, 0, "10", "a"), ITEMS.ins(100, 1, "20", "b"), hist.ins(100, 2, "1", "x")], 150)
    lake.merge()  # gold empty: nothing to join
    lake.decode([ITEMS.ins(200, 0, "30", "c"), hist.ins(200, 1, "2", "y")], 250)
    lake.merge()  # keys past every gold file's range
    assert joins == []
    assert _last_operation(lake, ITEMS)[0] == _last_operation(lake, hist)[0] == "WRITE"
    # a range (15..25) a gold file's (20) overlaps, keys gold lacks: joined, appended
    lake.decode([ITEMS.ins(300, 0, "15", "d"), ITEMS.ins(300, 1, "25", "e")], 350)
    lake.merge()
    assert joins == [1] and _last_operation(lake, ITEMS)[0] == "WRITE"
    lake.decode([hist.ins(400, 0, "1", "x")], 450)  # a row gold holds: joined, merged (copy 2)
    lake.merge()
    assert joins == [1, 1] and _last_operation(lake, hist)[0] == "MERGE"
    assert lake.gold(ITEMS, "_slotlake_lsn") == [(10, "a", 100), (15, "d", 300), (20, "b", 100), (25, "e", 300),
                                                 (30, "c", 200)]
    assert lake.gold(hist, "_slotlake_dup", "_slotlake_lsn") == [(1, "x", 1, 100), (1, "x", 2, 400),
                                                                (2, "y", 1, 200)]


def test_insert_only_append_keeps_soft_deleted_keys_merged(spark, tmp_path):
    lake = Lake(spark, tmp_path, delete_mode="soft")
    lake.decode([ITEMS.ins(100, 0, "1", "a"), ITEMS.ins(100, 1, "2", "b")], 150)
    lake.merge()
    assert _last_operation(lake, ITEMS)[0] == "WRITE"
    assert lake.gold(ITEMS, "_slotlake_deleted") == [(1, "a", False), (2, "b", False)]
    lake.decode([ITEMS.dele(200, 0, "1", "a")], 250)
    lake.merge()
    lake.decode([ITEMS.ins(300, 0, "1", "again"), ITEMS.ins(300, 1, "3", "c")], 350)  # key 1 is soft-deleted
    lake.merge()
    assert _last_operation(lake, ITEMS)[0] == "MERGE"
    assert lake.gold(ITEMS, "_slotlake_deleted", "_slotlake_lsn") == [
        (1, "again", False, 300), (2, "b", False, 100), (3, "c", False, 300)]


def test_last_per_key_path_gives_the_window_paths_gold(spark, tmp_path, monkeypatch):
    """A keyed batch without key changes, unchanged TOAST or soft deletes takes `_last_per_key`; the same two
    batches merged with that path switched off (the window passes) give the same gold, row for row with the
    LSN and commit time, and both the expected one."""
    import slotlake.merge.lineage as lineage

    first = [ITEMS.ins(100, 0, "1", "a"), ITEMS.ins(100, 1, "2", "b"), ITEMS.ins(100, 2, "3", "c")]
    hot = [ITEMS.upd(200 + i, 0, "1", f"v{i}") for i in range(30)]  # one key updated many times
    second = hot + [
        ITEMS.dele(240, 0, "2", "b"), ITEMS.ins(241, 0, "2", "again"),  # delete then re-insert
        ITEMS.ins(242, 0, "4", "d"), ITEMS.dele(243, 0, "4", "d"),  # insert then delete
        ITEMS.dele(244, 0, "3", "c"),  # a delete of a gold row
        ITEMS.upd(245, 0, "5", "never inserted"),  # an update of a row gold does not have: inserted
    ]
    calls: list[int] = []
    real = lineage._last_per_key

    def counted(plan, ch, *args):
        calls.append(1)
        return real(plan, ch, *args)

    golds = []
    for name, path in (("fast", counted), ("windows", None)):
        lake = Lake(spark, tmp_path / name)
        monkeypatch.setattr(lineage, "_last_per_key", path or real)
        if path is None:  # the window passes: the same batch seen as one that may need gold's TOAST values
            keyed = lineage.keyed_source
            monkeypatch.setattr(lineage, "keyed_source", lambda plan, typed, target, toast=True, keyed=keyed,
                                **kw: keyed(plan, typed, target, toast=True, **kw))
        lake.decode(first, 150)
        lake.merge()
        lake.decode(second, 250)
        lake.merge()
        golds.append(lake.gold(ITEMS, "_slotlake_lsn", "_slotlake_commit_ts"))
        monkeypatch.undo()
    assert len(calls) == 1  # the first lake's second batch took the last-per-key path (the first is an append)
    assert golds[0] == golds[1] == sorted([
        (1, "v29", 229, ts(229).replace(tzinfo=None)), (2, "again", 241, ts(241).replace(tzinfo=None)),
        (5, "never inserted", 245, ts(245).replace(tzinfo=None))], key=repr)


def test_change_number_orders_changes_as_their_commit_lsn_and_seq(spark):
    # The merge's one pass takes the batch's first and last change per layout as min/max of `change_number`
    # (a hash aggregation): its order must be (commit_lsn, seq)'s, and `change_of` must give both back.
    from pyspark.sql import functions as F

    from slotlake.merge.lineage import change_number, change_of

    top_lsn, top_seq = (1 << 63) - 1, (1 << 31) - 1
    ids = [(0, 0), (0, top_seq), (1, 0), (1, 5), (0x16B3740, 2), (0x16B3740, 10), (0x16B3741, 0),
           (1 << 32, 7), (top_lsn - 1, top_seq), (top_lsn, 0), (top_lsn, top_seq)]
    rows = spark.createDataFrame(ids, "commit_lsn long, seq int").select(
        "commit_lsn", "seq", change_number().alias("n")).orderBy("n").collect()
    assert [(r["commit_lsn"], r["seq"]) for r in rows] == sorted(ids)
    assert [change_of(r["n"]) for r in rows] == sorted(ids)
    lo, hi = spark.createDataFrame(ids[::-1], "commit_lsn long, seq int").agg(
        F.min(change_number()), F.max(change_number())).collect()[0]
    assert (change_of(lo), change_of(hi)) == ((0, 0), (top_lsn, top_seq))


def test_change_number_in_a_long_orders_a_batch_as_the_decimal_does(spark):
    # `_last_per_key` numbers a batch's changes in a long from the batch's least commit LSN when its LSNs span
    # less than 2^32: the same order as (commit_lsn, seq) and as the decimal, up to the span's very edge.
    from slotlake.merge.lineage import change_number, long_base

    base, top_seq = 0x7FFF_0000_0000_0000, (1 << 31) - 1
    edge = base + (1 << 32) - 1
    ids = [(base, 0), (base, top_seq), (base + 1, 0), (base + 0x16B3740, 2), (base + 0x16B3740, 10),
           (edge - 1, top_seq), (edge, 0), (edge, 7), (edge, top_seq)]
    assert long_base(base, edge) == base
    assert long_base(base, edge + 1) is None and long_base(None, edge) is None and long_base(edge, base) is None
    rows = spark.createDataFrame(ids[::-1], "commit_lsn long, seq int").select(
        "commit_lsn", "seq", change_number(base).alias("n"), change_number().alias("d")).collect()
    assert [(r["commit_lsn"], r["seq"]) for r in sorted(rows, key=lambda r: r["n"])] == sorted(ids)
    assert [(r["commit_lsn"], r["seq"]) for r in sorted(rows, key=lambda r: r["d"])] == sorted(ids)
    assert max(r["n"] for r in rows) == (1 << 63) - 1  # the edge: a long's greatest value, no overflow
    assert spark.createDataFrame(ids, "commit_lsn long, seq int").select(change_number(base).alias("n")) \
        .schema["n"].dataType.typeName() == "long"


def test_a_batch_runs_interpreted_or_generated_by_its_size_unless_the_config_says(spark, tmp_path, caplog):
    import logging

    from slotlake.spark.session import (
        GENERATED_CONF,
        INTERPRETED_CONF,
        SMALL_BATCH_ROWS,
        SMALL_PLAN_CONF,
        codegen_for_batch,
    )

    aqe = "spark.sql.adaptive.enabled"
    assert SMALL_PLAN_CONF == {aqe: "false"}
    session = spark.newSession()
    # Spark's default, which a large batch keeps (`unset`); the suite's JVMs start their sessions with "false"
    # (tests/spark-conf/spark-defaults.conf), so this session is set as one of production's starts
    session.conf.set(aqe, "true")
    assert codegen_for_batch(session, SMALL_BATCH_ROWS, {}) == "generated code"
    assert [session.conf.get(k) for k in GENERATED_CONF] == list(GENERATED_CONF.values())
    assert session.conf.get(aqe) == "true"
    assert codegen_for_batch(session, 10, {"spark.sql.codegen.wholeStage": "true"}) is None  # the user's win
    assert [session.conf.get(k) for k in GENERATED_CONF] == list(GENERATED_CONF.values())
    assert session.conf.get(aqe) == "false"  # small: planned once, whatever the code keys say
    assert codegen_for_batch(session, SMALL_BATCH_ROWS, {}) == "generated code"
    assert session.conf.get(aqe) == "true"  # back to the default for a large batch
    assert codegen_for_batch(session, SMALL_BATCH_ROWS - 1, {}) == "interpreted"
    assert [session.conf.get(k) for k in INTERPRETED_CONF] == list(INTERPRETED_CONF.values())
    assert session.conf.get(aqe) == "false"
    other = spark.newSession()
    other.conf.set(aqe, "true")  # as a config's own spark.conf would set it
    assert codegen_for_batch(other, 10, {aqe: "true"}) == "interpreted"
    assert other.conf.get(aqe) == "true"  # the user's setting wins
    # The merge asks per table, in the table's own session, and says it in the table's "merged" line.
    with caplog.at_level(logging.INFO, logger="slotlake.merge.job"):
        test_insert_update_delete_by_primary_key(Lake(spark, tmp_path / "a"))
        lake = Lake(spark, tmp_path / "b")
        lake.cfg = parse_config({"lake": lake.cfg.lake, "spark": {"conf": {"spark.sql.codegen.wholeStage": "true"}},
                                 "sources": {SRC: {"dsn": "postgresql://u@127.0.0.1:5432/db"}}})
        lake.decode([ITEMS.ins(100, 0, "1", "a")], 150)
        lake.merge()
    merged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("merged ")]
    assert [m.rsplit(" quarantined", 1)[1] for m in merged] == ["; interpreted)", "; interpreted)", ")"], merged


def test_a_small_batch_into_a_big_gold_table_runs_generated_code(spark, tmp_path, caplog, monkeypatch):
    """A small batch's MERGE reads the gold files holding its keys (all of gold, for random keys), so a big gold
    table gets the generated code whatever the batch's size: interpreted, 1,000 changes into 10 M rows took 133 s
    instead of 26 s (bench/README.md)."""
    import logging

    import slotlake.spark.session as session
    from slotlake.spark.session import SMALL_GOLD_BYTES, codegen_for_batch

    s = spark.newSession()
    assert codegen_for_batch(s, 10, {}, gold_bytes=SMALL_GOLD_BYTES - 1) == "interpreted"
    assert codegen_for_batch(s, 10, {}, gold_bytes=SMALL_GOLD_BYTES) == "generated code"
    # The merge gives it gold's size: the items table of a few rows counts as big here. Its first merge creates
    # gold (nothing to read), the second merges into it.
    monkeypatch.setattr(session, "SMALL_GOLD_BYTES", 1)
    with caplog.at_level(logging.INFO, logger="slotlake.merge.job"):
        test_insert_update_delete_by_primary_key(Lake(spark, tmp_path))
    merged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("merged ")]
    assert [m.rsplit(" quarantined", 1)[1] for m in merged] == ["; interpreted)", "; generated code)"], merged


def test_a_small_batch_into_a_big_gold_table_reads_only_the_files_its_keys_can_be_in(spark, tmp_path, monkeypatch):
    """A small keyed batch into a big gold table names its keys in the MERGE condition, so Delta skips the gold
    files whose statistics hold none of them instead of reading all of gold (`_key_filter`). The proof: the files
    of the older keys are moved away before the MERGE, which would fail reading them."""
    import shutil

    import pyarrow as pa
    from deltalake import DeltaTable as RsTable

    import slotlake.spark.session as session

    monkeypatch.setattr(session, "SMALL_GOLD_BYTES", 1)  # the items table of a few rows counts as big here
    lake = Lake(spark, tmp_path)
    for i, first in enumerate((1, 11, 21)):  # three batches of new keys: appends, files of their own
        lake.decode([ITEMS.ins(100 * (i + 1), j, str(k), f"v{k}") for j, k in enumerate(range(first, first + 10))],
                    100 * (i + 1) + 50)
        lake.merge()
    gold = lake.paths.gold("public", "items")
    files = pa.table(RsTable(gold).get_add_actions(flatten=True)).to_pylist()
    old = [f["path"] for f in files if f["max.id"] <= 20]
    assert old and len(old) < len(files), files
    aside = tmp_path / "aside"
    aside.mkdir()
    for f in old:
        shutil.move(f"{gold}/{f}", aside / f.replace("/", "_"))
    lake.decode([ITEMS.upd(400, 0, "25", "new25"), ITEMS.dele(400, 1, "27", "v27"), ITEMS.ins(400, 2, "31", "v31")],
                450)
    lake.merge()
    for f in old:
        shutil.move(aside / f.replace("/", "_"), f"{gold}/{f}")
    from delta.tables import DeltaTable

    assert "IN (25,27,31)" in DeltaTable.forPath(spark, gold).history(1).collect()[0]["operationParameters"][
        "predicate"]
    assert lake.gold(ITEMS) == sorted([*((k, f"v{k}") for k in range(1, 31) if k not in (25, 27)), (25, "new25"),
                                       (31, "v31")], key=repr)


# Keyed scenarios (key changes, NULL keys, soft deletes, TOAST) merged into gold counted as big, so the batch's keys
# filter gold in the MERGE condition: as IN lists, or as ranges when the batch has more than `_KEY_FILTER_MAX` keys.
_KEY_FILTERED = [(test_key_change_deletes_old_key_and_chains, 5_000), (test_null_key_column_matches_null_safely, 5_000),
                 (test_unchanged_toast_across_a_key_change, 1),
                 (test_soft_delete_by_key_change_keeps_the_old_key_and_state, 1)]


@pytest.mark.parametrize(("scenario", "limit"), _KEY_FILTERED,
                         ids=lambda x: x.__name__.removeprefix("test_") if callable(x) else "in" if x > 1 else "range")
def test_scenarios_with_gold_filtered_by_the_batch_keys(scenario, limit, spark, tmp_path, monkeypatch):
    import inspect

    from delta.tables import DeltaTable

    import slotlake.merge.job as job
    import slotlake.spark.session as session

    monkeypatch.setattr(session, "SMALL_GOLD_BYTES", 1)
    monkeypatch.setattr(job, "_KEY_FILTER_MAX", limit)
    filters, real = [], job._key_filter
    monkeypatch.setattr(job, "_key_filter", lambda *a, **k: filters.append(real(*a, **k)) or filters[-1])
    if "lake" in inspect.signature(scenario).parameters:
        scenario(Lake(spark, tmp_path))
    else:
        scenario(spark, tmp_path)
    merges = [r["version"] for gold in (tmp_path / "lake" / SRC / "gold").glob("*/*")
              for r in DeltaTable.forPath(spark, str(gold)).history().collect() if r["operation"] == "MERGE"]
    # Every MERGE into an existing gold table (the first merge created gold: nothing to skip) had a filter: IN lists
    # for batches of up to `limit` keys, ranges for bigger ones.
    assert len(filters) == len([v for v in merges if v > 0]) > 0 and all(f is not None for f in filters), merges
    ranges = [str(f) for f in filters if ">=(" in str(f) and "<=(" in str(f)]  # Column<'and(>=(t.id, 1), ...'>
    assert bool(ranges) == (limit == 1), [str(f) for f in filters]


# The tests above merge batches of a few rows, which run interpreted; a batch of SMALL_BATCH_ROWS changes or more
# runs Spark's generated code (production's path for big batches). These scenarios cover keyed lineages (key
# changes, TOAST) and soft deletes with TRUNCATE on that path too (two: each costs ~45 s of compiling).
_GENERATED = [test_unchanged_toast_across_a_key_change, test_soft_deletes_keep_the_last_state]


@pytest.mark.parametrize("scenario", _GENERATED, ids=lambda f: f.__name__.removeprefix("test_"))
def test_scenarios_with_generated_code(scenario, spark, tmp_path, monkeypatch, caplog):
    import inspect
    import logging

    import slotlake.spark.session as session

    monkeypatch.setattr(session, "SMALL_BATCH_ROWS", 0)  # every batch counts as large
    with caplog.at_level(logging.INFO, logger="slotlake.merge.job"):
        if "lake" in inspect.signature(scenario).parameters:
            scenario(Lake(spark, tmp_path))
        else:
            scenario(spark, tmp_path)
    merged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("merged ")]
    assert merged and all(m.endswith("; generated code)") for m in merged), merged


# The same scenarios with each merge done by the in-process merge where it takes the batch (`slotlake sync`'s
# path: `merge.in_process.merge_in_process`, no Spark), else by Spark's as a sync does. The first merge of each
# creates gold (Spark's: loading a table is); the later ones must be in process, and every assertion of the
# scenario (gold's rows, `_slotlake_` columns, `_runs`) holds as it does for Spark's merge. Silver here is written
# by Spark's writer, without the decode's layout summaries: the in-process merge counts the batch itself. (Not
# here: a NULL in a key column, and silver files holding several tables, which the in-process merge leaves to Spark.)
_IN_PROCESS = [test_insert_update_delete_by_primary_key, test_using_index_key_is_not_the_first_column,
               test_full_identity_keeps_identical_rows_and_deletes_one,
               test_full_identity_unchanged_toast_comes_from_the_old_row, test_key_change_deletes_old_key_and_chains,
               test_delete_then_reinsert_in_one_batch_ends_as_reinserted, test_unchanged_toast_keeps_the_gold_value,
               test_truncate_in_the_middle_of_a_batch, test_truncate_alone_empties_the_table]


class InProcessLake(Lake):
    def __init__(self, spark, tmp_path, **source):
        super().__init__(spark, tmp_path, **source)
        self.engines: list[str] = []

    def merge(self, tables=None):
        from slotlake.merge.in_process import merge_in_process

        report = merge_in_process(self.cfg, SRC) if tables is None else None
        self.engines.append("in process" if report is not None else "spark")
        return report if report is not None else super().merge(tables)


@pytest.mark.parametrize("scenario", _IN_PROCESS, ids=lambda f: f.__name__.removeprefix("test_"))
def test_scenarios_merged_in_process(scenario, spark, tmp_path):
    lake = InProcessLake(spark, tmp_path)
    scenario(lake)
    assert lake.engines[0] == "spark" and "in process" in lake.engines[1:], lake.engines
