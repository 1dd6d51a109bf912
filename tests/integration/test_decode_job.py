"""The decode job with real Spark + Delta, from bronze files written (by the contract) from a real peek."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pgframes import Capture, write_bronze
from slotlake import delta_log
from slotlake.catalog import read_catalog
from slotlake.config import parse_config
from slotlake.decode.job import SILVER_COLUMNS, decode_watermark, run_decode
from slotlake.decode.pgoutput import decode_message
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BIG = "y" * 100_000


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    # Python workers must run this venv's interpreter (pyarrow, slotlake), not the python3 on PATH; PySpark
    # reads PYSPARK_PYTHON when the SparkContext starts (spark.pyspark.python is not honoured for local masters).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    s = get_spark("slotlake-test-decode", "local[2]", {"spark.sql.shuffle.partitions": "2"})
    yield s


def archive(cap: Capture, bronze: Path, start: str) -> tuple[Path, str]:
    """Peek, write the frames as one bronze file starting at `start`, advance the slot (as the extract does)."""
    frames = cap.peek()
    path = write_bronze(frames, bronze, Lsn.parse(start).value, cap.slot)
    end = str(decode_message(frames[-1].data).end_lsn)
    cap.advance(end)
    return path, end


def silver_rows(spark, path: str) -> list:
    return spark.read.format("delta").load(path).orderBy("commit_lsn", "seq").collect()


def test_decode_two_files_then_rerun_is_noop(spark, pg_db, tmp_path):
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "shop")
    bronze = Path(paths.bronze)
    cap = Capture(pg_db)
    try:
        cap.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2))")
        cap.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, n int)")
        cap.execute("ALTER TABLE docs ALTER body SET STORAGE EXTERNAL")
        cap.execute("CREATE TABLE dup (a int, b text)")
        cap.execute("ALTER TABLE dup REPLICA IDENTITY FULL")
        # File 1
        cap.transaction("INSERT INTO items VALUES (1, 'pen', 1.5), (2, NULL, 2)",
                        "UPDATE items SET name = 'ink' WHERE id = 1")
        cap.transaction("UPDATE items SET id = 3 WHERE id = 2", "DELETE FROM items WHERE id = 1")
        cap.transaction(f"INSERT INTO docs VALUES (1, '{BIG}', 0)", "INSERT INTO dup VALUES (1, 'a'), (1, 'a')")
        cap.transaction("UPDATE docs SET n = 1", "DELETE FROM dup WHERE ctid = (SELECT min(ctid) FROM dup)")
        file1, end1 = archive(cap, bronze, cap.start_lsn)

        first = run_decode(spark, cfg, "shop")
        assert first.files_decoded == 1 and first.end_lsn == Lsn.parse(end1)
        rows = silver_rows(spark, paths.changes)
        assert first.changes_written == len(rows) == 10
        assert spark.read.format("delta").load(paths.changes).columns == SILVER_COLUMNS
        got = [(r.table_name, r.op, r.seq, r.old_kind, r.old, r.new, r.unchanged) for r in rows]
        assert got == [
            ("items", "I", 0, None, None, ["1", "pen", "1.50"], []),
            ("items", "I", 1, None, None, ["2", None, "2.00"], []),
            ("items", "U", 2, None, None, ["1", "ink", "1.50"], []),
            ("items", "U", 0, "K", ["2", None, None], ["3", None, "2.00"], []),
            ("items", "D", 1, "K", ["1", None, None], None, []),
            ("docs", "I", 0, None, None, ["1", BIG, "0"], []),
            ("dup", "I", 1, None, None, ["1", "a"], []),
            ("dup", "I", 2, None, None, ["1", "a"], []),
            ("docs", "U", 0, None, None, ["1", None, "1"], [1]),
            ("dup", "D", 1, "O", ["1", "a"], None, []),
        ]
        frames_commits = {}
        for r in rows:
            assert r.commit_end_lsn is not None and r.commit_end_lsn > r.commit_lsn
            frames_commits.setdefault(r.commit_lsn, r.commit_end_lsn)
        assert max(frames_commits.values()) == Lsn.parse(end1).value
        assert all(r.bronze_file == file1.name for r in rows)
        items = rows[0]
        assert items.columns == ["id", "name", "price"] and items.key_columns == ["id"]
        assert items.type_oids == [23, 25, 1700] and items.typmods == [-1, -1, (10 << 16 | 2) + 4]
        assert items.replica_identity == "d" and rows[6].replica_identity == "f"
        catalog = {(v.table_name, v.version): v for v in read_catalog(spark, paths.catalog)}
        assert sorted(catalog) == [("docs", 1), ("dup", 1), ("items", 1)]
        v1 = catalog[("items", 1)]
        assert v1.valid_to_lsn is None and v1.valid_from_lsn == items.commit_lsn and v1.origin == "relation"
        assert [(c.position, c.name, c.type_name, c.typmod, c.is_key) for c in v1.columns] == [
            (1, "id", "int4", -1, True), (2, "name", "text", -1, False), (3, "price", "numeric", 655366, False)]

        # File 2: DDL changes the items definition; docs/dup are untouched.
        cap.execute("ALTER TABLE items ADD COLUMN note varchar(10)")
        cap.transaction("INSERT INTO items VALUES (4, 'cap', 4, 'new')")
        cap.transaction("TRUNCATE items, dup")
        file2, end2 = archive(cap, bronze, end1)

        second = run_decode(spark, cfg, "shop")
        assert (second.files_decoded, second.changes_written, second.end_lsn) == (1, 3, Lsn.parse(end2))
        assert second.catalog_versions_added == 1
        new_rows = [r for r in silver_rows(spark, paths.changes) if r.bronze_file == file2.name]
        assert [(r.table_name, r.op, r.new, r.truncate_options) for r in new_rows] == [
            ("items", "I", ["4", "cap", "4.00", "new"], None), ("items", "T", None, 0), ("dup", "T", None, 0)]
        assert new_rows[0].columns == ["id", "name", "price", "note"]
        catalog = {(v.table_name, v.version): v for v in read_catalog(spark, paths.catalog)}
        assert sorted(catalog) == [("docs", 1), ("dup", 1), ("items", 1), ("items", 2)]
        assert catalog[("items", 1)].valid_to_lsn == catalog[("items", 2)].valid_from_lsn == new_rows[0].commit_lsn
        assert catalog[("items", 2)].valid_to_lsn is None
        assert catalog[("items", 2)].columns[3].type_name == "varchar"
        assert catalog[("items", 2)].columns[3].typmod == 14

        # Re-run: nothing new, no new Delta commit anywhere.
        from delta.tables import DeltaTable

        silver_version = DeltaTable.forPath(spark, paths.changes).history(1).collect()[0].version
        catalog_version = DeltaTable.forPath(spark, paths.catalog).history(1).collect()[0].version
        third = run_decode(spark, cfg, "shop")
        assert (third.files_decoded, third.changes_written, third.end_lsn) == (0, 0, Lsn.parse(end2))
        assert DeltaTable.forPath(spark, paths.changes).history(1).collect()[0].version == silver_version
        assert DeltaTable.forPath(spark, paths.catalog).history(1).collect()[0].version == catalog_version
        last = DeltaTable.forPath(spark, paths.changes).history(1).collect()[0]
        assert json.loads(last.userMetadata) == {"slotlake": {"end_lsn": end2, "stage": "decode"}}
        assert decode_watermark(spark, paths.changes, "shop") == Lsn.parse(end2)
    finally:
        cap.close()


def test_catalog_from_ddl_events(spark, pg_db, tmp_path):
    """With the DDL capture installed, versions start at the DDL's own commit and know nullability."""
    from slotlake.source.ddl import install_ddl_capture

    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "shop")
    cap = Capture(pg_db)
    try:
        install_ddl_capture(cap.conn)
        create = cap.transaction("CREATE TABLE orders (id int PRIMARY KEY, total numeric(10,2) NOT NULL)")
        cap.transaction("INSERT INTO orders VALUES (1, 9.5)")
        cap.transaction("ALTER TABLE orders ADD COLUMN note text")
        cap.transaction("INSERT INTO orders VALUES (2, 1, 'x')")
        cap.transaction("DROP TABLE orders")
        frames = cap.peek()
        commit_of = {f.xid: decode_message(f.data).final_lsn.value for f in frames if f.data[:1] == b"B"}
        write_bronze(frames, Path(paths.bronze), Lsn.parse(cap.start_lsn).value, cap.slot)

        result = run_decode(spark, cfg, "shop")
        assert result.changes_written == 2
        versions = sorted((v for v in read_catalog(spark, paths.catalog) if v.table_name == "orders"),
                          key=lambda v: v.version)
        assert [(v.version, v.origin) for v in versions] == [(1, "ddl"), (2, "ddl")]
        v1, v2 = versions
        assert v1.valid_from_lsn == commit_of[create]
        assert v1.valid_to_lsn == v2.valid_from_lsn < max(commit_of.values())  # the ALTER's commit
        assert v2.valid_to_lsn == max(commit_of.values())  # closed by the DROP
        assert [(c.position, c.name, c.type_name, c.typmod, c.nullable, c.is_key) for c in v2.columns] == [
            (1, "id", "int4", -1, False, True), (2, "total", "numeric", 655366, False, False),
            (3, "note", "text", -1, True, False)]
        rows = silver_rows(spark, paths.changes)
        assert [r.new for r in rows] == [["1", "9.50"], ["2", "1.00", "x"]]
        assert rows[0].commit_lsn < v2.valid_from_lsn < rows[1].commit_lsn
    finally:
        cap.close()


