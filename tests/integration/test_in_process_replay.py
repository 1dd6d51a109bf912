"""`slotlake replay` without a JVM (slotlake.recover.replay_in_process), with real PostgreSQL and the real CLI:
every recorded range, one range over several syncs (several slices) and a range given by time are rebuilt into
`--dest` in the CLI's own process and equal the table as PostgreSQL held it at the range's end (recorded with
`CREATE TABLE recorded.<t>_<i> AS SELECT *`, an unpublished schema); the same replay through the Spark app
(`spark.in_process_bytes: 0`) writes the same rows, `_slotlake_` columns included; an in-place replay (twice), and
a backfill of the recorded intervals in place, leave the lake equal to PostgreSQL and silver's rows as they were;
a range the in-process merge cannot write exactly (a new column) goes to the Spark app and still comes out right.
`slotlake recover` of the recorded states runs in the CLI's process too (into Delta and into PostgreSQL) and writes
what the recover Spark app writes."""
from __future__ import annotations

import collections
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from clirun import launched_apps, slotlake, sync_ok  # noqa: E402
from delta_readers import read_delta_rs  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake import delta_log  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

TABLES = ["public.items", "public.hist", "public.events"]


def _config(path: Path, dsn: str, in_process_bytes: int | None) -> Path:
    spark: dict = {"master": "local[2]"}
    if in_process_bytes is not None:
        spark["in_process_bytes"] = in_process_bytes
    path.write_text(json.dumps({"lake": str(path.parent / "lake"), "spark": spark,
                                "extract": {"upto_nchanges": 60},  # many small bronze files: several slices
                                "sources": {"src": {"dsn": dsn, "tables": TABLES}}}))
    return path


def _sql(dsn: str, *statements: str) -> datetime:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def _phase(dsn: str, i: int) -> None:
    """~40 transactions: a hot row, updates, inserts, deletes of keys inserted in earlier transactions, FULL rows
    (two equal ones each time) and rows of a table without identity."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for j in range(40):
            k = i * 100 + j
            with conn.transaction():
                conn.execute("UPDATE items SET n = n + 1, name = 'hot' || %s, price = price + 0.01 WHERE id = 7",
                             (k,))
                conn.execute("UPDATE items SET n = n * 2 WHERE id BETWEEN %s AND %s", (j + 10, j + 13))
                conn.execute("INSERT INTO items VALUES (%s, 'new', %s)", (1000 + k, j))
                if j >= 10:
                    conn.execute("DELETE FROM items WHERE id = %s", (1000 + k - 10,))
                conn.execute("INSERT INTO hist SELECT %s, 'r' || %s, TIMESTAMPTZ '2024-01-01 00:00+00' + "
                             "%s * interval '1 hour' FROM generate_series(1, 2)", (j % 7, k, j % 5))
                conn.execute("INSERT INTO events VALUES (%s, 'e')", (j % 3,))


def _record(dsn: str, i: int) -> datetime:
    return _sql(dsn, *[f"CREATE TABLE recorded.{t.split('.')[1]}_{i} AS SELECT * FROM {t}" for t in TABLES])


def _replay(cfg: Path, frm: str, to: str, dest: Path, *more: str) -> str:
    # A Spark replay is a spark-submit of its own: on the worker's shared Spark server it once failed with "RDD ...
    # was locally checkpointed, its lineage has been truncated" (then ran again by spark-submit), and the next test
    # on that worker found the server unable to take its apps.
    out = slotlake(cfg, "replay", "src", "--from", frm, "--to", to, "--dest", str(dest), *more, server=False)
    assert out.returncode == 0, f"replay failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stderr


def _no_file_over_a_slice(paths: LakePaths, after: Lsn, slice_bytes: int) -> None:
    """No silver file with changes after `after` spans bronze files of more than `slice_bytes` in all."""
    from slotlake.bronze import list_bronze
    from slotlake.merge.watermarks import silver_file_stats

    bronze = list_bronze(paths.root)
    for f in silver_file_stats(paths.changes) or ():
        assert f.commit_end_lsn_min is not None and f.commit_end_lsn_max is not None, f
        if f.commit_end_lsn_min <= after.value:
            continue
        spanned = [b for b in bronze if b.end_lsn.value >= f.commit_end_lsn_min
                   and b.start_lsn.value < f.commit_end_lsn_max]
        size = sum(Path(b.path).stat().st_size for b in spanned)
        assert size <= slice_bytes, (f.path, [b.name for b in spanned], size, slice_bytes)


def _no_file_across(paths: LakePaths, ends: list[Lsn]) -> None:
    """No silver file holds changes on both sides of a run's end (`ends`)."""
    from slotlake.merge.watermarks import silver_file_stats

    for f in silver_file_stats(paths.changes) or ():
        assert f.commit_end_lsn_min is not None and f.commit_end_lsn_max is not None, f
        assert not any(f.commit_end_lsn_min <= e.value < f.commit_end_lsn_max for e in ends), (f, ends)


