"""DDL capture against a real PostgreSQL: the event triggers' messages as pgoutput delivers them from a slot."""
from __future__ import annotations

import struct
import uuid

import psycopg
import pytest

from slotlake.decode.messages import DDL_MESSAGE_PREFIX, ReplicaIdentity
from slotlake.errors import PreflightError
from slotlake.lsn import Lsn
from slotlake.source.catalog_read import read_table_defs
from slotlake.source.ddl import (
    DdlEvent,
    TableDef,
    ddl_capture_installed,
    install_ddl_capture,
    parse_ddl_event,
    uninstall_ddl_capture,
)
from slotlake.source.slot import current_wal_lsn

pytestmark = pytest.mark.integration

_HEAD = struct.Struct(">BQ")  # flags, lsn
_LEN = struct.Struct(">i")


def _message_frame(data: bytes) -> tuple[bool, int, str, bytes]:
    """pgoutput 'M': int8 flags, int64 lsn, prefix cstring, int32 length, content (parsed here on purpose,
    independently of slotlake.decode.pgoutput, so this test checks the wire bytes themselves)."""
    assert data[:1] == b"M"
    flags, lsn = _HEAD.unpack_from(data, 1)
    end = data.index(b"\0", 1 + _HEAD.size)
    prefix = data[1 + _HEAD.size:end].decode()
    (n,) = _LEN.unpack_from(data, end + 1)
    content = data[end + 1 + _LEN.size:]
    assert len(content) == n
    return bool(flags & 1), lsn, prefix, content


@pytest.fixture
def conn(pg_db):
    with psycopg.connect(pg_db, autocommit=True) as c:
        yield c


@pytest.fixture
def slot(conn):
    """A pgoutput slot and a publication with random names (the pg_db fixture drops the slot)."""
    name = "s_" + uuid.uuid4().hex[:8]
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
    conn.execute(f"CREATE PUBLICATION {name} FOR ALL TABLES")
    return name


def _peek_events(conn: psycopg.Connection, slot: str) -> list[tuple[int, DdlEvent]]:
    """(message LSN, event) for every slotlake.ddl message in the slot, in stream (= commit) order."""
    # Decoding stops at the flushed WAL position, and the test server runs with synchronous_commit=off, so
    # a commit made just now may not be flushed yet. A synchronous commit that writes WAL flushes all before it.
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        conn.execute("SELECT pg_logical_emit_message(true, 'test.flush', '')")
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
        "'publication_names', %s, 'messages', 'true')", [slot, slot]).fetchall()
    out = []
    for _, data in rows:
        if data[:1] != b"M":
            continue
        transactional, lsn, prefix, content = _message_frame(bytes(data))
        if prefix == DDL_MESSAGE_PREFIX:
            assert transactional, "DDL events must be transactional so they arrive at the DDL's commit"
            out.append((lsn, parse_ddl_event(content)))
    return out


def _cols(t: TableDef) -> list[tuple]:
    return [(c.attnum, c.name, c.type_name, c.default, c.is_key) for c in t.columns]


