"""Point-in-time recovery with real PostgreSQL, Spark and Delta: a workload with inserts, updates (unchanged TOAST,
a key change), deletes, TRUNCATE and DDL (ADD COLUMN, DROP COLUMN) runs in steps; after each step the tables'
exact rows are recorded (`CREATE TABLE recorded.<table>_<i> AS SELECT *`, in a schema the source does not publish,
so recording adds nothing to the stream) with `pg_current_wal_lsn()` and the server clock. The lake is synced
only now and then, so most points lie between two gold versions. Every recovery must equal the recorded state
row by row, for every selected table at once.
"""
from __future__ import annotations

import collections
import json
import subprocess
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from delta_readers import assert_all_readers_agree, delta_tables
from oracle import assert_gold_equals_pg, canonical, pg_rows
from slotlake.config import load_config
from slotlake.decode.job import run_decode
from slotlake.errors import SlotlakeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.job import run_merge
from slotlake.names import TableName
from slotlake.recover.point import request
from slotlake.recover.point_job import resolve_as_of, run_recover
from slotlake.source.connection import table_ident
from slotlake.source.ddl import install_ddl_capture
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")
TABLES = ["public.acct", "public.ev"]
BIG = "repeat(md5(g::text), 400)"  # ~12.8 KB, stored out of line: updates that leave it alone send it unchanged
SETUP = [
    "CREATE TABLE acct (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), note text, legacy int)",
    "ALTER TABLE acct ALTER COLUMN note SET STORAGE EXTERNAL",
    "CREATE TABLE ev (kind text, qty int)",
    "ALTER TABLE ev REPLICA IDENTITY FULL",
    "CREATE SCHEMA recorded",
    f"INSERT INTO acct SELECT g, 'owner ' || g, g * 10, CASE WHEN g % 2 = 0 THEN {BIG} END, g "
    "FROM generate_series(1, 10) g",
    "INSERT INTO ev VALUES ('a', 1), ('a', 1)",
]
# (statements, each in its own transaction; sync after the step's point is recorded)
STEPS: list[tuple[list[str], bool]] = [
    ([f"INSERT INTO acct SELECT g, 'owner ' || g, g * 10, {BIG}, g FROM generate_series(11, 20) g",
      "UPDATE acct SET balance = balance + 1 WHERE id <= 6",  # unchanged TOAST note on 2, 4, 6
      "INSERT INTO ev VALUES ('a', 1), ('b', NULL)"], False),
    (["UPDATE acct SET id = 100 WHERE id = 2",  # key change, TOAST note unchanged
      "DELETE FROM acct WHERE id IN (3, 12)",
      "DELETE FROM ev WHERE ctid = (SELECT min(ctid) FROM ev WHERE kind = 'a')",
      "UPDATE acct SET owner = 'moved' WHERE id = 14"], True),
    (["ALTER TABLE acct ADD COLUMN tier varchar(10)",  # no acct row changes after it until the next step
      "TRUNCATE ev", "INSERT INTO ev VALUES ('c', 3)"], False),
    (["UPDATE acct SET tier = 'gold' WHERE id > 15",
      "ALTER TABLE acct DROP COLUMN legacy",
      "UPDATE acct SET balance = NULL WHERE id = 100",
      "INSERT INTO acct VALUES (4000, 'late', 1.5, NULL, 'x')",
      "INSERT INTO ev VALUES ('d', 4)"], True),
]


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _record(dsn: str, i: int, tables: Sequence[str] = TABLES) -> tuple[Lsn, datetime]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        lsn = Lsn.parse(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        for t in tables:
            name = TableName.parse(t)
            conn.execute(sql.SQL("CREATE TABLE {} AS SELECT * FROM {}").format(
                sql.Identifier("recorded", f"{name.name}_{i}"), table_ident(name)))
    return lsn, now


def _sync(spark, cfg) -> None:
    extract(cfg, cfg.source("src"))
    run_decode(spark, cfg, "src")
    run_merge(spark, cfg, "src")


class Lake:
    def __init__(self, cfg, dsn: str, config_path: Path, points: list[tuple[Lsn, datetime]]) -> None:
        self.cfg, self.dsn, self.config_path, self.points = cfg, dsn, config_path, points


@pytest.fixture(scope="module")
def lake(pg_server, spark, tmp_path_factory) -> Lake:
    """The workload run and synced once for the module; points[i] = (LSN, time) right after step i (0: the copy)."""
    yield from workload_lake(pg_server, spark, tmp_path_factory.mktemp("recover"))


def workload_lake(pg_server, spark, home: Path, source_settings: str = "",
                  after_sync: Callable[[int, Path], None] | None = None, tables: Sequence[str] = TABLES,
                  setup: Sequence[str] = SETUP, steps: Sequence[tuple[list[str], bool]] = STEPS):
    """Run the workload and yield its Lake (the `lake` fixture; tests/integration/test_history.py with
    `source_settings` = extra lines of the source's config, e.g. "    history: true\n"). `after_sync(i, config
    path)` runs after step i's sync and may rewrite the config (reloaded then: a setting changed mid-workload).
    `tables`, `setup`, `steps`: another workload (setup must create the schema `recorded`); recorded tables are
    `recorded."<table>_<i>"`."""
    name = "t_" + uuid.uuid4().hex[:10]
    pg_server.psql(f"CREATE DATABASE {name}")
    dsn = pg_server.dsn(name)
    config_path = home / "slotlake.yaml"
    config_path.write_text(f"lake: {home / 'lake'}\nspark: {{master: \"local[1]\"}}\nsources:\n  src:\n"
                           f"    dsn: {dsn}\n    tables: [{', '.join(tables)}]\n{source_settings}")
    cfg = load_config(str(config_path))
    try:
        _sql(dsn, *setup)
        with psycopg.connect(dsn) as conn:
            install_ddl_capture(conn)  # ADD COLUMN reaches _catalog at its commit, before any row uses it
        run_preflight(cfg, cfg.source("src"))  # slot + initial copy
        _sync(spark, cfg)  # loads the copy
        points = [_record(dsn, 0, tables)]
        for i, (statements, sync_after) in enumerate(steps, start=1):
            _sql(dsn, *statements)
            points.append(_record(dsn, i, tables))
            if sync_after:
                _sync(spark, cfg)
                if after_sync is not None:
                    after_sync(i, config_path)
                    cfg = load_config(str(config_path))
        # the pipeline itself is right before recovery is judged (gold acct keeps the dropped column `legacy`)
        last = TableName.parse(tables[-1])
        assert_gold_equals_pg(LakePaths.of(cfg.lake, "src").gold(*last), dsn, str(last))
        yield Lake(cfg, dsn, config_path, points)
        # the module's tests are done with it: every Delta table under `home` (the shared lake, what the module wrote
        # beside it) reads the same with Spark and delta-rs (tests/conftest.py checks each test's own tmp_path)
        tables = delta_tables(home)
        assert tables, f"no Delta table under {home}"
        assert_all_readers_agree(spark, tables)
    finally:
        pg_server.psql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                       f"WHERE database = '{name}' AND NOT active")
        pg_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _recover(spark, lake: Lake, as_of: str, to: str, tables=TABLES, **kw):
    req, password = request("src", as_of, tables, to, **kw)
    return run_recover(spark, lake.cfg, req, password)


