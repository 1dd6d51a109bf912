"""Pure parts of the source I/O and bronze: DSN redaction and session options, bronze naming and placement,
the commit scan over Arrow batches."""
from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from slotlake import bronze
from slotlake.errors import ExtractError
from slotlake.lsn import Lsn
from slotlake.source.connection import SESSION_SETTINGS, redact, scrub, session_dsn
from slotlake.source.extract import SCHEMA, _Call, _scan

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dsn, expected", [
    ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgres://u@h/db?password=secret&sslmode=require", "postgres://u@h/db?password=***&sslmode=require"),
    ("host=h user=u password=secret dbname=d", "host=h user=u password=*** dbname=d"),
    ("host=h password = 'se cret' dbname=d", "host=h password = *** dbname=d"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
], ids=["uri-userinfo", "uri-query", "keyvalue", "keyvalue-quoted", "no-password"])
def test_redact(dsn, expected):
    assert redact(dsn) == expected
    assert "secret" not in redact(dsn) and "se cret" not in redact(dsn)


def test_scrub_makes_one_line_without_the_password():
    dsn = "postgresql://u:s3cr3t@h/db"
    assert scrub(f"failed for {dsn}\n\tand s3cr3t again", dsn) == "failed for postgresql://u:***@h/db and *** again"


@pytest.mark.parametrize("dsn", ["postgresql://u@h:5/db?options=-c%20work_mem%3D1MB",
                                 "host=h dbname=d options='-c work_mem=1MB'"], ids=["uri", "keyvalue"])
def test_session_dsn_keeps_existing_options_and_adds_the_pinned_ones(dsn):
    from psycopg.conninfo import conninfo_to_dict

    options = conninfo_to_dict(session_dsn(dsn))["options"]
    assert options.startswith("-c work_mem=1MB ")
    for k, v in SESSION_SETTINGS.items():
        assert f"-c {k}={v}" in options


def test_bronze_names_sort_by_lsn_and_round_trip():
    a, b = Lsn.parse("0/FFFFFFFF"), Lsn.parse("1/0")
    assert bronze.bronze_name(a, b) == "00000000FFFFFFFF_0000000100000000.parquet"
    assert bronze.parse_bronze_name(bronze.bronze_name(a, b)) == (a, b)
    assert bronze.bronze_name(Lsn(9), a) < bronze.bronze_name(a, b)
    assert bronze.parse_bronze_name(".00000000FFFFFFFF_pending.parquet.tmp") is None


def test_list_bronze_ignores_tmp_and_sorts_by_end(tmp_path):
    root = str(tmp_path / "shop")
    for start, end in [(0x10, 0x20), (0x20, 0x100), (0x100, 0x1000)]:
        tmp = bronze.tmp_path(root, Lsn(start))
        tmp.write_bytes(b"x")
        bronze.place(tmp, Lsn(start), Lsn(end))
    bronze.tmp_path(root, Lsn(0x1000)).write_bytes(b"half")
    files = bronze.list_bronze(root)
    assert [(f.start_lsn.value, f.end_lsn.value) for f in files] == [(0x10, 0x20), (0x20, 0x100), (0x100, 0x1000)]
    assert bronze.max_archived_end(root) == Lsn(0x1000)
    assert bronze.max_archived_end(str(tmp_path / "empty")) is None
    assert bronze.remove_abandoned(root) == [".0000000000001000_pending.parquet.tmp"]


def test_place_refuses_to_overwrite(tmp_path):
    root = str(tmp_path / "shop")
    for _ in range(2):
        bronze.tmp_path(root, Lsn(1)).write_bytes(b"x")
    bronze.place(bronze.tmp_path(root, Lsn(1)), Lsn(1), Lsn(2))
    bronze.tmp_path(root, Lsn(1)).write_bytes(b"y")
    with pytest.raises(ExtractError, match="immutable"):
        bronze.place(bronze.tmp_path(root, Lsn(1)), Lsn(1), Lsn(2))


