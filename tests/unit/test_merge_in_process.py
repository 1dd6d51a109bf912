"""The in-process merge's MERGE sources (slotlake.merge.in_process): for a keyed batch, key changes as a delete at
the old key and the row at the new one, unchanged TOAST values from the batch or from gold's row; for a FULL-identity
batch, the copies of each distinct row it adds or removes after gold's count; and the batches it leaves to Spark.
Silver-shaped batches (slotlake's own format) against small gold tables written with delta-rs, merged with the
module's own MERGE; the same cases run against PostgreSQL and Spark's merge in
tests/integration/test_in_process_sync.py."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from slotlake.merge.in_process import Declined, _full_source, _keyed_source, _merge, _prepare_truncated, _Table
from slotlake.merge.plan import TableShape, plan_table
from slotlake.names import TableName

pytestmark = pytest.mark.unit

INT4, TEXT = 23, 25
PLAN = plan_table(TableShape("public", "t", ("id", "name", "big"), (INT4, TEXT, TEXT), (-1, -1, -1), ("id",), "d"),
                  "hard")
TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SILVER = pa.schema([("commit_lsn", pa.int64()), ("seq", pa.int64()), ("commit_ts", pa.timestamp("us", "UTC")),
                    ("op", pa.string()), ("old", pa.list_(pa.string())), ("new", pa.list_(pa.string())),
                    ("unchanged", pa.list_(pa.int32()))])


@pytest.fixture
def gold(tmp_path) -> str:
    from deltalake import write_deltalake

    path = str(tmp_path / "gold")
    write_deltalake(path, pa.table({
        "id": pa.array([1, 2, 3, 5], pa.int32()), "name": ["a", "b", "c", "e"], "big": ["B1", "B2", "B3", None],
        "_slotlake_lsn": pa.array([1, 1, 1, 1], pa.int64()),
        "_slotlake_commit_ts": pa.array([TS] * 4, pa.timestamp("us", "UTC"))}))
    return path


def batch(*changes) -> pa.Table:
    """(op, old, new, unchanged) per change, numbered in commit order."""
    return pa.Table.from_pylist([
        {"commit_lsn": 100 + i, "seq": 0, "commit_ts": TS, "op": op, "old": old, "new": new, "unchanged": unchanged}
        for i, (op, old, new, unchanged) in enumerate(changes)], schema=SILVER)


def final(source: pa.Table) -> dict:
    """{key: (action, name, big, lsn)}."""
    return {r["__k0"]: (r["__action"], r["__v1"], r["__v2"], r["__lsn"]) for r in source.to_pylist()}


def merged(gold: str, source: pa.Table) -> dict:
    """Gold after the in-process merge's MERGE of `source`: {id: (name, big, lsn)}."""
    from deltalake import DeltaTable

    _merge(DeltaTable(gold), PLAN, source)
    return {r["id"]: (r["name"], r["big"], r["_slotlake_lsn"]) for r in DeltaTable(gold).to_pyarrow_table().to_pylist()}


def test_unchanged_toast_from_the_batch_or_gold(gold):
    source = _keyed_source(PLAN, batch(
        ("U", None, ["1", "a2", None], [2]),  # from gold
        ("U", None, ["2", "b", "X"], None), ("U", None, ["2", "b2", None], [2]),  # from the batch's earlier change
        ("I", None, ["4", "d", "D4"], None), ("U", None, ["4", "d2", None], [2]),  # from the batch's insert
        ("U", None, ["3", "c2", None], [2]), ("D", ["3", None, None], None, None),  # deleted: nothing to fill
        ("U", None, ["5", "e2", None], [2]),  # gold's value is NULL
    ), gold)
    assert final(source) == {1: ("U", "a2", None, 100), 2: ("U", "b2", "X", 102), 4: ("U", "d2", "D4", 104),
                             3: ("D", None, None, 106), 5: ("U", "e2", None, 107)}
    assert {r["__k0"]: r["__u2"] for r in source.to_pylist()} == {1: True, 2: False, 4: False, 3: False, 5: True}
    assert merged(gold, source) == {1: ("a2", "B1", 100), 2: ("b2", "X", 102), 4: ("d2", "D4", 104),
                                    5: ("e2", None, 107)}


def test_an_unchanged_toast_value_of_a_row_gold_lacks_is_left_to_spark(gold):
    with pytest.raises(Declined, match="gold does not hold"):
        _keyed_source(PLAN, batch(("U", None, ["9", "x", None], [2])), gold)


