"""The `slotlake` console script end to end: real PostgreSQL, real spark-submit, real Delta."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from demo import ROUND_1, ROUND_2, SCHEMA, TABLES  # noqa: E402  the demo's shop: every identity kind, TOAST, TRUNCATE

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake.config import load_config  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402
from slotlake.pipeline import task_preflight  # noqa: E402

SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")


def slotlake(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [SLOTLAKE, *(["--config", str(config)] if config else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def write_config(path: Path, dsn: str, *, tables: list[str] = TABLES) -> Path:
    path.write_text(f"lake: ./lake\nspark: {{master: \"local[2]\"}}\nsources:\n  shop:\n    dsn: {dsn}\n"
                    f"    tables: [{', '.join(tables)}]\n")
    return path


def run_sql(dsn: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.spark_submit  # the CLI's own path: a spark-submit per app (the other tests use a warm server)
@pytest.mark.spark_codegen  # and Spark's whole-stage codegen, as in production (the suite runs it interpreted)
def test_sync_twice_then_status_gold_equals_postgres(pg_db, tmp_path):
    run_sql(pg_db, [SCHEMA])
    cfg_path = write_config(tmp_path / "slotlake.yaml", pg_db)
    task_preflight(load_config(str(cfg_path)), "shop")  # the slot exists before the first change
    run_sql(pg_db, ROUND_1)

    first = slotlake("sync", "shop", config=cfg_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "sync shop: archived" in first.stdout
    for table in TABLES:
        schema, name = table.split(".")
        assert_gold_equals_pg(str(tmp_path / "lake" / "shop" / "gold" / schema / name), pg_db, table)

    run_sql(pg_db, ROUND_2)
    second = slotlake("sync", "shop", "--json", config=cfg_path)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads(second.stdout)
    assert report["archived_changes"] > 0 and report["decoded_changes"] > 0
    assert report["end_lsn"] and report["slot_lag_bytes"] is not None
    assert {t["table"] for t in report["merged"]} == set(TABLES)  # round 2 changed every table
    counts = {}
    for table in TABLES:
        schema, name = table.split(".")
        counts[table] = assert_gold_equals_pg(str(tmp_path / "lake" / "shop" / "gold" / schema / name),
                                              pg_db, table)
    assert counts == {"public.customers": 7, "public.orders": 11, "public.order_items": 3, "public.products": 3}

    status = slotlake("status", "shop", "--json", config=cfg_path)
    assert status.returncode == 0, status.stderr[-3000:]
    st = json.loads(status.stdout)
    assert st["slot"]["exists"] and st["slot"]["wal_status"] in ("reserved", "extended")
    assert st["slot"]["lag_bytes"] >= 0 and st["slot"]["retained_wal_bytes"] >= st["slot"]["lag_bytes"]
    assert {t["table"] for t in st["tables"]} == set(TABLES)
    for t in st["tables"]:
        # every table applied up to the same run end, and not past what the slot confirmed
        assert Lsn.parse(t["applied_lsn"]) <= Lsn.parse(st["slot"]["confirmed_flush_lsn"])
        assert t["committed_at"]
    assert len({t["applied_lsn"] for t in st["tables"]}) == 1

    text = slotlake("status", "shop", config=cfg_path)
    assert text.returncode == 0 and "gold public.orders: applied LSN" in text.stdout

    # Object-store lakes take the same answer from the _runs table through Spark: it must agree.
    from slotlake.cli import runs_status

    from_runs = runs_status(load_config(str(cfg_path)), str(tmp_path / "lake" / "shop" / "_runs"))
    assert [(t["table"], t["applied_lsn"], t["gold_version"]) for t in from_runs] == \
        [(t["table"], t["applied_lsn"], t["gold_version"]) for t in st["tables"]]


@pytest.mark.integration
def test_unknown_source_is_one_line_error(pg_db, tmp_path):
    cfg_path = write_config(tmp_path / "slotlake.yaml", pg_db)
    p = slotlake("sync", "nosuch", config=cfg_path)
    assert p.returncode == 1
    assert p.stderr.strip() == "slotlake: error: unknown source 'nosuch': the config defines shop"


@pytest.mark.integration
def test_unreachable_database_is_one_line_error_without_password(tmp_path):
    from slotlake_dev.localpg import free_port

    dsn = f"postgresql://someone:s3cret-pw@127.0.0.1:{free_port()}/shop"
    cfg_path = write_config(tmp_path / "slotlake.yaml", dsn)
    p = slotlake("status", "shop", config=cfg_path)
    assert p.returncode == 1, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("slotlake: error: "), p.stderr
    assert "Traceback" not in p.stderr
    assert "s3cret-pw" not in p.stderr + p.stdout


@pytest.mark.integration
def test_missing_config_is_one_line_error(tmp_path):
    p = subprocess.run([SLOTLAKE, "status", "shop"], capture_output=True, text=True, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 1
    assert p.stderr.strip() == "slotlake: error: no config: pass --config FILE or set SLOTLAKE_CONFIG"
