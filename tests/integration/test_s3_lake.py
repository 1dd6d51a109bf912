"""A lake on S3 (`lake: s3a://bucket/prefix`) against a real S3-compatible endpoint (`moto_server`, tests/s3server.py),
through the real CLI: the initial copy, inserts, updates, deletes, a column type change and a TRUNCATE, a crash in
each window of tests/integration/test_faults.py (extract: after placing a bronze object with one conditional PUT,
before advancing the slot; decode: after the `_catalog` commit, before silver's; merge: after the first table's gold
commit, before the other tables and `_runs`), a small batch's decode written in the driver and committed by delta-rs,
an idle sync that starts no JVM, a small batch decoded and merged in the CLI's own process (no JVM), replays
(`--dest` and in place), recoveries (`--to s3a://...`, into PostgreSQL) and an undo in the CLI's process too. Gold
equals PostgreSQL row by row after every phase (read with delta-rs through the configured endpoint), and at the end
every Delta table in the bucket reads the same through delta-rs and Spark (s3a). Plus: a bronze object is never
replaced.

The runs killed inside their Spark app spark-submit it (the S3 jars and settings on spark-submit's command line);
the others run their apps in a `slotlake spark-server` started for this lake (`SLOTLAKE_SPARK_SERVER`), whose
session got the same S3 settings at its start: both paths a user of an s3a lake has, and one JVM start for the
test's five other apps instead of one each.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import clirun  # noqa: E402
from delta_readers import check_bucket, read_delta_rs  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402
from pgclock import run_sql  # noqa: E402
from slotlake import bronze, delta_log, storage  # noqa: E402
from slotlake.config import SPARK_SERVER_ENV, load_config  # noqa: E402
from slotlake.errors import ExtractError  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402
from sparkserver import free_port, spark_server  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.spark_submit]  # s3a: the apps need its S3 settings and jars; kills in apps

SOURCE = "shop"
TABLES = ["public.items", "public.notes"]
FULL = "public.events"  # REPLICA IDENTITY FULL, duplicate rows: changed only in phase 5 (gold read on S3 there)


def write_config(path: Path, s3_server, bucket: str, dsn: str, server: str | None = None) -> Path:
    spark = f'{{master: "local[2]", server: "{server}"}}' if server else '{master: "local[2]"}'
    path.write_text(f"lake: s3a://{bucket}/slotlake\n{s3_server.storage_yaml()}"
                    f"spark: {spark}\n"
                    "extract: {upto_nchanges: 30}\n"  # a few bronze objects per run
                    f"sources:\n  {SOURCE}:\n    dsn: {dsn}\n    tables: [{', '.join([*TABLES, FULL])}]\n")
    return path


def sync(cfg: Path, failpoint: str | None = None) -> tuple[dict, str]:
    if failpoint:
        return {}, clirun.sync_crashes(cfg, SOURCE, failpoint, "--json").stderr
    out = clirun.sync_ok(cfg, SOURCE, "--json")
    return json.loads(out.stdout), out.stderr


def slot_confirmed(dsn: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        (lsn,) = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                              (f"slotlake_{SOURCE}",)).fetchone()
    return Lsn.parse(str(lsn))


def silver_end(paths: LakePaths) -> str | None:
    """Silver's decode watermark, from its Delta log on S3 (None: nothing decoded yet)."""
    if not delta_log.is_delta_table(paths.changes):
        return None
    last = delta_log.latest_slotlake_commit(paths.changes, "decode")
    return last.end_lsn if last else None


def gold_mark(paths: LakePaths, table: str) -> str | None:
    """A gold table's merge watermark, from its Delta log on S3."""
    last = delta_log.latest_slotlake_commit(paths.gold(*table.split(".")), "merge")
    return last.end_lsn if last else None


def silver_writer(paths: LakePaths) -> str:
    """The engine of silver's newest commit (its commitInfo's engineInfo), read from its Delta log on S3."""
    return next(delta_log.commits(paths.changes)).engine


def run_ends(paths: LakePaths) -> set[str]:
    """The end LSNs of the complete merge runs in `_runs` (read with delta-rs through the endpoint)."""
    return {str(Lsn(v)) for v in read_delta_rs(paths.runs).column("run_end_lsn").to_pylist()}


def assert_gold(paths: LakePaths, dsn: str) -> None:
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), dsn, t)


