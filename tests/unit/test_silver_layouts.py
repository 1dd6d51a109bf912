"""decode/layouts.py: each silver file's layout summary, counted by the decode's task as it writes the file, equals
a row-by-row count of the file's rows (the merge's first pass), across row groups, layouts and TRUNCATE rows; and
merge/silver_stats.files_of picks only files wholly inside a merge's window."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slotlake.decode import silver_write
from slotlake.decode.decoded import KIND_CHANGE, decoded_schema
from slotlake.decode.layouts import SHAPE_FIELDS, LayoutGroup, LayoutScan, LayoutSummary, combine, read_layout_summary
from slotlake.merge.silver_stats import SilverFileStats, files_of
from slotlake.names import TableName

pytestmark = pytest.mark.unit

T0 = dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)
V1 = {"columns": ["id", "v"], "key_columns": ["id"], "type_oids": [23, 25], "typmods": [-1, -1],
      "replica_identity": "d"}
V2 = {"columns": ["id", "v", "w"], "key_columns": ["id"], "type_oids": [23, 25, 1700], "typmods": [-1, -1, 655366],
      "replica_identity": "d"}
FULL = {"columns": ["id", "v"], "key_columns": None, "type_oids": [23, 25], "typmods": [-1, -1],
        "replica_identity": "f"}


def _change(i: int, op: str, layout: dict | None, *, table: str = "t1", unchanged: list | None = None,
            seq: int = 0) -> dict:
    lsn = 1000 + i * 10
    row = {"kind": KIND_CHANGE, "commit_lsn": lsn, "commit_end_lsn": lsn + 5, "commit_ts": T0 + dt.timedelta(seconds=i),
           "xid": 700 + i, "seq": seq, "lsn": lsn + seq, "rel_oid": 16001, "schema_name": "public",
           "table_name": table, "op": op, "unchanged": unchanged, "bronze_file": "b.parquet"}
    if layout is not None:
        row.update(layout)
        row["new"] = None if op == "D" else [str(i)] * len(layout["columns"])
    return row


def _reference(rows: list[dict]) -> list[LayoutGroup]:
    """The merge's first pass, row by row."""
    out: dict = {}
    for r in rows:
        shape = None if r["op"] == "T" else tuple(
            tuple(r[f]) if isinstance(r[f], list) else r[f] for f in SHAPE_FIELDS)
        g = out.setdefault(shape, {"n": 0, "ids": [], "truncs": 0, "plain": 0, "toast": 0, "ts": [], "ud": 0,
                                   "old_u": 0})
        g["n"] += 1
        g["ids"].append((r["commit_lsn"], r["seq"]))
        g["truncs"] += r["op"] == "T"
        u = len(r["unchanged"] or [])
        g["plain"] += r["op"] == "I" and u <= 0
        g["toast"] += u > 0
        g["ts"].append(r["commit_ts"])
        g["ud"] += r["op"] in ("U", "D")
        g["old_u"] += r["op"] == "U" and r["old"] is not None
    return [LayoutGroup(s, g["n"], min(g["ids"]), max(g["ids"]),
                        g["truncs"], g["plain"], g["toast"],
                        (max(g["ts"]) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1),
                        g["ud"], g["old_u"])
            for s, g in out.items()]


def _key(g: LayoutGroup) -> str:
    return repr(g.shape)


def _workload() -> list[dict]:
    rows = [_change(i, "I", V1, seq=s) for i in range(40) for s in range(2)]
    rows += [_change(40 + i, "U", V1, unchanged=[1] if i % 3 == 0 else []) for i in range(20)]
    for r in rows[-4:]:
        r["old_kind"], r["old"] = "K", ["99", None]  # key changes: an old key tuple
    rows += [_change(60, "T", None)]
    rows += [_change(61 + i, "D", V1) for i in range(5)]
    rows += [_change(70 + i, "I", V2, unchanged=None) for i in range(30)]  # a column added: a second layout
    rows += [_change(100 + i, "U", V2, unchanged=[2]) for i in range(7)]
    rows += [_change(110, "T", None), _change(111, "I", V1)]  # the first layout comes back after a TRUNCATE
    return rows