def test_undecodable_bronze_fails_with_one_clear_error_and_writes_nothing(spark, pg_db, tmp_path):
    from slotlake.errors import DecodeError

    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "shop")
    cap = Capture(pg_db)
    try:
        cap.execute("CREATE TABLE t (id int PRIMARY KEY)")
        cap.transaction("INSERT INTO t VALUES (1)")
        frames = [f for f in cap.peek() if f.data[:1] != b"R"]  # as if the file had lost its Relation message
        path = write_bronze(frames, Path(paths.bronze), Lsn.parse(cap.start_lsn).value, cap.slot)
        with pytest.raises(DecodeError) as err:
            run_decode(spark, cfg, "shop")
        assert str(err.value).startswith(f"bronze file {path.name}, ord 1, LSN ")
        assert "change for relation OID" in str(err.value) and "before its Relation message" in str(err.value)
        assert decode_watermark(spark, paths.changes, "shop") is None
        # The decode runs inside the silver write: Delta may have made the table's `_delta_log` folder, but no
        # commit and no data file exist (nothing a reader or the next run would see).
        assert not delta_log.has_commits(paths.changes)
        assert [f for f in Path(paths.changes).rglob("*") if f.is_file() and "_delta_log" not in f.parts] == []
    finally:
        cap.close()