@pytest.fixture
def s3_spark_server(tmp_path, s3_server, s3_bucket, pg_db, monkeypatch):
    """A `slotlake spark-server` for the test's s3a lake, named in `SLOTLAKE_SPARK_SERVER` for the CLI runs (which
    drop it for a failpoint inside a Spark app: tests/clirun.py)."""
    address = f"127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "server.yaml", s3_server, s3_bucket, pg_db, server=address)
    with spark_server(config, tmp_path / "server.log") as server:
        monkeypatch.setenv(SPARK_SERVER_ENV, address)
        yield
    assert server.returncode == 0, (tmp_path / "server.log").read_text()[-3000:]


def test_workload_on_an_s3a_lake_through_the_cli(pg_db, tmp_path, s3_server, s3_bucket, s3_spark_server):
    cfg = write_config(tmp_path / "slotlake.yaml", s3_server, s3_bucket, pg_db)
    lake = load_config(str(cfg))  # also points this process's slotlake.storage at the endpoint
    assert lake.lake == f"s3a://{s3_bucket}/slotlake" and lake.storage is not None
    paths = LakePaths.of(lake.lake, SOURCE)
    run_sql(pg_db,
            "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(10,2), at timestamptz)",
            "CREATE TABLE notes (id bigint PRIMARY KEY, body text)",
            "INSERT INTO items SELECT g, 'item ' || g, g % 7, g * 1.25, '2024-01-01'::timestamptz + g * interval '1h' "
            "FROM generate_series(1, 200) g",
            "INSERT INTO notes SELECT g, repeat('n', g) FROM generate_series(1, 50) g",
            "CREATE TABLE events (kind text, n int)", "ALTER TABLE events REPLICA IDENTITY FULL",
            "INSERT INTO events SELECT 'k' || (g % 4), g % 3 FROM generate_series(1, 24) g")

    # 1. the first sync: publication, slot, the initial copy (parts and records on S3), loaded into gold in the CLI's
    # own process (the bootstrap catalog and each table's version 0 put on S3 with conditional PUTs), no Spark app
    report, log = sync(cfg)
    assert clirun.launched_apps(log) == [], log[-3000:]
    assert all(f"snapshot load {t} in this process" in log for t in [*TABLES, FULL]), log[-3000:]
    assert_gold(paths, pg_db)
    keys = s3_server.keys(s3_bucket, "slotlake/shop/")
    assert any(k.startswith("slotlake/shop/bronze/snapshot/public.items/") and k.endswith(".parquet") for k in keys)
    assert any(k.startswith("slotlake/shop/bronze/snapshot/_generations/") for k in keys)
    assert any(k.startswith("slotlake/shop/bronze/catalog/") for k in keys)  # the bootstrap catalog read
    assert not any("/." in k or k.endswith(".tmp") for k in keys if "/bronze/" in k)  # nothing half-written
    assert {m["table"] for m in report["merged"]} == {*TABLES, FULL}, report["merged"]  # counts from the S3 logs

    # 2. inserts, updates, deletes; the first sync dies right after placing a bronze object (one PUT), before the
    # slot moved: the next sync archives nothing twice
    run_sql(pg_db,
            "INSERT INTO items SELECT g, 'new ' || g, 1, 2.50, now() FROM generate_series(201, 260) g",
            "UPDATE items SET qty = qty + 100, name = name || '!' WHERE id % 5 = 0",
            "DELETE FROM items WHERE id % 11 = 0",
            "UPDATE notes SET body = upper(body) WHERE id < 10",
            "ALTER TABLE notes ALTER COLUMN body TYPE varchar(500)",
            "DELETE FROM notes WHERE id > 45")
    before = slot_confirmed(pg_db)
    _, log = sync(cfg, "extract_after_write")
    assert "failpoint extract_after_write" in log, log[-3000:]
    placed = bronze.list_bronze(paths.root)
    assert placed and placed[-1].path.startswith(f"s3a://{s3_bucket}/") and placed[-1].end_lsn > before
    assert slot_confirmed(pg_db) == before  # the object is durable, the slot not advanced
    # the decode window: the next sync archives the rest, commits the ALTER's new catalog version to `_catalog` on S3
    # and dies before silver's commit; the one after re-applies the catalog (nothing added) and finishes
    catalog_before = read_delta_rs(paths.catalog).num_rows
    silver_before = silver_end(paths)
    _, log = sync(cfg, "decode_after_catalog")
    assert "submitting slotlake-" in log, log[-3000:]  # a kill inside the app: spark-submit, not the server
    assert silver_end(paths) == silver_before  # silver did not move...
    catalog_rows = read_delta_rs(paths.catalog).num_rows
    assert catalog_rows > catalog_before  # ...but the catalog commit landed on S3: the window was really hit
    report, log = sync(cfg)
    assert "on the Spark server at" in log and "submitting slotlake-" not in log, log[-3000:]  # the lake's server
    assert silver_end(paths) != silver_before
    # a small batch on S3 is decoded in the driver: its files written there, placed on S3, committed by delta-rs
    assert silver_writer(paths).startswith("delta-rs"), silver_writer(paths)
    assert read_delta_rs(paths.catalog).num_rows == catalog_rows
    assert report["spark_skipped"] is False and report["merged"], report
    assert_gold(paths, pg_db)
    files = bronze.list_bronze(paths.root)
    assert all(b.start_lsn >= a.end_lsn for a, b in zip(files, files[1:])), files  # no LSN range twice
    with psycopg.connect(pg_db, autocommit=True) as conn:
        point = Lsn.parse(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))
        conn.execute("CREATE SCHEMA recorded")  # the state at `point`, for recover
        for t in TABLES:
            name = t.split(".")[1]
            conn.execute(f"CREATE TABLE recorded.{name} AS TABLE {t}")

    # 3. TRUNCATE, then new rows and an update in the same batch
    run_sql(pg_db, "TRUNCATE items",
            "INSERT INTO items VALUES (1, 'after truncate', 1, 9.99, now()), (2, 'b', 2, 0.01, NULL)",
            "UPDATE items SET qty = 3 WHERE id = 2",
            "INSERT INTO notes VALUES (1000, 'late')")
    # the merge window: dies right after the first table's gold commit on S3, before the other table and `_runs`
    silver_before = silver_end(paths)
    sync(cfg, "merge_after_first_table")
    end = silver_end(paths)
    assert end != silver_before  # this run's decode finished
    marks = {t: gold_mark(paths, t) for t in TABLES}
    assert end in marks.values() and set(marks.values()) != {end}, (end, marks)  # one table committed, not both
    assert end not in run_ends(paths)
    report, _ = sync(cfg)
    assert silver_end(paths) == end  # nothing new: the re-run only finished the merge
    assert_gold(paths, pg_db)
    assert report["merged"], report
    for t in TABLES:  # each table holds this run's changes exactly once: the committed one was not merged again
        commits = [c for c in delta_log.commits(paths.gold(*t.split("."))) if c.end_lsn == end]
        assert len(commits) == 1, (t, commits)
    assert end in run_ends(paths)  # the run is complete in _runs (read from S3 with delta-rs)

    # 4. nothing new: decided from the Delta logs and bronze on S3, no Spark app, no JVM
    report, log = sync(cfg)
    assert report["spark_skipped"] is True, report["spark"]
    assert report["spark"].startswith("decode and merge skipped: nothing new"), report["spark"]
    assert clirun.launched_apps(log) == []  # run_spark_app was never called: no spark-submit, no JVM
    assert delta_log.readable(paths.root) and delta_log.latest_slotlake_commit(paths.changes, "decode")

    # 5. a small batch (inserts, updates, deletes, a key change; in the FULL-identity table a copy of a duplicated row
    # deleted, one updated, one more inserted: its MERGE counts gold's copies, read from S3): decoded and merged in
    # the CLI's own process, no Spark app, no JVM: bronze copied from S3, silver's files and gold's MERGEs written
    # by delta-rs on S3 (conditional PUTs of the log entries), `_runs` appended to, gold == PostgreSQL
    assert_gold_equals_pg(paths.gold("public", "events"), pg_db, FULL)
    before = silver_end(paths)
    run_sql(pg_db,
            "DELETE FROM events WHERE ctid = (SELECT min(ctid) FROM events WHERE kind = 'k1' AND n = 1)",
            "UPDATE events SET n = 7 WHERE ctid = (SELECT min(ctid) FROM events WHERE kind = 'k2' AND n = 2)",
            "INSERT INTO events VALUES ('k3', 0), ('k0', NULL)",
            "INSERT INTO items SELECT g, 'late ' || g, g, 1.50, now() FROM generate_series(300, 340) g",
            "UPDATE items SET qty = qty * 2 WHERE id BETWEEN 300 AND 310")
    with psycopg.connect(pg_db, autocommit=True) as conn:  # a point inside the batch, for recover (phase 6)
        inside = Lsn.parse(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))
        conn.execute("CREATE SCHEMA inside")
        for t in TABLES:
            conn.execute(f"CREATE TABLE inside.{t.split('.')[1]} AS TABLE {t}")
    with psycopg.connect(pg_db) as conn:  # a transaction to undo (phase 6)
        deleted = conn.execute("SELECT * FROM items WHERE id = 2").fetchall()
        conn.execute("DELETE FROM items WHERE id = 2")
        bad_xid = int(conn.execute("SELECT txid_current() % 4294967296").fetchone()[0])
        conn.commit()
    assert len(deleted) == 1
    run_sql(pg_db,
            "INSERT INTO notes SELECT g, repeat('t', 400) || g FROM generate_series(2000, 2005) g",
            "UPDATE notes SET id = id + 100 WHERE id = 2005")
    report, log = sync(cfg)
    assert clirun.launched_apps(log) == [] and "in this process" in log, log[-3000:]
    assert "1 slice(s) decoded and 1 merged in this process" in log, log[-3000:]
    assert silver_writer(paths).startswith("delta-rs"), silver_writer(paths)
    assert_gold(paths, pg_db)
    assert_gold_equals_pg(paths.gold("public", "events"), pg_db, FULL)
    end = silver_end(paths)
    assert end in run_ends(paths), (end, run_ends(paths))
    for t in [*TABLES, FULL]:
        last = next(delta_log.commits(paths.gold(*t.split("."))))
        assert last.end_lsn == end, (t, last)
    # ...and replayed in the CLI's process too: into new tables in the bucket (`--dest`), then in place (silver's
    # files of the range re-derived and replaced on S3, each gold table rewritten in one commit): no Spark app,
    # both equal to PostgreSQL (nothing changed since), the scratch tables in a local folder (none in the bucket)
    out = clirun.slotlake(cfg, "replay", SOURCE, "--from", before, "--to", end, "--dest",
                          f"s3a://{s3_bucket}/replayed")
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [] and "(in this process, " in out.stderr, \
        out.stderr[-3000:]
    for t in [*TABLES, FULL]:
        assert_gold_equals_pg(f"s3a://{s3_bucket}/replayed/{t.replace('.', '/')}", pg_db, t)
    versions = {t: next(delta_log.commits(paths.gold(*t.split(".")))).version for t in [*TABLES, FULL]}
    out = clirun.slotlake(cfg, "replay", SOURCE, "--from", before, "--to", end)
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [] and "(in this process, " in out.stderr, \
        out.stderr[-3000:]
    assert_gold(paths, pg_db)
    assert_gold_equals_pg(paths.gold("public", "events"), pg_db, FULL)
    for t in [*TABLES, FULL]:
        last = next(delta_log.commits(paths.gold(*t.split("."))))
        assert last.version == versions[t] + 1 and "replay" in (last.slotlake or {}), (t, last)
    assert silver_end(paths) == end
    assert not [k for k in s3_server.keys(s3_bucket, "slotlake/shop/") if "/_replay/" in k]

    # 6. recover both tables as of `point` into the bucket, compared with PostgreSQL as it was then: the Spark app
    # (the replay to it holds the column type change: several column layouts, which the in-process merge declines)
    out = clirun.slotlake(cfg, "recover", SOURCE, "--as-of", str(point), "--table", TABLES[0], "--table", TABLES[1],
                          "--to", f"s3a://{s3_bucket}/out", "--json", timeout=1200)
    assert out.returncode == 0, out.stderr[-4000:]
    assert clirun.launched_apps(out.stderr) == ["recover"] and "several column layouts" in out.stderr, \
        out.stderr[-3000:]
    for t in TABLES:
        name = t.split(".")[1]
        assert_gold_equals_pg(f"s3a://{s3_bucket}/out/public/{name}", pg_db, f"recorded.{name}")
    # ...and as of the point inside phase 5's batch, into the bucket and into PostgreSQL, in the CLI's process (no
    # Spark app): gold's state at phase 4's run copied, the batch's first transactions re-decoded and merged
    out = clirun.slotlake(cfg, "recover", SOURCE, "--as-of", str(inside), "--table", TABLES[0], "--table", TABLES[1],
                          "--to", f"s3a://{s3_bucket}/inside", timeout=1200)
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [] and "in this process" in out.stderr, \
        "\n".join(x for x in out.stderr.splitlines() if "declined" in x) or out.stderr[-3000:]
    for t in TABLES:
        name = t.split(".")[1]
        assert_gold_equals_pg(f"s3a://{s3_bucket}/inside/public/{name}", pg_db, f"inside.{name}")
    out = clirun.slotlake(cfg, "recover", SOURCE, "--as-of", str(inside), "--table", TABLES[0], "--table", TABLES[1],
                          "--to", pg_db, "--into-schema", "rec", timeout=1200)
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [], out.stderr[-3000:]
    with psycopg.connect(pg_db) as conn:
        for t in TABLES:
            name = t.split(".")[1]
            for a, b in ((f"rec.{name}", f"inside.{name}"), (f"inside.{name}", f"rec.{name}")):
                [(extra,)] = conn.execute(f"SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) x").fetchall()
                assert extra == 0, f"{a} holds {extra} row(s) {b} does not"

    # ...and the undo of phase 5's delete, built in the CLI's process (no Spark app), applied with psql: the row is
    # back as it was
    script = tmp_path / "undo.sql"
    out = clirun.slotlake(cfg, "undo", SOURCE, "--xid", str(bad_xid), "--out", str(script), timeout=1200)
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [] and "in this process" in out.stderr, \
        "\n".join(x for x in out.stderr.splitlines() if "declined" in x) or out.stderr[-3000:]
    from slotlake_dev.localpg import pg_bindir

    applied = subprocess.run([str(pg_bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", pg_db],
                             input=script.read_text(), capture_output=True, text=True, timeout=300)
    assert applied.returncode == 0, applied.stderr
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT * FROM items WHERE id = 2").fetchall() == deleted

    # 7. every Delta table in the bucket (gold, silver, _catalog, _runs, the recovered ones) through delta-rs and
    # Spark (s3a), in a process whose Spark session has the S3 jars
    n, _ = check_bucket(str(cfg), f"s3a://{s3_bucket}")
    assert n >= len(TABLES) * 2 + 3, n


def test_deletion_vectors_on_an_s3a_lake_without_spark(pg_db, tmp_path, s3_server, s3_bucket, s3_spark_server):
    """`deletion_vectors: true` on an s3a lake: after Spark's initial copy, small batches are merged in the CLI's
    process by marking gold's rows in deletion vectors (merge/dv_merge.py: the vector files and the log entry put on
    S3 with conditional PUTs, nothing of gold rewritten), the FULL-identity table's new rows appended; then a replay
    in place (gold overwritten by `dv_merge.overwrite` on S3, its vectors kept on), a recovery as of a point between
    two batches into the bucket (gold read through its vectors on S3), another batch marked on top of the
    overwrite, `slotlake optimize` (files and vectors folded on S3) and a batch after it: all in the CLI's process.
    Gold equals PostgreSQL after each step, the recovery PostgreSQL's state at that point; every table in the bucket
    reads the same through delta-rs and Spark (s3a)."""
    from delta_readers import deletion_vectors
    from slotlake.merge.dv_merge import ENGINE

    cfg = tmp_path / "dv.yaml"
    cfg.write_text(f"lake: s3a://{s3_bucket}/dv\n{s3_server.storage_yaml()}spark: {{master: \"local[2]\"}}\n"
                   f"sources:\n  {SOURCE}:\n    dsn: {pg_db}\n    tables: [public.items, {FULL}]\n"
                   "    deletion_vectors: true\n")
    lake = load_config(str(cfg))
    paths = LakePaths.of(lake.lake, SOURCE)
    items, events = paths.gold("public", "items"), paths.gold("public", "events")
    run_sql(pg_db,
            "CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(10,2), at timestamptz)",
            "INSERT INTO items SELECT g, 'item ' || g, g % 7, g * 1.25, '2024-01-01'::timestamptz + g * interval '1h' "
            "FROM generate_series(1, 3000) g",
            "CREATE TABLE events (kind text, n int)", "ALTER TABLE events REPLICA IDENTITY FULL",
            "INSERT INTO events SELECT 'k' || (g % 4), g % 3 FROM generate_series(1, 24) g")

    def check() -> None:
        assert_gold_equals_pg(items, pg_db, "public.items")
        assert_gold_equals_pg(events, pg_db, FULL)

    def in_process(statements: list[str]) -> None:
        run_sql(pg_db, *statements)
        _, log = sync(cfg)
        assert clirun.launched_apps(log) == [] and "(in this process, without Spark)" in log, log[-3000:]
        check()

    _, log = sync(cfg)  # the initial copies: Spark loads them (the lake's server), deletion vectors on
    assert "on the Spark server at" in log, log[-3000:]
    assert deletion_vectors(items) and deletion_vectors(events)
    check()
    files_before = set(delta_log.snapshot(items).files)
    in_process(["UPDATE items SET qty = qty + 100 WHERE id % 97 = 0", "DELETE FROM items WHERE id % 101 = 0",
                "INSERT INTO items SELECT g, 'new', 1, 2.50, now() FROM generate_series(5000, 5019) g",
                "INSERT INTO events VALUES ('k9', 9), ('k9', 9)"])
    newest = next(delta_log.commits(items))
    assert (newest.engine, newest.operation) == (ENGINE, "MERGE"), newest
    assert newest.metrics["numTargetRowsCopied"] == 0 and newest.metrics["numTargetDeletionVectorsAdded"] >= 1
    after = delta_log.snapshot(items)
    assert files_before <= set(after.files) and len(after.files) == len(files_before) + 1  # nothing rewritten
    vectors = [a["deletionVector"] for a in after.files.values() if a.get("deletionVector")]
    assert vectors and all(v["storageType"] == "u" for v in vectors), vectors  # vector files, on S3
    assert any("deletion_vector_" in k for k in s3_server.keys(s3_bucket, "dv/shop/gold/public/items/"))
    assert (next(delta_log.commits(events)).engine, next(delta_log.commits(events)).operation) == (ENGINE, "WRITE")
    start = silver_end(paths)
    with psycopg.connect(pg_db, autocommit=True) as conn:  # the state between two batches, for recover
        point = Lsn.parse(str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]))
        conn.execute("CREATE SCHEMA recorded")
        conn.execute("CREATE TABLE recorded.items AS TABLE items")
    in_process(["UPDATE items SET name = 'again' WHERE id % 89 = 0", "DELETE FROM items WHERE id BETWEEN 10 AND 30",
                "UPDATE items SET qty = 0 WHERE id = 5000"])
    end = silver_end(paths)

    # a replay in place of the range, in this process: each gold table overwritten in one commit, vectors on
    version = next(delta_log.commits(items)).version
    out = clirun.slotlake(cfg, "replay", SOURCE, "--from", str(start), "--to", str(end))
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [] and "(in this process, " in out.stderr, \
        out.stderr[-3000:]
    last = next(delta_log.commits(items))
    assert (last.version, last.engine, last.operation) == (version + 1, ENGINE, "WRITE"), last
    assert "replay" in (last.slotlake or {}) and last.end_lsn == end, last
    assert deletion_vectors(items)
    assert not any(a.get("deletionVector") for a in delta_log.snapshot(items).files.values())
    check()

    # recover as of `point` into the bucket, in this process: gold's state then, read through its vectors on S3
    out = clirun.slotlake(cfg, "recover", SOURCE, "--as-of", str(point), "--table", "public.items",
                          "--to", f"s3a://{s3_bucket}/dv_out", timeout=1200)
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [] and "in this process" in out.stderr, \
        "\n".join(x for x in out.stderr.splitlines() if "declined" in x) or out.stderr[-3000:]
    assert_gold_equals_pg(f"s3a://{s3_bucket}/dv_out/public/items", pg_db, "recorded.items")

    # a batch marked on top of the overwrite, then `slotlake optimize` folds both tables' files and vectors on S3
    in_process(["UPDATE items SET qty = qty - 1 WHERE id % 13 = 0", "DELETE FROM items WHERE id % 113 = 0"])
    assert any(a.get("deletionVector") for a in delta_log.snapshot(items).files.values())
    mark, files = delta_log.latest_slotlake_commit(items), len(delta_log.snapshot(items).files)
    out = clirun.slotlake(cfg, "optimize", SOURCE, "--json")
    assert out.returncode == 0 and clirun.launched_apps(out.stderr) == [], out.stderr[-3000:]
    done = {d["table"]: d for d in json.loads(out.stdout)}
    assert done["public.items"]["files_removed"] == files >= 2 and done["public.items"]["vectors_removed"] >= 1, done
    assert len(delta_log.snapshot(items).files) == 1 and delta_log.latest_slotlake_commit(items) == mark
    check()
    in_process(["UPDATE items SET name = 'after optimize' WHERE id % 7 = 0"])
    n, _ = check_bucket(str(cfg), f"s3a://{s3_bucket}/dv")
    assert n >= 5, n  # gold x2, silver, _catalog, _runs
    m, _ = check_bucket(str(cfg), f"s3a://{s3_bucket}/dv_out")
    assert m == 1, m


