"""Fault tests through the real pipeline (the CLI's `slotlake sync`, real PostgreSQL and Delta; the runs that are
killed inside a Spark app use spark-submit, the others this worker's warm Spark server).

On the default server (Debian's PostgreSQL; tests/integration/test_e2e_workload.py runs the same workload on the
newest, in soft mode). One source, the workload of tests/workload.py (several tables, updates, deletes, key
changes, unchanged TOAST, FULL duplicates, TRUNCATE), and one crash per phase, each in the window its stage must
survive:
  extract  dies after placing a bronze file, before advancing the slot    (SLOTLAKE_FAILPOINT=extract_after_write)
  decode   dies after the _catalog/_ddl_log commits, before silver's commit (decode_after_catalog, os._exit(137))
  merge    dies right after the first table's gold commit, before the other tables and _runs
                                                                           (merge_after_first_table, os._exit(137))
After each crash the next plain sync must leave every gold table equal to PostgreSQL (the oracle compares
multisets, so a duplicate or a missing row fails), every table with changes in the phase at silver's end (a
table without changes keeps its earlier watermark), and `_runs` with exactly one row per table for that end.
"""
from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import clirun  # noqa: E402
import workload  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake import delta_log  # noqa: E402
from slotlake.bronze import list_bronze  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402

SOURCE = "wl"


def sync_ok(cfg: Path) -> None:
    clirun.sync_ok(cfg, SOURCE)


def sync_crashes(cfg: Path, failpoint: str) -> str:
    out = clirun.sync_crashes(cfg, SOURCE, failpoint)
    return out.stdout + out.stderr


def slot_confirmed(dsn: str) -> Lsn:
    with psycopg.connect(dsn) as conn:
        (lsn,) = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s",
                              (f"slotlake_{SOURCE}",)).fetchone()
    return Lsn.parse(str(lsn))


def stage_end(path: str, stage: str) -> str | None:
    last = delta_log.latest_slotlake_commit(path, stage)
    return last.end_lsn if last else None


def gold_watermarks(paths: LakePaths) -> dict[str, str | None]:
    return {t: stage_end(paths.gold(*t.split(".")), "merge") for t in workload.TABLES}


def runs_rows(spark, paths: LakePaths, end: str) -> list[tuple[str, str, int | None]]:
    if not delta_log.is_delta_table(paths.runs):
        return []
    return sorted((r.schema_name, r.table_name, r.gold_version) for r in
                  spark.read.format("delta").load(paths.runs).where(f"run_end_lsn = {Lsn.parse(end).value}")
                  .collect())


