"""Preflight against real PostgreSQL servers: each failure mode, and what it creates."""
from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from slotlake.bronze import bronze_dir
from slotlake.config import parse_config
from slotlake.errors import PreflightError, SlotLostError
from slotlake.source.connection import connect, redact, resolve_dsn
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight
from slotlake.source.slot import slot_info
from slotlake_dev.localpg import LocalPostgres, free_port

pytestmark = pytest.mark.integration


def _config(lake: Path, dsn: str, tables: list[str] | None = ("public.orders",), **source):
    raw = {"dsn": dsn, **source}
    if tables is not None:
        raw["tables"] = list(tables)
    return parse_config({"lake": str(lake), "sources": {"shop": raw}})


def _run(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET synchronous_commit = on")
        for s in statements:
            c.execute(s)


def _rows(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn) as c:
        return c.execute(query).fetchall()


@pytest.mark.pg_versions
def test_creates_publication_and_slot_and_reports_identities(pg_db, tmp_path):
    _run(pg_db,
         "CREATE TABLE orders (id int, line int, v text, PRIMARY KEY (line, id))",
         "CREATE TABLE by_index (a int NOT NULL, b text NOT NULL, v text)",
         "CREATE UNIQUE INDEX by_index_ab ON by_index (b, a)",
         "ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_ab",
         "CREATE TABLE events (kind text)", "ALTER TABLE events REPLICA IDENTITY FULL",
         "CREATE TABLE audit (msg text)", "ALTER TABLE audit REPLICA IDENTITY NOTHING")
    cfg = _config(tmp_path, pg_db, ["public.orders", "public.by_index", "public.events", "public.audit"])

    report = run_preflight(cfg, cfg.source("shop"))

    assert report.publication_created and report.slot_created
    assert report.server_version_num >= 140000
    assert {(t.name, t.replica_identity, t.key_columns) for t in report.tables} == {
        ("public.orders", "d", ("line", "id")), ("public.by_index", "i", ("b", "a")),
        ("public.events", "f", ()), ("public.audit", "n", ())}
    assert any("public.audit" in w and "NOTHING" in w for w in report.warnings)
    assert sorted(_rows(pg_db, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'slotlake_shop'")) == [
        ("audit",), ("by_index",), ("events",), ("orders",)]
    assert report.slot.plugin == "pgoutput" and report.slot.name == "slotlake_shop"
    assert report.retained_wal_bytes is not None and report.retained_wal_bytes >= 0

    again = run_preflight(cfg, cfg.source("shop"))
    assert not again.publication_created and not again.slot_created
    assert again.slot.confirmed_flush_lsn == report.slot.confirmed_flush_lsn


def test_adds_configured_tables_missing_from_an_existing_publication(pg_db, tmp_path):
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)", "CREATE TABLE customers (id int PRIMARY KEY)",
         "CREATE PUBLICATION slotlake_shop FOR TABLE orders")
    cfg = _config(tmp_path, pg_db, ["public.orders", "public.customers"])
    report = run_preflight(cfg, cfg.source("shop"))
    assert report.tables_added == ("public.customers",) and not report.publication_created
    assert sorted(_rows(pg_db, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'slotlake_shop'")) == [
        ("customers",), ("orders",)]


def test_tables_default_to_an_existing_publication(pg_db, tmp_path):
    # Without tables and without a publication, preflight creates one FOR ALL TABLES (test_publications.py).
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)", "CREATE TABLE other (id int PRIMARY KEY)")
    cfg = _config(tmp_path, pg_db, None)
    _run(pg_db, "CREATE PUBLICATION slotlake_shop FOR TABLE orders")
    report = run_preflight(cfg, cfg.source("shop"))
    assert [t.name for t in report.tables] == ["public.orders"]


def test_missing_table(pg_db, tmp_path):
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)")
    cfg = _config(tmp_path, pg_db, ["public.orders", "public.nope"])
    with pytest.raises(PreflightError, match=r"table public\.nope does not exist.*sources\.shop\.tables"):
        run_preflight(cfg, cfg.source("shop"))
    assert _rows(pg_db, "SELECT count(*) FROM pg_publication")[0][0] == 0


def test_default_identity_without_primary_key(pg_db, tmp_path):
    _run(pg_db, "CREATE TABLE orders (id int, v text)")
    cfg = _config(tmp_path, pg_db)
    with pytest.raises(PreflightError, match=r"public\.orders has REPLICA IDENTITY DEFAULT but no primary key.*"
                                             r"ALTER TABLE public\.orders REPLICA IDENTITY FULL"):
        run_preflight(cfg, cfg.source("shop"))


def test_role_without_replication_or_select(pg_db, pg_server, tmp_path):
    db = pg_db.rsplit("/", 1)[1]
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)",
         f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'plain_{db}') THEN "
         f"CREATE ROLE plain_{db} LOGIN; END IF; END $$")
    try:
        cfg = _config(tmp_path, pg_server.dsn(db, user=f"plain_{db}"))
        with pytest.raises(PreflightError, match=f"role plain_{db} may not use replication slots.*REPLICATION"):
            run_preflight(cfg, cfg.source("shop"))
        _run(pg_db, f"ALTER ROLE plain_{db} REPLICATION")
        with pytest.raises(PreflightError, match="no SELECT on public.orders; run GRANT SELECT"):
            run_preflight(cfg, cfg.source("shop"))
    finally:
        _run(pg_db, f"DROP OWNED BY plain_{db}")
        pg_server.psql(f"DROP ROLE IF EXISTS plain_{db}")