def test_ddl_sequence_arrives_in_commit_order_with_definitions(conn, slot):
    install_ddl_capture(conn)
    assert ddl_capture_installed(conn)
    ddl = [
        "CREATE TABLE public.orders (id int PRIMARY KEY, amount numeric(10,2), note text)",
        "ALTER TABLE public.orders ADD COLUMN status varchar(20) NOT NULL DEFAULT 'new'",
        "ALTER TABLE public.orders RENAME COLUMN note TO remark",
        "ALTER TABLE public.orders ALTER COLUMN amount TYPE numeric(12,3)",
        "CREATE FUNCTION public.twice(x int) RETURNS int LANGUAGE sql AS 'SELECT 2 * x'",
        "CREATE INDEX orders_status ON public.orders (status)",
        "ALTER TABLE public.orders DROP COLUMN remark",
        "ALTER TABLE public.orders REPLICA IDENTITY FULL",
        "ALTER TABLE public.orders RENAME TO purchases",
        "DROP TABLE public.purchases",
    ]
    for q in ddl:
        conn.execute(q)
    # the unrelated DDL went through and works
    assert conn.execute("SELECT public.twice(21)").fetchone()[0] == 42

    events = _peek_events(conn, slot)
    tags = [(e.event, e.command_tag) for _, e in events]
    assert tags == [("ddl_command_end", "CREATE TABLE")] + [("ddl_command_end", "ALTER TABLE")] * 6 + [
        ("sql_drop", "DROP TABLE")]
    # one event per DDL statement on the table, none for CREATE FUNCTION / CREATE INDEX
    table_ddl = [q for q in ddl if "twice" not in q and "CREATE INDEX" not in q]
    assert [e.query for _, e in events] == table_ddl
    lsns = [lsn for lsn, _ in events]
    assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns)

    defs = [e.tables for _, e in events[:-1]]
    assert all(len(t) == 1 for t in defs)
    create, add, rename, retype, drop_col, full, rename_table = (t[0] for t in defs)
    oid = create.oid
    assert all(t[0].oid == oid for t in defs)

    assert (create.schema, create.name, create.replica_identity) == ("public", "orders", ReplicaIdentity.DEFAULT)
    assert _cols(create) == [(1, "id", "integer", None, True), (2, "amount", "numeric(10,2)", None, False),
                             (3, "note", "text", None, False)]
    amount = create.columns[1]
    assert (amount.type_oid, amount.typmod, amount.not_null) == (1700, (10 << 16 | 2) + 4, False)
    assert create.columns[0].not_null

    status = add.columns[3]
    assert (status.attnum, status.name, status.type_name, status.not_null, status.default) == (
        4, "status", "character varying(20)", True, "'new'::character varying")
    assert status.type_oid == 1043 and status.typmod == 24

    # a rename keeps the attnum: it is not a drop + add
    assert _cols(rename)[2] == (3, "remark", "text", None, False)
    assert [c.attnum for c in rename.columns] == [1, 2, 3, 4]

    assert retype.columns[1].type_name == "numeric(12,3)" and retype.columns[1].attnum == 2

    # the dropped column is gone, the others keep their attnums (a gap at 3)
    assert [(c.attnum, c.name) for c in drop_col.columns] == [(1, "id"), (2, "amount"), (4, "status")]
    assert drop_col.key_columns == ("id",)

    assert full.replica_identity is ReplicaIdentity.FULL
    assert full.key_columns == ("id", "amount", "status")

    assert (rename_table.schema, rename_table.name, rename_table.oid) == ("public", "purchases", oid)
    assert rename_table.columns == full.columns

    dropped = events[-1][1]
    assert [(d.oid, d.schema, d.name) for d in dropped.dropped] == [(oid, "public", "purchases")]
    assert dropped.tables == ()


def test_events_share_the_transaction_and_vanish_on_rollback(conn, slot):
    install_ddl_capture(conn)
    with conn.transaction():
        conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
        conn.execute("CREATE SCHEMA s2")  # tag CREATE SCHEMA, but no table: no event
        conn.execute("ALTER TABLE a SET SCHEMA s2")
    with pytest.raises(psycopg.errors.DivisionByZero):
        with conn.transaction():
            conn.execute("CREATE TABLE b (id int)")
            conn.execute("SELECT 1/0")
    events = [e for _, e in _peek_events(conn, slot)]
    assert [(e.command_tag, e.tables[0].schema, e.tables[0].name) for e in events] == [
        ("CREATE TABLE", "public", "a"), ("ALTER TABLE", "s2", "a")]


def test_replica_identity_using_index_and_create_schema_with_tables(conn, slot):
    install_ddl_capture(conn)
    conn.execute("CREATE SCHEMA shop CREATE TABLE items (id bigint GENERATED ALWAYS AS IDENTITY, "
                 "sku text NOT NULL, qty int NOT NULL, total int GENERATED ALWAYS AS (qty * 2) STORED)")
    conn.execute("CREATE UNIQUE INDEX items_sku_qty ON shop.items (sku, qty)")
    conn.execute("ALTER TABLE shop.items REPLICA IDENTITY USING INDEX items_sku_qty")
    conn.execute("ALTER TABLE shop.items REPLICA IDENTITY NOTHING")
    events = [e for _, e in _peek_events(conn, slot)]
    assert [e.command_tag for e in events] == ["CREATE SCHEMA", "ALTER TABLE", "ALTER TABLE"]
    created, by_index, nothing = (e.tables[0] for e in events)
    assert created.qualified_name == "shop.items" and created.key_columns == ()
    assert [(c.name, c.identity, c.generated) for c in created.columns] == [
        ("id", "a", ""), ("sku", "", ""), ("qty", "", ""), ("total", "", "s")]
    assert created.columns[3].default == "(qty * 2)"
    assert by_index.replica_identity is ReplicaIdentity.INDEX
    assert by_index.key_columns == ("sku", "qty")
    assert nothing.replica_identity is ReplicaIdentity.NOTHING and nothing.key_columns == ()


