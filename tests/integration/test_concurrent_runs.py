"""Two runs of one source at once, as real processes: the source's run lock (a PostgreSQL advisory lock) makes
the second one wait or stop with one line naming the first, and nothing is archived, decoded or merged twice.

Real PostgreSQL, the real `slotlake` CLI, real spark-submit and Delta. The overlap is made certain, not hoped
for: the test holds the lock itself, or waits until the first CLI holds it before starting the second.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from demo import ROUND_1, ROUND_2, SCHEMA, TABLES  # noqa: E402

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake import bronze  # noqa: E402
from slotlake.config import load_config  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402
from slotlake.source.lock import source_lock  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")


def write_config(path: Path, dsn: str, lock_timeout_s: int) -> Path:
    path.write_text(f"lake: ./lake\nspark: {{master: \"local[2]\"}}\nsources:\n  shop:\n    dsn: {dsn}\n"
                    f"    tables: [{', '.join(TABLES)}]\n    lock_timeout_s: {lock_timeout_s}\n")
    return path


def start_sync(config: Path, log: Path) -> subprocess.Popen:
    out = open(log, "w")
    return subprocess.Popen([SLOTLAKE, "--config", str(config), "sync", "shop"], stdout=out,
                            stderr=subprocess.STDOUT, text=True)


def run_sql(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def lock_sessions(dsn: str) -> dict[str, bool]:
    """application_name -> holds the lock, for the sessions of slotlake's run lock (holding or waiting)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT a.application_name, EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND "
            "l.locktype = 'advisory' AND l.granted) FROM pg_stat_activity a "
            "WHERE a.application_name LIKE 'slotlake %%' AND a.datname = current_database()").fetchall()
    return {r[0]: r[1] for r in rows}


def wait_for(what: str, predicate, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, f"the sync ended before {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def assert_lake_exact(spark, dsn: str, lake_root: str) -> None:
    """Gold == PostgreSQL row by row; bronze files never overlap (no commit archived twice); silver has each change
    once; every table's last `_runs` row and watermark are at silver's end."""
    from pyspark.sql import functions as F

    from slotlake import delta_log

    paths = LakePaths(lake_root)
    for table in TABLES:
        assert_gold_equals_pg(paths.gold(*table.split(".")), dsn, table)
    files = bronze.list_bronze(lake_root)
    for before, after in zip(files, files[1:]):
        assert after.start_lsn >= before.end_lsn, f"bronze {before.name} and {after.name} overlap"
    twice = (spark.read.format("delta").load(paths.changes).groupBy("commit_lsn", "seq", "rel_oid").count()
             .where(F.col("count") > 1).collect())
    assert not twice, f"silver holds changes twice: {twice[:5]}"
    silver_end = Lsn.parse(next(c.end_lsn for c in delta_log.commits(paths.changes) if c.end_lsn))
    assert silver_end == bronze.max_archived_end(lake_root)
    runs = spark.read.format("delta").load(paths.runs).collect()
    assert len({(r["run_end_lsn"], r["schema_name"], r["table_name"]) for r in runs}) == len(runs)
    last = {}
    for r in runs:
        key = f"{r['schema_name']}.{r['table_name']}"
        last[key] = max(last.get(key, 0), r["run_end_lsn"])
    assert set(last) == set(TABLES) and {Lsn(v) for v in last.values()} == {silver_end}
    for table in TABLES:
        newest = delta_log.latest_slotlake_commit(paths.gold(*table.split(".")))
        assert newest is not None and Lsn.parse(newest.end_lsn) == silver_end, table


def test_a_sync_while_another_holds_the_source_stops_or_waits(spark, pg_db, tmp_path):
    run_sql(pg_db, [SCHEMA, *ROUND_1])
    fail_fast = write_config(tmp_path / "fail_fast.yaml", pg_db, lock_timeout_s=1)
    patient = write_config(tmp_path / "slotlake.yaml", pg_db, lock_timeout_s=1800)
    source = load_config(str(patient)).source("shop")
    with source_lock(source, "test"):  # another run (this test process) holds the source
        p = subprocess.run([SLOTLAKE, "--config", str(fail_fast), "sync", "shop"], capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 1, p.stderr[-3000:]
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith(f"slotlake: error: source shop is being synced by another run: slotlake test shop "
                               f"pid {os.getpid()} on {socket.gethostname()}"), p.stderr[-3000:]
        assert "lock_timeout_s" in last and "Traceback" not in p.stderr
        with psycopg.connect(pg_db) as conn:  # it stopped before touching anything
            assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slotlake_shop'"
                                ).fetchone()[0] == 0
        assert not (tmp_path / "lake" / "shop" / "bronze").exists()

        # A patient run waits for the holder, then goes on.
        log = tmp_path / "waiting.log"
        waiting = start_sync(patient, log)
        me = f"slotlake sync shop pid {waiting.pid} "
        wait_for("the second sync to wait for the lock",
                 lambda: any(n.startswith(me) and not held for n, held in lock_sessions(pg_db).items()), waiting, log)
        time.sleep(2)
        assert waiting.poll() is None and not (tmp_path / "lake" / "shop" / "bronze").exists()
    assert waiting.wait(timeout=1200) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "waiting up to 1800 s for slotlake test shop" in text and "sync shop: archived" in text
    run_sql(pg_db, ROUND_2)
    p = subprocess.run([SLOTLAKE, "--config", str(patient), "sync", "shop"], capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    assert_lake_exact(spark, pg_db, str(tmp_path / "lake" / "shop"))


def test_two_concurrent_syncs_with_a_workload_leave_the_lake_exact(spark, pg_db, tmp_path):
    run_sql(pg_db, [SCHEMA, *ROUND_1])
    config = write_config(tmp_path / "slotlake.yaml", pg_db, lock_timeout_s=1800)
    stop = threading.Event()
    written = [0]

    def workload() -> None:  # keeps committing while both syncs run
        with psycopg.connect(pg_db, autocommit=True) as conn:
            i = 1000
            while not stop.is_set():
                i += 1
                conn.execute("INSERT INTO customers (id, name, balance) VALUES (%s, %s, %s)", (i, f"c{i}", i))
                conn.execute("UPDATE customers SET balance = balance + 1 WHERE id = %s", (i - 1,))
                if i % 7 == 0:
                    conn.execute("DELETE FROM customers WHERE id = %s", (i - 3,))
                written[0] += 1
                time.sleep(0.05)

    worker = threading.Thread(target=workload, daemon=True)
    worker.start()
    try:
        first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
        first = start_sync(config, first_log)
        wait_for("the first sync to hold the lock",
                 lambda: any(n.startswith(f"slotlake sync shop pid {first.pid} ") and held
                             for n, held in lock_sessions(pg_db).items()), first, first_log)
        second = start_sync(config, second_log)
        codes = (first.wait(timeout=1800), second.wait(timeout=1800))
    finally:
        stop.set()
        worker.join(timeout=60)
    assert codes == (0, 0), first_log.read_text()[-3000:] + second_log.read_text()[-3000:]
    assert f"waiting up to 1800 s for slotlake sync shop pid {first.pid}" in second_log.read_text()
    assert written[0] > 0
    run_sql(pg_db, ROUND_2)
    final = subprocess.run([SLOTLAKE, "--config", str(config), "sync", "shop"], capture_output=True, text=True,
                           timeout=1200)
    assert final.returncode == 0, final.stderr[-3000:]
    assert_lake_exact(spark, pg_db, str(tmp_path / "lake" / "shop"))