def test_transactions_too_big_to_hold_get_their_commit_end_from_the_frames(spark, pg_db, tmp_path, monkeypatch):
    """A decode task holds a transaction's rows until its Commit only up to a limit (decode/commit_ends.py); the
    rows of a bigger one get their end LSN from the Commit frame the job read beforehand (`_summarize`): every
    silver row carries its own transaction's end, as PostgreSQL's Commit message says."""
    import dataclasses

    import slotlake.decode.job as decode_job
    from slotlake.decode.messages import Begin, Commit
    from slotlake.errors import DecodeError

    monkeypatch.setattr(decode_job, "MAX_HELD_ROWS", 20)
    # Arrow batches of 8 rows into the decode task, so a transaction spans batches (as a big one does): read by
    # the task itself (a local lake) or by Spark.
    monkeypatch.setattr(decode_job, "_BRONZE_BATCH_ROWS", 8)
    monkeypatch.setitem(decode_job._WHOLE_FILES, "spark.sql.execution.arrow.maxRecordsPerBatch", "8")
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "shop")
    cap = Capture(pg_db)
    try:
        cap.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        cap.execute("CREATE TABLE u (id int PRIMARY KEY)")
        cap.transaction("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 40) g")  # big: 40 changes
        for i in range(5):
            cap.transaction(f"UPDATE t SET v = 'b{i}' WHERE id = {i + 1}")  # small: 1 change each
        cap.transaction("DELETE FROM t WHERE id > 30", "INSERT INTO u SELECT g FROM generate_series(1, 15) g")
        frames = cap.peek()
        archive(cap, Path(paths.bronze), cap.start_lsn)
    finally:
        cap.close()
    ends, begun = {}, None
    for f in frames:  # the reference: each transaction's end LSN from its Commit message
        m = decode_message(f.data)
        if isinstance(m, Begin):
            begun = m.final_lsn.value
        elif isinstance(m, Commit):
            assert m.commit_lsn.value == begun
            ends[begun] = m.end_lsn.value
    summarize = decode_job._summarize
    with monkeypatch.context() as m:  # without the ends read from the frames, the task refuses to go on
        m.setattr(decode_job, "_summarize", lambda *a: dataclasses.replace(summarize(*a), big_ends={}))
        with pytest.raises(DecodeError, match="has more than 20 decoded rows"):
            run_decode(spark, cfg, "shop")
    assert not delta_log.has_commits(paths.changes)
    result = run_decode(spark, cfg, "shop")
    assert result.changes_written == 40 + 5 + 10 + 15
    rows = spark.read.format("delta").load(paths.changes).select("commit_lsn", "commit_end_lsn").collect()
    assert len(rows) == 70
    assert all(r["commit_end_lsn"] == ends[r["commit_lsn"]] for r in rows), rows
    assert len({r["commit_lsn"] for r in rows}) == 7


