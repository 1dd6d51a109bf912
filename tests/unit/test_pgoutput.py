"""The pgoutput decoder against frames captured from the real test server, plus malformed frames.

The captured frames come from `pg_logical_slot_peek_binary_changes` with the options the extract uses; every
scenario is one transaction so its frames can be picked out by xid.
"""
from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from pgframes import Capture, Frame
from slotlake.decode.frames import BronzeRow, SeenCommit, SeenRelation, SeenType, SilverChange, decode_stream
from slotlake.decode.messages import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    ReplicaIdentity,
    Truncate,
    Type,
    Update,
)
from slotlake.decode.pgoutput import PG_EPOCH_UNIX_US, decode_message
from slotlake.errors import DecodeError
from slotlake.lsn import Lsn

BIG = "x" * 200_000  # stored out of line (STORAGE EXTERNAL), so an update not touching it sends 'u'

SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE TABLE items (id int PRIMARY KEY, name varchar(20), price numeric(10,2), at timestamptz, "
    "raw bytea, ok boolean, m mood)",
    "CREATE TABLE full_rows (a int, b text)",
    "ALTER TABLE full_rows REPLICA IDENTITY FULL",
    "CREATE TABLE docs (id int PRIMARY KEY, body text, n int)",
    "ALTER TABLE docs ALTER body SET STORAGE EXTERNAL",
    "CREATE TABLE tr1 (id serial PRIMARY KEY)",
    "CREATE TABLE tr2 (id int)",
]

SCENARIOS = {
    "insert": ["INSERT INTO items VALUES (1, 'pen', 1.5, '2024-05-06 07:08:09.123456+02', '\\x00ff', true, 'happy')"],
    "insert_nulls": ["INSERT INTO items (id) VALUES (2)"],
    "update": ["UPDATE items SET name = 'ink' WHERE id = 1"],
    "update_key": ["UPDATE items SET id = 20 WHERE id = 2"],
    "delete": ["DELETE FROM items WHERE id = 1"],
    "full_insert": ["INSERT INTO full_rows VALUES (1, 'a'), (1, 'a')"],
    "full_update": ["UPDATE full_rows SET b = 'z' WHERE ctid = (SELECT min(ctid) FROM full_rows)"],
    "full_delete": ["DELETE FROM full_rows WHERE b = 'a'"],
    "toast_insert": [f"INSERT INTO docs VALUES (1, '{BIG}', 0)"],
    "toast_update": ["UPDATE docs SET n = 1 WHERE id = 1"],
    "truncate": ["INSERT INTO tr1 DEFAULT VALUES", "TRUNCATE tr1, tr2 RESTART IDENTITY"],
    "message": ["SELECT pg_logical_emit_message(true, 'x', 'y')"],
}


@pytest.fixture(scope="module")
def captured(pg_server):
    """{scenario: [Frame, ...]} of one transaction each, captured once for the module."""
    db = "t_" + uuid.uuid4().hex[:10]
    pg_server.psql(f"CREATE DATABASE {db}")
    cap = Capture(pg_server.dsn(db))
    try:
        for sql in SETUP:
            cap.execute(sql)
        started = time.time()
        xids = {name: cap.transaction(*sqls) for name, sqls in SCENARIOS.items()}
        frames = cap.peek()
        by_xid: dict[int, list[Frame]] = {}
        for f in frames:
            by_xid.setdefault(f.xid, []).append(f)
        yield {name: by_xid.get(xid, []) for name, xid in xids.items()} | {"_all": frames, "_started": started,
                                                                            "_xids": xids}
    finally:
        cap.close()
        pg_server.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def decoded(captured, name):
    return [decode_message(f.data, Lsn.parse(f.lsn)) for f in captured[name]]


def changes(captured, name):
    """The decoded messages of a scenario without Begin/Commit/Relation/Type."""
    return [m for m in decoded(captured, name) if not isinstance(m, (Begin, Commit, Relation, Type))]


def relation(captured, name, table):
    return next(m for m in decoded(captured, name) if isinstance(m, Relation) and m.name == table)


pytestmark = pytest.mark.integration


def test_begin_and_commit_frame_every_transaction(captured):
    for name, xid in captured["_xids"].items():
        msgs = decoded(captured, name)
        begin, commit = msgs[0], msgs[-1]
        assert isinstance(begin, Begin) and isinstance(commit, Commit), name
        assert begin.xid == xid
        assert begin.final_lsn == commit.commit_lsn
        assert commit.end_lsn > commit.commit_lsn
        assert commit.flags == 0
        assert begin.commit_ts_us == commit.commit_ts_us
        # PostgreSQL epoch: the commit happened during this test run.
        unix_s = (begin.commit_ts_us + PG_EPOCH_UNIX_US) / 1e6
        assert captured["_started"] - 5 < unix_s < time.time() + 5


