"""Extract against a real PostgreSQL: bounded calls, bronze files, slot advance, upto_lsn, crash recovery."""
from __future__ import annotations

import struct
import threading
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest

from slotlake import bronze
from slotlake.config import parse_config
from slotlake.errors import ExtractError
from slotlake.lsn import Lsn
from slotlake.source.extract import FAILPOINT_AFTER_WRITE, FAILPOINT_ENV, extract
from slotlake.source.preflight import run_preflight
from slotlake.source.slot import slot_info
from slotlake.source.status import slot_status

pytestmark = pytest.mark.integration

_BEGIN = struct.Struct(">QqI")  # final_lsn, ts, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit_lsn, end_lsn, ts


def _config(lake: Path, dsn: str, **extract):
    return parse_config({"lake": str(lake), "extract": extract,
                         "sources": {"shop": {"dsn": dsn, "tables": ["public.orders"]}}})


def _run(dsn: str, *statements: str) -> None:
    # The test server runs with synchronous_commit=off; a peek never reads past the flushed WAL, so commit
    # synchronously to make the changes visible to the next extract at once.
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET synchronous_commit = on")
        for s in statements:
            c.execute(s)


def _transactions(files: list[bronze.BronzeFile]) -> list[tuple[int, int, int, int]]:
    """(commit_lsn, end_lsn, xid, changes) per transaction, in file order, decoded from the frames themselves."""
    out = []
    for f in files:
        table = pq.read_table(f.path)
        assert table.column_names == ["lsn", "xid", "data", "ord"]
        assert table.column("ord").to_pylist() == list(range(table.num_rows))
        begin = None
        changes = 0
        for data in table.column("data").to_pylist():
            kind = data[:1]
            if kind == b"B":
                assert begin is None, "Begin inside a transaction"
                begin = _BEGIN.unpack_from(data, 1)
                changes = 0
            elif kind == b"C":
                flags, commit_lsn, end_lsn, _ = _COMMIT.unpack_from(data, 1)
                assert begin is not None and begin[0] == commit_lsn
                out.append((commit_lsn, end_lsn, begin[2], changes))
                begin = None
            elif kind in (b"I", b"U", b"D"):
                changes += 1
        assert begin is None, f"{f.name} ends inside a transaction"
        last = table.column("data")[-1].as_py()
        assert last[:1] == b"C" and _COMMIT.unpack_from(last, 1)[2] == f.end_lsn.value, \
            "file name end LSN must be the last commit's end LSN"
    return out


@pytest.fixture
def source_db(pg_db):
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    return pg_db


@pytest.mark.pg_versions
def test_multiple_calls_files_and_slot_position(source_db, tmp_path):
    cfg = _config(tmp_path / "lake", source_db, upto_nchanges=25, batch_rows=10)
    src = cfg.source("shop")
    run_preflight(cfg, src)
    for i in range(20):  # 20 transactions of 3 rows: B + 3 I + C = 5 rows each
        _run(source_db, f"INSERT INTO orders SELECT g, 'v' || g FROM generate_series({i * 3}, {i * 3 + 2}) g")
    start = slot_info(psycopg.connect(source_db), "slotlake_shop").confirmed_flush_lsn

    result = extract(cfg, src)

    files = bronze.list_bronze(str(tmp_path / "lake" / "shop"))
    assert len(files) >= 4, "upto_nchanges=25 must split 100 rows over several calls"
    assert result.files == tuple(f.path for f in files)
    assert result.calls == len(files), "no extra empty call once upto_lsn is reached"
    names = [Path(f.path).name for f in files]
    assert names == sorted(names)
    assert files[0].start_lsn == start
    for prev, nxt in zip(files, files[1:]):
        assert nxt.start_lsn == prev.end_lsn, "each file starts where the slot was advanced after the previous one"
    for f in files:
        assert Path(f.path).name == bronze.bronze_name(f.start_lsn, f.end_lsn)
        meta = pq.read_metadata(f.path).metadata
        assert meta[b"slotlake.start_lsn"].decode() == str(f.start_lsn)
        assert meta[b"slotlake.end_lsn"].decode() == str(f.end_lsn)
        assert meta[b"slotlake.slot"] == b"slotlake_shop"
        assert int(meta[b"slotlake.rows"]) == pq.read_metadata(f.path).num_rows
    assert max(pq.read_metadata(f.path).row_group(0).num_rows for f in files) <= 10
    txns = _transactions(files)
    assert len(txns) == 20 and all(t[3] == 3 for t in txns)
    assert [t[0] for t in txns] == sorted(t[0] for t in txns)
    # Each peek call is a new decoding session, so pgoutput sends the Relation message again in every file (and
    # once more after a relcache invalidation, e.g. an autoanalyze of the table during the calls).
    kinds = [[d[:1] for d in pq.read_table(f.path).column("data").to_pylist()] for f in files]
    assert all(b"R" in k for k in kinds)
    assert sum(len(k) - k.count(b"R") for k in kinds) == 100  # 20 x (Begin, 3 Inserts, Commit)
    assert result.rows == sum(pq.read_metadata(f.path).num_rows for f in files) == sum(len(k) for k in kinds)
    # The slot sits at the end of the last archived commit; status agrees.
    with psycopg.connect(source_db) as c:
        assert slot_info(c, "slotlake_shop").confirmed_flush_lsn == files[-1].end_lsn == result.end_lsn
    status = slot_status(src)
    assert status.exists and status.confirmed_flush_lsn == files[-1].end_lsn
    assert status.lag_bytes == status.current_lsn - files[-1].end_lsn
    assert status.retained_wal_bytes == status.current_lsn - status.restart_lsn

    again = extract(cfg, src)
    assert again.files == () and again.rows == 0
    assert bronze.list_bronze(str(tmp_path / "lake" / "shop")) == files


