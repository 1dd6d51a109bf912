"""A small batch decoded and merged in `slotlake sync`'s own process (no JVM: slotlake.merge.in_process), next to
the same changes through the Spark apps (`spark.in_process_bytes: 0`) from the same database: both lakes' gold
tables must hold the same rows, `_slotlake_` columns included, and equal PostgreSQL; key changes, unchanged TOAST
values and a FULL-identity table's updates and deletes are merged here too; batches the in-process merge cannot
write exactly (a key change of a row with an unchanged TOAST value, a value only Spark types) must go to Spark's
merge and come out the same; batches with TRUNCATEs are merged here as one overwrite per table."""
from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from clirun import launched_apps, slotlake, sync_crashes, sync_ok  # noqa: E402
from delta_readers import read_delta_rs  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake import bronze, delta_log  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

TABLES = ["public.items", "public.hist", "public.events"]
IN_PROCESS, SPARK = "inproc", "viaspark"


def write_config(path: Path, dsn: str, *, extract: dict | None = None, in_process_bytes: int | None = None) -> Path:
    """The in-process lake's config at `path` (`spark.in_process_bytes` as given, else its default) and the Spark
    lake's beside it (returned); both with the `extract` settings given."""
    sources = {name: {"dsn": dsn, "tables": TABLES} for name in (IN_PROCESS, SPARK)}
    more = {"extract": extract} if extract else {}
    spark = {"master": "local[2]"} if in_process_bytes is None else {"master": "local[2]",
                                                                     "in_process_bytes": in_process_bytes}
    path.write_text(json.dumps({"lake": str(path.parent / "lake"), "spark": spark,
                                "sources": {IN_PROCESS: sources[IN_PROCESS]}, **more}))
    other = path.with_name("spark.yaml")
    other.write_text(json.dumps({"lake": str(path.parent / "lake_spark"),
                                 "spark": {"master": "local[2]", "in_process_bytes": 0},
                                 "sources": {SPARK: sources[SPARK]}, **more}))
    return other


def sync(cfg: Path, source: str) -> tuple[dict, str]:
    out = sync_ok(cfg, source, "--json")
    return json.loads(out.stdout), out.stderr


def gold_rows(path: str) -> collections.Counter:
    """Every gold row, `_slotlake_` columns included, read with delta-rs. The two lakes' slots have their own
    consistent points: a row of the initial copy (no commit time) has its lake's, so it reads as "copy"."""
    table = read_delta_rs(path)
    rows = table.to_pylist()
    for r in rows:
        if r["_slotlake_commit_ts"] is None:
            r["_slotlake_lsn"] = "copy"
    return collections.Counter(tuple(sorted(r.items())) for r in rows)


def check(tmp_path: Path, dsn: str) -> None:
    for t in TABLES:
        schema, table = t.split(".")
        a = LakePaths.of(str(tmp_path / "lake"), IN_PROCESS).gold(schema, table)
        b = LakePaths.of(str(tmp_path / "lake_spark"), SPARK).gold(schema, table)
        assert_gold_equals_pg(a, dsn, t)
        assert_gold_equals_pg(b, dsn, t)
        assert gold_rows(a) == gold_rows(b), t