def _by_spark(log: str) -> bool:
    """Whether the replay's log says the Spark app did it and this process did not."""
    return launched_apps(log) == ["replay"] and "(in this process, " not in log


def _rows(path: Path) -> collections.Counter:
    """Every row of the Delta table (all columns, lists included), read with delta-rs, as comparable text."""
    return collections.Counter(json.dumps(r, sort_keys=True, default=str) for r in read_delta_rs(str(path)).to_pylist())


def _same_pg_table(dsn: str, got: str, want: str) -> None:
    """Two PostgreSQL tables hold the same columns (names, types with typmods) and the same bag of rows."""
    with psycopg.connect(dsn) as conn:
        def columns(table: str) -> list[tuple]:
            return conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                                "%s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()

        assert columns(got) == columns(want), (got, want)
        for a, b in ((got, want), (want, got)):
            [(extra,)] = conn.execute(f"SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) x").fetchall()
            assert extra == 0, f"{a} holds {extra} row(s) {b} does not"
        assert conn.execute(f"SELECT count(*) FROM {got}").fetchone()[0] > 0, got


def test_replays_into_dest_run_in_process_and_equal_postgres_and_the_spark_replay(pg_db, tmp_path):
    _sql(pg_db,
         "CREATE TABLE items (id int PRIMARY KEY, name text, n bigint, price numeric(12,2) DEFAULT 1.10)",
         "CREATE TABLE hist (a int, b text, t timestamptz)", "ALTER TABLE hist REPLICA IDENTITY FULL",
         "CREATE TABLE events (k int, v text)", "ALTER TABLE events REPLICA IDENTITY NOTHING",
         "CREATE SCHEMA recorded",
         "INSERT INTO items SELECT g, 'n' || g, g FROM generate_series(1, 100) g")
    cfg = _config(tmp_path / "slotlake.yaml", pg_db, None)
    paths = LakePaths.of(str(tmp_path / "lake"), "src")
    sync_ok(cfg, "src")  # the initial copies (Spark loads them)
    _phase(pg_db, 0)
    sync_ok(cfg, "src")
    # slices of about two bronze files of this workload, for the syncs and the replays alike
    biggest = max(f.stat().st_size for f in Path(paths.root, "bronze").glob("*.parquet"))
    _config(cfg, pg_db, 2 * biggest + biggest // 2)
    ends = [delta_log.stage_end(paths.changes, "decode")]
    times = [_record(pg_db, 0)]
    for i in range(1, 4):
        _phase(pg_db, i)
        sync_ok(cfg, "src")
        ends.append(delta_log.stage_end(paths.changes, "decode"))
        times.append(_record(pg_db, i))
    assert ends == sorted(ends) and len(set(ends)) == len(ends)

    # each recorded range, and the three together (more slices than one sync's), in this process
    for i, (frm, to) in [(i, (ends[i - 1], ends[i])) for i in range(1, 4)] + [(3, (ends[0], ends[3]))]:
        dest = tmp_path / f"dest_{frm}_{to}".replace("/", "-")
        log = _replay(cfg, str(frm), str(to), dest)
        assert launched_apps(log) == [] and "in this process" in log, log[-3000:]
        for t in TABLES:
            name = t.split(".")[1]
            assert_gold_equals_pg(str(dest / "public" / name), pg_db, f"recorded.{name}_{i}")
    slices = re.findall(r"\(in this process, (\d+) slice\(s\)", log)  # the long range's
    assert len(slices) == 1 and int(slices[0]) >= 3, log[-3000:]

    # by time: the commits between the moments states 1 and 2 were recorded, one table
    dest = tmp_path / "dest_by_time"
    log = _replay(cfg, times[1].astimezone(UTC).replace(tzinfo=None).isoformat(), times[2].isoformat(), dest,
                  "--table", "public.items")
    assert launched_apps(log) == [], log[-3000:]
    assert_gold_equals_pg(str(dest / "public" / "items"), pg_db, "recorded.items_2")
    assert not (dest / "public" / "hist").exists()

    # the Spark replay of the long range writes the same rows, `_slotlake_` columns included
    spark_cfg = _config(tmp_path / "spark.yaml", pg_db, 0)
    log = _replay(spark_cfg, str(ends[0]), str(ends[3]), tmp_path / "dest_spark")
    assert _by_spark(log), log[-3000:]
    for t in TABLES:
        name = t.split(".")[1]
        ours = tmp_path / f"dest_{ends[0]}_{ends[3]}".replace("/", "-") / "public" / name
        assert _rows(ours) == _rows(tmp_path / "dest_spark" / "public" / name), t

    # recover (slotlake.recover.point_in_process): each recorded state by LSN into Delta, one by time into
    # PostgreSQL, in this process; the Spark app's recovery of the same point writes the same rows
    tables = [a for t in TABLES for a in ("--table", t)]
    for i in (1, 2, 3):
        out = slotlake(cfg, "recover", "src", "--as-of", str(ends[i]), *tables, "--to", str(tmp_path / f"rec_{i}"),
                       "--json", server=False)
        assert out.returncode == 0, out.stderr[-3000:]
        assert launched_apps(out.stderr) == [] and "in this process" in out.stderr, out.stderr[-3000:]
        assert ends[i - 1] < Lsn.parse(json.loads(out.stdout)["lsn"]) <= ends[i]  # the last commit at or before
        for t in TABLES:
            name = t.split(".")[1]
            assert_gold_equals_pg(str(tmp_path / f"rec_{i}" / "public" / name), pg_db, f"recorded.{name}_{i}")
    out = slotlake(cfg, "recover", "src", "--as-of", times[2].isoformat(), *tables, "--to", pg_db,
                   "--into-schema", "rec_2", server=False)
    assert out.returncode == 0 and launched_apps(out.stderr) == [], out.stderr[-3000:]
    for t in TABLES:
        _same_pg_table(pg_db, f"rec_2.{t.split('.')[1]}", f"recorded.{t.split('.')[1]}_2")
    out = slotlake(spark_cfg, "recover", "src", "--as-of", str(ends[2]), *tables, "--to",
                   str(tmp_path / "rec_spark"), server=False)
    assert out.returncode == 0 and launched_apps(out.stderr) == ["recover"], out.stderr[-3000:]
    for t in TABLES:
        name = t.split(".")[1]
        assert _rows(tmp_path / "rec_2" / "public" / name) == _rows(tmp_path / "rec_spark" / "public" / name), t

    # in place, twice, in this process (under the run lock): the lake still equals PostgreSQL, silver's rows and
    # watermark are what they were, each gold table has a new commit saying so; then the sync goes on from it
    silver_before = _rows(Path(paths.changes))
    for _ in range(2):
        versions = {t: next(delta_log.commits(paths.gold(*t.split(".")))).version for t in TABLES}
        out = slotlake(cfg, "replay", "src", "--from", str(ends[1]), "--to", str(ends[2]), server=False)
        assert out.returncode == 0, out.stderr[-3000:]
        assert launched_apps(out.stderr) == [] and "(in this process, " in out.stderr, \
            "\n".join(x for x in out.stderr.splitlines() if "declined" in x) or out.stderr[-3000:]
        for t in TABLES:
            assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
            last = next(delta_log.commits(paths.gold(*t.split("."))))
            assert last.version == versions[t] + 1 and last.operation == "WRITE", (t, last)
            assert last.end_lsn == str(ends[3]) and "replay" in (last.slotlake or {}), (t, last)
        assert _rows(Path(paths.changes)) == silver_before
        assert delta_log.stage_end(paths.changes, "decode") == ends[3]
        # as the sync's decode writes them, no silver file spans more than a slice of bronze: merges stop between
        # slices (a replayed range written as one file sent a 5 M-change replay's merge to Spark)
        _no_file_over_a_slice(paths, ends[1], 2 * biggest + biggest // 2)
    # a backfill in place, as the replay DAG runs one: the recorded intervals by time, in order, each in this
    # process. A time resolves to the last commit before it, so each replay starts at the run end before that and
    # re-derives the previous interval's run too; its silver files still end where the runs did (a file spanning
    # two runs sent the next interval's merge to Spark: no layout summary for a window that cuts it). Slices of the
    # default size here, so one slice holds both runs.
    _config(cfg, pg_db, None)
    for i in range(1, 4):
        out = slotlake(cfg, "replay", "src", "--from", times[i - 1].isoformat(), "--to", times[i].isoformat(),
                       server=False)
        assert out.returncode == 0, out.stderr[-3000:]
        assert launched_apps(out.stderr) == [] and "(in this process, " in out.stderr, \
            "\n".join(x for x in out.stderr.splitlines() if "declined" in x) or out.stderr[-3000:]
        for t in TABLES:
            assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
        _no_file_across(paths, ends)
    assert _rows(Path(paths.changes)) == silver_before
    _config(cfg, pg_db, 2 * biggest + biggest // 2)
    _sql(pg_db, "INSERT INTO items VALUES (4242, 'after the replay', 1)", "UPDATE items SET n = 0 WHERE id = 7")
    sync_ok(cfg, "src")
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
    _sql(pg_db, "DROP TABLE recorded.items_3, recorded.hist_3, recorded.events_3")
    ends[3] = delta_log.stage_end(paths.changes, "decode")
    _record(pg_db, 3)

    # a new column in the range (beside a key change, a FULL-identity delete and a TRUNCATE, which the in-process
    # merge takes): it declines, the Spark app rebuilds, still exact
    _sql(pg_db, "UPDATE items SET id = 5000 WHERE id = 3", "INSERT INTO hist VALUES (1, 'x', NULL)",
         "DELETE FROM hist WHERE a = 1 AND t IS NULL", "TRUNCATE events", "INSERT INTO events VALUES (7, 'after')",
         "ALTER TABLE events ADD COLUMN note text", "INSERT INTO events VALUES (8, 'noted', 'n')")
    sync_ok(cfg, "src")
    ends.append(delta_log.stage_end(paths.changes, "decode"))
    _record(pg_db, 4)
    dest = tmp_path / "dest_key_change"
    log = _replay(cfg, str(ends[3]), str(ends[4]), dest)
    assert "in this process declined" in log and _by_spark(log), log[-3000:]
    for t in TABLES:
        name = t.split(".")[1]
        assert_gold_equals_pg(str(dest / "public" / name), pg_db, f"recorded.{name}_4")
    # the same in place: declined after silver's rows were replaced (the merge comes after), so the Spark app does
    # it all again; the lake is still PostgreSQL's and silver's rows are what they were
    silver_before = _rows(Path(paths.changes))
    out = slotlake(cfg, "replay", "src", "--from", str(ends[3]), "--to", str(ends[4]), server=False)
    assert out.returncode == 0 and "in this process declined" in out.stderr and _by_spark(out.stderr), \
        out.stderr[-3000:]
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
    assert _rows(Path(paths.changes)) == silver_before
    assert not any(Path(paths.root, "_replay").iterdir())  # scratch tables removed
