"""The initial copy joined to the stream: real PostgreSQL with a concurrent writer, real Spark + Delta, gold == PG.

Every test runs the sync steps in this process in the pipeline's order (preflight, which creates a new source's
slot with its copy and copies tables still missing one; extract; decode; merge, which loads complete copies
first) and compares
every gold table with PostgreSQL row by row (tests/oracle.py).
"""
from __future__ import annotations

import os
import random
import sys
import threading
import time

import psycopg
import pytest

from oracle import assert_gold_equals_pg
from slotlake.config import parse_config
from slotlake.errors import SlotLostError, SnapshotError
from slotlake.lake import LakePaths
from slotlake.source import copies, resync
from slotlake.source import snapshot as snap
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SRC = "shop"
SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, balance numeric(12,2), owner text, flag boolean, code char(4));
CREATE TABLE events (kind text, qty int);
ALTER TABLE events REPLICA IDENTITY FULL;
INSERT INTO accounts SELECT g, g * 1.5, 'owner ' || g, g % 2 = 0, 'c' || (g % 10) FROM generate_series(1, 3000) g;
INSERT INTO events SELECT 'k' || (g % 7), g % 3 FROM generate_series(1, 1500) g;
ANALYZE;
"""
TABLES = ["public.accounts", "public.events"]


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from slotlake.spark.session import get_spark

    return get_spark("test-snapshot", master="local[2]")


@pytest.fixture(autouse=True)
def small_parts(monkeypatch):
    # Several parts per table, so the copy takes a while and the writer runs through it.
    monkeypatch.setenv("SLOTLAKE_SNAPSHOT_PART_PAGES", "4")
    monkeypatch.setenv("SLOTLAKE_SNAPSHOT_WORKERS", "2")


def _config(lake, dsn, tables):
    return parse_config({"lake": str(lake), "sources": {SRC: {"dsn": dsn, "tables": list(tables)}}})


def _sql(dsn: str, text: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(text)


class Writer(threading.Thread):
    """Inserts, updates, deletes and key changes on `keyed` (int PK `id`) and inserts/deletes on the FULL table,
    in small autocommit transactions, until stopped."""

    def __init__(self, dsn: str, keyed: str, full: str | None, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.keyed, self.full = dsn, keyed, full
        self.rng = random.Random(seed)
        self.seed = seed
        self.stop_event = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as c:
                next_id = 1_000_000 * self.seed
                while not self.stop_event.is_set():
                    r = self.rng.random()
                    k = self.rng.randint(1, 3000)
                    with c.transaction():
                        if r < 0.25:
                            next_id += 1
                            c.execute(f"INSERT INTO {self.keyed} (id, balance, owner, flag, code) "
                                      "VALUES (%s, 1.25, 'new', true, 'n')", (next_id,))
                        elif r < 0.55:
                            c.execute(f"UPDATE {self.keyed} SET balance = balance + 1, owner = owner || '+' "
                                      "WHERE id = %s", (k,))
                            c.execute(f"UPDATE {self.keyed} SET flag = NOT flag WHERE id = %s", (k + 1,))
                        elif r < 0.7:
                            c.execute(f"DELETE FROM {self.keyed} WHERE id = %s", (k,))
                        elif r < 0.85:
                            next_id += 1
                            c.execute(f"UPDATE {self.keyed} SET id = %s WHERE id = %s", (next_id, k))
                        elif self.full:
                            if r < 0.93:
                                c.execute(f"INSERT INTO {self.full} VALUES ('k' || %s, %s)", (k % 7, k % 3))
                            else:
                                c.execute(f"DELETE FROM {self.full} WHERE ctid = (SELECT min(ctid) FROM {self.full} "
                                          "WHERE kind = 'k' || %s)", (k % 7,))
                    self.ops += 1
        except BaseException as e:  # noqa: BLE001 - surfaced by stop()
            self.error = e

    def stop(self) -> int:
        self.stop_event.set()
        self.join(timeout=30)
        assert self.error is None, f"writer failed: {self.error}"
        return self.ops


def _sync(spark, cfg):
    from slotlake.decode.job import run_decode
    from slotlake.merge.job import run_merge

    src = cfg.source(SRC)
    run_preflight(cfg, src)
    extract(cfg, src)
    run_decode(spark, cfg, SRC)
    return run_merge(spark, cfg, SRC)


def _assert_equal(spark, cfg, dsn, tables):
    paths = LakePaths.of(cfg.lake, SRC)
    for t in tables:
        assert_gold_equals_pg(paths.gold(*t.split(".")), dsn, t)


def test_first_sync_copies_under_the_slot_snapshot_with_a_concurrent_writer(pg_db, tmp_path, spark):
    _sql(pg_db, SCHEMA)
    cfg = _config(tmp_path / "lake", pg_db, TABLES)
    writer = Writer(pg_db, "public.accounts", "public.events", seed=1)
    writer.start()
    time.sleep(0.3)
    src = cfg.source(SRC)
    report = run_preflight(cfg, src)  # creates the slot and copies both tables while the writer runs
    assert report.slot_created
    ops_during = writer.ops
    time.sleep(0.5)
    assert writer.stop() > ops_during > 0, "the writer must have run through the copy"
    root = LakePaths.of(cfg.lake, SRC).root
    gen = copies.current_generation(root)
    for t in TABLES:
        copy = copies.complete_copy(root, t, gen)
        assert copy is not None and copy.kind == "exported" and copy.parts_total > 1
        assert copy.watermark == gen.watermark
    from slotlake.decode.job import run_decode
    from slotlake.merge.job import run_merge

    assert snap.ensure_snapshots(cfg, src).copies == ()  # everything was copied with the slot
    # Loaded but not merged yet: `status` shows each table applied up to the copy's consistent point - 1.
    from slotlake.cli import source_status
    from slotlake.merge.snapshot_job import load_snapshots

    load_snapshots(spark, cfg, SRC)
    assert {t["table"]: (t["applied_lsn"], t["applied_by"]) for t in source_status(cfg, SRC)["tables"]} == {
        t: (str(gen.watermark), "snapshot") for t in TABLES}
    extract(cfg, src)
    run_decode(spark, cfg, SRC)
    run_merge(spark, cfg, SRC)
    _assert_equal(spark, cfg, pg_db, TABLES)
    # A later sync: more changes of every kind, then equality again.
    writer = Writer(pg_db, "public.accounts", "public.events", seed=2)
    writer.start()
    time.sleep(1.0)
    writer.stop()
    _sync(spark, cfg)
    _assert_equal(spark, cfg, pg_db, TABLES)


def test_a_merge_into_other_gold_paths_leaves_pending_copies_alone(pg_db, tmp_path, spark):
    """A replay or undo merges into its own tables (`gold_path_for`): a complete copy not loaded yet stays pending
    for the next live merge, which loads it and then applies the changes on top."""
    from slotlake import delta_log
    from slotlake.decode.job import run_decode
    from slotlake.lake import table_dir
    from slotlake.merge.job import run_merge

    _sql(pg_db, "CREATE TABLE items (id int PRIMARY KEY, v text); "
                "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 40) g")
    cfg = _config(tmp_path / "lake", pg_db, ["public.items"])
    src = cfg.source(SRC)
    assert run_preflight(cfg, src).slot_created  # the slot and its copy; nothing in gold yet
    _sql(pg_db, "UPDATE items SET v = 'x' WHERE id <= 5; DELETE FROM items WHERE id > 35")
    extract(cfg, src)
    run_decode(spark, cfg, SRC)
    gold = LakePaths.of(cfg.lake, SRC).gold("public", "items")
    other = str(tmp_path / "other")
    run_merge(spark, cfg, SRC, gold_path_for=lambda s, t: table_dir(other, s, t))
    assert delta_log.is_delta_table(table_dir(other, "public", "items"))
    assert not os.path.exists(gold), "a merge into other tables loaded the pending copy into live gold"
    root = LakePaths.of(cfg.lake, SRC).root
    assert copies.complete_copy(root, "public.items", copies.current_generation(root)) is not None
    run_merge(spark, cfg, SRC)
    _assert_equal(spark, cfg, pg_db, ["public.items"])

def test_table_added_to_a_running_source_under_concurrent_writes(pg_db, tmp_path, spark):
    _sql(pg_db, SCHEMA)
    _sql(pg_db, "CREATE TABLE later (LIKE accounts INCLUDING ALL); "
                "INSERT INTO later SELECT * FROM accounts; ANALYZE later")
    cfg = _config(tmp_path / "lake", pg_db, TABLES)
    _sync(spark, cfg)
    _assert_equal(spark, cfg, pg_db, TABLES)
    # The user adds public.later to the config while it is being written to.
    cfg2 = _config(tmp_path / "lake", pg_db, TABLES + ["public.later"])
    writer = Writer(pg_db, "public.later", None, seed=3)
    writer.start()
    time.sleep(0.3)
    src = cfg2.source(SRC)
    pre = run_preflight(cfg2, src)  # adds the table to the publication, then copies it under its own snapshot
    assert pre.tables_added == ("public.later",)
    root = LakePaths.of(cfg2.lake, SRC).root
    gen = copies.current_generation(root)
    added = copies.complete_copy(root, "public.later", gen)
    assert added is not None and added.kind == "current" and added.parts_total > 1
    assert added.copy_snapshot is not None and added.watermark == gen.watermark
    assert [len(copies.table_copies(root, t)) for t in TABLES] == [1, 1]  # the others are not copied again
    assert snap.ensure_snapshots(cfg2, src).copies == ()
    time.sleep(0.3)
    writer.stop()
    extract(cfg2, src)
    from slotlake.decode.job import run_decode
    from slotlake.merge.job import run_merge

    run_decode(spark, cfg2, SRC)
    run_merge(spark, cfg2, SRC)
    _assert_equal(spark, cfg2, pg_db, TABLES + ["public.later"])
    writer = Writer(pg_db, "public.later", None, seed=4)
    writer.start()
    time.sleep(0.5)
    writer.stop()
    _sync(spark, cfg2)
    _assert_equal(spark, cfg2, pg_db, TABLES + ["public.later"])


def test_killed_snapshot_resumes_the_unfinished_table_to_an_exact_result(pg_db, tmp_path, spark, monkeypatch):
    _sql(pg_db, SCHEMA)
    cfg = _config(tmp_path / "lake", pg_db, TABLES)
    src = cfg.source(SRC)
    root = LakePaths.of(cfg.lake, SRC).root
    writer = Writer(pg_db, "public.accounts", "public.events", seed=5)
    writer.start()
    monkeypatch.setenv("SLOTLAKE_SNAPSHOT_WORKERS", "1")  # parts in order: accounts first, then events
    monkeypatch.setenv(snap.FAILPOINT_ENV, f"{snap.FAILPOINT_AFTER_PARTS}2")
    with pytest.raises(SnapshotError, match="failpoint"):
        run_preflight(cfg, src)
    monkeypatch.delenv(snap.FAILPOINT_ENV)
    gen = copies.current_generation(root)
    assert gen is not None
    unfinished = [t for t in TABLES if copies.complete_copy(root, t, gen) is None]
    assert unfinished, "the failpoint must leave a table half copied"
    time.sleep(0.3)
    _sync(spark, cfg)  # the slot exists now: preflight recopies the unfinished table under a new snapshot
    writer.stop()
    for t in TABLES:
        done = copies.complete_copy(root, t, gen)
        assert done is not None
        assert done.kind == ("current" if t in unfinished else "exported")
    finished = [t for t in TABLES if t not in unfinished]
    for t in finished:  # a finished table is never copied again
        assert len(copies.table_copies(root, t)) == 1
    _sync(spark, cfg)
    _assert_equal(spark, cfg, pg_db, TABLES)


def test_slot_dropped_by_hand_then_resync(pg_db, tmp_path, spark):
    from delta.tables import DeltaTable

    from slotlake.merge.snapshot_job import load_snapshots

    _sql(pg_db, SCHEMA)
    cfg = _config(tmp_path / "lake", pg_db, TABLES)
    src = cfg.source(SRC)
    _sync(spark, cfg)
    _sql(pg_db, "UPDATE accounts SET owner = 'before drop' WHERE id <= 10")
    _sync(spark, cfg)
    _assert_equal(spark, cfg, pg_db, TABLES)
    paths = LakePaths.of(cfg.lake, SRC)
    gold = paths.gold("public", "accounts")
    version_before = DeltaTable.forPath(spark, gold).history(1).collect()[0]["version"]
    _sql(pg_db, f"SELECT pg_drop_replication_slot('{src.slot}')")
    # Changes made while there is no slot are lost to the stream; the resync's copy brings them.
    _sql(pg_db, "UPDATE accounts SET owner = 'lost' WHERE id <= 100; DELETE FROM events WHERE qty = 0")
    with pytest.raises(SlotLostError, match="resync"):
        run_preflight(cfg, src)
    report = resync.resync(cfg, src)
    assert report.old_slot is None and not report.old_slot_dropped
    assert report.snapshot.slot_created and {c.table for c in report.snapshot.copies} == set(TABLES)
    assert report.old_bronze_end is not None and report.snapshot.generation > report.old_bronze_end
    loads = load_snapshots(spark, cfg, SRC)
    assert all(x.gold_version is not None and x.gold_version > 0 for x in loads)
    _assert_equal(spark, cfg, pg_db, TABLES)
    # Time travel: the version before the resync still reads the old contents.
    old = spark.read.format("delta").option("versionAsOf", version_before).load(gold)
    assert old.where("owner = 'lost'").count() == 0 and old.where("owner = 'before drop'").count() == 10
    writer = Writer(pg_db, "public.accounts", "public.events", seed=6)
    writer.start()
    time.sleep(0.5)
    writer.stop()
    _sync(spark, cfg)
    _assert_equal(spark, cfg, pg_db, TABLES)


def test_table_without_select_right_fails_naming_it(pg_db, pg_server, tmp_path):
    _sql(pg_db, SCHEMA)
    role = f"r_{os.getpid()}_{int(time.time())}"
    _sql(pg_db, f"CREATE ROLE {role} LOGIN REPLICATION; GRANT SELECT ON accounts TO {role}; "
                "CREATE PUBLICATION slotlake_shop FOR TABLE accounts, events")
    try:
        dsn = pg_server.dsn(pg_db.rsplit("/", 1)[1], user=role)
        cfg = _config(tmp_path / "lake", dsn, TABLES)
        with pytest.raises(SnapshotError, match=r"table public\.events cannot be copied: .* no SELECT"):
            snap.create_slot_with_snapshot(cfg, cfg.source(SRC))
        with psycopg.connect(pg_db) as c:  # checked before anything was created
            assert c.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slotlake_shop'"
                             ).fetchone()[0] == 0
    finally:
        _sql(pg_db, f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_a_part_that_fails_is_copied_again_on_a_new_connection(pg_db, tmp_path, spark, monkeypatch):
    """A part whose connection dies is copied once more on a new connection in the same exported snapshot; the
    copy completes and gold equals PostgreSQL."""
    _sql(pg_db, SCHEMA)
    real = snap._copy_part
    failed: list[tuple[str, int]] = []

    def dies_once(bulk, copy, part, folder):
        if not failed and part.index == 1:
            failed.append((part.table, part.index))
            bulk.close()  # the connection is gone mid-copy
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(bulk, copy, part, folder)

    monkeypatch.setattr(snap, "_copy_part", dies_once)
    cfg = _config(tmp_path / "lake", pg_db, TABLES)
    assert run_preflight(cfg, cfg.source(SRC)).slot_created
    assert failed, "no part failed: the retry path did not run"
    root = LakePaths.of(cfg.lake, SRC).root
    gen = copies.current_generation(root)
    with psycopg.connect(pg_db) as c:
        for t in TABLES:
            copy = copies.complete_copy(root, t, gen)
            assert copy is not None and sorted(p["index"] for p in copy.parts) == list(range(copy.parts_total))
            assert sum(p["rows"] for p in copy.parts) == c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    _sync(spark, cfg)
    _assert_equal(spark, cfg, pg_db, TABLES)


def test_no_connection_in_the_snapshot_fails_the_copy_in_one_line(pg_db, tmp_path, monkeypatch):
    _sql(pg_db, SCHEMA)

    def refused(source, snapshot_name):
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(snap, "_open_in_snapshot", refused)
    cfg = _config(tmp_path / "lake", pg_db, TABLES)
    with pytest.raises(SnapshotError, match=r"^snapshot shop: cannot open a copy connection in the snapshot: "
                                            r"connection refused$"):
        run_preflight(cfg, cfg.source(SRC))
    root = LakePaths.of(cfg.lake, SRC).root
    gen = copies.current_generation(root)
    assert gen is None or all(copies.complete_copy(root, t, gen) is None for t in TABLES)

def test_spark_visibility_predicate_matches_the_pure_rule(spark):
    from slotlake.lsn import Lsn
    from slotlake.merge.visibility_job import not_seen_by_copy
    from slotlake.source.visibility import CopySnapshot, seen_by_copy

    epoch = 7 << 32
    snaps = [CopySnapshot.parse("100:110:102,105", Lsn(5000)),
             CopySnapshot(epoch + 0xFFFFFFF0, epoch + (1 << 32) + 0x10, (epoch + (1 << 32) + 0x5,), Lsn(5000)),
             CopySnapshot.parse("50:50:", Lsn(5000))]
    xids = [1, 49, 50, 99, 100, 101, 102, 104, 105, 109, 110, 111, 0xFFFFFFEF, 0xFFFFFFF0, 0xFFFFFFFE, 3, 5, 0x10]
    rows = [(x, lsn) for x in xids for lsn in (4000, 4999, 5000, 6000)]
    df = spark.createDataFrame(rows, "xid long, commit_lsn long")
    for s in snaps:
        got = {(r["xid"], r["commit_lsn"]) for r in df.where(not_seen_by_copy(s)).collect()}
        want = {(x, lsn) for x, lsn in rows if not seen_by_copy(x, lsn, s)}
        assert got == want, s
