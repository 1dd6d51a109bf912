"""BatchDecoder (decode/vector.py) against the reference row decoder (ChangeStreamDecoder + row_of).

The frames come from the real test server (several decoding sessions = several bronze files); the two decoders
must give the same table, row for row, whatever the batch boundaries, and the same DecodeError on bad input.
"""
from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest

from pgframes import Capture, Frame
from slotlake.decode.commit_ends import CommitEnds, InFileOrder
from slotlake.decode.decoded import (
    KIND_CHANGE,
    KIND_COMMIT,
    KIND_DDL,
    KIND_RELATION,
    KIND_TYPE,
    decoded_schema,
    row_of,
    rows_to_batch,
)
from slotlake.decode.frames import BronzeRow, ChangeStreamDecoder
from slotlake.decode.pgoutput import decode_message
from slotlake.decode.vector import BatchDecoder
from slotlake.errors import DecodeError
from slotlake.lsn import Lsn

BIG = "x" * 100_000  # stored out of line (STORAGE EXTERNAL): an update not touching it sends 'u'

SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), m mood, note varchar(10))",
    "CREATE TABLE full_rows (a int, b text)",
    "ALTER TABLE full_rows REPLICA IDENTITY FULL",
    "CREATE TABLE idx_rows (a int NOT NULL, b int NOT NULL, c text)",
    "CREATE UNIQUE INDEX idx_rows_ab ON idx_rows (a, b)",
    "ALTER TABLE idx_rows REPLICA IDENTITY USING INDEX idx_rows_ab",
    "CREATE TABLE docs (id int PRIMARY KEY, body text, n int)",
    "ALTER TABLE docs ALTER body SET STORAGE EXTERNAL",
    "CREATE TABLE tr1 (id serial PRIMARY KEY)",
    "CREATE TABLE tr2 (id int)",
    "CREATE TABLE tr3 (id int REFERENCES tr1)",
]

# Each inner list is one transaction; each outer list one decoding session (one peek = one bronze file).
SESSIONS = [
    [
        ["INSERT INTO items VALUES (1, 'pen', 1.5, 'happy', ''), (2, NULL, NULL, NULL, NULL)",
         "INSERT INTO items SELECT g, 'n' || g, g / 7.0, 'sad', repeat('é', g % 5) FROM generate_series(3, 400) g"],
        ["UPDATE items SET name = 'héllo ✓ 日本' WHERE id = 1", "UPDATE items SET id = 1000 WHERE id = 2"],
        ["DELETE FROM items WHERE id BETWEEN 10 AND 20"],
        ["INSERT INTO full_rows VALUES (1, 'a'), (1, 'a'), (2, NULL), (3, '')",
         "UPDATE full_rows SET b = 'z' WHERE a = 2", "DELETE FROM full_rows WHERE a = 3"],
        ["INSERT INTO idx_rows VALUES (1, 1, 'x'), (1, 2, NULL)", "UPDATE idx_rows SET c = 'y' WHERE b = 1",
         "UPDATE idx_rows SET b = 3 WHERE b = 2", "DELETE FROM idx_rows WHERE b = 1"],
        ["SELECT pg_logical_emit_message(false, 'other', 'not transactional')"],
        [f"INSERT INTO docs VALUES (1, '{BIG}', 0), (2, 'short', 0)", "UPDATE docs SET n = 1"],
    ],
    [
        ["UPDATE items SET price = price + 1 WHERE id < 50", "SELECT pg_logical_emit_message(true, 'x', 'y')"],
        ["INSERT INTO tr1 DEFAULT VALUES", "INSERT INTO tr3 VALUES (1)", "INSERT INTO tr2 VALUES (5)"],
        ["TRUNCATE tr1, tr2 RESTART IDENTITY CASCADE"],
        ["INSERT INTO tr2 VALUES (6)", "TRUNCATE tr2"],
        ["ALTER TABLE items ADD COLUMN extra int", "INSERT INTO items VALUES (5000, 'new', 1, 'sad', 'z', 7)"],
        ["UPDATE items SET extra = 1 WHERE id < 30",
         "SELECT pg_logical_emit_message(true, 'slotlake.ddl', '{\"event\": \"test\"}')"],
    ],
    [
        ["INSERT INTO items VALUES (6000, E'tab\\tand\\nnewline', 2, 'happy', NULL, NULL)"],
        ["ALTER TABLE items DROP COLUMN note", "UPDATE items SET m = 'happy' WHERE id < 100"],
        ["DELETE FROM items WHERE id > 300"],
        ["UPDATE docs SET n = 2 WHERE id = 1", "DELETE FROM docs"],
    ],
]