def assert_lake_equals_pg(spark, paths: LakePaths, dsn: str, since: str | None) -> None:
    """Gold == PostgreSQL; tables with changes after `since` applied up to silver's end; `_runs` complete."""
    for table in workload.TABLES:
        assert_gold_equals_pg(paths.gold(*table.split(".")), dsn, table)
    end = stage_end(paths.changes, "decode")
    changes = spark.read.format("delta").load(paths.changes).where(f"commit_lsn <= {Lsn.parse(end).value}")
    if since is not None:
        changes = changes.where(f"commit_lsn > {Lsn.parse(since).value}")
    touched = {f"{r.schema_name}.{r.table_name}" for r in changes.select("schema_name", "table_name").distinct()
               .collect()}
    assert touched, "the phase produced no changes"
    marks = gold_watermarks(paths)
    for table, mark in marks.items():
        assert mark is not None and Lsn.parse(mark) <= Lsn.parse(end), (table, mark, end)
        if table in touched:
            assert mark == end, (table, mark, end)
    # one _runs row per table for this end, naming the gold version that holds it
    rows = runs_rows(spark, paths, end)
    assert [f"{s}.{t}" for s, t, _ in rows] == sorted(workload.TABLES), rows
    for s, t, version in rows:
        assert version == next(delta_log.commits(paths.gold(s, t))).version, (s, t, version)


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
def test_sync_survives_a_crash_in_each_stage(pg_db, tmp_path, spark):
    with psycopg.connect(pg_db) as conn:
        workload.create_schema(conn)
    cfg = tmp_path / "slotlake.yaml"
    cfg.write_text(f"lake: {tmp_path / 'lake'}\nspark: {{master: \"local[2]\"}}\n"
                   "extract: {upto_nchanges: 40}\n"  # several bronze files per run: the crash leaves work behind
                   f"sources:\n  {SOURCE}:\n    dsn: {pg_db}\n    tables: [{', '.join(workload.TABLES)}]\n")
    paths = LakePaths.of(str(tmp_path / "lake"), SOURCE)
    sync_ok(cfg)  # publication, slot, (empty) initial copy

    # 1. extract: a bronze file is in place, the slot is not advanced; the re-run must not archive it twice
    with psycopg.connect(pg_db) as conn:
        workload.run_phase(conn, 0)
    before = slot_confirmed(pg_db)
    text = sync_crashes(cfg, "extract_after_write")
    assert "failpoint extract_after_write" in text, text[-3000:]
    files = list_bronze(paths.root)
    assert files and files[-1].end_lsn > before == slot_confirmed(pg_db), (files, before)
    sync_ok(cfg)
    assert_lake_equals_pg(spark, paths, pg_db, None)
    after_extract = list_bronze(paths.root)
    # no LSN range archived twice: each file starts at or after the previous one's end
    assert all(b.start_lsn >= a.end_lsn for a, b in zip(after_extract, after_extract[1:])), after_extract

    # 2. decode: killed after the catalog commit (a column type change makes a new catalog version), before silver
    with psycopg.connect(pg_db) as conn:
        conn.execute("ALTER TABLE customers ALTER COLUMN email TYPE varchar(200)")
        conn.commit()
        workload.run_phase(conn, 1)
    silver_before = stage_end(paths.changes, "decode")
    catalog_before = spark.read.format("delta").load(paths.catalog).count()
    sync_crashes(cfg, "decode_after_catalog")
    assert stage_end(paths.changes, "decode") == silver_before  # silver did not move...
    catalog_rows = spark.read.format("delta").load(paths.catalog).count()
    assert catalog_rows > catalog_before  # ...but the catalog commit did land: the window was really hit
    sync_ok(cfg)
    assert stage_end(paths.changes, "decode") != silver_before
    assert spark.read.format("delta").load(paths.catalog).count() == catalog_rows  # re-applied, nothing added
    assert_lake_equals_pg(spark, paths, pg_db, silver_before)

    # 3. merge: killed right after the first table's commit; other tables and _runs not written
    with psycopg.connect(pg_db) as conn:
        workload.run_phase(conn, 2)
    silver_before = stage_end(paths.changes, "decode")
    sync_crashes(cfg, "merge_after_first_table")
    end = stage_end(paths.changes, "decode")
    assert end != silver_before  # the decode of this run did finish
    marks = gold_watermarks(paths)
    assert end in marks.values(), (end, marks)  # the failpoint fired after a table committed its part
    assert runs_rows(spark, paths, end) == []  # and before _runs
    sync_ok(cfg)
    assert stage_end(paths.changes, "decode") == end  # nothing new: the re-run only finishes the merge
    assert_lake_equals_pg(spark, paths, pg_db, silver_before)
    # the tables that had committed before the crash were not merged again (idempotent writes skipped them)
    for table, mark in marks.items():
        if mark == end:
            commits = [c for c in delta_log.commits(paths.gold(*table.split("."))) if c.end_lsn == end]
            assert len(commits) == 1, (table, commits)

    # TOAST values came through the crashes whole
    notes = spark.read.format("delta").load(paths.gold("public", "orders")) \
        .where("id in (1004, 1005)").selectExpr("length(note)").collect()
    assert [r[0] for r in notes] == [12800, 12800]