def test_upto_lsn_leaves_later_commits_for_the_next_run(source_db, tmp_path):
    cfg = _config(tmp_path / "lake", source_db, upto_nchanges=1000)
    src = cfg.source("shop")
    run_preflight(cfg, src)
    _run(source_db, "INSERT INTO orders VALUES (1, 'before')", "INSERT INTO orders VALUES (2, 'before')")
    with psycopg.connect(source_db) as c:
        upto = Lsn.parse(c.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    _run(source_db, "INSERT INTO orders VALUES (3, 'after')", "UPDATE orders SET v = 'after' WHERE id = 1")

    first = extract(cfg, src, upto_lsn=upto)
    root = str(tmp_path / "lake" / "shop")
    assert first.upto_lsn == upto
    assert len(_transactions(bronze.list_bronze(root))) == 2
    assert all(t[1] <= upto.value for t in _transactions(bronze.list_bronze(root)))

    second = extract(cfg, src)
    txns = _transactions(bronze.list_bronze(root))
    assert len(txns) == 4
    assert second.rows > 0 and all(t[0] >= upto.value for t in txns[2:])


@pytest.mark.pg_versions
def test_rerun_after_crash_between_write_and_advance_archives_nothing_twice(source_db, tmp_path, monkeypatch):
    cfg = _config(tmp_path / "lake", source_db, upto_nchanges=12)
    src = cfg.source("shop")
    run_preflight(cfg, src)
    with psycopg.connect(source_db, autocommit=True) as c:
        c.execute("SET synchronous_commit = on")
        expected_xids = []
        for i in range(10):
            with c.transaction():
                c.execute("INSERT INTO orders VALUES (%s, 'x'), (%s, 'y')", (i * 2, i * 2 + 1))
                expected_xids.append(int(c.execute("SELECT txid_current()").fetchone()[0]))
            c.execute("UPDATE orders SET v = 'z' WHERE id = %s", (i * 2,))
    root = str(tmp_path / "lake" / "shop")

    monkeypatch.setenv(FAILPOINT_ENV, FAILPOINT_AFTER_WRITE)
    with pytest.raises(ExtractError, match="failpoint"):
        extract(cfg, src)
    crashed = bronze.list_bronze(root)
    assert len(crashed) == 1, "the failpoint fires after the first file is placed"
    with psycopg.connect(source_db) as c:
        assert slot_info(c, "slotlake_shop").confirmed_flush_lsn == crashed[0].start_lsn, "slot not advanced"
    # A half-written file from a run that died mid-call is never mistaken for archived data.
    (Path(root) / "bronze" / ".00000000DEADBEEF_pending.parquet.tmp").write_bytes(b"partial")

    monkeypatch.delenv(FAILPOINT_ENV)
    result = extract(cfg, src)
    assert result.recovered_to == crashed[0].end_lsn
    files = bronze.list_bronze(root)
    assert files[0] == crashed[0] and len(files) > 2
    assert not any(p.name.endswith(".tmp") for p in (Path(root) / "bronze").iterdir())
    txns = _transactions(files)
    commit_lsns = [t[0] for t in txns]
    assert len(commit_lsns) == len(set(commit_lsns)) == 20, "every commit exactly once across bronze"
    assert [t[2] for t in txns[::2]] == expected_xids
    assert all(t[3] == 2 for t in txns[::2]) and all(t[3] == 1 for t in txns[1::2])


@pytest.mark.pg_versions
def test_non_transactional_message_after_last_commit_is_not_archived_twice(source_db, tmp_path):
    cfg = _config(tmp_path / "lake", source_db)
    src = cfg.source("shop")
    run_preflight(cfg, src)
    # The message's WAL record is flushed by the next commit (here one on a table outside the publication,
    # which pgoutput 15+ sends nothing for), so it is the last thing of the peek output.
    _run(source_db, "CREATE TABLE other (id int)", "INSERT INTO orders VALUES (1, 'a')",
         "SELECT pg_logical_emit_message(false, 'slotlake.test', 'hello')", "INSERT INTO other VALUES (1)")
    first = extract(cfg, src)
    frames = pq.read_table(first.files[0]).column("data").to_pylist()
    assert frames[-1][:1] == b"M" and frames[-1][1] == 0, "the file ends with the non-transactional message"
    placed = bronze.list_bronze(str(tmp_path / "lake" / "shop"))[-1]
    assert placed.end_lsn.value == pq.read_table(first.files[0]).column("lsn")[-1].as_py() + 1
    # The next call found nothing more before upto_lsn, so the slot moved on to upto_lsn (no WAL pinned).
    assert first.end_lsn == first.upto_lsn > placed.end_lsn
    _run(source_db, "INSERT INTO orders VALUES (2, 'b')")
    extract(cfg, src)
    frames = [d for f in bronze.list_bronze(str(tmp_path / "lake" / "shop"))
              for d in pq.read_table(f.path).column("data").to_pylist()]
    assert sum(1 for d in frames if d[:1] == b"M" and b"slotlake.test" in d) == 1
    assert sum(1 for d in frames if d[:1] == b"I") == 2


# A stream of (lsn, xid, data) rows from the real server that fails after `ok` rows (division by zero in the row
# that follows), as a peek that fails midway does: its first batches arrive before the error.
_FAILING = ("SELECT g::bigint AS lsn, g::bigint AS xid, "
            "CASE WHEN g <= {ok} THEN convert_to(repeat('x', 60), 'UTF8') ELSE int4send(1 / (g - g)) END AS data "
            "FROM generate_series(1, {n}) g")


def test_a_stream_failing_midway_raises_its_error_and_a_failing_write_stops_the_read_ahead(source_db, tmp_path):
    """`_write_call` reads the server's batches in a thread of its own (`_Prefetch`) while it writes the previous
    one. The server's error midway is raised by the call, as before; a write failing while the server is still
    sending stops the reading thread, and the connection serves the next call."""
    from slotlake.source.connection import connect_bulk
    from slotlake.source.extract import _write_call

    src = _config(tmp_path / "lake", source_db).source("shop")
    with connect_bulk(src) as bulk:
        with pytest.raises(Exception, match="division by zero"):
            _write_call(bulk, _FAILING.format(ok=600_000, n=700_000), str(tmp_path / "a.parquet"), src, Lsn(0),
                        batch_rows=100_000)
        # The write fails (no such folder) at the first row group, with 3 M rows still to come from the server.
        with pytest.raises(OSError):
            _write_call(bulk, _FAILING.format(ok=3_000_000, n=3_000_000), str(tmp_path / "no" / "b.parquet"), src,
                        Lsn(0), batch_rows=1_000)
        assert not [t for t in threading.enumerate() if t.name == "slotlake-extract-read"]
        call = _write_call(bulk, _FAILING.format(ok=50_000, n=50_000), str(tmp_path / "c.parquet"), src, Lsn(0),
                           batch_rows=10_000)
    assert call.rows == 50_000 and pq.read_table(tmp_path / "c.parquet").num_rows == 50_000