def test_relation_message_columns_types_typmods_keys(captured):
    rel = relation(captured, "insert", "items")
    mood_oid = next(m for m in decoded(captured, "insert") if isinstance(m, Type)).oid
    assert rel.schema == "public" and rel.replica_identity is ReplicaIdentity.DEFAULT
    assert rel.columns == (
        Column("id", 23, -1, True),
        Column("name", 1043, 24, False),  # varchar(20): typmod = 20 + 4
        Column("price", 1700, (10 << 16 | 2) + 4, False),
        Column("at", 1184, -1, False),
        Column("raw", 17, -1, False),
        Column("ok", 16, -1, False),
        Column("m", mood_oid, -1, False),
    )


def test_type_message_for_custom_enum(captured):
    types = [m for m in decoded(captured, "insert") if isinstance(m, Type)]
    assert [(t.schema, t.name) for t in types] == [("public", "mood")]
    assert types[0].oid >= 16384  # a user type


def test_full_identity_relation(captured):
    rel = relation(captured, "full_insert", "full_rows")
    assert rel.replica_identity is ReplicaIdentity.FULL
    # With FULL every column is part of the identity.
    assert [c.is_key for c in rel.columns] == [True, True]


@pytest.mark.parametrize(
    "scenario, table, expected",
    [
        ("insert", "items", [Insert(0, ("1", "pen", "1.50", "2024-05-06 05:08:09.123456+00", "\\x00ff", "t",
                                        "happy"))]),
        ("insert_nulls", "items", [Insert(0, ("2", None, None, None, None, None, None))]),
        ("update", "items", [Update(0, None, None, ("1", "ink", "1.50", "2024-05-06 05:08:09.123456+00", "\\x00ff",
                                                    "t", "happy"))]),
        ("update_key", "items", [Update(0, "K", ("2", None, None, None, None, None, None),
                                        ("20", None, None, None, None, None, None))]),
        ("delete", "items", [Delete(0, "K", ("1", None, None, None, None, None, None))]),
        ("full_insert", "full_rows", [Insert(0, ("1", "a")), Insert(0, ("1", "a"))]),
        ("full_update", "full_rows", [Update(0, "O", ("1", "a"), ("1", "z"))]),
        ("full_delete", "full_rows", [Delete(0, "O", ("1", "a"))]),
        ("toast_insert", "docs", [Insert(0, ("1", BIG, "0"))]),
        ("toast_update", "docs", [Update(0, None, None, ("1", UNCHANGED_TOAST, "1"))]),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "",
)
def test_row_changes_decode_exactly(captured, scenario, table, expected):
    oids = {m.name: m.oid for f in captured["_all"] if f.data[:1] == b"R"
            for m in [decode_message(f.data)]}
    assert changes(captured, scenario) == [dataclasses.replace(e, relation_oid=oids[table]) for e in expected]


def test_truncate_lists_both_relations_with_restart_identity(captured):
    msgs = changes(captured, "truncate")
    assert isinstance(msgs[0], Insert)
    trunc = msgs[1]
    rels = {m.name: m.oid for m in decoded(captured, "truncate") if isinstance(m, Relation)}
    assert trunc == Truncate(options=2, relation_oids=(rels["tr1"], rels["tr2"]))


def test_transactional_logical_message(captured):
    msgs = changes(captured, "message")
    begin = decoded(captured, "message")[0]
    assert len(msgs) == 1
    m = msgs[0]
    assert isinstance(m, Message) and m.transactional and m.prefix == "x" and m.content == b"y"
    assert m.lsn == begin.final_lsn  # the message is the transaction's only record before its commit


def test_stream_decoder_on_real_frames(captured):
    """The whole capture as one bronze file: changes are numbered per transaction and carry their relation."""
    rows = [BronzeRow(Lsn.parse(f.lsn).value, f.xid, f.data, i, "f.parquet")
            for i, f in enumerate(captured["_all"])]
    items = list(decode_stream(rows))
    got = [c for c in items if isinstance(c, SilverChange)]
    commits = {c.commit_lsn: c for c in items if isinstance(c, SeenCommit)}
    assert [(c.table_name, c.op) for c in got] == [
        ("items", "I"), ("items", "I"), ("items", "U"), ("items", "U"), ("items", "D"),
        ("full_rows", "I"), ("full_rows", "I"), ("full_rows", "U"), ("full_rows", "D"),
        ("docs", "I"), ("docs", "U"), ("tr1", "I"), ("tr1", "T"), ("tr2", "T")]
    assert len(commits) == len(SCENARIOS)
    assert all(c.commit_lsn in commits and commits[c.commit_lsn].xid == c.xid for c in got)
    # seq counts changes within each transaction; the truncate gets one seq per relation.
    assert [c.seq for c in got] == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 2]
    key_update = got[3]
    assert key_update.old_kind == "K" and key_update.old == ("2", None, None, None, None, None, None)
    assert key_update.new[0] == "20" and key_update.key_columns == ("id",)
    assert key_update.columns == ("id", "name", "price", "at", "raw", "ok", "m")
    assert key_update.typmods == (-1, 24, 655366, -1, -1, -1, -1)
    toast = got[10]
    assert toast.unchanged == (1,) and toast.new == ("1", None, "1")
    assert got[12].truncate_options == 2 and got[12].new is None and got[12].old is None
    full_delete = got[8]
    assert full_delete.replica_identity == "f" and full_delete.old_kind == "O" and full_delete.old == ("1", "a")
    assert full_delete.commit_ts_us - captured["_started"] * 1e6 < 60e6
    rels = [r.relation.name for r in items if isinstance(r, SeenRelation)]
    assert rels == ["items", "full_rows", "docs", "tr1", "tr2"]  # repeats of an unchanged definition are dropped
    assert [(t.type.schema, t.type.name) for t in items if isinstance(t, SeenType)] == [("public", "mood")]


