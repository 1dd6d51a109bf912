"""End to end through the CLI: every type and every merge case of tests/workload.py, gold == PostgreSQL after
each sync (the database is the oracle)."""
from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import workload  # noqa: E402
from clirun import sync_ok  # noqa: E402
from conftest import NEWEST_MAJOR  # noqa: E402
from delta_readers import deletion_vectors  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402

# Gold tables given Delta's deletion vectors in the workload run: keyed (soft deletes, unchanged TOAST, key changes),
# FULL identity (`_slotlake_dup` copies) and TRUNCATE; the other tables keep copy-on-write.
DV_TABLES = ["public.customers", "public.orders", "public.events_full", "public.scratch"]


def sync(cfg: Path) -> str:
    return sync_ok(cfg, "wl").stdout


@pytest.fixture(scope="module")
def spark():
    from slotlake.spark.session import get_spark

    s = get_spark("slotlake-e2e-oracle", "local[2]")
    yield s


def assert_all_tables_equal(spark, lake: Path, dsn: str) -> dict[str, int]:
    counts = {}
    for table in workload.TABLES:
        schema, name = table.split(".")
        counts[table] = assert_gold_equals_pg(str(lake / "wl" / "gold" / schema / name), dsn, table)
    return counts


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
# On the newest PostgreSQL (18) in soft mode; tests/integration/test_faults.py runs the same workload on the default
# server (Debian's 15) in hard mode (the default), so each server and each delete mode gets the whole workload once.
@pytest.mark.parametrize("pg_major", [NEWEST_MAJOR], ids=[f"pg{NEWEST_MAJOR}"])
@pytest.mark.parametrize("delete_mode", ["soft"])
def test_every_type_and_merge_case_gold_equals_postgres(pg_db, tmp_path, spark, delete_mode):
    with psycopg.connect(pg_db) as conn:
        workload.create_schema(conn)
    cfg = tmp_path / "slotlake.yaml"
    cfg.write_text(f"lake: {tmp_path / 'lake'}\nspark: {{master: \"local[2]\"}}\n"
                   f"extract: {{upto_nchanges: 40}}\n"  # several peek calls, so several bronze files per run
                   f"sources:\n  wl:\n    dsn: {pg_db}\n    delete_mode: {delete_mode}\n"
                   f"    tables: [{', '.join(workload.TABLES)}]\n"
                   f"    deletion_vectors: [{', '.join(DV_TABLES)}]\n")
    sync(cfg)  # creates publication + slot (+ the empty initial copy)
    lake = tmp_path / "lake"
    for phase in range(len(workload.PHASES)):
        with psycopg.connect(pg_db) as conn:
            workload.run_phase(conn, phase)
        sync(cfg)
        counts = assert_all_tables_equal(spark, lake, pg_db)
        assert all(counts[t] > 0 for t in workload.TABLES if t != "public.scratch" or phase > 0), counts
    # the TOAST column really went through the unchanged-TOAST path: orders 4/5 moved keys without touching note
    notes = spark.read.format("delta").load(str(lake / "wl" / "gold" / "public" / "orders")) \
        .where("id in (1004, 1005)").selectExpr("length(note)").collect()
    assert [r[0] for r in notes] == [12800, 12800]
    from delta.tables import DeltaTable

    # Tables with deletion vectors (config `deletion_vectors`): their MERGEs marked rows in files instead of rewriting
    # them, and the other tables kept a protocol every delta-rs reader takes (the suite's reader check reads both).
    for table in workload.TABLES:
        path = lake / "wl" / "gold" / Path(*table.split("."))
        added = sum(int((r[0] or {}).get("numTargetDeletionVectorsAdded", 0))
                    for r in DeltaTable.forPath(spark, str(path)).history().select("operationMetrics").collect())
        assert deletion_vectors(path) == (table in DV_TABLES), table
        assert (added > 0) == (table in DV_TABLES), (table, added)
    if delete_mode == "soft":
        gone = spark.read.format("delta").load(str(lake / "wl" / "gold" / "public" / "customers")) \
            .where("_slotlake_deleted").count()
        assert gone > 0
