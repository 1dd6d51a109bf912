"""Capture real pgoutput frames from the test server (never hand-written bytes), and write bronze files from them."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

# The session settings the extract uses, so text values have a stable format.
SESSION_OPTIONS = ("-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 -c extra_float_digits=3 "
                   "-c bytea_output=hex -c client_encoding=UTF8")

PEEK_SQL = ("SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s, 'messages', 'true')")


@dataclass(frozen=True)
class Frame:
    lsn: str  # pg_lsn text
    xid: int
    data: bytes


def connect(dsn: str) -> psycopg.Connection:
    # synchronous_commit=on: the test server runs with it off, and a peek decodes only flushed WAL, so the
    # last commits could otherwise be missing from the frames for up to wal_writer_delay.
    return psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS + " -c synchronous_commit=on")


class Capture:
    """A slot + publication in a test database; run DML, then `peek()` the frames it produced."""

    def __init__(self, dsn: str, publication_tables: str = "ALL TABLES") -> None:
        self.dsn = dsn
        self.slot = "t_slot_" + uuid.uuid4().hex[:8]
        self.pub = "t_pub_" + uuid.uuid4().hex[:8]
        self.conn = connect(dsn)
        self.conn.execute(f"CREATE PUBLICATION {self.pub} FOR {publication_tables}")
        self.start_lsn: str = self.conn.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,)).fetchone()[0]

    def execute(self, sql: str, params: tuple = ()) -> None:
        self.conn.execute(sql, params)

    def transaction(self, *statements: str) -> int:
        """Run `statements` as one transaction; returns its xid (to find its frames)."""
        with self.conn.transaction():
            for sql in statements:
                self.conn.execute(sql)
            return int(self.conn.execute("SELECT txid_current()").fetchone()[0])

    def peek(self) -> list[Frame]:
        rows = self.conn.execute(PEEK_SQL, (self.slot, self.pub)).fetchall()
        return [Frame(lsn, xid, bytes(data)) for lsn, xid, data in rows]

    def advance(self, lsn: str) -> None:
        """Confirm everything up to `lsn` (what the extract does after archiving)."""
        self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, lsn))

    def close(self) -> None:
        self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        self.conn.close()


def write_bronze(frames: list[Frame], bronze_dir: Path, start_lsn: int, slot: str) -> Path:
    """Write one bronze file by the contract (docs/internals.md "Bronze") from whole transactions of `frames`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slotlake.bronze import META_END, META_ROWS, META_SLOT, META_START, bronze_name
    from slotlake.decode.messages import Commit
    from slotlake.decode.pgoutput import decode_message
    from slotlake.lsn import Lsn

    ends = [decode_message(f.data).end_lsn for f in frames if f.data[:1] == b"C"]
    assert ends, "write_bronze needs at least one whole transaction"
    end = ends[-1]
    assert isinstance(decode_message(frames[-1].data), Commit), "bronze holds whole transactions only"
    table = pa.table({
        "lsn": pa.array([Lsn.parse(f.lsn).value for f in frames], pa.int64()),
        "xid": pa.array([f.xid for f in frames], pa.int64()),
        "data": pa.array([f.data for f in frames], pa.binary()),
        "ord": pa.array(range(len(frames)), pa.int64()),
    })
    table = table.replace_schema_metadata({
        META_START: str(Lsn(start_lsn)), META_END: str(end), META_SLOT: slot, META_ROWS: str(len(frames))})
    bronze_dir.mkdir(parents=True, exist_ok=True)
    path = bronze_dir / bronze_name(Lsn(start_lsn), end)
    pq.write_table(table, path)
    return path