def test_small_batches_merge_in_process_exactly_as_spark_does(pg_db, tmp_path):
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, n bigint, ok boolean, d date, "
                     "ts timestamptz, tl timestamp, s smallint, big text, price numeric(10,2) DEFAULT 9.99, "
                     "amount numeric)")
        conn.execute("CREATE TABLE hist (a int, b text, t timestamptz, v numeric(6,3))")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE events (k int, v text)")
        conn.execute("ALTER TABLE events REPLICA IDENTITY NOTHING")
        conn.execute("INSERT INTO items SELECT g, 'n' || g, g * 1000000000::bigint, g % 2 = 0, DATE '2024-01-01' + g, "
                     "TIMESTAMPTZ '2024-01-01 00:00:00+00' + g * interval '1.5 s', TIMESTAMP '2023-06-01 12:00:00' "
                     "+ g * interval '1 ms', g, NULL, g * 1.25, g * 1.5 FROM generate_series(1, 200) g")
        conn.execute("INSERT INTO hist VALUES (0, 'seed', '2024-01-01'), (0, 'seed', '2024-01-01')")
        conn.execute("INSERT INTO events VALUES (0, 'seed')")
    spark_cfg = write_config(tmp_path / "slotlake.yaml", pg_db)
    cfg = tmp_path / "slotlake.yaml"
    paths = LakePaths.of(str(tmp_path / "lake"), IN_PROCESS)
    report, log = sync(cfg, IN_PROCESS)  # the initial copies, loaded here (FULL identity: two identical rows)
    assert launched_apps(log) == [], log[-3000:]
    sync(spark_cfg, SPARK)
    check(tmp_path, pg_db)
    # the first changes after the copies: decoded and merged here, `_runs` created here
    assert not delta_log.is_delta_table(paths.runs)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO events VALUES (0, 'first')")
        conn.execute("UPDATE items SET name = 'first' WHERE id = 1")
    report, log = sync(cfg, IN_PROCESS)
    assert launched_apps(log) == [] and "(in this process, without Spark)" in log, log[-3000:]
    assert delta_log.stage_end(paths.runs, "runs") == delta_log.stage_end(paths.changes, "decode")
    sync(spark_cfg, SPARK)
    check(tmp_path, pg_db)

    # 1. a mix the in-process merge takes: inserts, updates (a hot row many times), deletes, a key inserted and
    # deleted in the batch, NULLs, duplicate FULL rows, inserts into a NOTHING table
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (1000, 'new', NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
        for _ in range(30):
            conn.execute("UPDATE items SET n = n + 1, ts = ts + interval '1 us' WHERE id = 7")
        conn.execute("UPDATE items SET name = 'u' || id, ok = NOT ok, d = d + 1 WHERE id % 10 = 3")
        # decimals: the widest numeric(10,2), an unconstrained numeric with 18 fraction digits and one with 20
        # integer digits, negatives, NULL
        conn.execute("UPDATE items SET price = 99999999.99, amount = 12345678901234567890.000000000000000001 "
                     "WHERE id = 8")
        conn.execute("UPDATE items SET price = -0.01, amount = -0.5 WHERE id = 9")
        conn.execute("UPDATE items SET price = NULL, amount = NULL WHERE id = 10")
        conn.execute("DELETE FROM items WHERE id % 25 = 0")
        conn.execute("INSERT INTO items VALUES (2000, 'gone', 1, true, '2024-05-05', '2024-05-05 01:02:03.456789+00',"
                     " '2024-05-05 01:02:03.000001', -32768, 'x')")
        conn.execute("DELETE FROM items WHERE id = 2000")
        conn.execute("INSERT INTO hist VALUES (1, 'x', '2024-02-01'), (1, 'x', '2024-02-01'), (2, NULL, NULL)")
        conn.execute("INSERT INTO hist VALUES (1, 'x', '2024-02-01', NULL), (3, 'z', '2024-02-03 04:05:06.7+00', -1.5)")
        conn.execute("INSERT INTO events VALUES (1, 'a'), (1, 'a'), (2, NULL)")
    report, log = sync(cfg, IN_PROCESS)
    assert report["spark_skipped"] is False
    assert launched_apps(log) == [], log[-3000:]
    assert "merge inproc in this process declined" not in log, log[-3000:]
    assert "(in this process, without Spark)" in log, log[-3000:]
    merged = {m["table"]: m for m in report["merged"]}
    # id 1000 is inserted, then deleted with every 25th id; 2000 inserted and deleted: neither reaches gold
    assert (merged["public.items"]["deleted"], merged["public.items"]["inserted"]) == (8, 0), merged
    assert merged["public.items"]["updated"] == 24, merged  # ids 7 to 10 and the 20 ids ending in 3
    assert merged["public.hist"]["inserted"] == 5 and merged["public.events"]["inserted"] == 3, merged
    report, log = sync(spark_cfg, SPARK)
    assert launched_apps(log) == ["sync"], log[-3000:]
    check(tmp_path, pg_db)
    # the run is recorded as complete: the next sync has nothing to do and starts nothing
    report, log = sync(cfg, IN_PROCESS)
    assert report["spark_skipped"] is True, report["spark"]
    assert delta_log.stage_end(paths.runs, "runs") == delta_log.stage_end(paths.changes, "decode")

    # the process dies after its first table's commit: the next sync merges the rest, in process, nothing twice
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("UPDATE items SET n = -n WHERE id < 50")
        conn.execute("INSERT INTO hist VALUES (4, 'crash', '2024-03-01')")
        conn.execute("INSERT INTO events VALUES (4, 'crash')")
    sync_crashes(cfg, IN_PROCESS, "merge_after_first_table")
    silver_end = delta_log.stage_end(paths.changes, "decode")
    marks = {t: delta_log.stage_end(paths.gold(*t.split(".")), "merge") for t in TABLES}
    assert list(marks.values()).count(silver_end) == 1, marks  # one table committed, then the process died
    report, log = sync(cfg, IN_PROCESS)
    assert report["spark"].startswith("merge due:"), report["spark"]
    assert launched_apps(log) == [] and "(in this process, without Spark)" in log, log[-3000:]
    assert set(report["step_seconds"]) == {"preflight", "extract", "merge"}, report["step_seconds"]
    sync(spark_cfg, SPARK)
    check(tmp_path, pg_db)

    # 2. unchanged TOAST values (`big` is stored out of line), key changes and a FULL table's updates and deletes,
    # merged here as Spark merges them
    big = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300))"
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"UPDATE items SET big = {big} WHERE id IN (12, 14, 15, 26)")
    sync(cfg, IN_PROCESS)
    sync(spark_cfg, SPARK)
    batches = [
        ["UPDATE items SET name = 'toast' WHERE id = 12",  # the value from gold
         f"UPDATE items SET big = {big} WHERE id = 14",  # ... from an earlier change of the batch
         "UPDATE items SET name = 'again' WHERE id = 14", "UPDATE items SET n = 14 WHERE id = 14",
         f"INSERT INTO items (id, name, big) VALUES (4000, 'fresh', {big})",  # ... from the batch's insert
         "UPDATE items SET n = 5 WHERE id = 4000",
         "UPDATE items SET name = 'gone' WHERE id = 15", "DELETE FROM items WHERE id = 15",
         "UPDATE items SET n = 26 WHERE id = 26", "UPDATE items SET big = NULL WHERE id = 26"],
        ["UPDATE items SET id = 5000 WHERE id = 11", "UPDATE items SET n = 1 WHERE id = 5000",  # moved, updated
         "UPDATE items SET id = id + 10000 WHERE id BETWEEN 16 AND 19",
         "BEGIN", "UPDATE items SET id = -21 WHERE id = 21", "UPDATE items SET id = 21 WHERE id = 22",
         "UPDATE items SET id = 22 WHERE id = -21", "COMMIT",  # two rows swap keys in one transaction
         "INSERT INTO items (id, name) VALUES (11, 'back at 11')",  # the old key taken again
         "UPDATE items SET id = 6000 WHERE id = 5000", "DELETE FROM items WHERE id = 10016"],
        # FULL identity: copies removed and added after gold's count of each row (NULLs equal)
        ["DELETE FROM hist WHERE a = 1 AND v IS NULL", "UPDATE hist SET b = 'upd' WHERE a = 2",
         "INSERT INTO hist VALUES (2, 'upd', NULL), (0, 'seed', '2024-01-01')",  # copies of rows gold holds
         "UPDATE hist SET v = 1.5 WHERE a = 3", "DELETE FROM hist WHERE a = 4"],
    ]
    truncates = [  # after the declines below, which need row 12: gold is what the changes after the TRUNCATE leave
        ["TRUNCATE items", f"INSERT INTO items (id, name, big) VALUES (1, 'one', {big}), (2, 'two', NULL)",
         "UPDATE items SET name = 'one again' WHERE id = 1",  # its TOASTed value from the insert
         "DELETE FROM items WHERE id = 2", "TRUNCATE events", "INSERT INTO events VALUES (8, 'a'), (8, 'a')",
         "INSERT INTO hist VALUES (6, 'before', NULL, NULL)", "TRUNCATE hist",
         "INSERT INTO hist VALUES (5, 'h', NULL, NULL), (5, 'h', NULL, NULL)"],
        ["TRUNCATE events"],  # a TRUNCATE alone
    ]
    def in_process(statements: list[str]) -> None:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)
        report, log = sync(cfg, IN_PROCESS)
        assert "merge inproc in this process declined" not in log, (statements, log[-3000:])
        assert launched_apps(log) == [] and "(in this process, without Spark)" in log, (statements, log[-3000:])
        sync(spark_cfg, SPARK)
        check(tmp_path, pg_db)

    for statements in batches:
        in_process(statements)

    # 3. batches only Spark merges exactly: each is decoded here, then Spark's merge runs, and gold is the same
    declines = [
        "UPDATE items SET id = 7000 WHERE id = 12",  # a key change of a row whose TOASTed value is unchanged
        "INSERT INTO items (id, ts) VALUES (3000, 'infinity')",  # a value Spark quarantines
        "UPDATE items SET amount = 'NaN' WHERE id = 13",  # a numeric no decimal holds: Spark quarantines it
    ]
    for statement in declines:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(statement)
        report, log = sync(cfg, IN_PROCESS)
        assert "merge inproc in this process declined" in log, (statement, log[-3000:])
        assert launched_apps(log) == ["merge"], (statement, log[-3000:])
        sync(spark_cfg, SPARK)
        fix = {"INSERT INTO items (id, ts)": "UPDATE items SET ts = NULL WHERE id = 3000",
               "UPDATE items SET amount = 'NaN'": "UPDATE items SET amount = NULL WHERE id = 13"}
        for start, undo in fix.items():
            if not statement.startswith(start):
                continue
            with psycopg.connect(pg_db, autocommit=True) as conn:  # quarantined in both: gold has NULL there
                conn.execute(undo)
            sync(cfg, IN_PROCESS)
            sync(spark_cfg, SPARK)
        check(tmp_path, pg_db)

    # 4. TRUNCATEs: one overwrite per table, what the changes after the last TRUNCATE leave
    for statements in truncates:
        in_process(statements)

    # 5. `slotlake optimize` (merge/optimize.py: delta-rs's compaction here) after a few small batches, on both
    # lakes (files written here and by Spark; Spark's alone): one OPTIMIZE commit per table with files to fold, no
    # data changed, the watermarks as they were; the syncs go on from it
    for i in range(3):
        in_process([f"INSERT INTO events VALUES ({i}, 'small')", f"INSERT INTO hist VALUES ({i}, 'small', now(), 1)",
                    f"UPDATE items SET name = 'small {i}' WHERE id = 1"])
    for source, config, lake in ((IN_PROCESS, cfg, "lake"), (SPARK, spark_cfg, "lake_spark")):
        golds = {t: LakePaths.of(str(tmp_path / lake), source).gold(*t.split(".")) for t in TABLES}
        files = {t: len(delta_log.snapshot(p).files) for t, p in golds.items()}
        marks = {t: delta_log.latest_slotlake_commit(p) for t, p in golds.items()}
        out = slotlake(config, "optimize", source, "--json")
        assert out.returncode == 0 and launched_apps(out.stderr) == [], out.stderr[-3000:]
        done = {d["table"]: d for d in json.loads(out.stdout)}
        assert set(done) == set(TABLES), done
        for t, p in golds.items():
            assert delta_log.latest_slotlake_commit(p) == marks[t], t
            if done[t]["version"] is None:
                assert files[t] == 1 or done[t]["skipped"], (t, done[t])
                continue
            assert next(delta_log.commits(p)).operation == "OPTIMIZE", t
            assert done[t]["files_removed"] >= 2 and len(delta_log.snapshot(p).files) < files[t], (t, done[t])
        assert done["public.events"]["version"] is not None, done  # a file a batch: at least 3 to fold
    check(tmp_path, pg_db)
    in_process(["INSERT INTO events VALUES (9, 'after optimize')", "UPDATE items SET name = 'after' WHERE id = 2",
                "INSERT INTO hist VALUES (9, 'after optimize', now(), 2)"])