def test_recover_each_point_into_delta_equals_the_recorded_state(spark, lake, tmp_path):
    for i, (lsn, _) in enumerate(lake.points):
        dest = str(tmp_path / f"lsn_{i}")
        result = _recover(spark, lake, str(lsn), dest)
        assert result.lsn <= lsn and result.target == "delta"
        assert (result.commit_ts is None) == (i == 0)  # point 0: no decoded commit yet, the copy's state
        assert [t.table for t in result.tables] == TABLES  # both at the same commit LSN: one request
        for t in TABLES:
            schema, table = t.split(".")
            n = assert_gold_equals_pg(f"{dest}/{schema}/{table}", lake.dsn, f"recorded.{table}_{i}")
            assert {r.table: r.rows for r in result.tables}[t] == n


def test_recover_by_time_is_the_last_commit_at_or_before_it(spark, lake, tmp_path):
    changes = LakePaths.of(lake.cfg.lake, "src").changes
    # a moment exactly equal to a commit's time resolves to that commit (at or before: not strictly before)
    last_lsn, last_ts = (spark.read.format("delta").load(changes).where(f"commit_lsn <= {lake.points[2][0].value}")
                         .selectExpr("max(struct(commit_lsn, commit_ts)) AS m").collect()[0]["m"])
    exact = last_ts.replace(tzinfo=UTC)
    assert resolve_as_of(spark, changes, exact)[:2] == (Lsn(last_lsn), exact)
    before = resolve_as_of(spark, changes, exact.replace(microsecond=exact.microsecond - 1)
                           if exact.microsecond else exact.replace(second=exact.second - 1, microsecond=999999))
    assert before[0] < Lsn(last_lsn)
    for i in (1, 3):
        at = lake.points[i][1]
        naive_utc = at.astimezone(UTC).replace(tzinfo=None).isoformat()  # no zone: UTC
        dest = str(tmp_path / f"time_{i}")
        result = _recover(spark, lake, naive_utc, dest)
        assert lake.points[i - 1][0] < result.lsn <= lake.points[i][0]
        assert result.commit_ts is not None and result.commit_ts <= at
        for t in TABLES:
            schema, table = t.split(".")
            assert_gold_equals_pg(f"{dest}/{schema}/{table}", lake.dsn, f"recorded.{table}_{i}")


