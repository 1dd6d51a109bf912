"""The sync's fixed cost through the real CLI: a sync with nothing due starts no Spark app (decided from the lake's
watermarks), and every case with something due still runs it: the initial copy, new changes, a merge that died
after its first table, a table added to the config. Plus the append path for insert-only batches (a keyless
REPLICA IDENTITY FULL table with duplicate rows). Gold is compared with PostgreSQL after every run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from clirun import launched_apps, sync_crashes, sync_ok  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake import delta_log  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SOURCE = "shop"


def write_config(path: Path, dsn: str, tables: list[str]) -> Path:
    # Spark's decode and merge each time (`in_process_bytes: 0`): tests/integration/test_in_process_sync.py has the
    # syncs that need no JVM at all
    path.write_text(json.dumps({"lake": str(path.parent / "lake"),
                                "spark": {"master": "local[2]", "in_process_bytes": 0},
                                "sources": {SOURCE: {"dsn": dsn, "tables": tables}}}))
    return path


def sync(cfg: Path, failpoint: str | None = None) -> tuple[dict, str]:
    """One `slotlake sync --json` in a new process: (report, stderr log). Fails the test if the sync failed,
    unless a failpoint was asked for (then the report is empty)."""
    if failpoint:
        return {}, sync_crashes(cfg, SOURCE, failpoint, "--json").stderr
    out = sync_ok(cfg, SOURCE, "--json")
    return json.loads(out.stdout), out.stderr


def assert_skipped(report: dict, log: str) -> None:
    assert report["spark_skipped"] is True, report["spark"]
    assert report["spark"].startswith("decode and merge skipped: nothing new"), report["spark"]
    assert launched_apps(log) == []  # run_spark_app was never called: no spark-submit, no Spark server request


def assert_ran(report: dict, log: str, due: str) -> None:
    assert report["spark_skipped"] is False
    assert due in report["spark"], report["spark"]
    assert launched_apps(log), log[-3000:]


def assert_gold(paths: LakePaths, dsn: str, tables: list[str]) -> None:
    for t in tables:
        assert_gold_equals_pg(paths.gold(*t.split(".")), dsn, t)


def versions(paths: LakePaths, tables: list[str]) -> dict[str, int]:
    return {t: next(delta_log.commits(paths.gold(*t.split(".")))).version for t in tables}


def test_idle_sync_skips_spark_and_every_pending_case_runs_it(pg_db, tmp_path):
    tables = ["public.items", "public.hist"]
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE hist (a int, b text)")  # no key: REPLICA IDENTITY FULL, duplicates allowed
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE extra (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')")
        conn.execute("INSERT INTO hist VALUES (1, 'x'), (1, 'x')")
        conn.execute("INSERT INTO extra VALUES (1, 'e')")
    cfg = write_config(tmp_path / "slotlake.yaml", pg_db, tables)
    paths = LakePaths.of(str(tmp_path / "lake"), SOURCE)

    # 1. a new source: slot, initial copy, and its load into gold: Spark runs
    report, log = sync(cfg)
    assert_ran(report, log, "initial copy of public.items, public.hist is not loaded")
    assert_gold(paths, pg_db, tables)

    # 2. nothing new: no Spark app, gold untouched and still equal to PostgreSQL
    before = versions(paths, tables)
    report, log = sync(cfg)
    assert_skipped(report, log)
    assert versions(paths, tables) == before
    assert_gold(paths, pg_db, tables)

    # 3. new changes: Spark runs
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (3, 'c')")
        conn.execute("UPDATE items SET name = 'b2' WHERE id = 2")
        conn.execute("INSERT INTO hist VALUES (2, NULL), (2, NULL), (3, 'y')")
    report, log = sync(cfg)
    assert_ran(report, log, "bronze holds changes up to")
    assert_gold(paths, pg_db, tables)
    report, log = sync(cfg)
    assert_skipped(report, log)

    # 4. a merge that died after its first table: the other table is behind silver, so the next sync runs Spark
    # (the merge alone: the decode has nothing left) and brings it to silver's end
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("UPDATE items SET name = 'a2' WHERE id = 1")
        conn.execute("DELETE FROM hist WHERE b = 'y'")
    sync(cfg, "merge_after_first_table")
    silver_end = delta_log.latest_slotlake_commit(paths.changes, "decode").end_lsn
    marks = {t: delta_log.latest_slotlake_commit(paths.gold(*t.split(".")), "merge").end_lsn for t in tables}
    assert silver_end in marks.values(), marks  # the failpoint fired after a table committed its part
    report, log = sync(cfg)
    assert_ran(report, log, f"silver is at {silver_end}, the last complete merge run at")
    assert report["spark"].startswith("merge due:"), report["spark"]
    assert launched_apps(log) == ["merge"], log[-3000:]
    assert_gold(paths, pg_db, tables)
    report, log = sync(cfg)
    assert_skipped(report, log)

    # 5. a table added to the config: its initial copy must be loaded, so Spark runs
    tables.append("public.extra")
    write_config(cfg, pg_db, tables)
    report, log = sync(cfg)
    assert_ran(report, log, "initial copy of public.extra is not loaded")
    assert_gold(paths, pg_db, tables)
    report, log = sync(cfg)
    assert_skipped(report, log)
    assert_gold(paths, pg_db, tables)


def test_insert_only_batch_of_a_keyless_full_table_is_an_append(pg_db, tmp_path):
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE hist (a int, b text, t timestamptz)")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO hist VALUES (0, 'seed', '2024-01-01')")
    cfg = write_config(tmp_path / "slotlake.yaml", pg_db, ["public.hist"])
    paths = LakePaths.of(str(tmp_path / "lake"), SOURCE)
    gold = paths.gold("public", "hist")
    sync(cfg)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        # identical rows within the batch and across transactions, and NULLs
        conn.execute("INSERT INTO hist VALUES (1, 'x', '2024-01-02'), (1, 'x', '2024-01-02'), (2, NULL, NULL)")
        conn.execute("INSERT INTO hist VALUES (1, 'x', '2024-01-02'), (2, NULL, NULL), (3, 'z', '2024-01-03')")
    report, _ = sync(cfg)
    assert_gold_equals_pg(gold, pg_db, "public.hist")  # a multiset: three (1, 'x') rows, two (2, NULL)
    last = next(delta_log.commits(gold))
    silver_end = delta_log.latest_slotlake_commit(paths.changes, "decode").end_lsn
    assert last.operation == "WRITE", last  # an append, not a MERGE
    assert last.slotlake == {"end_lsn": silver_end, "stage": "merge"}
    assert last.metrics.get("numOutputRows") == 6
    (merged,) = report["merged"]
    assert merged["inserted"] == 6 and merged["applied_lsn"] == silver_end

    # a batch holding a row gold already has keeps the MERGE (the new copy is numbered after the existing ones)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO hist VALUES (3, 'z', '2024-01-03'), (4, 'w', NULL)")
    sync(cfg)
    assert_gold_equals_pg(gold, pg_db, "public.hist")
    assert next(delta_log.commits(gold)).operation == "MERGE"