@pytest.fixture(scope="module")
def bronze(pg_server) -> list[BronzeRow]:
    """The captured frames as bronze rows: one file per decoding session, rows in (file, ord) order."""
    db = "t_" + uuid.uuid4().hex[:10]
    pg_server.psql(f"CREATE DATABASE {db}")
    cap = Capture(pg_server.dsn(db))
    rows: list[BronzeRow] = []
    try:
        for sql in SETUP:
            cap.execute(sql)
        for n, session in enumerate(SESSIONS):
            for txn in session:
                cap.transaction(*txn)
            frames: list[Frame] = cap.peek()
            assert frames[-1].data[:1] == b"C"
            rows += [BronzeRow(Lsn.parse(f.lsn).value, f.xid, f.data, i, f"{n:04d}.parquet")
                     for i, f in enumerate(frames)]
            cap.advance(str(decode_message(frames[-1].data).end_lsn))
    finally:
        cap.close()
        pg_server.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    return rows


def bronze_batch(rows: list[BronzeRow]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "lsn": pa.array([r.lsn for r in rows], pa.int64()), "xid": pa.array([r.xid for r in rows], pa.int64()),
        "data": pa.array([r.data for r in rows], pa.binary()), "ord": pa.array([r.ord for r in rows], pa.int64()),
        "file": pa.array([r.file for r in rows], pa.string())})


def by_reference(rows: list[BronzeRow]) -> pa.Table:
    decoder = ChangeStreamDecoder()
    out = [row_of(item) for row in rows for item in decoder.feed(row)]
    decoder.finish(rows[-1] if rows else None)
    return pa.Table.from_batches([rows_to_batch(out)])


def by_batches(rows: list[BronzeRow], sizes: list[int], decoder: BatchDecoder | None = None) -> pa.Table:
    decoder = decoder or BatchDecoder()
    out, at, k = [], 0, 0
    while at < len(rows):
        size = sizes[k % len(sizes)]
        out += decoder.feed(bronze_batch(rows[at:at + size]))
        at, k = at + size, k + 1
    decoder.finish()
    return pa.Table.from_batches(out, schema=decoded_schema())


def outcome(decode):
    """The decoded table, or the error a decoder raised (type and text)."""
    try:
        return decode()
    except Exception as e:  # noqa: BLE001 - both decoders must fail the same way, whatever the exception
        return (type(e).__name__, str(e))


def same(a, b) -> bool:
    return a.equals(b) if isinstance(a, pa.Table) and isinstance(b, pa.Table) else a == b


pytestmark = pytest.mark.integration


def test_captured_stream_covers_every_case(bronze):
    """The capture holds what the equivalence tests claim to cover (so they cannot pass on a thin stream)."""
    t = by_reference(bronze).to_pylist()
    kinds = {r["kind"] for r in t}
    assert kinds == {KIND_CHANGE, KIND_COMMIT, KIND_RELATION, KIND_TYPE, KIND_DDL}
    changes = [r for r in t if r["kind"] == KIND_CHANGE]
    assert {r["op"] for r in changes} == {"I", "U", "D", "T"}
    assert {(r["replica_identity"], r["op"], r["old_kind"]) for r in changes} >= {
        ("d", "U", None), ("d", "U", "K"), ("d", "D", "K"), ("f", "U", "O"), ("f", "D", "O"), ("i", "U", "K")}
    assert any(r["unchanged"] for r in changes) and any(None in (r["new"] or ()) for r in changes)
    assert any("" in (r["new"] or ()) for r in changes) and any("héllo ✓ 日本" in (r["new"] or ()) for r in changes)
    assert {r["truncate_options"] for r in changes if r["op"] == "T"} == {0, 1 | 2}
    assert len({r["bronze_file"] for r in t}) == len(SESSIONS)
    assert len({tuple(r["columns"]) for r in changes if r["table_name"] == "items"}) == 3  # two ALTERs


@pytest.mark.parametrize("sizes", [[1], [2], [7], [1000], [100_000], [3, 1, 64, 5, 250, 2]],
                         ids=["1", "2", "7", "1000", "all", "mixed"])
