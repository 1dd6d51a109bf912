"""The recovery without Spark, its parts that need no database: resolving a point from silver's commit columns
(a small Delta table written with delta-rs here), the projection onto the columns at the point, and the rows it
COPYs (soft-deleted rows left out)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from slotlake.catalog import CatalogColumn, CatalogVersion
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.recover.point import RecoverRequest
from slotlake.recover.point_in_process import _history_at, _postgres_rows, _projected, _replayed, resolve_as_of

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
NUMERIC, TEXT, INT4 = 1700, 25, 23


def _silver(path) -> str:
    """Three commits (LSN 100, 200, 300) a minute apart, two rows each, as silver holds them."""
    write_deltalake(str(path), pa.table({
        "commit_lsn": pa.array([100, 100, 200, 200, 300, 300], pa.int64()),
        "commit_ts": pa.array([T0 + timedelta(minutes=i // 2) for i in range(6)], pa.timestamp("us", tz="UTC")),
    }))
    return str(path)


def test_resolve_as_of_is_the_last_commit_at_or_before_the_point(tmp_path):
    silver = _silver(tmp_path / "changes")
    last = Lsn(300)
    assert resolve_as_of(silver, Lsn(250)) == (Lsn(200), T0 + timedelta(minutes=1), last)
    assert resolve_as_of(silver, Lsn(200)) == (Lsn(200), T0 + timedelta(minutes=1), last)  # at: inclusive
    assert resolve_as_of(silver, Lsn(50)) == (Lsn(50), None, last)  # before every commit: the LSN as given
    assert resolve_as_of(silver, T0 + timedelta(minutes=1)) == (Lsn(200), T0 + timedelta(minutes=1), last)
    assert resolve_as_of(silver, T0 + timedelta(seconds=59)) == (Lsn(100), T0, last)
    assert resolve_as_of(silver, T0 - timedelta(seconds=1)) == (Lsn(99), None, last)  # just before the first
    # a zoned moment is the same instant
    zoned = (T0 + timedelta(minutes=2)).astimezone(ZoneInfo("Europe/Berlin"))
    assert resolve_as_of(silver, zoned)[0] == Lsn(300)


def _version(*columns: tuple[str, int, int]) -> CatalogVersion:
    return CatalogVersion(rel_oid=1, schema_name="public", table_name="t", version=2, valid_from_lsn=0,
                          valid_to_lsn=None, replica_identity="d",
                          columns=tuple(CatalogColumn(position=i, name=n, type_oid=oid, type_name=None, typmod=mod,
                                                      nullable=True, is_key=i == 1)
                                        for i, (n, oid, mod) in enumerate(columns, start=1)),
                          origin="relation")


T = TableName("public", "t")


def test_projection_takes_the_columns_at_the_point_and_the_rows_leave_out_soft_deletes(tmp_path):
    gold = tmp_path / "tables" / "public" / "t"  # where the replay leaves the table's state
    write_deltalake(str(gold), pa.table({
        "id": pa.array([1, 2, 3], pa.int32()),
        "legacy": pa.array(["a", "b", "c"]),  # dropped before the point: left out
        "name": pa.array(["x", None, "z"]),
        "_slotlake_deleted": pa.array([False, True, None]),
    }))
    version = _version(("id", INT4, -1), ("price", NUMERIC, (12 << 16 | 2) + 4), ("name", TEXT, -1))
    req = RecoverRequest(source="src", as_of=Lsn(5), tables=(TableName("public", "t"),), to_postgres="dbname=x")
    scanner = _projected("src", req, T, Lsn(5), [version], *_replayed("src", T, Lsn(5), str(tmp_path)))
    got = scanner.to_table()
    assert got.schema.names == ["id", "price", "name", "_slotlake_deleted"]
    assert got.schema.field("price").type == pa.decimal128(12, 2)  # added, never changed since: NULL of gold's type
    assert got.column("price").null_count == 3
    scanner = _projected("src", req, T, Lsn(5), [version], *_replayed("src", T, Lsn(5), str(tmp_path)))
    assert sorted(_postgres_rows(scanner)) == [(1, None, "x"), (3, None, "z")]  # row 2 soft-deleted


def test_a_table_without_state_or_columns_at_the_point_is_refused(tmp_path):
    from slotlake.errors import RecoverError

    req = RecoverRequest(source="src", as_of=Lsn(5), tables=(T,), to_postgres="dbname=x")
    with pytest.raises(RecoverError, match=r"public\.t has no state at 0/5 .*slotlake status src"):
        _replayed("src", T, Lsn(5), str(tmp_path))
    write_deltalake(str(tmp_path / "tables" / "public" / "t"), pa.table({"id": pa.array([1], pa.int32())}))
    with pytest.raises(RecoverError, match=r"no column definition in _catalog at 0/5 .*--to a Delta folder"):
        _projected("src", req, T, Lsn(5), [], *_replayed("src", T, Lsn(5), str(tmp_path)))


def test_history_gives_the_versions_valid_at_the_point_shaped_like_gold(tmp_path):
    """valid_from <= L < valid_to (NULL: still open), as `history_job.history_as_of`; the version's commit LSN and
    time become `_slotlake_lsn` and `_slotlake_commit_ts`."""
    path = tmp_path / "gold_history"
    write_deltalake(str(path), pa.table({
        "id": pa.array([1, 1, 2, 3], pa.int32()),
        "v": pa.array(["a", "b", "c", "d"]),
        "_slotlake_valid_from_lsn": pa.array([10, 20, 15, 30], pa.int64()),
        "_slotlake_valid_to_lsn": pa.array([20, None, 25, None], pa.int64()),
        "_slotlake_valid_from_ts": pa.array([T0] * 4, pa.timestamp("us", tz="UTC")),
        "_slotlake_valid_to_ts": pa.array([None] * 4, pa.timestamp("us", tz="UTC")),
        "_slotlake_op": pa.array(["I", "U", "I", "I"]),
    }))
    req = RecoverRequest(source="src", as_of=Lsn(20), tables=(T,), to_delta=str(tmp_path / "out"))

    def at(lsn: int) -> list[dict]:
        got = _projected("src", req, T, Lsn(lsn), [], *_history_at(str(path), Lsn(lsn))).to_table()
        assert got.schema.names == ["id", "v", "_slotlake_lsn", "_slotlake_commit_ts"]
        return sorted(got.to_pylist(), key=lambda r: r["id"])

    assert [(r["id"], r["v"], r["_slotlake_lsn"]) for r in at(19)] == [(1, "a", 10), (2, "c", 15)]
    assert [(r["id"], r["v"], r["_slotlake_lsn"]) for r in at(20)] == [(1, "b", 20), (2, "c", 15)]  # 20 ends "a"
    assert [(r["id"], r["v"]) for r in at(30)] == [(1, "b"), (3, "d")]  # 25 ended id 2
    assert at(5) == []


def test_rows_keep_python_values_psycopg_copies(tmp_path):
    gold = tmp_path / "tables" / "public" / "t"
    write_deltalake(str(gold), pa.table({
        "id": pa.array([1], pa.int64()),
        "amount": pa.array([Decimal("12.30")], pa.decimal128(12, 2)),
        "at": pa.array([T0], pa.timestamp("us", tz="UTC")),
    }))
    req = RecoverRequest(source="src", as_of=Lsn(5), tables=(T,), to_delta=str(tmp_path))
    # a table dropped before the point (no catalog version), into Delta: gold's columns as they are
    [row] = list(_postgres_rows(_projected("src", req, T, Lsn(5), [], *_replayed("src", T, Lsn(5), str(tmp_path)))))
    assert row == (1, Decimal("12.30"), T0) and row[2].utcoffset() == timedelta(0)  # aware: psycopg sends +00
