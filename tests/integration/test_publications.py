"""Sources without a table list (FOR ALL TABLES / FOR TABLES IN SCHEMA) and keyless insert-only tables, against a
real PostgreSQL, real Spark + Delta, gold compared with PostgreSQL row by row (tests/oracle.py).

The sync steps run in this process in the pipeline's order (preflight, which creates the publications and the slot
with its copy and copies tables that joined later; extract; decode; merge, which loads complete copies first).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest

from oracle import assert_gold_equals_pg
from slotlake import delta_log
from slotlake.config import parse_config
from slotlake.errors import PreflightError
from slotlake.lake import LakePaths
from slotlake.source import copies
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight

pytestmark = pytest.mark.integration

SRC = "shop"
SLOTLAKE = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "slotlake")


@pytest.fixture(autouse=True)
def small_parts(monkeypatch):
    monkeypatch.setenv("SLOTLAKE_SNAPSHOT_PART_PAGES", "4")


def _config(lake, dsn, **source):
    return parse_config({"lake": str(lake), "sources": {SRC: {"dsn": dsn, **source}}})


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for s in statements:
            c.execute(s)


def _rows(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn) as c:
        return c.execute(query).fetchall()


def _sync(spark, cfg):
    from slotlake.decode.job import run_decode
    from slotlake.merge.job import run_merge

    run_preflight(cfg, cfg.source(SRC))
    extract(cfg, cfg.source(SRC))
    run_decode(spark, cfg, SRC)
    return run_merge(spark, cfg, SRC)


def _gold(cfg) -> list[str]:
    return [f"{s}.{t}" for s, t in delta_log.gold_tables(LakePaths.of(cfg.lake, SRC).root)]


def _assert_equal(spark, cfg, dsn, tables):
    paths = LakePaths.of(cfg.lake, SRC)
    return {t: assert_gold_equals_pg(paths.gold(*t.split(".")), dsn, t) for t in tables}


@pytest.fixture
def role(pg_db, pg_server):
    """A login role with REPLICATION and CREATE on the test database, but not superuser; its DSN."""
    db = pg_db.rsplit("/", 1)[1]
    name = f"nosu_{db}"
    _sql(pg_db, f"CREATE ROLE {name} LOGIN REPLICATION", f"GRANT CREATE ON DATABASE {db} TO {name}")
    try:
        yield pg_server.dsn(db, user=name)
    finally:
        _sql(pg_db, f"DROP OWNED BY {name}")
        pg_server.psql(f"DROP ROLE IF EXISTS {name}")


# ---- preflight ------------------------------------------------------------------------------------------------

def test_no_table_list_creates_a_publication_for_all_tables(pg_db, tmp_path):
    _sql(pg_db, "CREATE TABLE orders (id int PRIMARY KEY, v text)",
         "CREATE TABLE log (at timestamptz, msg text)",  # no key, REPLICA IDENTITY DEFAULT
         "CREATE TABLE m (city int, day date, PRIMARY KEY (city, day)) PARTITION BY RANGE (day)",
         "CREATE TABLE m_2024 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
    cfg = _config(tmp_path, pg_db)
    report = run_preflight(cfg, cfg.source(SRC))
    assert report.publication_created and report.slot_created
    assert _rows(pg_db, "SELECT puballtables, pubviaroot, pubupdate FROM pg_publication "
                        "WHERE pubname = 'slotlake_shop'") == [(True, True, True)]
    assert {(t.name, t.key_columns) for t in report.tables} == {
        ("public.orders", ("id",)), ("public.log", ()), ("public.m", ("city", "day"))}
    # The keyless table does not stop the source: it is synced as appends, and the warning names the fixes.
    warning = next(w for w in report.warnings if w.startswith("public.log"))
    assert "ALTER TABLE public.log REPLICA IDENTITY FULL" in warning and "sources.shop.insert_only" in warning
    root = LakePaths.of(cfg.lake, SRC).root
    gen = copies.current_generation(root)
    assert {t for t in ("public.orders", "public.log", "public.m") if copies.complete_copy(root, t, gen)} == {
        "public.orders", "public.log", "public.m"}
    # A table created later is followed: the publication has it, and the next preflight copies it.
    _sql(pg_db, "CREATE TABLE later (id int PRIMARY KEY)", "INSERT INTO later VALUES (1), (2)")
    again = run_preflight(cfg, cfg.source(SRC))
    assert not again.publication_created and "public.later" in {t.name for t in again.tables}
    copy = copies.complete_copy(root, "public.later", gen)
    assert copy is not None and copy.kind == "current" and copy.rows == 2


def test_refused_keyless_table_names_insert_only(pg_db, tmp_path):
    _sql(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)", "CREATE TABLE history (v int)")
    cfg = _config(tmp_path, pg_db, tables=["public.orders", "public.history"])
    with pytest.raises(PreflightError, match=r"public\.history has REPLICA IDENTITY DEFAULT but no primary key.*"
                                             r"REPLICA IDENTITY FULL.*move it from sources\.shop\.tables to "
                                             r"sources\.shop\.insert_only"):
        run_preflight(cfg, cfg.source(SRC))


def test_schemas_need_existing_schemas(pg_db, tmp_path):
    _sql(pg_db, "CREATE SCHEMA sales")
    cfg = _config(tmp_path, pg_db, schemas=["sales", "nope"])
    with pytest.raises(PreflightError, match=r"schema nope does not exist.*sources\.shop\.schemas"):
        run_preflight(cfg, cfg.source(SRC))
    assert _rows(pg_db, "SELECT count(*) FROM pg_publication") == [(0,)]


def test_role_that_may_not_create_an_all_tables_publication_gets_the_statement(pg_db, role, tmp_path):
    _sql(pg_db, "CREATE TABLE orders (id int PRIMARY KEY)")
    cfg_path = tmp_path / "slotlake.yaml"
    cfg_path.write_text(f"lake: ./lake\nsources:\n  shop:\n    dsn: {role}\n")
    p = subprocess.run([SLOTLAKE, "--config", str(cfg_path), "sync", SRC], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("slotlake: error: source shop: cannot create publication slotlake_shop: "), p.stderr
    assert "superuser" in line and 'CREATE PUBLICATION "slotlake_shop" FOR ALL TABLES WITH ' \
                                   "(publish_via_partition_root = true)" in line, line
    assert "Traceback" not in p.stderr
    # TABLES IN SCHEMA needs a superuser too (PostgreSQL 15+).
    cfg = _config(tmp_path / "s", role, schemas=["public"])
    with pytest.raises(PreflightError, match=r"cannot create publication slotlake_shop: .*ask a superuser to run: "
                                             r"CREATE PUBLICATION \"slotlake_shop\" FOR TABLES IN SCHEMA "
                                             r"\"public\""):
        run_preflight(cfg, cfg.source(SRC))
    assert _rows(pg_db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'slotlake_shop'") == [(0,)]


# ---- end to end -----------------------------------------------------------------------------------------------

SHOP = """
CREATE TABLE accounts (id int PRIMARY KEY, balance numeric(12,2), owner text);
CREATE TABLE events (kind text, qty int);
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE TABLE log (msg text, n int);
INSERT INTO accounts SELECT g, g * 1.5, 'owner ' || g FROM generate_series(1, 500) g;
INSERT INTO events SELECT 'k' || (g % 7), g % 3 FROM generate_series(1, 300) g;
INSERT INTO log SELECT 'boot', g % 3 FROM generate_series(1, 50) g;
ANALYZE;
"""


@pytest.mark.spark
@pytest.mark.slow
def test_all_tables_source_follows_tables_created_later(pg_db, tmp_path, spark):
    from slotlake.decode.job import run_decode
    from slotlake.merge.job import run_merge

    _sql(pg_db, SHOP)
    cfg = _config(tmp_path / "lake", pg_db)
    src = cfg.source(SRC)
    _sync(spark, cfg)
    tables = ["public.accounts", "public.events", "public.log"]
    assert _gold(cfg) == sorted(tables)
    _assert_equal(spark, cfg, pg_db, tables)

    # Between two syncs: a new table, created and written to, and changes everywhere.
    _sql(pg_db, "CREATE TABLE fresh (id int PRIMARY KEY, v text)",
         "INSERT INTO fresh SELECT g, 'v' || g FROM generate_series(1, 200) g",
         "UPDATE fresh SET v = 'updated' WHERE id % 10 = 0", "DELETE FROM fresh WHERE id > 190",
         "UPDATE accounts SET owner = 'x' WHERE id < 20", "DELETE FROM events WHERE qty = 0",
         "INSERT INTO log SELECT 'again', g % 3 FROM generate_series(1, 20) g",
         "INSERT INTO log SELECT 'again', g % 3 FROM generate_series(1, 20) g")
    # Created after this run's preflight, written before its extract: the stream alone brings it this run.
    run_preflight(cfg, src)
    _sql(pg_db, "BEGIN; CREATE TABLE racer (id int PRIMARY KEY, v int); "
                "INSERT INTO racer SELECT g, g FROM generate_series(1, 30) g; COMMIT",
         "UPDATE racer SET v = -v WHERE id <= 5", "INSERT INTO fresh VALUES (500, 'in the same run')")
    extract(cfg, src)
    run_decode(spark, cfg, SRC)
    run_merge(spark, cfg, SRC)
    tables += ["public.fresh", "public.racer"]
    assert _gold(cfg) == sorted(tables)
    counts = _assert_equal(spark, cfg, pg_db, tables)
    assert counts["public.fresh"] == 191 and counts["public.racer"] == 30 and counts["public.log"] == 90

    # The next sync copies `racer` (no copy yet) under its own snapshot: nothing doubled, nothing missed.
    _sql(pg_db, "UPDATE racer SET v = 0 WHERE id > 25", "INSERT INTO racer VALUES (31, 31)",
         "UPDATE fresh SET v = 'later' WHERE id < 5", "INSERT INTO log VALUES ('third', 1)")
    _sync(spark, cfg)
    root = LakePaths.of(cfg.lake, SRC).root
    gen = copies.current_generation(root)
    assert all(copies.complete_copy(root, t, gen) is not None for t in tables)
    counts = _assert_equal(spark, cfg, pg_db, tables)
    assert counts["public.racer"] == 31 and counts["public.log"] == 91


@pytest.mark.spark
@pytest.mark.slow
def test_schemas_source_ignores_other_schemas(pg_db, tmp_path, spark):
    _sql(pg_db, "CREATE SCHEMA sales", "CREATE SCHEMA ops",
         "CREATE TABLE sales.orders (id int PRIMARY KEY, v text)", "CREATE TABLE ops.jobs (id int PRIMARY KEY)",
         "CREATE TABLE public.other (id int PRIMARY KEY)",
         "INSERT INTO sales.orders VALUES (1, 'a'), (2, 'b')", "INSERT INTO ops.jobs VALUES (1)",
         "INSERT INTO public.other VALUES (1)")
    cfg = _config(tmp_path / "lake", pg_db, schemas=["sales", "ops"])
    _sync(spark, cfg)
    assert _rows(pg_db, "SELECT puballtables, pubviaroot FROM pg_publication WHERE pubname = 'slotlake_shop'") == [
        (False, True)]
    _sql(pg_db, "UPDATE sales.orders SET v = 'c' WHERE id = 1", "INSERT INTO public.other VALUES (2)",
         "CREATE TABLE sales.returns (id int PRIMARY KEY)", "INSERT INTO sales.returns VALUES (7)",
         "CREATE TABLE public.later (id int PRIMARY KEY)", "INSERT INTO public.later VALUES (1)")
    _sync(spark, cfg)
    tables = ["ops.jobs", "sales.orders", "sales.returns"]
    assert _gold(cfg) == tables, "tables outside the schemas are not synced"
    _assert_equal(spark, cfg, pg_db, tables)


HISTORY = """
CREATE TABLE accounts (id int PRIMARY KEY, balance int);
CREATE TABLE history (aid int, delta int, note text);
INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 10) g;
INSERT INTO history VALUES (1, 5, 'before the slot'), (1, 5, 'before the slot');
"""


@pytest.mark.spark
@pytest.mark.slow
def test_insert_only_keyless_table_is_merged_as_appends(pg_db, tmp_path, spark):
    _sql(pg_db, HISTORY)
    cfg = _config(tmp_path / "lake", pg_db, tables=["public.accounts"], insert_only=["public.history"])
    report = run_preflight(cfg, cfg.source(SRC))
    assert [t.name for t in report.tables] == ["public.accounts", "public.history"]
    assert _rows(pg_db, "SELECT pubname, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot FROM pg_publication "
                        "ORDER BY 1") == [("slotlake_shop", True, True, True, True, True),
                                          ("slotlake_shop_insert_only", True, False, False, True, True)]
    # The application's UPDATE and DELETE keep working on both tables (a keyless table in a publication that
    # publishes updates would make PostgreSQL reject them).
    _sql(pg_db, "UPDATE accounts SET balance = balance + 1 WHERE id = 1", "UPDATE history SET note = note WHERE false",
         "DELETE FROM history WHERE false")
    _sql(pg_db, "INSERT INTO history VALUES (2, 1, 'dup'), (2, 1, 'dup')",
         "INSERT INTO history VALUES (2, 1, 'dup')", "UPDATE accounts SET balance = balance + 2 WHERE id = 2")
    _sync(spark, cfg)
    tables = ["public.accounts", "public.history"]
    assert _assert_equal(spark, cfg, pg_db, tables)["public.history"] == 5  # duplicates survive
    _sql(pg_db, "INSERT INTO history VALUES (3, 3, 'gone')", "TRUNCATE history",
         "INSERT INTO history VALUES (4, 4, 'after'), (4, 4, 'after')",
         "UPDATE accounts SET balance = 9 WHERE id = 3")
    _sync(spark, cfg)
    assert _assert_equal(spark, cfg, pg_db, tables) == {"public.accounts": 10, "public.history": 2}


@pytest.mark.spark
@pytest.mark.slow
def test_insert_only_added_to_a_running_source(pg_db, tmp_path, spark):
    """The insert-only publication is created after the slot: PostgreSQL up to 17 cannot decode the slot's older
    changes with it, so the extract reads without it up to the point the preflight recorded; a transaction that
    wrote to the table before the publication existed and commits while the preflight waits is in the copy."""
    import threading

    from slotlake.decode.job import run_decode
    from slotlake.merge.job import run_merge

    _sql(pg_db, HISTORY)
    lake = tmp_path / "lake"
    _sync(spark, _config(lake, pg_db, tables=["public.accounts"]))
    _sql(pg_db, "UPDATE accounts SET balance = 1 WHERE id = 1", "INSERT INTO history VALUES (1, 1, 'unpublished')")
    running = psycopg.connect(pg_db)
    running.execute("INSERT INTO history VALUES (9, 9, 'open across the creation'), (9, 9, 'open across the creation')")
    running.execute("UPDATE accounts SET balance = 2 WHERE id = 2")
    timer = threading.Timer(2.0, running.commit)
    timer.start()
    cfg = _config(lake, pg_db, tables=["public.accounts"], insert_only=["public.history"])
    src = cfg.source(SRC)
    try:
        run_preflight(cfg, src)  # creates the publication, waits for `running`, copies history
    finally:
        timer.join()
        running.close()
    root = LakePaths.of(cfg.lake, SRC).root
    since = copies.publication_start(root, src.slot, src.insert_only_publication)
    assert since is not None
    _sql(pg_db, "INSERT INTO history VALUES (2, 2, 'published'), (2, 2, 'published')",
         "UPDATE accounts SET balance = 3 WHERE id = 3")
    result = extract(cfg, src)
    assert result.end_lsn > since
    run_decode(spark, cfg, SRC)
    run_merge(spark, cfg, SRC)
    tables = ["public.accounts", "public.history"]
    assert _assert_equal(spark, cfg, pg_db, tables) == {"public.accounts": 10, "public.history": 7}
    _sql(pg_db, "TRUNCATE history", "INSERT INTO history VALUES (4, 4, 'next'), (4, 4, 'next')")
    _sync(spark, cfg)
    assert _assert_equal(spark, cfg, pg_db, tables)["public.history"] == 2