def test_each_silver_file_holds_one_table(spark, pg_db, tmp_path, monkeypatch):
    """The decode lays silver out by table (a big batch of a table over several files), so the merge of a table
    reads only its files: Delta's file statistics show one table per file, and the rows are all there."""
    import slotlake.decode.job as decode_job

    monkeypatch.setattr(decode_job, "_ROWS_PER_FILE", 50)
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "shop")
    cap = Capture(pg_db)
    try:
        for t in ("big", "small", "tiny"):
            cap.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
        cap.transaction("INSERT INTO big SELECT g, 'b' FROM generate_series(1, 120) g",
                        "INSERT INTO small SELECT g, 's' FROM generate_series(1, 7) g",
                        "INSERT INTO tiny VALUES (1, 't')")
        cap.transaction("UPDATE big SET v = 'c' WHERE id <= 20", "DELETE FROM small WHERE id = 1")
        archive(cap, Path(paths.bronze), cap.start_lsn)
    finally:
        cap.close()
    result = run_decode(spark, cfg, "shop")
    assert result.changes_written == 120 + 7 + 1 + 20 + 1
    log = sorted(Path(paths.changes, "_delta_log").glob("*.json"))[-1]
    adds = [json.loads(line)["add"] for line in log.read_text().splitlines() if '"add"' in line]
    stats = [json.loads(a["stats"]) for a in adds]
    assert all(s["minValues"]["table_name"] == s["maxValues"]["table_name"] for s in stats), stats
    per_table: dict[str, int] = {}
    for s in stats:
        per_table[s["minValues"]["table_name"]] = per_table.get(s["minValues"]["table_name"], 0) + 1
    assert per_table == {"big": 3, "small": 1, "tiny": 1}  # big: 140 changes at 50 per file
    assert sum(s["numRecords"] for s in stats) == 149
    # Statistics for the columns readers filter silver by only (contracts.SILVER_PROPERTIES), set at creation.
    first = sorted(Path(paths.changes, "_delta_log").glob("*.json"))[0].read_text().splitlines()
    meta = next(json.loads(line)["metaData"] for line in first if '"metaData"' in line)
    assert meta["configuration"] == {"delta.dataSkippingNumIndexedCols": "10"}
    indexed = ["commit_lsn", "commit_end_lsn", "commit_ts", "xid", "seq", "lsn", "rel_oid", "schema_name",
               "table_name", "op"]
    assert all(sorted(s["nullCount"]) == sorted(indexed) for s in stats), stats
    got = spark.read.format("delta").load(paths.changes).groupBy("table_name").count().collect()
    assert {r["table_name"]: r["count"] for r in got} == {"big": 140, "small": 8, "tiny": 1}
    # The merge reads the same statistics with delta-rs, no Spark job: which tables have changes, exactly.
    from slotlake.merge.silver_stats import has_changes, tables_in_window
    from slotlake.merge.watermarks import silver_file_stats
    from slotlake.names import TableName

    files = silver_file_stats(paths.changes)
    assert files is not None and len(files) == 5
    end = int(result.end_lsn)
    assert tables_in_window(files, None, end) == {TableName("public", t) for t in ("big", "small", "tiny")}
    assert not has_changes(files, TableName("public", "other"), None, end)
    assert not has_changes(files, TableName("public", "big"), end, end + 1)  # nothing after the end


def test_silver_written_by_the_tasks_and_by_spark_is_one_table(spark, pg_db, tmp_path, monkeypatch):
    """A local lake's decode writes silver's files from its tasks and commits them with delta-rs
    (`decode/silver_write.py`); a silver table Spark's writer started (an s3a lake's path, or a lake from before)
    takes those commits, and both honour each other's idempotent-write transaction. Spark and delta-rs read the
    same rows, with statistics that name each file's one table."""
    import datetime as dt

    import deltalake

    from slotlake.decode import silver_write
    from slotlake.decode.job import SILVER_DDL, app_id

    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "shop")
    cap = Capture(pg_db)
    try:
        cap.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        cap.execute("CREATE TABLE b (k text, at timestamptz)")
        cap.execute("ALTER TABLE b REPLICA IDENTITY FULL")
        cap.transaction("INSERT INTO a SELECT g, 'x' FROM generate_series(1, 30) g",
                        "INSERT INTO b VALUES ('p', '2024-05-01 10:00:00.123456+00'), ('q', NULL)")
        archive(cap, Path(paths.bronze), cap.start_lsn)
        monkeypatch.setattr(silver_write, "writes_directly", lambda path: False)  # Spark's writer first
        assert run_decode(spark, cfg, "shop").changes_written == 32
        assert _commit_info(paths.changes, 0)["engineInfo"].startswith("Apache-Spark")
        cap.transaction("UPDATE a SET v = 'y' WHERE id <= 5", "DELETE FROM b WHERE k = 'q'")
        _, end2 = archive(cap, Path(paths.bronze), cap.start_lsn)
    finally:
        cap.close()
    monkeypatch.undo()
    second = run_decode(spark, cfg, "shop")
    assert second.changes_written == 6 and second.end_lsn == Lsn.parse(end2)
    newest = next(delta_log.commits(paths.changes))
    assert _commit_info(paths.changes, newest.version)["engineInfo"].startswith("delta-rs")
    assert newest.end_lsn == end2 and newest.stage == "decode" and newest.metrics["numOutputRows"] == 6
    table = deltalake.DeltaTable(paths.changes)
    assert table.transaction_version(app_id("shop")) == Lsn.parse(end2).value
    # Spark's writer skips a write of that transaction (a re-run after the delta-rs commit)...
    spark.createDataFrame([], SILVER_DDL).write.format("delta").mode("append").option(
        "txnAppId", app_id("shop")).option("txnVersion", Lsn.parse(end2).value).save(paths.changes)
    assert deltalake.DeltaTable(paths.changes).version() == table.version()
    # ...and so does the direct commit
    assert not silver_write.commit(paths.changes, [], app_id=app_id("shop"), version=Lsn.parse(end2).value,
                                   user_metadata="{}", properties={})
    assert deltalake.DeltaTable(paths.changes).version() == table.version()
    by_spark = sorted((r.table_name, r.op, tuple(r.new or ()), r.columns, r.type_oids)
                      for r in spark.read.format("delta").load(paths.changes).collect())
    by_rs = sorted((r["table_name"], r["op"], tuple(r["new"] or ()), r["columns"], r["type_oids"])
                   for r in table.to_pyarrow_table().to_pylist())
    assert len(by_spark) == 38 and by_spark == by_rs
    assert sum(1 for r in by_spark if r[:2] == ("a", "U")) == 5 and ("b", "D", (), ["k", "at"], [25, 1184]) in by_rs
    # the commit time of the direct rows: the same instant for both readers, a moment ago
    got = {r["commit_ts"] for r in table.to_pyarrow_table().to_pylist() if r["op"] in ("U", "D")}
    assert len(got) == 1 and abs(dt.datetime.now(dt.UTC) - got.pop()) < dt.timedelta(minutes=10)
    stats = [json.loads(line)["add"]["stats"] for line in _commit_lines(paths.changes, newest.version)
             if '"add"' in line]
    stats = [json.loads(x) for x in stats]
    assert sorted(x["minValues"]["table_name"] for x in stats) == ["a", "b"]
    assert all(x["minValues"]["table_name"] == x["maxValues"]["table_name"] for x in stats)
    assert sum(x["numRecords"] for x in stats) == 6
    # Delta's data skipping reads those statistics: a window of the first decode's LSNs reads none of these files
    first_max = max(r.commit_end_lsn for r in spark.read.format("delta").load(paths.changes)
                    .where("op = 'I'").collect())
    window = spark.read.format("delta").load(paths.changes).where(f"commit_end_lsn <= {first_max}")
    assert window.count() == 32 and not (set(window.inputFiles())
                                         & {str(Path(paths.changes, json.loads(line)["add"]["path"]))
                                            for line in _commit_lines(paths.changes, newest.version)
                                            if '"add"' in line})