def test_bootstrap_read_matches_the_ddl_event(conn, slot):
    """The Python bootstrap query and slotlake.table_def in the SQL file build the same TableDef."""
    install_ddl_capture(conn)
    conn.execute("CREATE SCHEMA app")
    conn.execute("CREATE TYPE app.mood AS ENUM ('ok', 'sad')")
    conn.execute("SET search_path = app, public")  # the session's path must not change type or default text
    conn.execute('CREATE TABLE app."Order Items" (id serial PRIMARY KEY, m app.mood DEFAULT \'ok\', '
                 "price numeric(8,2), tags text[], at timestamptz DEFAULT now(), code char(3))")
    conn.execute("CREATE TABLE public.plain (k int NOT NULL, v text)")
    conn.execute("CREATE UNIQUE INDEX plain_k ON public.plain (k)")
    conn.execute("ALTER TABLE public.plain REPLICA IDENTITY USING INDEX plain_k")
    conn.execute("ALTER TABLE public.plain ADD COLUMN w int DEFAULT 3")
    conn.execute("ALTER TABLE public.plain DROP COLUMN v")
    conn.execute("RESET search_path")
    latest = {}
    for _, e in _peek_events(conn, slot):
        for t in e.tables:
            latest[t.oid] = t
    boot = read_table_defs(conn)
    assert [t.qualified_name for t in boot] == ['app."Order Items"', "public.plain"]  # canonical names (TableName)
    assert boot == [latest[t.oid] for t in boot]
    items = boot[0]
    assert [c.type_name for c in items.columns] == ["integer", "app.mood", "numeric(8,2)", "text[]",
                                                    "timestamp with time zone", "character(3)"]
    assert items.columns[0].default == "nextval('app.\"Order Items_id_seq\"'::regclass)"
    assert items.columns[1].default == "'ok'::app.mood"
    assert boot[1].key_columns == ("k",) and [c.attnum for c in boot[1].columns] == [1, 3]


def test_bootstrap_read_without_capture_installed(conn):
    """No event triggers, no superuser needed: plain catalog reads, with a named subset and missing names."""
    conn.execute("CREATE TABLE public.t1 (id int PRIMARY KEY, x text)")
    conn.execute("CREATE TABLE public.t2 (id int)")
    conn.execute("ALTER TABLE public.t2 REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE public.parts (id int, d date) PARTITION BY RANGE (d)")
    conn.execute("CREATE TEMP TABLE scratch (id int)")
    conn.execute("CREATE VIEW public.v AS SELECT 1 AS one")
    assert not ddl_capture_installed(conn)
    everything = read_table_defs(conn)
    assert [(t.qualified_name, t.kind) for t in everything] == [
        ("public.parts", "p"), ("public.t1", "r"), ("public.t2", "r")]
    t2, t1 = read_table_defs(conn, ["public.t2", "public.t1"])[::-1]
    assert t1.key_columns == ("id",) and t2.key_columns == ("id",) and t2.replica_identity is ReplicaIdentity.FULL
    with pytest.raises(PreflightError, match=r"public\.nope, other\.t1"):
        read_table_defs(conn, ["public.t1", "public.nope", "other.t1"])
    with pytest.raises(PreflightError, match="schema.table"):
        read_table_defs(conn, ["t1"])
    # the search_path pinned for the read does not leak into the caller's transaction
    with conn.transaction():
        conn.execute("SET LOCAL search_path = public")
        read_table_defs(conn, ["public.t1"])
        assert conn.execute("SHOW search_path").fetchone()[0] == "public"


