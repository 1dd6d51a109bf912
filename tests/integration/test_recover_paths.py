"""Recover's paths with real PostgreSQL, Spark and Delta, each result compared with the recorded state row by row:
history switched on later and only for one table (`history: [public.acct]` after the second sync), and a
`resync` in the middle of the archive.

The workload of test_recover.py runs (points 0-4; syncs after steps 2 and 4). After step 2's sync the config
gains `history: [public.acct]`: acct's history starts at step 4's merge from gold's rows at step 2's end, so
points 0-2 lie before it (replay) and 3-4 after it (acct from history, ev by replay at the same commit LSN).
These recoveries are made before the resync (they are what a user got then) and kept on the Lake. Then
`resync src` (new slot, new copy, gold replaced), more changes and syncs (points 5, 6): every point before and
after the resync must still recover exactly; acct's history restarts from the resync's gold, so points before
the resync are replayed from the old slot's archive.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from integration.test_recover import (
    TABLES,
    Lake,
    _record,
    _recover,
    _sql,
    _sync,
    assert_pg_tables_equal,
    workload_lake,
)
from oracle import assert_gold_equals_pg
from slotlake.lake import LakePaths
from slotlake.merge.history_job import history_coverage
from slotlake.merge.snapshot_job import load_snapshots
from slotlake.source.resync import resync

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

ACCT = ("public.acct",)
HISTORY_FROM_STEP = 2  # history is switched on after this step's sync


def _enable_acct_history(i: int, config_path: Path) -> None:
    if i == HISTORY_FROM_STEP:
        config_path.write_text(config_path.read_text() + "    history: [public.acct]\n")


def _assert_recovered(spark, lake: Lake, dest: str, i: int) -> None:
    for t in TABLES:
        schema, table = t.split(".")
        assert_gold_equals_pg(f"{dest}/{schema}/{table}", lake.dsn, f"recorded.{table}_{i}")


@pytest.fixture(scope="module")
def rlake(pg_server, spark, tmp_path_factory) -> Lake:
    home = tmp_path_factory.mktemp("recover_paths")
    workload = workload_lake(pg_server, spark, home, after_sync=_enable_acct_history)
    lake = next(workload)
    try:
        paths = LakePaths.of(lake.cfg.lake, "src")
        lake.history_before_resync = history_coverage(spark, paths.gold_history("public", "acct"))
        lake.before_resync = {}  # point -> (result, Delta dest) of a recovery made before the resync
        for i in range(len(lake.points)):
            dest = str(home / f"before_resync_{i}")
            lake.before_resync[i] = (_recover(spark, lake, str(lake.points[i][0]), dest), dest)
        # A change the old slot never archives (the resync drops it): the WAL from here to the new consistent point
        # is a gap in the archive.
        _sql(lake.dsn, "UPDATE acct SET owner = 'never archived' WHERE id = 1")
        lake.in_gap = _record(lake.dsn, 99)[0]
        lake.resync = resync(lake.cfg, lake.cfg.source("src"))
        load_snapshots(spark, lake.cfg, "src")  # what `slotlake resync` runs next (the snapshot app)
        _sql(lake.dsn, "UPDATE acct SET owner = 'post' WHERE id IN (1, 4)",  # TOAST note unchanged on 4
             "DELETE FROM acct WHERE id = 5",
             "UPDATE acct SET id = 300 WHERE id = 100",
             "INSERT INTO acct VALUES (5000, 'new', 2, NULL, 'y')",
             "INSERT INTO ev VALUES ('e', 5), ('e', 5)",
             "DELETE FROM ev WHERE kind = 'd'")
        lake.points.append(_record(lake.dsn, 5))
        _sync(spark, lake.cfg)
        _sql(lake.dsn, "UPDATE acct SET balance = 99 WHERE id = 300",
             "DELETE FROM ev WHERE ctid = (SELECT min(ctid) FROM ev WHERE kind = 'e')")
        lake.points.append(_record(lake.dsn, 6))
        _sync(spark, lake.cfg)
        yield lake
        next(workload, None)  # the rest of workload_lake: Spark and delta-rs read every table under `home` the same
    finally:
        workload.close()  # drops the database


def test_history_enabled_later_and_for_one_table_replays_before_its_start(spark, rlake):
    paths = LakePaths.of(rlake.cfg.lake, "src")
    start = rlake.history_before_resync
    assert start is not None, "acct's history should exist after step 4's sync"
    # it started at the second sync's watermark: after point 2's commits, before point 3's
    assert rlake.points[HISTORY_FROM_STEP][0] <= start.history_from < rlake.points[HISTORY_FROM_STEP + 1][0]
    assert history_coverage(spark, paths.gold_history("public", "ev")) is None  # only acct keeps history
    for i, (result, dest) in rlake.before_resync.items():
        expected = ACCT if i > HISTORY_FROM_STEP else ()
        assert result.from_history == expected, i  # before history's start: replay; after: acct from history
        assert [t.table for t in result.tables] == TABLES
        _assert_recovered(spark, rlake, dest, i)  # acct (history) and ev (replay) at one commit LSN


def test_recover_before_and_after_a_resync_into_delta(spark, rlake, tmp_path):
    generation = rlake.resync.snapshot.generation
    assert rlake.points[4][0] < generation < rlake.points[5][0]
    for i in range(len(rlake.points)):
        dest = str(tmp_path / f"lsn_{i}")
        result = _recover(spark, rlake, str(rlake.points[i][0]), dest)
        # acct's history restarted from the resync's gold: points before the resync are replayed
        assert result.from_history == (ACCT if i > 4 else ()), i
        _assert_recovered(spark, rlake, dest, i)
    for i in (4, 6):  # by time as well
        dest = str(tmp_path / f"time_{i}")
        _recover(spark, rlake, rlake.points[i][1].isoformat(), dest)
        _assert_recovered(spark, rlake, dest, i)


def test_a_point_the_archive_never_covered_is_refused(spark, rlake, tmp_path):
    from slotlake.recover.point import RecoverError
    from slotlake.source.copies import current_generation

    gen = current_generation(LakePaths.of(rlake.cfg.lake, "src").root)
    assert gen.reason == "resync" and rlake.points[4][0] <= gen.archived_to < rlake.in_gap < gen.consistent_point
    with pytest.raises(RecoverError, match=r"falls where the archive has nothing: the changes after .* up to the "
                                           r"resync at .* were never archived"):
        _recover(spark, rlake, str(rlake.in_gap), str(tmp_path / "gap"))
    assert not (tmp_path / "gap").exists()  # refused before any work


def test_recover_before_and_after_a_resync_into_postgres(spark, rlake):
    for i in (3, 5):
        result = _recover(spark, rlake, str(rlake.points[i][0]), rlake.dsn, into_schema=f"resync_{i}")
        assert result.target == "postgres"
        for t in ("acct", "ev"):
            assert_pg_tables_equal(rlake.dsn, f"resync_{i}.{t}", f"recorded.{t}_{i}")


# --- delete_mode: soft + history, and recovery into PostgreSQL of the types a user has ---------------------------
TYPED = 'public."Typed"'
TYPED_SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    ('CREATE TABLE "Typed" (id int PRIMARY KEY, tags text[] NOT NULL, nums int[], doc jsonb, uid uuid NOT NULL, '
     '"At" timestamptz, raw bytea, m mood, "Label" text)'),
    "CREATE SCHEMA recorded",
    ("INSERT INTO \"Typed\" SELECT g, ARRAY['t' || g, 'x,y'], ARRAY[g, NULL, -g], "
     "jsonb_build_object('k', g, 'l', jsonb_build_array(1, 'a')), gen_random_uuid(), "
     "'2026-03-29 01:30:00+01'::timestamptz + g * interval '1 hour', decode('00ff' || lpad(g::text, 2, '0'), 'hex'), "
     "(ARRAY['sad', 'ok', 'happy']::mood[])[1 + g % 3], 'L' || g FROM generate_series(1, 4) g"),
]
TYPED_STEPS: list[tuple[list[str], bool]] = [
    (["UPDATE \"Typed\" SET tags = tags || 'more'::text, doc = doc || '{\"n\": null}' WHERE id = 2",
      'DELETE FROM "Typed" WHERE id = 3',
      "INSERT INTO \"Typed\" VALUES (5, '{}', NULL, '[]', gen_random_uuid(), NULL, '', 'ok', NULL)"], True),
    (['DELETE FROM "Typed" WHERE id = 1',
      ("INSERT INTO \"Typed\" VALUES (3, ARRAY['back'], ARRAY[3], '[1, 2]', gen_random_uuid(), now(), NULL, "
       "'happy', 'again')"),  # a soft-deleted key written again
      "UPDATE \"Typed\" SET m = 'sad', \"Label\" = NULL WHERE id = 4"], False),
    (["UPDATE \"Typed\" SET \"At\" = '1999-12-31 23:59:59.999999+00' WHERE id = 2",
      'DELETE FROM "Typed" WHERE id = 5'], True),
]


def _recorded(i: int) -> str:
    return f'recorded."Typed_{i}"'


@pytest.fixture(scope="module")
def slake(pg_server, spark, tmp_path_factory) -> Lake:
    yield from workload_lake(pg_server, spark, tmp_path_factory.mktemp("soft_types"),
                             # slots are per cluster: not the name of rlake's slot (alive in this module too)
                             "    slot: slotlake_typed\n    delete_mode: soft\n    history: true\n",
                             tables=[TYPED], setup=TYPED_SETUP, steps=TYPED_STEPS)


def test_soft_delete_history_as_of_and_recover_equal_the_recorded_states(spark, slake, tmp_path):
    from slotlake.merge.history_job import history_as_of
    from slotlake.recover.point_job import resolve_as_of

    paths = LakePaths.of(slake.cfg.lake, "src")
    for i, (lsn, _) in enumerate(slake.points):
        at = resolve_as_of(spark, paths.changes, lsn)[0]
        as_of = str(tmp_path / f"history_{i}")
        history_as_of(spark, paths.gold_history("public", "Typed"), at).write.format("delta").save(as_of)
        assert_gold_equals_pg(as_of, slake.dsn, _recorded(i))  # no soft-deleted row after its delete
        dest = str(tmp_path / f"lsn_{i}")
        result = _recover(spark, slake, str(lsn), dest, tables=[TYPED])
        assert result.from_history == (TYPED,)
        assert_gold_equals_pg(f"{dest}/public/Typed", slake.dsn, _recorded(i))


def _not_null(dsn: str, table: str) -> list[str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attnotnull ORDER BY attnum", (table,)).fetchall()]


def test_recover_into_postgres_keeps_types_quoted_names_and_not_null(spark, slake):
    for i in (0, 2, 3):
        result = _recover(spark, slake, str(slake.points[i][0]), slake.dsn, tables=[TYPED], into_schema=f"typed_{i}")
        assert [(t.table, t.written_to) for t in result.tables] == [(TYPED, f'typed_{i}."Typed"')]
        assert_pg_tables_equal(slake.dsn, f'typed_{i}."Typed"', _recorded(i))  # types too: text[], mood, ...
        # NOT NULL as the source had it (_catalog's bootstrap read knows it; the key is NOT NULL anyway)
        assert _not_null(slake.dsn, f'typed_{i}."Typed"') == _not_null(slake.dsn, TYPED) == ["id", "tags", "uid"]


def test_recover_into_postgres_without_the_enum_type_fails_in_one_line_and_creates_nothing(spark, slake, pg_server):
    import psycopg

    from slotlake.recover.point import RecoverError

    other = "t_noenum_" + slake.dsn.rsplit("/", 1)[1].split("?")[0][-10:]
    pg_server.psql(f"CREATE DATABASE {other}")
    try:
        dsn = pg_server.dsn(other)
        with pytest.raises(RecoverError) as err:
            _recover(spark, slake, str(slake.points[1][0]), dsn, tables=[TYPED])
        assert str(err.value) == (
            'type public.mood of public."Typed".m does not exist in the target database; create it '
            "there first (CREATE TYPE ..., as on the source) or recover --to a Delta folder")
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT to_regclass('recovered.\"Typed\"')").fetchone()[0] is None
    finally:
        pg_server.psql(f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")


def test_recover_in_process_reads_the_history_table_as_the_spark_app_does(slake, tmp_path):
    """`recover_in_process` (no JVM) reads the history table at each point (soft deletes, arrays, jsonb, uuid,
    bytea, an enum, quoted names) and writes the recorded state, into Delta and into PostgreSQL with the types,
    key and NOT NULL the Spark app gives them (test_recover_into_postgres_keeps_types_quoted_names_and_not_null)."""
    from slotlake.recover.point import request
    from slotlake.recover.point_in_process import recover_in_process

    for i, (lsn, _) in enumerate(slake.points):
        dest = str(tmp_path / f"here_{i}")
        result = recover_in_process(slake.cfg, *request("src", str(lsn), [TYPED], dest))
        assert result is not None and result.from_history == (TYPED,), i  # not declined: done in this process
        assert_gold_equals_pg(f"{dest}/public/Typed", slake.dsn, _recorded(i))
    for i in (0, 3):
        result = recover_in_process(slake.cfg, *request("src", str(slake.points[i][0]), [TYPED], slake.dsn,
                                                        into_schema=f"typed_here_{i}"))
        assert result is not None and [(t.table, t.written_to) for t in result.tables] == [
            (TYPED, f'typed_here_{i}."Typed"')]
        assert_pg_tables_equal(slake.dsn, f'typed_here_{i}."Typed"', _recorded(i))
        assert _not_null(slake.dsn, f'typed_here_{i}."Typed"') == ["id", "tags", "uid"]