def _commit_lines(table_path: str, version: int) -> list[str]:
    return Path(table_path, "_delta_log", f"{version:020d}.json").read_text().splitlines()


def _commit_info(table_path: str, version: int) -> dict:
    return next(json.loads(line)["commitInfo"] for line in _commit_lines(table_path, version) if "commitInfo" in line)


def test_a_replays_re_decode_is_written_by_the_tasks_and_replaces_the_table(spark, pg_db, tmp_path):
    """`decode_range` on a local lake: the tasks write the window's changes and one delta-rs commit replaces the
    replay's table (its earlier files removed), rows equal to the live decode's in that window for Spark and
    delta-rs; a table there of another shape is rewritten by Spark's schema overwrite instead."""
    import deltalake

    from slotlake.decode.job import decode_range

    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": pg_db}}})
    paths = LakePaths.of(cfg.lake, "shop")
    cap = Capture(pg_db)
    try:
        cap.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        cap.transaction("INSERT INTO a SELECT g, 'x' FROM generate_series(1, 20) g")
        _, end1 = archive(cap, Path(paths.bronze), cap.start_lsn)
        cap.transaction("UPDATE a SET v = 'y' WHERE id <= 5")
        cap.transaction("DELETE FROM a WHERE id > 18")
        _, end2 = archive(cap, Path(paths.bronze), cap.start_lsn)
    finally:
        cap.close()
    assert run_decode(spark, cfg, "shop").changes_written == 27
    live = [r.asDict() for r in silver_rows(spark, paths.changes)]
    replay = str(tmp_path / "replay_changes")

    def both(path: str) -> list[dict]:
        by_spark = [r.asDict() for r in silver_rows(spark, path)]
        by_rs = sorted(deltalake.DeltaTable(path).to_pyarrow_table().to_pylist(),
                       key=lambda r: (r["commit_lsn"], r["seq"]))
        assert [(r["commit_lsn"], r["seq"], r["op"], r["new"], r["old"]) for r in by_rs] == [
            (r["commit_lsn"], r["seq"], r["op"], r["new"], r["old"]) for r in by_spark]
        return by_spark

    whole = decode_range(spark, cfg, "shop", None, Lsn.parse(end2), replay)
    assert whole.changes_written == 27 and both(replay) == live
    assert _commit_info(replay, 0)["engineInfo"].startswith("delta-rs")
    # the second window replaces the first: only the changes committed after end1 remain
    second = decode_range(spark, cfg, "shop", Lsn.parse(end1), Lsn.parse(end2), replay)
    assert second.changes_written == 7
    assert both(replay) == [r for r in live if r["commit_end_lsn"] > Lsn.parse(end1).value]
    assert _commit_info(replay, 1)["engineInfo"].startswith("delta-rs")
    adds = [ln for ln in _commit_lines(replay, 1) if '"add"' in ln]
    assert len(deltalake.DeltaTable(replay).file_uris()) == len(adds)
    assert next(delta_log.commits(replay)).end_lsn == end2
    # the first window only: the insert transaction
    first = decode_range(spark, cfg, "shop", None, Lsn.parse(end1), replay)
    assert first.changes_written == 20 and both(replay) == live[:20]
    # a table of another shape at the path: Spark's writer overwrites it, schema and all
    other = str(tmp_path / "other")
    # (one partition: Spark leaves an empty partition's file on disk without adding it to the log)
    spark.createDataFrame([(1, "z")], "id int, note string").coalesce(1).write.format("delta").save(other)
    again = decode_range(spark, cfg, "shop", None, Lsn.parse(end2), other)
    assert again.changes_written == 27 and both(other) == live
    assert _commit_info(other, 1)["engineInfo"].startswith("Apache-Spark")
    # ...and the tasks wrote nothing there first: every Parquet file in the folder is one a commit added
    added = {json.loads(ln)["add"]["path"] for v in (0, 1) for ln in _commit_lines(other, v) if '"add"' in ln}
    assert {str(p.relative_to(other)) for p in Path(other).rglob("*.parquet")} == added