def test_a_bronze_object_is_never_replaced(s3_server, s3_bucket, tmp_path, monkeypatch):
    storage.configure(storage.StorageSettings(endpoint=s3_server.endpoint, region="us-east-1", path_style=True))
    root = f"s3a://{s3_bucket}/lake/shop"
    first = bronze.tmp_path(root, Lsn(0x10))
    first.write_bytes(b"first")
    placed = bronze.place(first, Lsn(0x10), Lsn(0x20), root)
    assert placed.path == f"s3a://{s3_bucket}/lake/shop/bronze/{bronze.bronze_name(Lsn(0x10), Lsn(0x20))}"
    assert not first.exists()  # the local scratch file is gone once the PUT returned
    second = bronze.tmp_path(root, Lsn(0x10))
    second.write_bytes(b"second")
    with pytest.raises(ExtractError, match="already exists; bronze files are immutable"):
        bronze.place(second, Lsn(0x10), Lsn(0x20), root)  # If-None-Match: * -> 412
    files = storage.files_for(placed.path)
    with pytest.raises(FileExistsError):
        files.put_new(placed.path, b"third")
    assert files.read_bytes(placed.path) == b"first" and files.size(placed.path) == len(b"first")
    with pytest.raises(FileNotFoundError):
        files.size(f"{root}/bronze/nope.parquet")
    assert [f.path for f in bronze.list_bronze(root)] == [placed.path]
    assert s3_server.keys(s3_bucket) == [f"lake/shop/bronze/{bronze.bronze_name(Lsn(0x10), Lsn(0x20))}"]
    # a small batch's files are copied for the decode in the driver (names and LSNs kept); a bigger one is not read
    from slotlake.decode import job

    staged = job._staged_bronze(bronze.list_bronze(root), str(tmp_path))
    assert staged is not None and [(f.name, f.start_lsn, f.end_lsn) for f in staged] == [
        (placed.name, placed.start_lsn, placed.end_lsn)] and Path(staged[0].path).read_bytes() == b"first"
    monkeypatch.setattr(job, "IN_DRIVER_BRONZE_BYTES", len(b"first") - 1)
    assert job._staged_bronze(bronze.list_bronze(root), str(tmp_path / "big")) is None
    assert not (tmp_path / "big").exists()
    # the in-process decode's slice: the longest prefix within its bytes (none here), nothing downloaded past it
    assert job._staged_bronze(bronze.list_bronze(root), str(tmp_path), max_bytes=len(b"first") - 1,
                              whole=False) == []
    # a file copied from S3 streamed to disk; pyarrow reads the lake's files through `storage.arrow_files`
    files.get_file(placed.path, str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == b"first"
    with pytest.raises(FileNotFoundError):
        files.get_file(f"{root}/bronze/nope.parquet", str(tmp_path / "nope"))
    fs, key = storage.arrow_files(placed.path)
    assert key == placed.path[len("s3a://"):]
    with fs.open_input_stream(key) as f:
        assert f.read() == b"first"
    # a folder removed with everything under it (a replay's `--dest` tables when it declines); nothing else
    files.put_new(f"{root}/_x/t/_delta_log/0.json", b"{}")
    files.put_new(f"{root}/_x/t/part.parquet", b"p")
    files.remove_tree(f"{root}/_x")
    assert s3_server.keys(s3_bucket) == [f"lake/shop/bronze/{bronze.bronze_name(Lsn(0x10), Lsn(0x20))}"]