# ---- malformed input: pure, no server ----

BEGIN = b"B" + (0x1000).to_bytes(8, "big") + (5).to_bytes(8, "big") + (7).to_bytes(4, "big")


@pytest.mark.unit
@pytest.mark.parametrize(
    "frame, fragment",
    [
        (b"", "empty frame"),
        (b"S\x00\x00\x00\x01", "unknown pgoutput message type 'S' (byte 0x53) at LSN 0/10"),
        (b"Z", "unknown pgoutput message type 'Z'"),
        (BEGIN[:-1], "frame ends early"),
        (BEGIN + b"\x00", "1 unexpected trailing bytes"),
        (b"Y\x00\x00\x00\x01public", "without its NUL terminator"),
        (b"I\x00\x00\x00\x01N\x00\x01x", "unknown tuple value kind 'x'"),
        (b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x09ab", "runs past the end"),
        (b"I\x00\x00\x00\x01X\x00\x00", "expected new tuple marker 'N'"),
        (b"D\x00\x00\x00\x01N\x00\x00", "expected old tuple marker 'K' or 'O'"),
        (b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x01\xff", "not valid UTF-8"),
    ],
    ids=["empty", "streaming-start", "unknown", "short", "trailing", "no-nul", "bad-kind", "long-value",
         "bad-new-marker", "bad-old-marker", "bad-utf8"],
)
def test_malformed_frames_raise_decode_error(frame, fragment):
    with pytest.raises(DecodeError) as err:
        decode_message(frame, Lsn(0x10))
    assert fragment in str(err.value)


@pytest.mark.unit
def test_binary_tuple_value_and_memoryview_input():
    frame = b"I\x00\x00\x00\x01N\x00\x03b\x00\x00\x00\x02\x00\x01nu"
    assert decode_message(memoryview(b"zz" + frame)[2:]) == Insert(1, (b"\x00\x01", None, UNCHANGED_TOAST))


@pytest.mark.unit
def test_stream_rejects_change_before_relation_and_file_ending_mid_transaction():
    insert = b"I\x00\x00\x00\x01N\x00\x00"
    with pytest.raises(DecodeError, match="before its Relation message"):
        list(decode_stream([BronzeRow(16, 7, BEGIN, 0, "a"), BronzeRow(16, 7, insert, 1, "a")]))
    with pytest.raises(DecodeError, match="ended inside transaction 7"):
        list(decode_stream([BronzeRow(16, 7, BEGIN, 0, "a"), BronzeRow(16, 8, BEGIN, 0, "b")]))
    with pytest.raises(DecodeError, match="stream ended inside transaction 7"):
        list(decode_stream([BronzeRow(16, 7, BEGIN, 0, "a")]))
