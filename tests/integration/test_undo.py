"""`slotlake transactions` and `slotlake undo` against a real PostgreSQL, the real pipeline, Spark and Delta.

A workload of inserts, updates (unchanged TOAST, a key change, several changes of one row) and deletes runs on a
keyed table and a REPLICA IDENTITY FULL table with duplicate rows; the state just before a "bad" transaction is
recorded (`CREATE TABLE recorded.* AS SELECT *`: the `recorded` schema is not published), the bad transaction runs
after other changes of the same sync batch (so its before-images need gold plus silver), then one sync. The undo
script, applied to the source, must bring both tables back to the recorded state row by row; applied while a row
it would touch was changed again, it must abort naming the table and key and change nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from oracle import canonical, pg_rows
from slotlake.config import parse_config
from slotlake.decode.job import decode_watermark, run_decode
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.job import run_merge
from slotlake.recover.transactions import list_transactions
from slotlake.recover.undo import UndoError, undo
from slotlake.source.extract import extract
from slotlake.source.preflight import run_preflight

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")
TABLES = ["public.acct", "public.ev", "public.trunc_me"]
BIG = "repeat('toast-', 2000)"  # 10 kB: stored out of line, sent as unchanged TOAST when not updated
SETUP = [
    "CREATE TABLE acct (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), note text, tags text[], "
    "at timestamptz, raw bytea, doc jsonb, score float8, born date, ok boolean, \"select\" varchar(20))",
    "CREATE TABLE ev (kind text, qty int, doc json)",
    "ALTER TABLE ev REPLICA IDENTITY FULL",
    "CREATE TABLE trunc_me (id int PRIMARY KEY)",
    "CREATE TABLE nokey (v int)",
    "CREATE SCHEMA recorded",
    # rows that exist before the slot: they reach gold through the initial copy
    f"INSERT INTO acct SELECT g, 'owner ' || g, g * 10.5, CASE WHEN g % 2 = 0 THEN {BIG} ELSE 'n' || g END, "
    "ARRAY['a''b', 'c\"d', NULL, 'e\\f'], '2024-03-01 09:14:00.123456+02'::timestamptz + g * interval '1 day', "
    "'\\x00ff'::bytea || int4send(g), jsonb_build_object('k', g, 's', 'it''s'), g / 3.0, "
    "date '2020-02-29' + g, g % 3 = 0, 'sel ' || g FROM generate_series(1, 12) g",
    "INSERT INTO ev VALUES ('a', 1, '{\"x\": 1}'), ('a', 1, '{\"x\": 1}'), ('b', 2, NULL)",
    "INSERT INTO trunc_me VALUES (1), (2)",
]
PHASE_1 = [
    "INSERT INTO acct (id, owner, balance, note) VALUES (13, 'thirteen', 13, " + BIG + ")",
    "UPDATE acct SET balance = balance + 1 WHERE id <= 3",
    "DELETE FROM acct WHERE id = 11",
    "INSERT INTO ev VALUES ('c', 3, '[1, 2]')",
]
# Same batch as the bad transaction, before it: the before-images come from gold@R plus these silver changes.
BEFORE_BAD = [
    "UPDATE acct SET owner = 'just before' WHERE id = 4",
    "UPDATE acct SET balance = 99.99 WHERE id = 6",
    "INSERT INTO acct (id, owner) VALUES (20, 'twenty')",
]
# One transaction: inserts, an update leaving a TOASTed note unchanged, a key change of a TOASTed row, a delete
# (DEFAULT identity: the old tuple holds only the key), a row updated twice, a row inserted then updated, a row
# updated then deleted, and on the FULL table: one of two identical rows deleted, a row updated, a row inserted.
BAD = [
    "INSERT INTO acct (id, owner, balance, tags) VALUES (100, 'bad', 1, ARRAY['x'])",
    "UPDATE acct SET balance = 0 WHERE id = 2",
    "UPDATE acct SET id = 400 WHERE id = 4",
    "DELETE FROM acct WHERE id = 6",
    "UPDATE acct SET owner = 'twice-1' WHERE id = 3",
    "UPDATE acct SET owner = 'twice-2', ok = NULL WHERE id = 3",
    "INSERT INTO acct (id, owner) VALUES (101, 'new')",
    "UPDATE acct SET owner = 'new then changed' WHERE id = 101",
    "UPDATE acct SET owner = 'doomed' WHERE id = 8",
    "DELETE FROM acct WHERE id = 8",
    "DELETE FROM ev WHERE ctid = (SELECT min(ctid) FROM ev WHERE kind = 'a')",
    "UPDATE ev SET qty = 20 WHERE kind = 'b'",
    "INSERT INTO ev VALUES ('z', 26, '{}')",
]
AFTER_BAD = [
    "UPDATE acct SET owner = 'after, other row' WHERE id = 1",  # a later change of a row the undo does not touch
]


def _sql(dsn: str, *statements: str, one_transaction: bool = False) -> None:
    with psycopg.connect(dsn, autocommit=not one_transaction) as conn:
        for s in statements:
            conn.execute(s)


def _xid_of(dsn: str, *statements: str) -> int:
    """Run the statements as one transaction; its xid (32-bit, as pgoutput reports it)."""
    with psycopg.connect(dsn) as conn:
        for s in statements:
            conn.execute(s)
        xid = conn.execute("SELECT txid_current() % 4294967296").fetchone()[0]
        conn.commit()
    return int(xid)


def _sync(spark, cfg) -> Lsn | None:
    extract(cfg, cfg.source("src"))
    run_decode(spark, cfg, "src")
    run_merge(spark, cfg, "src")
    return decode_watermark(spark, LakePaths.of(cfg.lake, "src").changes, "src")


def _state(dsn: str, table: str) -> list[tuple]:
    """The table's rows as canonical text (oracle.canonical), sorted: equal exactly when the contents are."""
    cols, rows = pg_rows(dsn, table)
    return sorted(tuple(canonical(v, t) or "\0NULL" for v, (_, t) in zip(r, cols)) for r in rows)


