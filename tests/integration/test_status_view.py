"""The slotlake view of the Airflow UI against a real lake: a real PostgreSQL, two syncs through the real CLI, then
the plugin's FastAPI app serves the page and its JSON. Every number is checked against its source: the slot
against pg_replication_slots, each gold table's applied LSN and version against delta-rs, the runs' change counts
against the rows changed in PostgreSQL. Plus: the plugin loaded by Airflow from the package's entry point, its
app answering only requests with an Airflow token."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from clirun import sync_ok  # noqa: E402
from slotlake import delta_log  # noqa: E402
from slotlake.config import load_config  # noqa: E402
from slotlake.contracts import CommitMeta  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402
from slotlake.pipeline import task_preflight  # noqa: E402
from slotlake.source.slot import current_wal_lsn  # noqa: E402

SOURCE = "shop"
TABLES = ["public.customers", "public.orders"]


def write_config(path: Path, dsn: str, **extract) -> Path:
    path.write_text(json.dumps({
        "lake": str(path.parent / "lake"), "spark": {"master": "local[2]"}, **({"extract": extract} if extract else {}),
        "sources": {SOURCE: {"dsn": dsn, "tables": TABLES},
                    # a source whose database does not answer: its part of the page is an error line
                    "down": {"dsn": "postgresql://nobody@127.0.0.1:1/nothing", "tables": ["public.t"]}}}))
    return path


def changed_rows(dsn: str, statements: list[str]) -> int:
    """Run the statements; the number of rows they changed (what the run must report as changes)."""
    total = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            total += max(conn.execute(s).rowcount, 0)
    return total


def sync(cfg: Path) -> None:
    sync_ok(cfg, SOURCE)


def view_client(monkeypatch, cfg: Path):
    from fastapi.testclient import TestClient

    from slotlake.airflow import status_app

    monkeypatch.setenv("SLOTLAKE_CONFIG", str(cfg))
    app = status_app.create_app()
    # The Airflow token check is the API server's (test_the_plugin_loads_and_its_app_needs_an_airflow_token).
    app.dependency_overrides[status_app.access_check] = lambda: None
    return TestClient(app)


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.slow
def test_view_shows_slot_tables_and_runs_as_they_are(pg_db, tmp_path, monkeypatch):
    changed_rows(pg_db, ["CREATE TABLE customers (id int PRIMARY KEY, name text)",
                         "CREATE TABLE orders (id int PRIMARY KEY, customer int, amount numeric(10,2))"])
    cfg = write_config(tmp_path / "slotlake.yaml", pg_db, warn_retained_wal_mb=1)
    task_preflight(load_config(str(cfg)), SOURCE)  # the slot exists before the first change

    client = view_client(monkeypatch, cfg)
    before = client.get("/api/status").json()  # slot created, nothing synced yet
    shop = next(s for s in before["sources"] if s["source"] == SOURCE)
    assert shop["tables"] == [] and shop["runs"] == [] and shop["errors"] == {}
    assert "no gold tables yet" in client.get("/").text

    first = changed_rows(pg_db, ["INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 4) g",
                                 "INSERT INTO orders SELECT g, g % 4 + 1, g * 1.5 FROM generate_series(1, 6) g"])
    sync(cfg)
    second = changed_rows(pg_db, ["UPDATE orders SET amount = amount + 1 WHERE id <= 3",
                                  "DELETE FROM orders WHERE id = 6",
                                  "INSERT INTO customers VALUES (5, 'late')",
                                  "UPDATE customers SET name = 'x' WHERE id = 1"])
    sync(cfg)
    assert (first, second) == (10, 6)
    # WAL past the 1 MB threshold (a non-transactional message, which no sync reads here). The view compares the
    # slot with pg_current_wal_lsn(), the WAL *written* so far, which trails the inserted record until the WAL
    # writer catches up (up to wal_buffers behind): wait for the write position to pass the message's end.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SELECT pg_logical_emit_message(false, 'test.filler', repeat('x', 2 * 1024 * 1024))")
        (inserted,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        deadline = time.monotonic() + 60
        while current_wal_lsn(conn) < Lsn.parse(inserted):
            assert time.monotonic() < deadline, "the WAL writer did not write the message in 60 s"
            time.sleep(0.2)

    res = client.get("/api/status")
    assert res.status_code == 200
    doc = res.json()
    shop = next(s for s in doc["sources"] if s["source"] == SOURCE)
    assert shop["errors"] == {}

    # the slot, as PostgreSQL has it
    with psycopg.connect(pg_db) as conn:
        restart, confirmed, wal_status, active = conn.execute(
            "SELECT restart_lsn::text, confirmed_flush_lsn::text, wal_status, active FROM pg_replication_slots "
            "WHERE slot_name = %s", (shop["slot"]["slot"],)).fetchone()
    s = shop["slot"]
    assert (s["exists"], s["restart_lsn"], s["confirmed_flush_lsn"], s["wal_status"], s["active"]) == (
        True, str(Lsn.parse(restart)), str(Lsn.parse(confirmed)), wal_status, active)
    assert s["retained_wal_bytes"] > 1024 * 1024 and s["invalidated"] is None

    # each gold table's applied LSN and version, as delta-rs reads them
    paths = LakePaths.of(str(tmp_path / "lake"), SOURCE)
    assert [t["table"] for t in shop["tables"]] == TABLES
    for t in shop["tables"]:
        gold = DeltaTable(paths.gold(*t["table"].split(".")))
        newest = next(h for h in gold.history() if CommitMeta.parse(h.get("userMetadata")) is not None)
        assert t["gold_version"] == gold.version() == newest["version"]
        assert t["applied_lsn"] == str(CommitMeta.parse(newest["userMetadata"]).end_lsn)
        assert t["applied_by"] == "merge"

    # both runs, newest first, with the rows changed in PostgreSQL, a duration and a lag
    runs = shop["runs"]
    assert [r["changes"] for r in runs] == [second, first]
    assert [r["tables"] for r in runs] == [2, 2]
    assert runs[0]["run_end_lsn"] == shop["tables"][0]["applied_lsn"]
    assert Lsn.parse(runs[1]["run_end_lsn"]) < Lsn.parse(runs[0]["run_end_lsn"])
    for r in runs:
        assert r["duration_s"] > 0 and r["throughput_per_s"] == pytest.approx(r["changes"] / r["duration_s"])
        assert r["lag_s"] > 0  # the newest change committed before the run finished
    rs_runs = DeltaTable(paths.runs).to_pyarrow_table().to_pylist()  # the new columns, filled by the merge
    assert len(rs_runs) == 4 and all(r["started_at"] <= r["finished_at"] for r in rs_runs)
    assert all(r["changes"] > 0 and r["last_commit_ts"] < r["finished_at"] for r in rs_runs)

    # the forced warning, and the unreachable source, on the page
    assert [a["level"] for a in shop["alerts"]] == ["warning"]
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert 'class="banner warning"' in html and "more than extract.warn_retained_wal_mb" in html
    assert "cannot read the slot from the source database; check sources.down.dsn" in html
    for t in shop["tables"]:
        assert t["table"] in html and t["applied_lsn"] in html
    assert "<svg" in html and shop["slot"]["slot"] in html
    down = next(s for s in doc["sources"] if s["source"] == "down")
    assert set(down["errors"]) == {"slot"} and down["tables"] == [] and down["runs"] == []

    # with the default threshold the same slot raises nothing
    client = view_client(monkeypatch, write_config(tmp_path / "default.yaml", pg_db))
    shop = next(s for s in client.get("/api/status").json()["sources"] if s["source"] == SOURCE)
    assert shop["alerts"] == []
    assert delta_log.is_delta_table(paths.runs)


@pytest.mark.integration
@pytest.mark.spark
def test_an_older_runs_table_gains_the_new_columns(spark, tmp_path):
    """A `_runs` table an older slotlake wrote (without started_at, changes, last_commit_ts) gets them the way the
    merge adds them before its write (ensure_table: ALTER TABLE ADD COLUMNS); its rows read NULL there, and the
    view shows such runs without duration or lag."""
    from slotlake import contracts
    from slotlake.merge.typing_job import ensure_table
    from slotlake.status import run_rows
    from slotlake.status_view import summarize_runs

    cfg = load_config(str(write_config(tmp_path / "slotlake.yaml", "postgresql://nobody@127.0.0.1:1/x")))
    path = LakePaths.of(cfg.lake, SOURCE).runs
    finished = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    old = tuple(c for c in contracts.RUNS if c[0] in ("run_end_lsn", "schema_name", "table_name", "gold_version",
                                                      "finished_at"))
    spark.createDataFrame([(4096, "public", "orders", 1, finished)], contracts.ddl(old)) \
        .write.format("delta").save(path)
    ensure_table(spark, path, contracts.RUNS)
    ensure_table(spark, path, contracts.RUNS)  # nothing left to add: no new commit
    assert DeltaTable(path).version() == 1
    (row,) = run_rows(cfg, SOURCE)
    assert row == {"run_end_lsn": "0/1000", "schema_name": "public", "table_name": "orders", "gold_version": 1,
                   "finished_at": finished, "started_at": None, "changes": None, "last_commit_ts": None}
    (run,) = summarize_runs([row])
    assert (run.changes, run.duration_s, run.lag_s) == (None, None, None)


@pytest.mark.integration
@pytest.mark.airflow
def test_the_plugin_loads_and_its_app_needs_an_airflow_token(tmp_path):
    """Airflow's own plugin manager and API app: the plugin comes from the `airflow.plugins` entry point of the
    installed slotlake (declared in pyproject.toml, installed by scripts/setup.sh's editable install) exactly once,
    its nav view is listed, and its app answers 401 without a token, 200 with the UI's `_token` cookie or a Bearer
    token."""
    import tomllib
    from importlib.metadata import entry_points

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["airflow.plugins"]
    installed = {e.name: e.value for e in entry_points(group="airflow.plugins") if e.name in declared}
    assert installed == declared, f"the venv's slotlake lacks its airflow.plugins entry point: run scripts/setup.sh " \
                                  f"(installed {installed}, declared {declared})"
    script = textwrap.dedent("""
        import json
        from fastapi.testclient import TestClient
        from airflow import plugins_manager
        from airflow.api_fastapi.app import create_app, get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        plugins, errors = plugins_manager._get_plugins()
        client = TestClient(create_app("core"))
        token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
        listed = client.get("/api/v2/plugins", headers={"Authorization": f"Bearer {token}"}).json()["plugins"]
        print(json.dumps({
            "plugins": [p.name for p in plugins], "errors": errors,
            "views": [v for p in listed for v in p["external_views"]],
            "anonymous": client.get("/slotlake/api/status").status_code,
            "cookie": client.get("/slotlake/api/status", cookies={"_token": token}).json(),
            "bearer": client.get("/slotlake/", headers={"Authorization": f"Bearer {token}"}).status_code,
            "bad_token": client.get("/slotlake/", cookies={"_token": "x.y.z"}).status_code,
        }))
    """)
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"), "AIRFLOW__API_AUTH__JWT_SECRET": "test-secret",
           "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager."
                                          "SimpleAuthManager",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db",
           "SLOTLAKE_CONFIG": str(tmp_path / "missing.yaml")}
    airflow = str(ROOT / ".venv" / "bin" / "airflow")
    migrate = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["plugins"].count("slotlake") == 1 and got["errors"] == {}
    (view,) = [v for v in got["views"] if v["name"] == "slotlake"]
    assert (view["href"], view["url_route"], view["destination"]) == ("slotlake/", "slotlake", "nav")
    assert (got["anonymous"], got["bearer"], got["bad_token"]) == (401, 200, 403)
    assert got["cookie"]["sources"] == []
    assert "set SLOTLAKE_CONFIG in the environment of the Airflow API server" in got["cookie"]["error"]