def test_same_table_as_the_row_decoder_for_any_batch_size(bronze, sizes):
    decoder = BatchDecoder()
    got = by_batches(bronze, sizes, decoder)
    want = by_reference(bronze)
    assert got.num_rows == want.num_rows > 500
    assert got.equals(want)
    if sizes[0] >= 1000:  # the point of it: the reference decodes only the rare messages, not the changes
        assert decoder.rows_by_reference < len(bronze) / 20


def test_large_binary_input_takes_the_fast_path_too(bronze):
    """Spark sends large_binary/large_string with spark.sql.execution.arrow.useLargeVarTypes."""
    decoder = BatchDecoder()
    batch = bronze_batch(bronze)
    large = batch.cast(pa.schema([("lsn", pa.int64()), ("xid", pa.int64()), ("data", pa.large_binary()),
                                  ("ord", pa.int64()), ("file", pa.large_string())]))
    got = pa.Table.from_batches(list(decoder.feed(large)), schema=decoded_schema())
    decoder.finish()
    assert got.equals(by_reference(bronze))
    assert decoder.rows_by_reference < len(bronze) / 20


def test_same_table_for_random_batch_sizes(bronze):
    rnd = random.Random(9)
    want = by_reference(bronze)
    for _ in range(5):
        sizes = [rnd.choice([1, 2, 3, 7, 16, 100, 999]) for _ in range(50)]
        assert by_batches(bronze, sizes).equals(want), sizes


def test_same_error_or_table_for_corrupted_frames(bronze):
    """Truncated, extended and flipped bytes: both decoders raise the same DecodeError, or agree on the table."""
    rnd = random.Random(10)
    file_rows = [r for r in bronze if r.file == bronze[0].file][:600]
    errors = 0
    for case in range(150):
        i = rnd.randrange(len(file_rows))
        data = bytearray(file_rows[i].data)
        how = case % 4
        if how == 0:
            data = data[:rnd.randrange(len(data))]
        elif how == 1:
            data += bytes([rnd.randrange(256)])
        elif how == 2:
            data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
        else:
            data[rnd.randrange(len(data))] = rnd.choice(b"tnubKONBCIUDRY\x00\xff")
        rows = list(file_rows)
        rows[i] = BronzeRow(rows[i].lsn, rows[i].xid, bytes(data), rows[i].ord, rows[i].file)
        want = outcome(lambda rows=rows: by_reference(rows))
        size = rnd.choice([1, 5, 1000])
        got = outcome(lambda rows=rows, size=size: by_batches(rows, [size]))
        assert same(got, want), (case, i, got if not isinstance(got, pa.Table) else "table", want)
        errors += not isinstance(want, pa.Table)
    assert errors > 100  # most corruptions must be errors, or this tests little


def _drop(rows: list[BronzeRow], pick) -> list[BronzeRow]:
    i = next(k for k, r in enumerate(rows) if pick(r))
    return rows[:i] + rows[i + 1:]


def _first(prefix: bytes):
    return lambda r: r.data[:1] == prefix


def _commit_lsn_plus_one(rows: list[BronzeRow]) -> list[BronzeRow]:
    i = next(k for k, r in enumerate(rows) if r.data[:1] == b"C")
    d = bytearray(rows[i].data)
    d[9] ^= 1  # low byte of commit_lsn
    return rows[:i] + [BronzeRow(rows[i].lsn, rows[i].xid, bytes(d), rows[i].ord, rows[i].file)] + rows[i + 1:]


@pytest.mark.parametrize("damage, fragment", [
    (lambda rows: _drop(rows, _first(b"R")), "before its Relation message"),
    (lambda rows: _drop(rows, _first(b"B")), "message outside a transaction"),
    (lambda rows: _drop(rows, _first(b"C")), "inside transaction"),
    (lambda rows: [r for r in rows if r.file == rows[0].file][:-1], "stream ended inside transaction"),
    (_commit_lsn_plus_one, "does not match Begin final LSN"),
], ids=["no-relation", "no-begin", "no-commit", "ends-in-txn", "commit-lsn"])
def test_same_structural_errors(bronze, damage, fragment):
    rows = damage(list(bronze))
    want = outcome(lambda: by_reference(rows))
    assert want[0] == "DecodeError" and fragment in want[1]
    for sizes in ([1], [7], [100_000]):
        assert outcome(lambda sizes=sizes: by_batches(rows, sizes)) == want