@pytest.mark.parametrize("row_group", [1, 7, 64, 10_000])
def test_the_footers_summary_equals_a_row_by_row_count_of_the_file(tmp_path, monkeypatch, row_group):
    monkeypatch.setattr(silver_write, "ROW_GROUP_ROWS", row_group)
    rows = _workload()
    batches = pa.Table.from_pylist(rows, schema=decoded_schema()).to_batches(max_chunksize=13)
    out = pa.Table.from_batches(list(silver_write.write_task(iter(batches), decode=lambda b: b,
                                                             folder=str(tmp_path), rows_per_file=10_000)))
    assert out.num_rows == 1
    path = tmp_path / out.column("path")[0].as_py()
    summary = read_layout_summary(pq.read_metadata(path).metadata)
    assert summary is not None
    written = pq.read_table(path).to_pylist()
    assert len(written) == len(rows)
    want = sorted(_reference(written), key=_key)
    assert sorted(summary.groups, key=_key) == want
    assert len(want) == 3 and sum(g.truncs for g in want) == 2 and sum(g.toast for g in want) == 7 + 7
    assert sum(g.ud for g in want) == 20 + 5 + 7 and sum(g.old_updates for g in want) == 4
    # two files' summaries add up to the summary of their rows together
    half = len(rows) // 2
    a, b = LayoutScan(), LayoutScan()
    table = pa.Table.from_pylist(written, schema=pq.read_schema(path))
    a.add(table.slice(0, half))
    b.add(table.slice(half))
    both = combine([*a.summary().groups, *b.summary().groups])
    assert sorted(both, key=_key) == want
    assert LayoutSummary.parse(summary.json()) == summary


def test_a_keyless_full_table_and_a_file_of_one_layout():
    rows = [_change(i, "I", FULL) for i in range(50)] + [_change(50, "D", FULL)]
    scan = LayoutScan()
    table = pa.Table.from_pylist(rows, schema=decoded_schema())
    scan.add(table.slice(0, 20))
    scan.add(table.slice(20))
    summary = scan.summary()
    assert summary is not None and list(summary.groups) == _reference(rows)
    (g,) = summary.groups
    assert g.shape_map == {**FULL, "columns": ("id", "v"), "type_oids": (23, 25), "typmods": (-1, -1),
                           "schema_name": "public", "table_name": "t1"}
    assert g.last_ts == T0 + dt.timedelta(seconds=50) and g.plain == 50 and g.n == 51


def test_what_cannot_be_counted_leaves_no_summary():
    scan = LayoutScan()
    rows = [_change(1, "I", V1)]
    rows[0]["seq"] = None  # not a change the decoder writes: the file is left to the merge's Spark pass
    scan.add(pa.Table.from_pylist(rows, schema=decoded_schema()))
    assert scan.summary() is None
    for text in (None, b"", b"{", b'{"v": 99, "groups": []}', b'{"v": 1}', b'{"v": 1, "groups": [{"n": 1}]}'):
        assert LayoutSummary.parse(text) is None


def test_only_files_wholly_inside_the_window_of_the_one_table_are_summed():
    t = TableName("public", "t1")

    def f(path, lsn_min, lsn_max, end_min, end_max, table="t1"):
        return SilverFileStats("public", "public", table, table, lsn_min, end_max, path, lsn_max, end_min)

    files = [f("a", 100, 190, 105, 195), f("b", 200, 290, 205, 295), f("c", 300, 390, 305, 395),
             f("other", 100, 390, 105, 395, table="t2")]
    assert files_of(files, t, None, 395) == ["a", "b", "c"]
    assert files_of(files, t, 195, 295) == ["b"]  # a ends at the mark, c starts past the end
    assert files_of(files, t, 195, 350) is None  # c straddles the end
    assert files_of(files, t, 150, 295) is None  # a straddles the mark
    assert files_of(files, t, 395, 500) == []
    assert files_of([SilverFileStats("public", "public", "t1", "t1", 100, 195)], t, None, 395) is None  # no path
    mixed = SilverFileStats("public", "public", "t0", "t1", 100, 195, "m", 190, 105)
    assert files_of([mixed], t, None, 395) is None  # a file of several tables