def test_the_extracts_frame_summaries_stand_in_for_the_decodes_aggregation(spark, pg_db, tmp_path, monkeypatch):
    """Bronze files written by the extract carry their frame summary (`source/frame_summary.py`): the decode reads
    the footers instead of aggregating the frames in Spark, and gets what the aggregation gets (catalog
    transactions, big transactions' ends, changes per relation), so silver is the same."""
    import psycopg

    import slotlake.decode.job as decode_job
    from slotlake import bronze
    from slotlake.source.extract import extract
    from slotlake.source.preflight import run_preflight

    monkeypatch.setattr(bronze, "BIG_TXN_MIN_ROWS", 30)
    monkeypatch.setattr(decode_job, "MAX_HELD_ROWS", 80)  # transactions of more than 40 rows are big
    cfg = parse_config({"lake": str(tmp_path / "lake"), "extract": {"batch_rows": 16, "upto_nchanges": 200},
                        "sources": {"shop": {"dsn": pg_db, "tables": ["public.fs_a", "public.fs_b"]}}})
    with psycopg.connect(pg_db, autocommit=True) as c:
        c.execute("CREATE TABLE fs_a (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE fs_b (id int PRIMARY KEY)")
    src = cfg.source("shop")
    run_preflight(cfg, src)
    with psycopg.connect(pg_db, autocommit=True) as c:
        c.execute("SET synchronous_commit = on")
        c.execute("INSERT INTO fs_a SELECT g, 'x' FROM generate_series(1, 10) g")
        c.execute("INSERT INTO fs_b SELECT g FROM generate_series(1, 120) g")  # big, spans Arrow batches
        c.execute("UPDATE fs_a SET v = 'y' WHERE id <= 4")
        c.execute("ALTER TABLE fs_a ADD COLUMN w int")
        c.execute("INSERT INTO fs_a VALUES (11, 'z', 7)")
        c.execute("TRUNCATE fs_a, fs_b")
        c.execute("INSERT INTO fs_b SELECT g FROM generate_series(1, 45) g")  # big: 47 frames
    extract(cfg, src)
    paths = LakePaths.of(cfg.lake, "shop")
    todo = bronze.list_bronze(paths.root)
    assert all(pq_meta(f.path).get(bronze.META_FRAMES.encode()) for f in todo)
    held = decode_job.MAX_HELD_ROWS
    from_footers = decode_job._footer_summary(todo, held)
    from_spark = decode_job._summarize(decode_job._bronze(spark, todo), held)
    assert from_footers is not None
    assert sorted(from_footers.meta_txns) == sorted(from_spark.meta_txns) and from_footers.meta_txns
    assert from_footers.big_ends == from_spark.big_ends and len(from_spark.big_ends) == 2
    assert from_footers.changes_per_oid == from_spark.changes_per_oid
    assert sum(from_spark.changes_per_oid.values()) == 10 + 120 + 4 + 1 + 45
    # the catalog's frames: read from the local files' row groups that can hold those transactions (pyarrow, no
    # Spark job), the same decoded rows as Spark's read of every frame
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from slotlake.decode.decoded import KIND_RELATION
    for f in todo:
        whole = pq.read_table(f.path)
        for xids in ({x for n, x in from_spark.meta_txns if n == f.name} or {1}, set(whole["xid"].to_pylist()[:3])):
            got = bronze.read_txn_frames(f.path, xids)
            assert got.to_pylist() == whole.filter(pc.is_in(whole["xid"], value_set=pa.array(sorted(xids)))) \
                .select(got.column_names).to_pylist()
    local = decode_job._catalog_rows(None, from_footers, todo)
    via_spark = decode_job._catalog_rows(decode_job._bronze(spark, todo), from_spark)
    assert local == via_spark
    assert sum(r["kind"] == KIND_RELATION for r in local) >= 3  # fs_a, fs_b, fs_a after ADD COLUMN
    # the decode takes the footers' summary (no aggregation of the frames) and writes every change
    monkeypatch.setattr(decode_job, "_summarize", lambda *a: pytest.fail("the frames were aggregated in Spark"))
    assert run_decode(spark, cfg, "shop").changes_written == 10 + 120 + 4 + 1 + 2 + 45  # TRUNCATE: one per table
    # a file without a summary (an older extract's) has the frames aggregated again
    monkeypatch.undo()
    monkeypatch.setattr(bronze, "BIG_TXN_MIN_ROWS", 31)  # the footers' summaries were written under 30
    assert decode_job._footer_summary(todo, held) is None