def _types(dsn: str, table: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()]


def _primary_key(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(
            "SELECT a.attname FROM pg_constraint c CROSS JOIN unnest(c.conkey) WITH ORDINALITY k(n, o) "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n "
            "WHERE c.conrelid = %s::regclass AND c.contype = 'p' ORDER BY k.o", (table,)).fetchall()]


def assert_pg_tables_equal(dsn: str, got: str, want: str) -> None:
    got_cols, got_rows = pg_rows(dsn, got)
    want_cols, want_rows = pg_rows(dsn, want)
    assert got_cols == want_cols
    assert _types(dsn, got) == _types(dsn, want)  # with typmods: numeric(12,2), varchar(10)

    def bag(rows):
        return collections.Counter(tuple(canonical(v, t) for v, (_, t) in zip(r, want_cols)) for r in rows)

    assert bag(got_rows) == bag(want_rows), f"{got} != {want}"


def test_recover_into_postgres_with_historical_columns_types_and_key(spark, lake, tmp_path):
    for i in (1, 3, 4):  # before the DDL, after ADD COLUMN (no row written since), after DROP COLUMN
        result = _recover(spark, lake, str(lake.points[i][0]), lake.dsn, into_schema=f"rec_{i}")
        assert result.target == "postgres"
        assert [(t.table, t.written_to) for t in result.tables] == [
            ("public.acct", f"rec_{i}.acct"), ("public.ev", f"rec_{i}.ev")]
        for t in ("acct", "ev"):
            assert_pg_tables_equal(lake.dsn, f"rec_{i}.{t}", f"recorded.{t}_{i}")
        assert _primary_key(lake.dsn, f"rec_{i}.acct") == ["id"]
        assert _primary_key(lake.dsn, f"rec_{i}.ev") == []  # REPLICA IDENTITY FULL: no key
    assert [c for c, _ in _types(lake.dsn, "rec_1.acct")] == ["id", "owner", "balance", "note", "legacy"]
    assert [c for c, _ in _types(lake.dsn, "rec_4.acct")] == ["id", "owner", "balance", "note", "tier"]


def _cli(lake: Lake, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SLOTLAKE, "--config", str(lake.config_path), "recover", "src", *args],
                          capture_output=True, text=True, timeout=1800)


