"""`slotlake sync` with spark-submit starts its Spark app once the extract has archived its first file
(slotlake.spark.early): the app's JVM starts while the extract still runs, waits for the extract's end, and then
decodes and merges exactly what a later start would have. When the extract fails after that start, the app is told
to stop, does nothing and leaves no process; the next sync brings gold to PostgreSQL. These runs use no Spark
server (the suite's warm server is taken out of their environment): that is the path this is about."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from clirun import SLOTLAKE, cli_env, launched_apps, sync_ok  # noqa: E402
from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake import delta_log, failpoints  # noqa: E402
from slotlake.config import SPARK_SERVER_ENV  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SOURCE = "shop"
TABLES = ["public.items", "public.hist"]


def spark_submit_sync(cfg: Path, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = cli_env(failpoint)
    env.pop(SPARK_SERVER_ENV, None)  # spark-submit, as with the default config
    return subprocess.run([SLOTLAKE, "--config", str(cfg), "sync", SOURCE, "--json"], capture_output=True, text=True,
                          env=env, timeout=900, check=False)


def waiting_apps(cfg: Path) -> list[str]:
    """Command lines of processes started to wait for a decision of a sync of `cfg` (`--wait-for`).

    Only this test's config: other tests running beside it (other xdist workers) start such apps too."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "--wait-for" in cmd and "slotlake-sync-" in cmd and f" {cfg} " in cmd:
            found.append(cmd)
    return found


def write_some(dsn: str, start: int, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(start, start + n):  # one transaction each: the peeks split between them
            conn.execute("INSERT INTO items VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                         (i % 40, f"v{i}"))
            conn.execute("INSERT INTO hist VALUES (%s, 'x')", (i % 7,))
            if i % 9 == 0:
                conn.execute("DELETE FROM items WHERE id = %s", ((i * 3) % 40,))


def test_the_app_starts_during_the_extract_and_a_failed_extract_stops_it(pg_db, tmp_path):
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE hist (a int, b text)")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO items VALUES (1, 'a')")
    cfg = tmp_path / "slotlake.yaml"
    cfg.write_text(json.dumps({"lake": str(tmp_path / "lake"), "spark": {"master": "local[2]", "in_process_bytes": 0},
                               "extract": {"upto_nchanges": 30},  # several peek calls, so several files
                               "sources": {SOURCE: {"dsn": pg_db, "tables": TABLES}}}))
    paths = LakePaths.of(str(tmp_path / "lake"), SOURCE)
    sync_ok(cfg, SOURCE)  # slot and initial copy, through the suite's warm server (not what this is about)

    # 1. a backlog of several files: the app is submitted after the first one, before the extract ends
    write_some(pg_db, 0, 60)
    out = spark_submit_sync(cfg)
    assert out.returncode == 0, out.stderr[-4000:]
    log = out.stderr
    assert launched_apps(log) == ["sync"], log[-3000:]  # one app, not a second one after the extract
    submitted = log.index("submitting slotlake-sync-shop")
    # submitted once the first call's file was placed (its log line follows), while the extract went on
    assert submitted < log.index("extract shop: call 1:") < log.index("extract shop: call 2:"), log[-3000:]
    assert log.index("extract shop: call 2:") < log.index("sync shop: decode and merge due"), log[-3000:]
    report = json.loads(out.stdout)
    assert set(report["step_seconds"]) == {"preflight", "extract", "spark"}, report
    assert report["decoded_changes"] > 60
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
    assert waiting_apps(cfg) == []

    # 2. the extract fails after its first file: the started app is told to stop, writes nothing, and is gone
    write_some(pg_db, 60, 60)
    silver_before = next(delta_log.commits(paths.changes)).version
    gold_before = {t: next(delta_log.commits(paths.gold(*t.split(".")))).version for t in TABLES}
    out = spark_submit_sync(cfg, f"{failpoints.EXTRACT_AFTER_FILES}1")
    assert out.returncode != 0
    log = out.stderr
    assert f"failpoint {failpoints.EXTRACT_AFTER_FILES}1" in log, log[-3000:]
    assert launched_apps(log) == ["sync"], log[-3000:]
    assert "told to stop before starting: nothing was done" in log, log[-3000:]
    assert waiting_apps(cfg) == []
    assert next(delta_log.commits(paths.changes)).version == silver_before  # the app decoded nothing
    assert {t: next(delta_log.commits(paths.gold(*t.split(".")))).version for t in TABLES} == gold_before

    # 3. the next sync archives the rest and brings every table to PostgreSQL, nothing twice
    out = spark_submit_sync(cfg)
    assert out.returncode == 0, out.stderr[-4000:]
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), pg_db, t)
    assert waiting_apps(cfg) == []