def pq_meta(path: str) -> dict:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).metadata or {}


def test_the_silver_files_layout_summaries_stand_in_for_the_merges_first_pass(spark, pg_db, tmp_path, monkeypatch):
    """Silver files written by the decode's tasks carry their layout summary (`decode/layouts.py`): the merge adds
    up the footers of a table's files instead of its Spark pass over the batch, and gets what the pass gets (per
    column layout: changes, first and last change, TRUNCATEs, plain inserts, unchanged TOAST, newest commit time),
    through a schema change, a TRUNCATE, unchanged TOAST values and a keyless FULL table; gold == PostgreSQL."""
    import psycopg

    import slotlake.merge.job as merge_job
    from oracle import assert_gold_equals_pg
    from slotlake.merge.watermarks import footer_groups, silver_file_stats
    from slotlake.names import TableName
    from slotlake.source.extract import extract
    from slotlake.source.preflight import run_preflight

    cfg = parse_config({"lake": str(tmp_path / "lake"), "extract": {"batch_rows": 16, "upto_nchanges": 40},
                        "sources": {"shop": {"dsn": pg_db, "tables": ["public.ls_a", "public.ls_b"]}}})
    with psycopg.connect(pg_db, autocommit=True) as c:
        c.execute("CREATE TABLE ls_a (id int PRIMARY KEY, v text, doc text)")
        c.execute("ALTER TABLE ls_a ALTER COLUMN doc SET STORAGE EXTERNAL")  # out of line: unchanged TOAST
        c.execute("CREATE TABLE ls_b (id int, v text)")
        c.execute("ALTER TABLE ls_b REPLICA IDENTITY FULL")
    src = cfg.source("shop")
    run_preflight(cfg, src)
    with psycopg.connect(pg_db, autocommit=True) as c:
        c.execute("SET synchronous_commit = on")
        c.execute("INSERT INTO ls_a SELECT g, 'x', repeat('d', 3000) FROM generate_series(1, 30) g")
        c.execute("INSERT INTO ls_b SELECT g % 7, 'x' FROM generate_series(1, 50) g")
        c.execute("UPDATE ls_a SET v = 'y' WHERE id <= 10")  # doc unchanged: TOAST placeholders
        c.execute("DELETE FROM ls_b WHERE id = 3")
        c.execute("ALTER TABLE ls_a ADD COLUMN w int")
        c.execute("INSERT INTO ls_a VALUES (31, 'z', 'short', 7)")
        c.execute("UPDATE ls_a SET w = 1 WHERE id BETWEEN 5 AND 12")
        c.execute("TRUNCATE ls_b")
        c.execute("INSERT INTO ls_b SELECT g % 5, 'w' FROM generate_series(1, 20) g")
    extract(cfg, src)
    assert run_decode(spark, cfg, "shop").changes_written > 0
    paths = LakePaths.of(cfg.lake, "shop")
    files = silver_file_stats(paths.changes)
    assert files is not None
    end = decode_watermark(spark, paths.changes, "shop")
    for name in ("ls_a", "ls_b"):
        table = TableName("public", name)
        from_footers = footer_groups(paths.changes, files, table, None, end)
        batch = silver_rows_df(spark, paths.changes, name, end)
        from_spark = merge_job._spark_groups(batch)
        assert from_footers is not None
        assert sorted(from_footers, key=repr) == sorted(from_spark, key=repr)
        assert sum(g.n for g in from_spark) == batch.count()
    a = {g.shape_map["columns"] if g.shape else None: g for g in footer_groups(
        paths.changes, files, TableName("public", "ls_a"), None, end)}
    assert set(a) == {("id", "v", "doc"), ("id", "v", "doc", "w")} and a[("id", "v", "doc")].toast == 10
    b = footer_groups(paths.changes, files, TableName("public", "ls_b"), None, end)
    assert sum(g.truncs for g in b) == 1
    # a window a file straddles (its end inside the file) is left to the Spark pass
    spans = [f for f in files if f.only_table() == TableName("public", "ls_a") and f.commit_lsn_min < f.commit_lsn_max]
    assert spans, "no silver file of ls_a spans two commits"
    cut = Lsn(spans[0].commit_lsn_min)
    assert footer_groups(paths.changes, files, TableName("public", "ls_a"), None, cut) is None
    # the merge takes the footers (no Spark pass) and gold equals PostgreSQL
    monkeypatch.setattr(merge_job, "_spark_groups", lambda *a: pytest.fail("the merge counted the batch in Spark"))
    from slotlake.merge.job import run_merge

    report = run_merge(spark, cfg, "shop")
    assert {t.table_name: t.changes for t in report.tables} == {
        "ls_a": sum(g.n for g in a.values()), "ls_b": sum(g.n for g in b)}
    for name in ("ls_a", "ls_b"):
        assert_gold_equals_pg(paths.gold("public", name), pg_db, f"public.{name}")
        assert_gold_equals_pg(paths.gold("public", name), pg_db, f"public.{name}")