# ---- pure: hand-made frames for what a server never sends ----

BEGIN = b"B" + (0x1000).to_bytes(8, "big") + (5).to_bytes(8, "big") + (7).to_bytes(4, "big")
COMMIT = b"C\x00" + (0x1000).to_bytes(8, "big") + (0x1010).to_bytes(8, "big") + (5).to_bytes(8, "big")
RELATION = b"R\x00\x00\x00\x01public\x00t\x00d\x00\x02\x01id\x00\x00\x00\x00\x17\xff\xff\xff\xff" \
           b"\x00v\x00\x00\x00\x00\x19\xff\xff\xff\xff"
INSERT = b"I\x00\x00\x00\x01N\x00\x02t\x00\x00\x00\x011n"


def _rows(*frames: bytes, file: str = "f") -> list[BronzeRow]:
    return [BronzeRow(0x1000 + i, 7, f, i, file) for i, f in enumerate(frames)]


@pytest.mark.unit
@pytest.mark.parametrize("frames", [
    (BEGIN, RELATION, INSERT, COMMIT),
    (BEGIN, RELATION, INSERT, INSERT[:-1], COMMIT),
    (BEGIN, RELATION, INSERT + b"\x00", COMMIT),
    (BEGIN, RELATION, b"I\x00\x00\x00\x01N\x00\x02b\x00\x00\x00\x011n", COMMIT),
    (BEGIN, RELATION, b"I\x00\x00\x00\x01N\x00\x02t\x00\x00\x00\x01\xffn", COMMIT),
    (BEGIN, RELATION, b"I\x00\x00\x00\x01N\x00\x01t\x00\x00\x00\x011", COMMIT),
    (BEGIN, RELATION, b"D\x00\x00\x00\x01K\x00\x02un", COMMIT),
    (BEGIN, RELATION, b"U\x00\x00\x00\x01O\x00\x02t\x00\x00\x00\x011nN\x00\x02t\x00\x00\x00\x012u", COMMIT),
    (BEGIN, RELATION, b"U\x00\x00\x00\x01K\x00\x02t\x00\x00\x00\x011nX\x00\x02nn", COMMIT),
    (BEGIN, RELATION, INSERT, BEGIN, COMMIT),
    (BEGIN, RELATION, INSERT, b"", COMMIT),
    (BEGIN, RELATION, INSERT, b"S\x00", COMMIT),
    (BEGIN, RELATION, b"I\x00\x00\x00\x02N\x00\x00", COMMIT),
    (BEGIN, RELATION, INSERT, COMMIT, INSERT),
    (BEGIN + b"\x00", RELATION, INSERT, COMMIT),
    (BEGIN, RELATION, INSERT, COMMIT[:-1]),
], ids=["ok", "short", "trailing", "binary", "utf8", "ncols", "toast-old", "toast-new-ok", "bad-marker",
        "begin-in-txn", "empty", "unknown", "no-relation", "after-commit", "long-begin", "short-commit"])
def test_hand_made_frames_same_outcome(frames):
    rows = _rows(*frames)
    want = outcome(lambda: by_reference(rows))
    for sizes in ([1], [2], [3], [100]):
        assert same(outcome(lambda sizes=sizes: by_batches(rows, sizes)), want), sizes


@pytest.mark.unit
def test_file_change_inside_a_transaction_and_relations_per_file():
    rows = _rows(BEGIN, RELATION, INSERT, COMMIT, file="a") + _rows(BEGIN, INSERT, COMMIT, file="b")
    want = outcome(lambda: by_reference(rows))
    assert want[0] == "DecodeError" and "before its Relation message" in want[1]
    assert outcome(lambda: by_batches(rows, [100])) == want
    rows = _rows(BEGIN, RELATION, INSERT, file="a") + _rows(BEGIN, RELATION, INSERT, COMMIT, file="b")
    want = outcome(lambda: by_reference(rows))
    assert want[0] == "DecodeError" and "file a ended inside transaction 7" in want[1]
    assert outcome(lambda: by_batches(rows, [100])) == outcome(lambda: by_batches(rows, [1])) == want


# ---- commit end LSNs filled in the decode task (decode/commit_ends.py) ----------------------------------------