def test_initial_copies_load_in_process_as_spark_loads_them_and_the_rest_go_to_spark(pg_db, tmp_path):
    """A new source's first sync loads its copies here (no JVM): keyed, FULL identity with identical rows, soft
    deletes, `numeric.unconstrained: string`, a time stamp without a zone; every row, `_slotlake_` columns included,
    as the Spark load of the same copies writes it. A table added later whose copy only Spark types (a double) is
    declined, logged, and loaded by Spark; the tables loaded before it stay as they are."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, tl timestamp, amount numeric, d date)")
        conn.execute("INSERT INTO items SELECT g, 'n' || g, TIMESTAMP '2024-01-01 00:00:00' + g * interval '1 ms', "
                     "g * 1.000000000000000000001, DATE '2024-01-01' + g FROM generate_series(1, 300) g")
        conn.execute("INSERT INTO items VALUES (0, NULL, NULL, 'NaN', NULL)")
        conn.execute("CREATE TABLE hist (a int, b text)")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO hist VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, NULL), (2, NULL), (3, 'y')")
        conn.execute("CREATE TABLE events (k int, v text)")  # no key, no rows
        conn.execute("ALTER TABLE events REPLICA IDENTITY NOTHING")
        conn.execute("CREATE TABLE ratings (id int PRIMARY KEY, score double precision)")
        conn.execute("INSERT INTO ratings VALUES (1, 0.5), (2, NULL)")
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")  # several batches of BATCH_ROWS
        conn.execute("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 140000) g")
        # a date before 1900 in the copy's last batch, which only Spark types: declined after the first batches
        conn.execute("CREATE TABLE dated (id int PRIMARY KEY, d date)")
        conn.execute("INSERT INTO dated SELECT g, DATE '2000-01-01' + g % 1000 FROM generate_series(1, 70000) g")
        conn.execute("UPDATE dated SET d = '1850-06-01' WHERE id = 70000")
    tables = ["public.items", "public.hist", "public.events", "public.big"]
    source = {"dsn": pg_db, "tables": tables, "delete_mode": "soft", "numeric": {"unconstrained": "string"}}
    cfg, spark_cfg = tmp_path / "slotlake.yaml", tmp_path / "spark.yaml"

    def configure(listed: list[str]) -> None:
        for path, name, lake, more in ((cfg, IN_PROCESS, "lake", {}), (spark_cfg, SPARK, "lake_spark",
                                                                      {"in_process_bytes": 0})):
            path.write_text(json.dumps({"lake": str(tmp_path / lake), "spark": {"master": "local[2]", **more},
                                        "sources": {name: {**source, "tables": listed}}}))

    def same(listed: list[str]) -> None:
        for t in listed:
            a = LakePaths.of(str(tmp_path / "lake"), IN_PROCESS).gold(*t.split("."))
            b = LakePaths.of(str(tmp_path / "lake_spark"), SPARK).gold(*t.split("."))
            numeric = ["amount"] if t == "public.items" else []
            assert_gold_equals_pg(a, pg_db, t, numeric_text=numeric)
            assert gold_rows(a) == gold_rows(b), t
            assert read_delta_rs(a).schema == read_delta_rs(b).schema, t

    configure(tables)
    report, log = sync(cfg, IN_PROCESS)
    assert launched_apps(log) == [], log[-3000:]
    for t in tables:
        assert f"snapshot load {t} in this process" in log, log[-3000:]
    paths = LakePaths.of(str(tmp_path / "lake"), IN_PROCESS)
    assert delta_log.stage_end(paths.catalog, "catalog") is not None  # the bootstrap definitions, written here
    assert {m["table"]: m["inserted"] for m in report["merged"]} == {
        "public.items": 301, "public.hist": 6, "public.big": 140000}, report["merged"]  # (events: an empty copy)
    assert delta_log.has_commits(paths.gold("public", "events"))
    report, log = sync(spark_cfg, SPARK)
    assert launched_apps(log) == ["sync"], log[-3000:]
    same(tables)
    # the changes after the copies: the soft-deleting merge is Spark's (on top of the tables loaded here)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("DELETE FROM hist WHERE a = 1 AND ctid = (SELECT min(ctid) FROM hist WHERE a = 1)")
        conn.execute("UPDATE items SET name = 'u', amount = 0.1 WHERE id < 5")
        conn.execute("DELETE FROM items WHERE id = 7")
        conn.execute("INSERT INTO events VALUES (1, 'e')")
    for config, name in ((cfg, IN_PROCESS), (spark_cfg, SPARK)):
        sync(config, name)
    same(tables)

    # tables added: a copy with a value only Spark types in its last batch is declined after its first batches
    # were written (their files removed: gold holds only what its log adds), then loaded by Spark; a copy of a
    # double, which Spark types, is declined before anything is read
    def added(table: str, why: str) -> None:
        tables.append(table)
        configure(tables)
        _, log = sync(cfg, IN_PROCESS)
        assert f"snapshot load {table} in this process declined ({why}" in log, log[-3000:]
        assert launched_apps(log) != [], log[-3000:]
        gold = paths.gold(*table.split("."))
        assert {p.name for p in Path(gold).glob("*.parquet")} == set(delta_log.snapshot(gold).files), gold
        sync(spark_cfg, SPARK)
        same(tables)

    added("public.dated", "public.dated.d: a value")
    added("public.ratings", "score: a type Spark types")


def _create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, n bigint, big text)")
        conn.execute("ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL")  # out of line, not compressed
        # FULL identity: a slice's rows are appended when gold holds no equal row (gold's files whose ranges
        # overlap the slice's are read to tell)
        conn.execute("CREATE TABLE hist (a int, b text, t timestamptz, v numeric(6,3))")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE events (k int, v text)")
        conn.execute("ALTER TABLE events REPLICA IDENTITY NOTHING")
        conn.execute("INSERT INTO items SELECT g, 'n' || g, g FROM generate_series(1, 100) g")


def _decode_commits(paths: LakePaths) -> int:
    return sum(1 for c in delta_log.commits(paths.changes) if c.operation != "CREATE TABLE")


def _slices(log: str) -> tuple[int, int]:
    """(slices decoded, slices merged) in this process, from the sync's log line."""
    found = re.findall(r"(\d+) slice\(s\) decoded and (\d+) merged in this process", log)
    assert len(found) == 1, log[-3000:]
    return int(found[0][0]), int(found[0][1])


