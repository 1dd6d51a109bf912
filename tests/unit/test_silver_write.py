"""decode/silver_write.py: the decode's tasks write silver's Parquet files (one table per file, bounded memory and
open files, Delta statistics) and delta-rs commits them; in process, on Arrow batches shaped as the decoder's."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slotlake import contracts
from slotlake.decode import silver_write
from slotlake.decode.decoded import KIND_CHANGE, KIND_COMMIT, decoded_schema

pytestmark = pytest.mark.unit

T0 = dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)


def _rows(tables: int, per_table: int) -> list[dict]:
    """Changes of `tables` tables, interleaved, one commit row after each round (the decoder's other kinds)."""
    rows = []
    for i in range(per_table):
        for t in range(1, tables + 1):
            lsn = 1000 + i * 10 + t
            rows.append({"kind": KIND_CHANGE, "commit_lsn": lsn, "commit_end_lsn": lsn + 1,
                         "commit_ts": T0 + dt.timedelta(seconds=i), "xid": 700 + i, "seq": t, "lsn": lsn,
                         "rel_oid": 16000 + t, "schema_name": "public", "table_name": f"t{t}", "op": "I",
                         "replica_identity": "d", "columns": ["id", "v"], "key_columns": ["id"],
                         "type_oids": [23, 25], "typmods": [-1, -1], "new": [str(i), None if i % 3 else "x"],
                         "unchanged": [], "bronze_file": "b.parquet"})
        rows.append({"kind": KIND_COMMIT, "commit_lsn": 5})
    return rows


def _batches(rows: list[dict], size: int) -> list[pa.RecordBatch]:
    table = pa.Table.from_pylist(rows, schema=decoded_schema())
    return table.to_batches(max_chunksize=size)


def test_each_file_holds_one_table_within_the_limits_with_its_statistics(tmp_path, monkeypatch):
    monkeypatch.setattr(silver_write, "ROW_GROUP_ROWS", 8)
    monkeypatch.setattr(silver_write, "MAX_HELD_ROWS", 20)
    monkeypatch.setattr(silver_write, "MAX_OPEN_FILES", 2)
    out = list(silver_write.write_task(iter(_batches(_rows(5, 30), 7)), decode=lambda b: b, folder=str(tmp_path),
                                       rows_per_file=25))
    files = pa.Table.from_batches(out).to_pylist()
    per_table: dict[str, int] = {}
    for f in files:
        data = pq.read_table(tmp_path / f["path"])
        assert data.schema == contracts.arrow_schema(contracts.SILVER)
        names = set(data.column("table_name").to_pylist())
        assert len(names) == 1 and f["rows"] == data.num_rows <= 25  # one table per file, at most rows_per_file
        name = names.pop()
        per_table[name] = per_table.get(name, 0) + data.num_rows
        meta = pq.ParquetFile(tmp_path / f["path"]).metadata
        assert meta.num_row_groups >= 1
        chunks = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings
                  for i in range(meta.num_columns)}
        # repeating scalars dictionary-encoded; unique LSNs, arrays and values plain
        assert "RLE_DICTIONARY" in chunks["table_name"] and "RLE_DICTIONARY" in chunks["op"]
        assert not {"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & ({*chunks["lsn"], *chunks["columns.list.element"],
                                                              *chunks["new.list.element"]})
        stats = json.loads(f["stats"])
        lsns = data.column("commit_lsn").to_pylist()
        assert stats["numRecords"] == data.num_rows and f["size"] == (tmp_path / f["path"]).stat().st_size
        assert stats["minValues"]["commit_lsn"] == min(lsns) and stats["maxValues"]["commit_lsn"] == max(lsns)
        assert stats["minValues"]["table_name"] == stats["maxValues"]["table_name"] == name
        assert set(stats["minValues"]) <= {c for c, _ in contracts.SILVER[:contracts.SILVER_STATS_COLUMNS]}
        assert stats["nullCount"]["commit_ts"] == 0 and "new" not in stats["nullCount"]
        assert stats["minValues"]["commit_ts"].endswith(".123Z")  # UTC to the millisecond, as Delta writes
    assert per_table == {f"t{t}": 30 for t in range(1, 6)}
    # the open-file limit closed files early: more files than tables x ceil(30 / 25)
    assert len(files) > 10
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == sorted(f["path"] for f in files)


def test_each_tables_changes_keep_their_stream_order_and_only_the_indexed_columns_get_parquet_statistics(tmp_path):
    rows = _rows(3, 12)
    # a change of no relation (rel_oid NULL) among them, and one table's changes in a batch of its own
    rows.insert(5, {**rows[0], "rel_oid": None, "table_name": "none", "lsn": 1})
    rows += [{**rows[1], "lsn": 5000 + i, "seq": 100 + i} for i in range(4)]
    out = list(silver_write.write_task(iter(_batches(rows, 9)), decode=lambda b: b, folder=str(tmp_path),
                                       rows_per_file=1000))
    written: dict[object, list[int]] = {}
    for f in pa.Table.from_batches(out).to_pylist():
        data = pq.read_table(tmp_path / f["path"])
        (oid,) = set(data.column("rel_oid").to_pylist())
        written[oid] = data.column("lsn").to_pylist()
        meta = pq.ParquetFile(tmp_path / f["path"]).metadata.row_group(0)
        with_stats = {meta.column(i).path_in_schema for i in range(meta.num_columns) if meta.column(i).is_stats_set}
        assert with_stats == set(silver_write.STATS_COLUMNS)  # the arrays' and values' are never read
    expected: dict[object, list[int]] = {}
    for r in rows:
        if r["kind"] == KIND_CHANGE:
            expected.setdefault(r["rel_oid"], []).append(r["lsn"])
    assert written == expected and len(expected) == 4


def test_the_commit_adds_the_files_once_with_the_transaction(tmp_path):
    from deltalake import DeltaTable

    folder = tmp_path / "changes"
    folder.mkdir()
    out = list(silver_write.write_task(iter(_batches(_rows(2, 10), 5)), decode=lambda b: b, folder=str(folder),
                                       rows_per_file=1000))
    files = pa.Table.from_batches(out).to_pylist()
    meta = '{"slotlake":{"end_lsn":"0/50","stage":"decode"}}'
    assert silver_write.commit(str(folder), files, app_id="slotlake-decode-x", version=80, user_metadata=meta,
                               properties={"delta.dataSkippingNumIndexedCols": "10"})
    table = DeltaTable(str(folder))
    assert table.transaction_version("slotlake-decode-x") == 80
    assert table.metadata().configuration == {"delta.dataSkippingNumIndexedCols": "10"}
    assert table.to_pyarrow_table().num_rows == 20
    history = table.history(1)[0]
    assert history["userMetadata"] == meta and history["operationMetrics"]["numOutputRows"] == "20"
    # the same transaction again: nothing committed
    assert not silver_write.commit(str(folder), files, app_id="slotlake-decode-x", version=80, user_metadata=meta,
                                   properties={})
    assert DeltaTable(str(folder)).version() == table.version() and table.to_pyarrow_table().num_rows == 20