def silver_rows_df(spark, changes: str, table: str, end):
    from pyspark.sql import functions as F

    return (spark.read.format("delta").load(changes)
            .where((F.col("schema_name") == "public") & (F.col("table_name") == table)
                   & (F.col("commit_lsn") <= int(end))))


def test_a_small_batch_is_decoded_in_the_driver_a_big_one_by_a_task_per_file_alike(spark, pg_db, tmp_path,
                                                                                     monkeypatch):
    """Bronze files of at most `IN_DRIVER_BRONZE_BYTES` in all are decoded in the driver by the function the
    tasks run, no Spark job; above it by a Spark job of a task per file. The same bronze files give the same silver
    rows either way (a keyed table, unchanged TOAST, a FULL-identity table with duplicate rows, a TRUNCATE), read
    alike by Spark and delta-rs."""
    import shutil

    import deltalake

    import slotlake.decode.job as decode_job

    cfg_of = {name: parse_config({"lake": str(tmp_path / name), "sources": {"shop": {"dsn": pg_db}}})
              for name in ("driver", "tasks")}
    paths = {name: LakePaths.of(c.lake, "shop") for name, c in cfg_of.items()}
    cap = Capture(pg_db)
    try:
        cap.execute("CREATE TABLE a (id int PRIMARY KEY, v text, big text)")
        cap.execute("ALTER TABLE a ALTER big SET STORAGE EXTERNAL")
        cap.execute("CREATE TABLE d (k int, v text)")
        cap.execute("ALTER TABLE d REPLICA IDENTITY FULL")
        cap.transaction(f"INSERT INTO a SELECT g, 'x', '{BIG}' FROM generate_series(1, 12) g",
                        "INSERT INTO d VALUES (1, 'p'), (1, 'p'), (2, 'q')")
        archive(cap, Path(paths["driver"].bronze), cap.start_lsn)
        cap.transaction("UPDATE a SET v = 'y' WHERE id <= 4", "DELETE FROM d WHERE k = 2")
        cap.transaction("TRUNCATE d", "INSERT INTO d VALUES (3, 'r')", "DELETE FROM a WHERE id = 12")
        archive(cap, Path(paths["driver"].bronze), cap.start_lsn)
    finally:
        cap.close()
    shutil.copytree(paths["driver"].bronze, paths["tasks"].bronze)
    decided = []
    in_driver = decode_job._in_driver
    monkeypatch.setattr(decode_job, "_in_driver", lambda files: decided.append(in_driver(files)) or decided[-1])
    assert run_decode(spark, cfg_of["driver"], "shop").changes_written == 12 + 3 + 4 + 1 + 1 + 1 + 1
    monkeypatch.setattr(decode_job, "IN_DRIVER_BRONZE_BYTES", 0)
    assert run_decode(spark, cfg_of["tasks"], "shop").changes_written == 23
    assert decided == [True, False]

    def rows(p: LakePaths) -> list[dict]:
        by_spark = [r.asDict(recursive=True) for r in silver_rows(spark, p.changes)]
        by_rs = sorted(deltalake.DeltaTable(p.changes).to_pyarrow_table().to_pylist(),
                       key=lambda r: (r["commit_lsn"], r["seq"]))
        assert [{k: r[k] for k in SILVER_COLUMNS if k != "commit_ts"} for r in by_rs] == [
            {k: r[k] for k in SILVER_COLUMNS if k != "commit_ts"} for r in by_spark]
        return by_spark

    driver, tasks = rows(paths["driver"]), rows(paths["tasks"])
    assert len(driver) == 23 and driver == tasks
    assert {r["op"] for r in driver} == {"I", "U", "D", "T"}
    assert sum(1 for r in driver if r["table_name"] == "a" and r["op"] == "U" and r["unchanged"]) == 4  # TOAST
