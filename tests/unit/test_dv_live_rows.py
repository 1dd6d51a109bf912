"""Reading and overwriting a table with deletion vectors without Spark (merge/dv_merge.py: `LiveRows`, `overwrite`,
`live_row_count`), checked against delta-rs's query engine, which applies the vectors itself. The table: written
by delta-rs, given the deletion-vector protocol as Spark's `ALTER TABLE ... SET TBLPROPERTIES
('delta.enableDeletionVectors' = 'true')` writes it, rows marked by `commit_marks` across the reader's batch edges.
Spark reads what these functions write in tests/integration/test_in_process_deletion_vectors.py (the suite's
reader check), where replays, recoveries and an undo run on such tables."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from pyroaring import BitMap

from slotlake import delta_log
from slotlake.merge import dv_merge

# the test compares with delta-rs's query engine itself; Spark reads these writers' tables in the integration test
pytestmark = [pytest.mark.unit,
              pytest.mark.delta_readers(skip="compared with delta-rs's query engine here, without a JVM")]

ROWS = 150_000  # more than two of the reader's 65,536-row batches in one file
MARKED = [0, 1, 65_535, 65_536, 65_537, 131_072, ROWS - 1]


def _query(path: str, version: int | None = None) -> collections.Counter:
    table = DeltaTable(path, version=version)
    got = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    return collections.Counter((r["id"], r["v"]) for r in got.to_pylist())


def _rows(table: pa.Table) -> collections.Counter:
    return collections.Counter((r["id"], r["v"]) for r in table.to_pylist())


@pytest.fixture
def table(tmp_path) -> str:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array(range(ROWS), pa.int64()),
                                    "v": pa.array([f"v{i % 1000}" for i in range(ROWS)])}))
    snap = delta_log.snapshot(path)
    assert snap is not None and len(snap.files) == 1
    meta = dict(snap.metadata)
    meta["configuration"] = {**(meta.get("configuration") or {}), "delta.enableDeletionVectors": "true"}
    upgrade = [{"commitInfo": {"timestamp": 0, "operation": "SET TBLPROPERTIES"}},
               {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                             "writerFeatures": ["appendOnly", "deletionVectors", "invariants"]}},
               {"metaData": meta}]
    (tmp_path / "t" / "_delta_log" / f"{1:020d}.json").write_text("\n".join(json.dumps(a) for a in upgrade) + "\n")
    (file,) = snap.files
    marks = dv_merge.Marks(1, touched={file: BitMap(MARKED)}, live={file: ROWS}, adds=snap.files,
                           metrics={"numTargetRowsDeleted": len(MARKED)})
    assert dv_merge.commit_marks(path, marks, app_id="test", txn_version=1, user_metadata="{}") == 2
    return path


def test_live_rows_leave_out_what_the_vectors_delete_as_delta_rs_reads_them(table):
    expected = collections.Counter((i, f"v{i % 1000}") for i in range(ROWS) if i not in set(MARKED))
    live = dv_merge.LiveRows(table)
    assert live.version == 2 and live.schema.names == ["id", "v"]
    assert _rows(live.to_table()) == expected == _query(table)
    assert dv_merge.live_row_count(table) == ROWS - len(MARKED)
    # as of the version before the marks: every row
    before = dv_merge.LiveRows(table, 1).to_table()
    assert before.num_rows == ROWS and _rows(before) == _query(table, 1)
    # a projection and a filter, as the recovery's scanner asks for them, across a batch edge
    got = live.scanner(columns={"x": ds.field("id")}, filter=ds.field("id") >= 65_530, batch_size=1_000).to_reader()
    assert got.schema.names == ["x"]
    assert sorted(pa.Table.from_batches(list(got), schema=got.schema).column("x").to_pylist()) == [
        i for i in range(65_530, ROWS) if i not in set(MARKED)]


def test_an_overwrite_replaces_every_file_and_keeps_the_vectors_on(table):
    keep = dv_merge.LiveRows(table).to_table(filter=ds.field("id") < 100_000)
    version = dv_merge.overwrite(table, pa.RecordBatchReader.from_batches(keep.schema, keep.to_batches()),
                                 '{"slotlake": {"stage": "merge", "end_lsn": "0/10"}}')
    assert version == 3
    assert _query(table) == _rows(keep) == _rows(dv_merge.LiveRows(table).to_table())
    snap = delta_log.snapshot(table)
    assert snap is not None and not any(a.get("deletionVector") for a in snap.files.values())
    assert "deletionVectors" in snap.protocol["readerFeatures"]
    assert dv_merge.live_row_count(table) == keep.num_rows
    newest = next(delta_log.commits(table))
    assert (newest.operation, newest.end_lsn, newest.metrics["numOutputRows"]) == ("WRITE", "0/10", keep.num_rows)
    assert _query(table, 2) == _rows(dv_merge.LiveRows(table, 2).to_table())  # history kept
    with pytest.raises(dv_merge.CannotMark):  # not gold's columns: refused before the log is written
        other = pa.table({"id": pa.array([1], pa.int64())})
        dv_merge.overwrite(table, pa.RecordBatchReader.from_batches(other.schema, other.to_batches()), "{}")
    assert next(delta_log.commits(table)).version == 3


def test_a_table_with_a_feature_the_overwrite_does_not_write_is_refused_before_any_write(table):
    dv_merge.check_writable(table)  # the fixture's table: written here
    snap = delta_log.snapshot(table)
    assert snap is not None
    meta = dict(snap.metadata)
    meta["configuration"] = {**(meta.get("configuration") or {}), "delta.appendOnly": "true"}
    (Path(table) / "_delta_log" / f"{3:020d}.json").write_text("\n".join(json.dumps(a) for a in [
        {"commitInfo": {"timestamp": 0, "operation": "SET TBLPROPERTIES"}}, {"metaData": meta}]) + "\n")
    with pytest.raises(dv_merge.CannotMark, match="append-only"):
        dv_merge.check_writable(table)
    keep = dv_merge.LiveRows(table).to_table()
    with pytest.raises(dv_merge.CannotMark, match="append-only"):  # what the in-place replay would meet at the end
        dv_merge.overwrite(table, pa.RecordBatchReader.from_batches(keep.schema, keep.to_batches()), "{}")
    assert next(delta_log.commits(table)).version == 3 and _query(table) == _rows(keep)


def test_compact_folds_small_files_and_vectors_and_changes_no_data(table):
    for i in range(2):  # two more small files, appended as the in-process merge appends rows
        rows = pa.table({"id": pa.array([ROWS + i], pa.int64()), "v": [f"x{i}"]})
        dv_merge.commit_marks(table, dv_merge.plan_append(table, rows), app_id="test", txn_version=2 + i,
                              user_metadata='{"slotlake": {"stage": "merge", "end_lsn": "0/20"}}')
    expected = _query(table)
    assert sum(expected.values()) == ROWS - len(MARKED) + 2
    version = next(delta_log.commits(table)).version
    assert len(delta_log.snapshot(table).files) == 3
    done = dv_merge.compact(table)
    assert done == dv_merge.Compacted(version + 1, files_removed=3, files_added=1, vectors_removed=1,
                                      rows=ROWS - len(MARKED) + 2)
    snap = delta_log.snapshot(table)
    assert len(snap.files) == 1 and not any(a.get("deletionVector") for a in snap.files.values())
    assert "deletionVectors" in snap.protocol["readerFeatures"]
    assert _query(table) == expected == _rows(dv_merge.LiveRows(table).to_table())
    assert _query(table, version) == expected  # history: the version before reads the same rows
    newest = next(delta_log.commits(table))
    assert newest.operation == "OPTIMIZE" and newest.version == version + 1
    assert delta_log.latest_slotlake_commit(table).end_lsn == "0/20"  # the watermark is the append's still
    entry = Path(table) / "_delta_log" / f"{version + 1:020d}.json"
    actions = [json.loads(line) for line in entry.read_text().splitlines()]
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 4 and all(c["dataChange"] is False for c in changes)
    assert dv_merge.live_row_count(table) == sum(expected.values())
    assert dv_merge.compact(table) is None  # one file, no vector: nothing to fold