def test_a_backlog_bigger_than_a_slice_is_decoded_and_merged_slice_by_slice(pg_db, tmp_path):
    """A backlog of many small bronze files (`extract.upto_nchanges: 60`) and `spark.in_process_bytes` of about two
    of them: the sync takes it slice by slice in process (a silver commit and a gold commit a slice, no JVM), with
    a hot row, keys inserted in one slice and deleted in a later one, FULL rows equal within a slice and whose
    value ranges overlap gold's files (so gold's rows are read to tell that none is equal); then a key change of a
    row with an unchanged TOAST value in the middle of a backlog: the slices before it merge here, Spark's app does
    the rest. Gold equals PostgreSQL and the Spark-only lake's gold row for row."""
    _create_tables(pg_db)
    extract = {"upto_nchanges": 60}
    probe = write_config(tmp_path / "slotlake.yaml", pg_db, extract=extract)
    cfg = tmp_path / "slotlake.yaml"
    sync(cfg, IN_PROCESS)  # the initial copies (Spark loads them)
    sync(probe, SPARK)
    paths = LakePaths.of(str(tmp_path / "lake"), IN_PROCESS)
    # a slice of about two bronze files of this workload: one small sync's file sets the size
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for i in range(12):
            conn.execute(f"UPDATE items SET n = n + 1 WHERE id BETWEEN {i * 4 + 1} AND {i * 4 + 4}")
    sync(cfg, IN_PROCESS)
    sync(probe, SPARK)
    sizes = sorted(f.stat().st_size for f in Path(paths.root, "bronze").glob("*.parquet"))
    assert len(sizes) >= 1, sizes
    write_config(cfg, pg_db, extract=extract, in_process_bytes=2 * sizes[-1] + sizes[-1] // 2)
    spark_cfg = tmp_path / "spark.yaml"
    check(tmp_path, pg_db)

    # 1. ~900 changes in ~60 transactions: ~15 files, several slices
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for i in range(60):
            with conn.transaction():
                conn.execute("UPDATE items SET n = n + 1, name = 'hot' || %s WHERE id = 7", (i,))
                conn.execute("UPDATE items SET n = n * 2 WHERE id BETWEEN %s AND %s", (i % 90 + 10, i % 90 + 14))
                conn.execute("INSERT INTO items VALUES (%s, 'new', %s)", (1000 + i, i))
                if i >= 20:  # keys inserted in an earlier slice, deleted in a later one
                    conn.execute("DELETE FROM items WHERE id = %s", (1000 + i - 20,))
                # two equal rows; every slice's ranges of a and t overlap gold's files, no row equals one of gold
                conn.execute("INSERT INTO hist SELECT %s, 'r' || %s, t FROM generate_series(1, 2), "
                             "(SELECT TIMESTAMPTZ '2024-01-01 00:00+00' + %s * interval '1 hour' t) x",
                             (i % 7, i, i % 5))
                conn.execute("INSERT INTO events VALUES (%s, 'e')", (i % 3,))
    before = _decode_commits(paths)
    report, log = sync(cfg, IN_PROCESS)
    assert launched_apps(log) == [], log[-3000:]
    decoded, merged = _slices(log)
    assert decoded == merged >= 3, log[-3000:]
    assert _decode_commits(paths) - before == decoded
    # one gold commit a slice for the table every slice changes
    assert sum(1 for c in delta_log.commits(paths.gold("public", "items")) if c.operation == "MERGE") >= decoded
    # silver and `_runs` end at the last bronze file's end; the slot (the report's end) may be past it, where the
    # extract found only WAL of other databases (this cluster's other tests) and recorded that coverage
    assert delta_log.stage_end(paths.runs, "runs") == delta_log.stage_end(paths.changes, "decode") == \
        bronze.max_archived_end(paths.root)
    assert Lsn.parse(report["end_lsn"]) == bronze.covered_lsn(paths.root)
    sync(spark_cfg, SPARK)
    check(tmp_path, pg_db)

    # 2. in the middle of the backlog, a key change of a row whose TOASTed value is unchanged (only Spark's merge
    # follows it across keys): the slices before it are merged here, Spark does the rest
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for i in range(40):
            with conn.transaction():
                conn.execute("UPDATE items SET n = n + 1 WHERE id BETWEEN 20 AND 30")
                conn.execute("INSERT INTO hist VALUES (2, 'after', TIMESTAMPTZ '2025-01-01 00:00+00' + %s * "
                             "interval '1 hour')", (i,))
                if i == 20:
                    conn.execute("UPDATE items SET big = repeat('x', 3000) WHERE id = 99")  # (small in bronze)
                    conn.execute("UPDATE items SET id = 9999 WHERE id = 99")
    report, log = sync(cfg, IN_PROCESS)
    decoded, merged = _slices(log)
    assert decoded > merged >= 1, log[-3000:]
    assert "a key change and unchanged TOAST in one batch" in log, log[-3000:]
    assert "the rest by Spark" in log and launched_apps(log) == ["sync"], log[-3000:]
    sync(spark_cfg, SPARK)
    check(tmp_path, pg_db)


# `slotlake sync` run by `slotlake.cli.main` in a new interpreter, which then prints the Spark modules it imported
_SYNC_AND_LIST_SPARK = """
import json, sys
from slotlake.cli import main
code = main(["--config", sys.argv[1], "sync", sys.argv[2], "--json"])
sys.stdout.flush()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "delta"))))
sys.exit(code)
"""


def test_syncs_in_process_never_import_spark(pg_db, tmp_path):
    """A first sync (the initial copies loaded here), a small batch of inserts, updates, deletes, FULL and NOTHING
    rows, and an idle sync, each `slotlake sync` in a new interpreter: none starts a Spark app, and none imports
    pyspark, py4j or delta-spark (their import is 0.1-0.2 s of a small sync's ~1.5 s); gold equals PostgreSQL."""
    from clirun import cli_env

    _create_tables(pg_db)
    write_config(tmp_path / "slotlake.yaml", pg_db)
    cfg = tmp_path / "slotlake.yaml"

    def run() -> tuple[dict, str]:
        out = subprocess.run([sys.executable, "-c", _SYNC_AND_LIST_SPARK, str(cfg), IN_PROCESS], capture_output=True,
                             text=True, timeout=600, env=cli_env(), check=False)
        assert out.returncode == 0, out.stderr[-3000:]
        *report, imported = out.stdout.strip().splitlines()
        assert json.loads(imported) == [], out.stderr[-3000:]
        assert launched_apps(out.stderr) == [], out.stderr[-3000:]
        return json.loads("\n".join(report)), out.stderr

    run()
    lake = LakePaths.of(str(tmp_path / "lake"), IN_PROCESS)
    assert all(delta_log.is_delta_table(lake.gold(*t.split("."))) for t in TABLES)  # loaded by the first sync
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("UPDATE items SET n = n + 1 WHERE id <= 30")
        conn.execute("DELETE FROM items WHERE id > 90")
        conn.execute("INSERT INTO items VALUES (500, 'x', 5, repeat('b', 3000))")
        conn.execute("INSERT INTO hist VALUES (1, 'a', now(), 1.5), (1, 'a', now(), 1.5)")
        conn.execute("INSERT INTO events VALUES (1, 'e')")
    second, log = run()
    assert second["decoded_changes"] == 44, second  # 30 updates, 10 deletes, 1 + 2 + 1 inserts
    assert re.search(r"1 slice\(s\) decoded and 1 merged in this process", log), log[-3000:]
    idle, _ = run()
    assert idle["archived_changes"] == 0, idle
    for table in TABLES:
        schema, name = table.split(".")
        assert_gold_equals_pg(lake.gold(schema, name), pg_db, table)