def test_key_changes_leave_their_old_key(gold):
    source = _keyed_source(PLAN, batch(
        ("U", ["1", None, None], ["10", "a", "B1"], None),  # moved
        ("U", None, ["10", "a2", "B1"], None),  # then updated at its new key
        ("U", ["2", None, None], ["-2", "b", "B2"], None),  # 2 and 3 swap keys through -2
        ("U", ["3", None, None], ["2", "c", "B3"], None),
        ("U", ["-2", None, None], ["3", "b", "B2"], None),
        ("I", None, ["1", "new", None], None),  # the old key taken again
        ("U", ["5", None, None], ["5", "e5", None], None),  # an old tuple with the same key: an update
    ), gold)
    assert final(source) == {10: ("U", "a2", "B1", 101), 1: ("U", "new", None, 105), 2: ("U", "c", "B3", 103),
                             3: ("U", "b", "B2", 104), -2: ("D", "b", "B2", 104), 5: ("U", "e5", None, 106)}
    assert merged(gold, source) == {10: ("a2", "B1", 101), 1: ("new", None, 105), 2: ("c", "B3", 103),
                                    3: ("b", "B2", 104), 5: ("e5", None, 106)}


def test_batches_spark_merges(gold):
    with pytest.raises(Declined, match="key change and unchanged TOAST"):
        _keyed_source(PLAN, batch(("U", ["1", None, None], ["10", "a", None], [2])), gold)
    with pytest.raises(Declined, match="a key an earlier change of the batch left"):  # 1 left, then updated there
        _keyed_source(PLAN, batch(("U", ["1", None, None], ["10", "a", "B1"], None),
                                  ("U", None, ["1", "a", "B1"], None)), gold)


FULL = plan_table(TableShape("public", "h", ("a", "b"), (INT4, TEXT), (-1, -1), (), "f"), "hard")


@pytest.fixture
def full_gold(tmp_path) -> str:
    """(1, 'x') twice, (2, NULL) once, (3, 'big') once."""
    from deltalake import write_deltalake

    path = str(tmp_path / "full")
    write_deltalake(path, pa.table({
        "a": pa.array([1, 1, 2, 3], pa.int32()), "b": ["x", "x", None, "big"],
        "_slotlake_lsn": pa.array([1, 1, 1, 1], pa.int64()),
        "_slotlake_commit_ts": pa.array([TS] * 4, pa.timestamp("us", "UTC")),
        "_slotlake_dup": pa.array([1, 2, 1, 1], pa.int32())}))
    return path


def full_rows(path: str) -> list:
    from deltalake import DeltaTable

    return sorted(((r["a"], r["b"], r["_slotlake_dup"], r["_slotlake_lsn"])
                   for r in DeltaTable(path).to_pyarrow_table().to_pylist()), key=repr)


def test_full_identity_copies_added_and_removed_after_golds_count(full_gold):
    from deltalake import DeltaTable

    source = _full_source(FULL, batch(
        ("D", ["1", "x"], None, None),  # one of gold's two copies: the second goes
        ("U", ["2", None], ["2", "y"], None),  # NULL matched as NULL
        ("I", None, ["2", "y"], None),  # ... and a second (2, 'y')
        ("U", ["3", "big"], ["4", None], [1]),  # unchanged TOAST: the old row's value
        ("D", ["9", "none"], None, None),  # a row gold does not hold: removes nothing
        ("I", None, ["5", "z"], None), ("D", ["5", "z"], None, None),  # in and out in the batch
    ), full_gold)
    assert sorted(((r["__v0"], r["__v1"], r["__dup"], r["__action"]) for r in source.to_pylist()), key=repr) == sorted([
        (1, "x", 2, "D"), (2, None, 1, "D"), (2, "y", 1, "U"), (2, "y", 2, "U"), (3, "big", 1, "D"),
        (4, "big", 1, "U")], key=repr)
    _merge(DeltaTable(full_gold), FULL, source)
    assert full_rows(full_gold) == sorted([(1, "x", 1, 1), (2, "y", 1, 102), (2, "y", 2, 102), (4, "big", 1, 103)],
                                          key=repr)