def _apply(dsn: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run the script as a user would: psql -v ON_ERROR_STOP=1 -f FILE."""
    from slotlake_dev.localpg import pg_bindir

    return subprocess.run([str(pg_bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn],
                          input=script, capture_output=True, text=True, timeout=300)


def test_undo_script_restores_the_state_before_the_transaction(spark, pg_db, tmp_path):
    cfg = parse_config({"lake": str(tmp_path / "lake"), "spark": {"master": "local[2]"},
                        "sources": {"src": {"dsn": pg_db, "tables": TABLES,
                                            "insert_only": ["public.nokey"]}}})
    _sql(pg_db, *SETUP)
    run_preflight(cfg, cfg.source("src"))  # slot + initial copy
    _sync(spark, cfg)
    _sql(pg_db, *PHASE_1)
    first = _sync(spark, cfg)
    _sql(pg_db, *BEFORE_BAD)
    _sql(pg_db, "CREATE TABLE recorded.acct AS SELECT * FROM acct", "CREATE TABLE recorded.ev AS SELECT * FROM ev")
    bad = _xid_of(pg_db, *BAD)
    trunc = _xid_of(pg_db, "TRUNCATE trunc_me")
    keyless = _xid_of(pg_db, "INSERT INTO nokey VALUES (1)")
    _sql(pg_db, *AFTER_BAD)
    _sync(spark, cfg)
    expected = {t: _state(pg_db, f"recorded.{t}") for t in ("acct", "ev")}
    assert expected["acct"] != _state(pg_db, "public.acct") and expected["ev"] != _state(pg_db, "public.ev")

    # transactions: the bad one with its change counts (per change message, as silver holds them)
    listed = list_transactions(cfg, "src", str(first + 1), "FFFFFFFF/0")
    by_xid = {t.xid: t for t in listed.transactions}
    assert [t.xid for t in listed.transactions][-4:] == [bad, trunc, keyless, list(by_xid)[-1]]
    counts = {str(c.table): (c.inserted, c.updated, c.deleted, c.truncated) for c in by_xid[bad].tables}
    assert counts == {"public.acct": (2, 6, 2, 0), "public.ev": (1, 1, 1, 0)}
    assert [(str(c.table), c.truncated) for c in by_xid[trunc].tables] == [("public.trunc_me", 1)]
    only_ev = list_transactions(cfg, "src", str(first + 1), "FFFFFFFF/0", ["public.ev"])
    assert [t.xid for t in only_ev.transactions] == [bad]
    assert [str(c.table) for c in only_ev.transactions[0].tables] == ["public.ev"]
    assert len(by_xid[bad].tables) == 2 and by_xid[bad].commit_lsn < by_xid[bad].commit_end_lsn

    # refusals: TRUNCATE, a keyless table, an unknown xid
    with pytest.raises(UndoError, match="truncated public.trunc_me"):
        undo(cfg, "src", xid=trunc, spark=spark)
    with pytest.raises(UndoError, match="public.nokey has no replica identity key"):
        undo(cfg, "src", xid=keyless, spark=spark)
    with pytest.raises(UndoError, match="xid 1 is not in src's silver"):
        undo(cfg, "src", xid=1, spark=spark)

    result = undo(cfg, "src", commit_lsn=str(by_xid[bad].commit_lsn), spark=spark)
    script = result.script
    assert script.count("BEGIN;") == 1 and script.rstrip().endswith("COMMIT;")
    # the key change is set back by one UPDATE; the update that left the TOASTed note alone does not write it
    assert 'UPDATE "public"."acct" SET "id" = \'4\'::"int4" WHERE "id" = \'400\'::"int4";' in script
    row_2 = [line for line in script.splitlines()
             if line.startswith("UPDATE") and line.endswith("WHERE \"id\" = '2'::\"int4\";")]
    assert row_2 == ['UPDATE "public"."acct" SET "balance" = \'22.00\'::"numeric" WHERE "id" = \'2\'::"int4";']

    # A row the script would set back was changed again: it aborts naming table and key, and changes nothing.
    _sql(pg_db, "UPDATE acct SET owner = 'changed later' WHERE id = 400")
    now = {t: _state(pg_db, f"public.{t}") for t in ("acct", "ev")}
    p = _apply(pg_db, script)
    assert p.returncode != 0
    assert 'slotlake undo: public.acct row ("id")=(400) changed since transaction' in p.stderr
    assert {t: _state(pg_db, f"public.{t}") for t in ("acct", "ev")} == now
    _sql(pg_db, "UPDATE acct SET owner = 'just before' WHERE id = 400")
    # FULL table: one more copy of a row the transaction inserted: the count differs, abort.
    _sql(pg_db, "INSERT INTO ev VALUES ('z', 26, '{}')")
    p = _apply(pg_db, script)
    assert p.returncode != 0 and "slotlake undo: public.ev row" in p.stderr
    _sql(pg_db, "DELETE FROM ev WHERE ctid = (SELECT max(ctid) FROM ev WHERE kind = 'z')")

    p = _apply(pg_db, script)
    assert p.returncode == 0, p.stderr
    after = {t: _state(pg_db, f"public.{t}") for t in ("acct", "ev")}
    # acct id 1 keeps the later change the undo does not touch; everything else is as before the transaction
    later = [r for r in after["acct"] if r[0] == "1"]
    assert later and later[0][1] == "after, other row"
    assert after["ev"] == expected["ev"]
    assert [r for r in after["acct"] if r[0] != "1"] == [r for r in expected["acct"] if r[0] != "1"]
    # Running it again aborts (the rows are no longer as the transaction left them) and changes nothing.
    p = _apply(pg_db, script)
    assert p.returncode != 0 and "slotlake undo:" in p.stderr
    assert {t: _state(pg_db, f"public.{t}") for t in ("acct", "ev")} == after


def test_cli_transactions_and_undo(pg_db, tmp_path):
    """The console script: `transactions --json` finds the transaction, `undo --xid --out` writes the script."""
    config = tmp_path / "slotlake.yaml"
    config.write_text(f"lake: ./lake\nspark: {{master: \"local[1]\"}}\nsources:\n  src:\n    dsn: {pg_db}\n"
                      "    tables: [public.acct]\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SLOTLAKE, "--config", str(config), *args], capture_output=True, text=True,
                              timeout=900, cwd=tmp_path, env=os.environ)

    _sql(pg_db, "CREATE TABLE acct (id int PRIMARY KEY, owner text)", "INSERT INTO acct VALUES (1, 'one')")
    assert cli("sync", "src").returncode == 0
    before = _state(pg_db, "public.acct")
    xid = _xid_of(pg_db, "INSERT INTO acct VALUES (2, 'two')", "UPDATE acct SET owner = 'uno' WHERE id = 1")
    assert cli("sync", "src").returncode == 0
    p = cli("transactions", "src", "--from", "0/0", "--to", "FFFFFFFF/0", "--json")
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)["transactions"]
    assert [(t["xid"], t["tables"]) for t in listed] == [
        (xid, [{"table": "public.acct", "inserted": 1, "updated": 1, "deleted": 0, "truncated": 0}])]
    p = cli("transactions", "src", "--from", "0/0", "--to", "FFFFFFFF/0")
    assert p.returncode == 0 and str(xid) in p.stdout and "public.acct" in p.stdout
    out = tmp_path / "undo.sql"
    p = cli("undo", "src", "--xid", str(xid), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert f"transaction {xid}" in p.stdout
    assert "in this process" in p.stderr, p.stderr[-3000:]  # no Spark session (recover/undo_in_process.py)
    assert _apply(pg_db, out.read_text()).returncode == 0
    assert _state(pg_db, "public.acct") == before
    p = cli("undo", "src", "--xid", "7")
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith("slotlake: error: xid 7 is not in")


def _undo_rows(t) -> tuple:
    """A `TableUndo` as (table, removed rows, added rows, {row: rows equal to it after the transaction}), the rows as
    multisets: the two paths list them in their own orders (`after_counts` follows the first-seen order)."""
    def key(r: dict) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in r.items()))

    distinct = list(dict.fromkeys(key(r) for r in (*t.removed, *t.added)))
    return (str(t.table), sorted(key(r) for r in t.removed), sorted(key(r) for r in t.added),
            dict(zip(distinct, t.after_counts, strict=True)) if t.after_counts else {})


def test_undo_without_spark_writes_the_spark_states_script(spark, pg_db, tmp_path, caplog):
    """A transaction the in-process merge takes (key changes but no unchanged TOAST, FULL rows deleted and updated):
    `undo` without a Spark session builds both states in this process (`recover/undo_in_process.py`) and writes
    the script the Spark states give, line for line; applied, it brings both tables back to the state recorded
    just before the transaction."""
    import logging

    cfg = parse_config({"lake": str(tmp_path / "lake"), "spark": {"master": "local[2]"},
                        "sources": {"src": {"dsn": pg_db, "tables": ["public.acct", "public.ev"]}}})
    _sql(pg_db,
         "CREATE TABLE acct (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), at timestamptz, "
         "born date, ok boolean)",
         "CREATE TABLE ev (kind text, qty int)", "ALTER TABLE ev REPLICA IDENTITY FULL", "CREATE SCHEMA recorded",
         "INSERT INTO acct SELECT g, 'owner ' || g, g * 10.5, '2024-03-01 09:14:00.123456+02'::timestamptz + "
         "g * interval '1 day', date '2020-02-29' + g, g % 3 = 0 FROM generate_series(1, 12) g",
         "INSERT INTO ev VALUES ('a', 1), ('a', 1), ('b', 2)")
    run_preflight(cfg, cfg.source("src"))
    _sync(spark, cfg)
    _sql(pg_db, "UPDATE acct SET balance = balance + 1 WHERE id <= 3", "INSERT INTO ev VALUES ('c', 3)")
    _sync(spark, cfg)
    _sql(pg_db, "UPDATE acct SET owner = 'just before' WHERE id = 4", "INSERT INTO acct VALUES (20, 'twenty')")
    _sql(pg_db, "CREATE TABLE recorded.acct AS SELECT * FROM acct", "CREATE TABLE recorded.ev AS SELECT * FROM ev")
    bad = _xid_of(pg_db,
                  "INSERT INTO acct (id, owner, balance) VALUES (100, 'bad', 1)",
                  "UPDATE acct SET balance = 0, at = NULL WHERE id = 2",
                  "DELETE FROM acct WHERE id = 6",  # DEFAULT identity: the old tuple holds only the key
                  "UPDATE acct SET owner = 'twice-1' WHERE id = 3", "UPDATE acct SET owner = 'twice-2' WHERE id = 3",
                  "INSERT INTO acct (id, owner) VALUES (101, 'new')",
                  "UPDATE acct SET owner = 'new then changed' WHERE id = 101",
                  "UPDATE acct SET owner = 'doomed' WHERE id = 8", "DELETE FROM acct WHERE id = 8",
                  "UPDATE acct SET id = 500, owner = 'moved' WHERE id = 9",  # key changes: one row, two in a chain
                  "UPDATE acct SET id = 600 WHERE id = 10", "UPDATE acct SET id = 10 WHERE id = 11",
                  # FULL: inserts (two identical), one of two identical rows deleted, a row updated
                  "INSERT INTO ev VALUES ('z', 26), ('z', 26), ('y', NULL)",
                  "DELETE FROM ev WHERE ctid = (SELECT ctid FROM ev WHERE kind = 'a' LIMIT 1)",
                  "UPDATE ev SET qty = 9 WHERE kind = 'b'")
    _sql(pg_db, "UPDATE acct SET owner = 'after, other row' WHERE id = 1")
    _sync(spark, cfg)

    with caplog.at_level(logging.INFO, logger="slotlake"):
        here = undo(cfg, "src", xid=bad)
    assert "added by the transaction" in caplog.text and "in this process" in caplog.text, caplog.text[-3000:]
    assert "the states of" not in caplog.text  # not handed to Spark
    by_spark = undo(cfg, "src", xid=bad, spark=spark)
    assert sorted(here.script.splitlines()) == sorted(by_spark.script.splitlines())
    assert [_undo_rows(t) for t in here.tables] == [_undo_rows(t) for t in by_spark.tables]

    p = _apply(pg_db, here.script)
    assert p.returncode == 0, p.stderr
    after = {t: _state(pg_db, f"public.{t}") for t in ("acct", "ev")}
    expected = {t: _state(pg_db, f"recorded.{t}") for t in ("acct", "ev")}
    assert after["ev"] == expected["ev"]
    assert [r for r in after["acct"] if r[0] != "1"] == [r for r in expected["acct"] if r[0] != "1"]
    assert not any(Path(LakePaths.of(cfg.lake, "src").root, "_undo").iterdir())  # scratch removed