def test_cli_refuses_an_existing_table_without_replace_and_never_prints_the_password(lake):
    secret = "s3cret-" + uuid.uuid4().hex[:6]
    _sql(lake.dsn, "CREATE SCHEMA taken", "CREATE TABLE taken.acct (keep int)", "INSERT INTO taken.acct VALUES (7)")
    user, rest = lake.dsn.split("://", 1)[1].split("@", 1)
    url = f"postgresql://{user}:{secret}@{rest}"  # trust auth: the password is sent and ignored
    lsn = str(lake.points[2][0])

    refused = _cli(lake, "--as-of", lsn, "--table", "public.acct", "--to", url, "--into-schema", "taken")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "slotlake: error: taken.acct already exist(s) in the target database; pass --replace to overwrite, or "
        "choose another --into-schema")
    assert _sql_rows(lake.dsn, "SELECT * FROM taken.acct") == [(7,)]  # untouched

    replaced = _cli(lake, "--as-of", lsn, "--table", "public.acct", "--to", url, "--into-schema", "taken",
                    "--replace", "--json")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    out = json.loads(replaced.stdout)
    assert out["target"] == "postgres" and Lsn.parse(out["lsn"]) <= lake.points[2][0]
    assert out["tables"] == [{"table": "public.acct", "rows": 18, "written_to": "taken.acct"}]
    assert_pg_tables_equal(lake.dsn, "taken.acct", "recorded.acct_2")
    assert secret not in refused.stdout + refused.stderr + replaced.stdout + replaced.stderr


def _sql_rows(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(query).fetchall()]


def test_recover_to_delta_refuses_an_existing_table_without_replace(spark, lake, tmp_path):
    lsn = str(lake.points[1][0])
    dest = str(tmp_path / "dest")
    _recover(spark, lake, lsn, dest, tables=["public.ev"])
    with pytest.raises(SlotlakeError, match=r"public\.ev already exist\(s\) under .*; pass --replace"):
        _recover(spark, lake, str(lake.points[3][0]), dest, tables=["public.ev"])
    assert_gold_equals_pg(f"{dest}/public/ev", lake.dsn, "recorded.ev_1")  # untouched
    _recover(spark, lake, str(lake.points[3][0]), dest, tables=["public.ev"], replace=True)
    assert_gold_equals_pg(f"{dest}/public/ev", lake.dsn, "recorded.ev_3")


@pytest.mark.airflow
@pytest.mark.slow
def test_recover_dag_through_airflow_dags_test(lake, tmp_path):
    from slotlake_dev.airflow_local import dags_test, local_airflow_env, migrate

    env = local_airflow_env(tmp_path / "airflow", lake.config_path)
    migrate(env)
    dest = tmp_path / "dag_dest"
    i = 3
    conf = {"tables": TABLES, "as_of": lake.points[i][1].isoformat(), "target": "delta",
            "destination": str(dest), "mode": "restore"}
    with pytest.raises(SlotlakeError):  # the form's as_of pattern refuses anything but an LSN or ISO time
        dags_test(env, "slotlake_recover__src", conf={**conf, "as_of": "yesterday"})
    assert not dest.exists()
    out = dags_test(env, "slotlake_recover__src", conf=conf)
    assert f"recover src as of {lake.points[i][1].astimezone(UTC).isoformat()}: commit LSN" in out
    assert f"public.acct: 18 rows -> {dest}/public/acct" in out  # the result in the task log (and its XCom)
    assert "Returned value was: {'source': 'src', 'as_of': " in out and "'rows': 18" in out  # the XCom
    for t in TABLES:
        schema, table = t.split(".")
        assert_gold_equals_pg(str(dest / schema / table), lake.dsn, f"recorded.{table}_{i}")

    # mode undo_sql: `slotlake undo --xid N --out <destination>` for the last archived transaction
    xid = (_spark_silver_last(lake))
    script = tmp_path / "undo.sql"
    out = dags_test(env, "slotlake_recover__src", conf={**conf, "mode": "undo_sql", "xid": xid,
                                                         "destination": str(script)})
    assert f"'mode': 'undo_sql', 'xid': {xid}" in out and f"'script': '{script}'" in out
    assert script.read_text().strip()


def _spark_silver_last(lake: Lake) -> int:
    from slotlake.spark.session import get_spark

    changes = LakePaths.of(lake.cfg.lake, "src").changes
    return get_spark("slotlake-tests", "local[2]").read.format("delta").load(changes).orderBy(
        "commit_lsn", ascending=False).first()["xid"]