def test_after_a_truncate_gold_is_what_the_later_changes_leave():
    keyed = _Table(TableName("public", "t"), "unused", 1, truncate=True)
    _prepare_truncated(keyed, PLAN, batch(
        ("U", None, ["1", "a2", "B"], None), ("T", None, None, None),
        ("I", None, ["7", "g", "G"], None), ("U", None, ["7", "g2", None], [2]),  # its value from the insert
        ("I", None, ["8", "h", None], None), ("D", ["8", None, None], None, None)))
    assert keyed.source.to_pylist() == [{"id": 7, "name": "g2", "big": "G", "_slotlake_lsn": 103,
                                         "_slotlake_commit_ts": TS}]
    _prepare_truncated(keyed, PLAN, batch(
        ("T", None, None, None), ("I", None, ["7", "g", "G"], None),
        ("U", ["7", None, None], ["70", "g3", "G3"], None)))  # a key change after it
    assert keyed.source.to_pylist() == [{"id": 70, "name": "g3", "big": "G3", "_slotlake_lsn": 102,
                                         "_slotlake_commit_ts": TS}]
    full = _Table(TableName("public", "h"), "unused", 1, truncate=True)
    _prepare_truncated(full, FULL, batch(
        ("I", None, ["1", "x"], None), ("T", None, None, None), ("T", None, None, None),
        ("I", None, ["2", "y"], None), ("I", None, ["2", "y"], None), ("I", None, ["3", None], None),
        ("D", ["2", "y"], None, None)))
    assert sorted(((r["a"], r["b"], r["_slotlake_dup"]) for r in full.source.to_pylist()), key=repr) == [
        (2, "y", 1), (3, None, 1)]
    with pytest.raises(Declined, match="after a TRUNCATE"):  # no gold row to keep the value of
        _prepare_truncated(keyed, PLAN, batch(("T", None, None, None), ("U", None, ["1", "a", None], [2])))


def test_a_window_that_cuts_a_silver_file_is_read_and_counted_here(tmp_path):
    """A silver file holding changes on both sides of the merge's window (an in-place replay's re-derived file, the
    next interval's replay starting inside it) has a footer summary for the whole file only: the batch is read and
    counted here, the rows at or before the window's start left out."""
    import pyarrow.parquet as pq

    from slotlake.merge.in_process import _counted_batch
    from slotlake.merge.silver_stats import SilverFileStats

    rows = batch(("I", None, ["1", "a", "x"], None), ("U", None, ["1", "b", None], [2]),
                 ("I", None, ["2", "c", "y"], None), ("D", ["2", None, None], None, None),
                 ("I", None, ["3", "d", "z"], None))
    n = rows.num_rows
    rows = rows.append_column("commit_end_lsn", pa.array([r + 10 for r in rows.column("commit_lsn").to_pylist()]))
    for name, value, tp in (("schema_name", "public", pa.string()), ("table_name", "t", pa.string()),
                            ("columns", ["id", "name", "big"], pa.list_(pa.string())),
                            ("type_oids", [INT4, TEXT, TEXT], pa.list_(pa.int32())),
                            ("typmods", [-1, -1, -1], pa.list_(pa.int32())),
                            ("key_columns", ["id"], pa.list_(pa.string())), ("replica_identity", "d", pa.string())):
        rows = rows.append_column(name, pa.array([value] * n, tp))
    (tmp_path / "changes").mkdir()
    pq.write_table(rows, tmp_path / "changes" / "part-0.parquet")
    stats = [SilverFileStats("public", "public", "t", "t", 100, 114, "part-0.parquet", 104, 110)]
    name = TableName("public", "t")
    got, groups = _counted_batch(str(tmp_path / "changes"), stats, name, 111, 104, budget=10)  # ends 112..114
    assert got.column("commit_lsn").to_pylist() == [102, 103, 104]
    assert "columns" not in got.column_names and {"op", "old", "new", "unchanged"} <= set(got.column_names)
    [g] = groups
    assert (g.n, g.plain, g.ud, g.toast, g.truncs, g.lo, g.hi) == (3, 2, 1, 0, 0, (102, 0), (104, 0))
    assert g.shape_map is not None and list(g.shape_map["columns"]) == ["id", "name", "big"]
    _, groups = _counted_batch(str(tmp_path / "changes"), stats, name, None, 104, budget=10)
    assert [(g.n, g.plain, g.ud, g.toast) for g in groups] == [(5, 3, 2, 1)]
    with pytest.raises(Declined, match="more than"):
        _counted_batch(str(tmp_path / "changes"), stats, name, None, 104, budget=4)


def test_the_runs_budget_is_shared_by_tables_prepared_side_by_side():
    """`_Budget`: the tables of a run prepared in threads take their changes from one bound; the one that would
    pass it declines (Spark merges the run), whichever thread asks."""
    from concurrent.futures import ThreadPoolExecutor

    from slotlake.merge.in_process import MAX_CHANGES, Declined, _Budget

    budget = _Budget(1000)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(budget.take, [10] * 100))
    assert budget.left == 0
    with pytest.raises(Declined, match=f"more than {MAX_CHANGES:,} changes"):
        budget.take(1)
    budget = _Budget(100)
    budget.take(60)
    with pytest.raises(Declined):
        budget.take(41)
    budget.take(40)  # a refused take took nothing
    assert budget.left == 0