def _joined_ends(table: pa.Table) -> list:
    """What the join of every row with its transaction's Commit row (by commit LSN) gives: the reference."""
    rows = table.to_pylist()
    ends = {r["commit_lsn"]: r["commit_end_lsn"] for r in rows if r["kind"] == KIND_COMMIT}
    return [r["commit_end_lsn"] if r["kind"] == KIND_COMMIT else ends.get(r["commit_lsn"]) for r in rows]


def _through_commit_ends(table: pa.Table, sizes: list[int], max_held: int, known: dict | None = None) -> pa.Table:
    filler, out, at, k = CommitEnds(max_held, known), [], 0, 0
    batches = table.to_batches()
    whole = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    while at < whole.num_rows:
        size = sizes[k % len(sizes)]
        out += filler.feed(whole.slice(at, size))
        at, k = at + size, k + 1
    out += filler.finish()
    return pa.Table.from_batches(out, schema=decoded_schema())


@pytest.mark.parametrize("sizes", [[1], [5], [100_000], [3, 1, 64, 5, 250, 2]], ids=["1", "5", "all", "mixed"])
def test_commit_ends_filled_as_the_join_would(bronze, sizes):
    decoded = by_reference(bronze)
    want = _joined_ends(decoded)
    assert decoded.column("commit_end_lsn").null_count > 500  # the decoders leave it to the filler
    got = _through_commit_ends(decoded, sizes, max_held=1_000_000)
    assert got.drop_columns(["commit_end_lsn"]).equals(decoded.drop_columns(["commit_end_lsn"]))  # same rows, order
    assert got.column("commit_end_lsn").to_pylist() == want
    assert sum(e is not None for e in want) > 500


def _sizes_and_ends(decoded: pa.Table) -> tuple[dict[int, int], dict[int, int]]:
    sizes: dict[int, int] = {}
    ends: dict[int, int] = {}
    for r in decoded.to_pylist():
        sizes[r["commit_lsn"]] = sizes.get(r["commit_lsn"], 0) + 1
        if r["kind"] == KIND_COMMIT:
            ends[r["commit_lsn"]] = r["commit_end_lsn"]
    return sizes, ends


@pytest.mark.parametrize("max_held", [1, 10, 50])
def test_commit_ends_of_transactions_too_big_to_hold_come_from_the_known_ends(bronze, max_held):
    """Rows of a transaction with more rows than the limit go out as they come, filled from `known_ends` (the
    job reads those from the Commit frames beforehand): every row gets its own transaction's end."""
    decoded = by_reference(bronze)
    want = _joined_ends(decoded)
    sizes, ends = _sizes_and_ends(decoded)
    big = {lsn: end for lsn, end in ends.items() if sizes[lsn] > max_held}
    assert big  # the limit is hit
    got = _through_commit_ends(decoded, [7, 300, 1], max_held=max_held, known=big)
    assert got.drop_columns(["commit_end_lsn"]).equals(decoded.drop_columns(["commit_end_lsn"]))
    assert got.column("commit_end_lsn").to_pylist() == want


def test_a_transaction_too_big_to_hold_without_its_known_end_is_an_error(bronze):
    """No row leaves the task without its end: a big transaction missing from `known_ends` raises."""
    decoded = by_reference(bronze)
    sizes, ends = _sizes_and_ends(decoded)
    big = {lsn: end for lsn, end in ends.items() if sizes[lsn] > 10}
    first = min(big)
    with pytest.raises(DecodeError, match=f"commit LSN {Lsn(first)} has more than 10 decoded rows"):
        _through_commit_ends(decoded, [7, 300, 1], max_held=10, known={k: v for k, v in big.items() if k != first})


def test_in_file_order_accepts_each_file_in_order_and_refuses_a_swap(bronze):
    order = InFileOrder()
    for at in range(0, len(bronze), 97):
        order.check(bronze_batch(bronze[at:at + 97]))  # files in sequence, batches cut anywhere: fine
    rows = list(bronze)
    i = next(k for k in range(1, len(rows)) if rows[k].file == rows[k - 1].file)
    rows[i - 1], rows[i] = rows[i], rows[i - 1]
    with pytest.raises(DecodeError, match=rf"row ord {rows[i].ord} came after ord {rows[i - 1].ord}"):
        fresh = InFileOrder()
        for at in range(0, len(rows), 50):
            fresh.check(bronze_batch(rows[at:at + 50]))