def test_coverage_markers_extend_bronze_but_not_its_files(tmp_path):
    root = str(tmp_path / "shop")
    assert bronze.covered_lsn(root) is None
    bronze.tmp_path(root, Lsn(0x10)).write_bytes(b"x")
    bronze.place(bronze.tmp_path(root, Lsn(0x10)), Lsn(0x10), Lsn(0x20))
    assert bronze.covered_lsn(root) == Lsn(0x20)
    for covered in (0x30, 0x50, 0x50):  # a repeat (a run retried after a crash) is the same marker
        bronze.place_covered(root, Lsn(covered), slot="slotlake_shop", upto=Lsn(0x60))
    assert bronze.list_covered(root) == [Lsn(0x50)]  # the newest says all the older ones said
    assert bronze.covered_lsn(root) == Lsn(0x50)
    # the marker is not a bronze file: listing, crash recovery and abandoned-file cleanup do not see it
    assert [f.end_lsn for f in bronze.list_bronze(root)] == [Lsn(0x20)]
    assert bronze.max_archived_end(root) == Lsn(0x20)
    assert bronze.remove_abandoned(root) == []
    # a later bronze file past the marker covers further
    bronze.tmp_path(root, Lsn(0x50)).write_bytes(b"x")
    bronze.place(bronze.tmp_path(root, Lsn(0x50)), Lsn(0x50), Lsn(0x70))
    assert bronze.covered_lsn(root) == Lsn(0x70)
    (bronze.covered_dir(root) / ".0000000000000080.json.tmp").write_text("{")  # a write that died
    assert bronze.covered_lsn(root) == Lsn(0x70)


def test_bronze_of_an_s3a_lake_goes_through_storage():
    with pytest.raises(ExtractError, match="not on the local filesystem; the lake's files on S3 are read and written "
                                           "through slotlake.storage"):
        bronze.bronze_dir("s3a://bucket/lake/shop")
    assert bronze.bronze_path("s3a://bucket/lake/shop") == "s3a://bucket/lake/shop/bronze"
    # An s3a lake's files are written to a local scratch folder first, one per source lake.
    assert bronze.tmp_path("s3a://bucket/lake/shop", Lsn(1)).parent == bronze.scratch_dir("s3a://bucket/lake/shop")
    assert bronze.scratch_dir("s3a://bucket/lake/shop") != bronze.scratch_dir("s3a://bucket/lake/crm")


def _batch(frames: list[tuple[int, bytes]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([f[0] for f in frames], pa.int64()), pa.array([7] * len(frames),
                                       pa.int64()), pa.array([f[1] for f in frames], pa.binary()),
                                       pa.array(range(len(frames)), pa.int64())], schema=SCHEMA)


def _commit(end: int) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, end - 50, end, 0)


def _message(transactional: bool) -> bytes:
    return b"M" + struct.pack(">BQ", int(transactional), 1) + b"p\x00" + struct.pack(">I", 1) + b"x"


BEGIN = b"B" + struct.pack(">QqI", 1, 0, 7)
INSERT_26 = b"I" + b"\x00" * 25  # as long as a Commit frame: the scan must look at the first byte too


@pytest.mark.parametrize("batches, end, open_txn", [
    ([[(1, BEGIN), (2, INSERT_26), (3, _commit(100))]], 100, False),
    ([[(1, BEGIN), (2, INSERT_26), (3, _commit(100)), (4, BEGIN)], [(5, INSERT_26), (6, _commit(200))]], 200, False),
    ([[(1, BEGIN), (2, _commit(100)), (150, _message(False))]], 151, False),
    ([[(1, BEGIN), (2, _commit(100))], [(150, _message(False)), (160, _message(False))]], 161, False),
    ([[(1, BEGIN), (2, _commit(100)), (3, BEGIN), (4, _message(True))]], 100, True),
    ([[(1, BEGIN), (2, INSERT_26)]], None, True),
], ids=["one-txn", "txn-across-batches", "trailing-message", "trailing-messages-next-batch",
        "ends-inside-txn", "no-commit"])
def test_scan_finds_the_end_of_the_last_commit(batches, end, open_txn):
    call = _Call()
    for frames in batches:
        _scan(call, _batch(frames))
    assert call.rows == sum(len(b) for b in batches)
    assert (call.end_lsn.value if call.end_lsn else None) == end
    assert call.open_transaction is open_txn