def test_current_wal_lsn_moves_forward(conn):
    before = current_wal_lsn(conn)
    with conn.transaction():
        # pg_current_wal_lsn is the write position: an asynchronous commit (the test server's default) may not
        # have reached it yet; a synchronous one has.
        conn.execute("SET LOCAL synchronous_commit = on")
        conn.execute("CREATE TABLE w (x int)")
        conn.execute("INSERT INTO w SELECT generate_series(1, 1000)")
    after = current_wal_lsn(conn)
    assert isinstance(before, Lsn) and after > before
    server = Lsn.parse(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    assert after <= server


def test_a_failing_capture_does_not_block_ddl_and_is_recorded(conn, slot):
    install_ddl_capture(conn)
    # Simulate a capture bug: the definition builder raises.
    conn.execute("CREATE OR REPLACE FUNCTION slotlake.table_def(rel oid) RETURNS jsonb LANGUAGE plpgsql AS "
                 "$$BEGIN RAISE EXCEPTION 'boom in capture'; END$$")
    conn.execute("CREATE TABLE survives (id int)")
    assert conn.execute("SELECT count(*) FROM survives").fetchone()[0] == 0
    events = [e for _, e in _peek_events(conn, slot)]
    assert len(events) == 1 and events[0].is_error
    assert events[0].command_tag == "CREATE TABLE" and events[0].query == "CREATE TABLE survives (id int)"
    assert events[0].error == "P0001: boom in capture"
    # reinstalling repairs it
    install_ddl_capture(conn)
    conn.execute("ALTER TABLE survives ADD COLUMN y int")
    last = _peek_events(conn, slot)[-1][1]
    assert not last.is_error and [c.name for c in last.tables[0].columns] == ["id", "y"]


def test_non_superuser_ddl_is_captured(conn, slot, pg_db):
    install_ddl_capture(conn)
    role = "app_" + uuid.uuid4().hex[:6]
    conn.execute(f"CREATE ROLE {role} LOGIN")
    conn.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
    try:
        with psycopg.connect(pg_db.replace("//postgres@", f"//{role}@"), autocommit=True) as app:
            assert app.execute("SELECT current_user").fetchone()[0] == role
            app.execute("CREATE TABLE owned (id int PRIMARY KEY)")
            app.execute("DROP TABLE owned")
            with pytest.raises(PreflightError, match="superuser"):
                install_ddl_capture(app)
        events = [e for _, e in _peek_events(conn, slot)]
        assert [(e.event, e.command_tag) for e in events] == [("ddl_command_end", "CREATE TABLE"),
                                                               ("sql_drop", "DROP TABLE")]
    finally:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def test_uninstall_and_reinstall(conn, slot):
    install_ddl_capture(conn)
    install_ddl_capture(conn)  # idempotent: replaces, does not duplicate
    assert conn.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'slotlake%'").fetchone()[0] == 2
    conn.execute("CREATE TABLE one (id int)")
    assert len(_peek_events(conn, slot)) == 1

    uninstall_ddl_capture(conn)
    uninstall_ddl_capture(conn)  # safe when already gone
    assert not ddl_capture_installed(conn)
    assert conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'slotlake'").fetchone()[0] == 0
    conn.execute("ALTER TABLE one ADD COLUMN x int")  # DDL still works, and emits nothing
    conn.execute("DROP TABLE one")
    assert len(_peek_events(conn, slot)) == 1

    install_ddl_capture(conn)
    assert ddl_capture_installed(conn)
    conn.execute("CREATE TABLE two (id int)")
    assert [e.tables[0].name for _, e in _peek_events(conn, slot) if e.tables] == ["one", "two"]

    conn.execute("ALTER EVENT TRIGGER slotlake_sql_drop DISABLE")
    assert not ddl_capture_installed(conn)  # a disabled trigger means drops would be missed


def test_alter_on_a_parent_carries_every_partition_and_child(conn, slot):
    """PostgreSQL reports only the parent for ALTER TABLE, but partitions and children change too."""
    install_ddl_capture(conn)
    conn.execute("CREATE TABLE m (id int, d date, PRIMARY KEY (id, d)) PARTITION BY RANGE (d)")
    conn.execute("CREATE TABLE m_2024 PARTITION OF m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')")
    # a partition with a dropped column: its attnums differ from the parent's
    conn.execute("CREATE TABLE m_2025 (junk int, id int NOT NULL, d date NOT NULL)")
    conn.execute("ALTER TABLE m_2025 DROP COLUMN junk")
    conn.execute("ALTER TABLE m ATTACH PARTITION m_2025 FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')")
    conn.execute("ALTER TABLE m ADD COLUMN x int DEFAULT 1")
    conn.execute("CREATE TABLE p (a int)")
    conn.execute("CREATE TABLE ch () INHERITS (p)")
    conn.execute("ALTER TABLE p RENAME COLUMN a TO aa")
    conn.execute("DROP TABLE m")
    events = [e for _, e in _peek_events(conn, slot)]
    attach, add, rename, drop = events[4], events[5], events[8], events[9]
    assert attach.query.startswith("ALTER TABLE m ATTACH")
    # attaching gave m_2025 the partitioned primary key
    assert {t.name: t.key_columns for t in attach.tables} == {"m": ("id", "d"), "m_2024": ("id", "d"),
                                                              "m_2025": ("id", "d")}
    assert [(t.name, [(c.attnum, c.name, c.default) for c in t.columns]) for t in add.tables] == [
        ("m", [(1, "id", None), (2, "d", None), (3, "x", "1")]),
        ("m_2024", [(1, "id", None), (2, "d", None), (3, "x", "1")]),
        ("m_2025", [(2, "id", None), (3, "d", None), (4, "x", "1")])]
    assert [(t.name, t.kind) for t in add.tables][:1] == [("m", "p")]
    assert [(t.name, [c.name for c in t.columns]) for t in rename.tables] == [("p", ["aa"]), ("ch", ["aa"])]
    assert sorted(d.name for d in drop.dropped) == ["m", "m_2024", "m_2025"]


def test_a_huge_query_text_is_capped(conn, slot):
    install_ddl_capture(conn)
    query = "CREATE TABLE big (id int) /* " + "x" * 70_000 + " */"
    conn.execute(query)
    (_, e), = _peek_events(conn, slot)
    assert e.query_truncated and e.query == query[:65536]
    assert e.tables[0].name == "big"


def test_definitions_agree_with_pgoutput_relation_messages(conn, slot):
    """What the capture says about a table is what pgoutput's Relation message says before its next row change:
    same columns in the same order (generated ones left out), type OIDs, typmods, key flags, identity."""
    from slotlake.decode.messages import Message, Relation
    from slotlake.decode.pgoutput import decode_message

    install_ddl_capture(conn)
    conn.execute("CREATE TABLE r (a int, junk int, b varchar(9) NOT NULL, c numeric(5,1), "
                 "g int GENERATED ALWAYS AS (a + 1) STORED)")
    conn.execute("ALTER TABLE r DROP COLUMN junk")
    conn.execute("CREATE UNIQUE INDEX r_b ON r (b)")
    steps = ["ALTER TABLE r REPLICA IDENTITY USING INDEX r_b", "ALTER TABLE r ADD PRIMARY KEY (a)",
             "ALTER TABLE r REPLICA IDENTITY DEFAULT", "ALTER TABLE r RENAME COLUMN c TO cc",
             "ALTER TABLE r REPLICA IDENTITY FULL", "ALTER TABLE r ALTER COLUMN cc TYPE numeric(7,2)"]
    for i, q in enumerate(steps):
        conn.execute(q)
        conn.execute("INSERT INTO r (a, b, cc) VALUES (%s, %s, 1)" if i >= 3 else
                     "INSERT INTO r (a, b, c) VALUES (%s, %s, 1)", [i, f"k{i}"])
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        conn.execute("SELECT pg_logical_emit_message(true, 'test.flush', '')")
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
        "'publication_names', %s, 'messages', 'true')", [slot, slot]).fetchall()
    last_def: TableDef | None = None
    compared = 0
    for (data,) in rows:
        msg = decode_message(bytes(data))
        if isinstance(msg, Message) and msg.prefix == DDL_MESSAGE_PREFIX:
            event = parse_ddl_event(msg.content)
            last_def = event.tables[-1] if event.tables else last_def
        elif isinstance(msg, Relation):
            assert last_def is not None and msg.oid == last_def.oid
            assert msg.replica_identity is last_def.replica_identity
            cols = last_def.replicated_columns
            assert [(c.name, c.type_oid, c.typmod, c.is_key) for c in msg.columns] == [
                (c.name, c.type_oid, c.typmod, c.is_key) for c in cols]
            compared += 1
    assert compared == len(steps)
    assert "g" not in [c.name for c in last_def.replicated_columns] and last_def.columns[-1].name == "g"