def test_connection_failure_message_is_redacted(tmp_path):
    dsn = f"postgresql://someone:hunter2secret@127.0.0.1:{free_port()}/nodb"
    cfg = _config(tmp_path, dsn)
    with pytest.raises(PreflightError) as err:
        run_preflight(cfg, cfg.source("shop"))
    assert "hunter2secret" not in str(err.value)
    assert redact(dsn) in str(err.value) and "someone:***@" in str(err.value)


def test_session_settings_are_pinned(pg_db, tmp_path):
    cfg = _config(tmp_path, pg_db)
    _run(pg_db, f"ALTER DATABASE {pg_db.rsplit('/', 1)[1]} SET TimeZone = 'Asia/Tokyo'")
    with connect(cfg.source("shop")) as c:
        assert c.execute("SELECT current_setting('TimeZone'), current_setting('DateStyle'), "
                         "current_setting('IntervalStyle'), current_setting('extra_float_digits'), "
                         "current_setting('bytea_output')").fetchone() == ("UTC", "ISO, MDY", "iso_8601", "3", "hex")


def test_slot_dropped_after_bronze_has_files_is_lost(pg_db, tmp_path):
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)")
    cfg = _config(tmp_path, pg_db)
    run_preflight(cfg, cfg.source("shop"))
    _run(pg_db, "INSERT INTO orders VALUES (1)")
    assert extract(cfg, cfg.source("shop")).files
    _run(pg_db, "SELECT pg_drop_replication_slot('slotlake_shop')")
    with pytest.raises(SlotLostError, match=r"slot slotlake_shop is missing but bronze holds changes.*"
                                            r"run `slotlake resync shop`"):
        run_preflight(cfg, cfg.source("shop"))
    assert slot_info(psycopg.connect(pg_db), "slotlake_shop") is None, "a lost slot is never silently recreated"
    assert any(bronze_dir(str(tmp_path / "shop")).iterdir())


def test_slot_of_another_plugin_is_refused(pg_db, tmp_path):
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)",
         "SELECT pg_create_logical_replication_slot('slotlake_shop', 'test_decoding')")
    cfg = _config(tmp_path, pg_db)
    with pytest.raises(PreflightError, match="plugin 'test_decoding', not a logical pgoutput slot"):
        run_preflight(cfg, cfg.source("shop"))


@pytest.mark.slow
def test_wal_level_replica_is_refused(tmp_path):
    with LocalPostgres(settings={"wal_level": "replica"}) as server:
        cfg = _config(tmp_path, server.dsn())
        with pytest.raises(PreflightError, match="wal_level is 'replica'.*set wal_level=logical.*restart"):
            run_preflight(cfg, cfg.source("shop"))


@pytest.mark.slow
def test_slot_invalidated_by_max_slot_wal_keep_size_is_lost(tmp_path):
    with LocalPostgres(settings={"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB",
                                 "min_wal_size": "32MB"}) as server:
        dsn = server.dsn()
        _run(dsn, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
        cfg = _config(tmp_path, dsn)
        run_preflight(cfg, cfg.source("shop"))
        for i in range(4):  # several WAL segments past the slot, then a checkpoint removes them
            _run(dsn, f"INSERT INTO orders SELECT g, repeat('x', 100) FROM generate_series({i * 1000}, "
                      f"{i * 1000 + 999}) g", "SELECT pg_switch_wal()")
        _run(dsn, "CHECKPOINT")
        assert _rows(dsn, "SELECT wal_status FROM pg_replication_slots")[0][0] == "lost"
        with pytest.raises(SlotLostError, match=r"slot slotlake_shop was invalidated \(wal_removed\).*"
                                                r"run `slotlake resync shop`"):
            run_preflight(cfg, cfg.source("shop"))


def test_conn_id_resolves_through_airflow(pg_db, tmp_path, monkeypatch):
    # Airflow reads connections from AIRFLOW_CONN_<ID> environment variables: a real lookup, no mock.
    monkeypatch.setenv("AIRFLOW_CONN_SLOTLAKE_TEST_SRC", pg_db)
    _run(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)")
    cfg = parse_config({"lake": str(tmp_path), "sources": {"shop": {"conn_id": "slotlake_test_src",
                                                                    "tables": ["public.orders"]}}})
    assert resolve_dsn(cfg.source("shop")).endswith(pg_db.split("://", 1)[1])
    assert run_preflight(cfg, cfg.source("shop")).slot_created


def test_partitioned_table_is_published_under_its_own_name(pg_db, tmp_path):
    _run(pg_db,
         "CREATE TABLE m (city int, day date, t real, PRIMARY KEY (city, day)) PARTITION BY RANGE (day)",
         "CREATE TABLE m_2024 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
         "CREATE PUBLICATION by_leaf FOR TABLE m")
    leaf = _config(tmp_path, pg_db, ["public.m"], publication="by_leaf", slot="s_leaf")
    with pytest.raises(PreflightError, match=r"public\.m is partitioned.*ALTER PUBLICATION \"?by_leaf\"? SET "
                                             r"\(publish_via_partition_root = true\)"):
        run_preflight(leaf, leaf.source("shop"))
    assert _rows(pg_db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 's_leaf'") == [(0,)]

    cfg = _config(tmp_path / "own", pg_db, ["public.m"])
    report = run_preflight(cfg, cfg.source("shop"))
    assert [(t.name, t.key_columns) for t in report.tables] == [("public.m", ("city", "day"))]
    assert _rows(pg_db, "SELECT pubviaroot FROM pg_publication WHERE pubname = 'slotlake_shop'") == [(True,)]
    assert _rows(pg_db, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'slotlake_shop'") == [("m",)]
