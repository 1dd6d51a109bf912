"""Decode one pgoutput frame (protocol version 1, text values) into a message value. Pure: bytes in, values out.

Reference: PostgreSQL docs, "Logical Replication Message Formats". All integers are big-endian. Strings are
NUL-terminated. This runs once per row change on Spark executors, so it works on a memoryview with precompiled
`struct` readers and never copies the frame.
"""
from __future__ import annotations

import struct

from slotlake.contracts import ReplicaIdentity
from slotlake.decode.messages import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    Truncate,
    Type,
    Update,
    Value,
)
from slotlake.errors import DecodeError
from slotlake.lsn import Lsn

PG_EPOCH_UNIX_US = 946_684_800_000_000  # 2000-01-01T00:00:00Z in microseconds since 1970-01-01

_BEGIN = struct.Struct(">QqI")  # final_lsn, commit ts, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit_lsn, end_lsn, commit ts
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_COLUMN_TAIL = struct.Struct(">Ii")  # type oid, typmod
_MESSAGE_HEAD = struct.Struct(">BQ")  # flags, lsn

_IDENTITIES = {b"d"[0]: ReplicaIdentity.DEFAULT, b"n"[0]: ReplicaIdentity.NOTHING,
               b"f"[0]: ReplicaIdentity.FULL, b"i"[0]: ReplicaIdentity.INDEX}


class _Frame:
    """A read cursor over one frame; errors carry the frame's message type and LSN."""

    __slots__ = ("raw", "buf", "pos", "kind", "lsn")

    def __init__(self, data: bytes | memoryview, lsn: Lsn | int | None) -> None:
        # bytes for C-speed NUL search (memoryview has no index()), a memoryview for zero-copy slices.
        self.raw = data if isinstance(data, bytes) else bytes(data)
        self.buf = memoryview(self.raw)
        self.pos = 1
        self.kind = chr(self.buf[0]) if len(self.buf) else "?"
        self.lsn = lsn

    def fail(self, what: str) -> DecodeError:
        at = f" at LSN {Lsn.parse(self.lsn)}" if self.lsn is not None else ""
        return DecodeError(f"pgoutput {self.kind!r} message{at}: {what} (offset {self.pos} of {len(self.buf)} bytes)")

    def unpack(self, s: struct.Struct) -> tuple:
        end = self.pos + s.size
        if end > len(self.buf):
            raise self.fail(f"frame ends early, needed {s.size} more bytes")
        out = s.unpack_from(self.buf, self.pos)
        self.pos = end
        return out

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise self.fail("frame ends early, needed 1 more byte")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def cstring(self) -> str:
        try:
            end = self.raw.index(0, self.pos)
        except ValueError:
            raise self.fail("string without its NUL terminator") from None
        s = str(self.buf[self.pos:end], "utf-8")
        self.pos = end + 1
        return s

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise self.fail(f"value of {n} bytes runs past the end of the frame")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def tuple_data(self) -> tuple[Value, ...]:
        # The hot path (every row change): one loop over local variables, no per-value method calls.
        raw = self.raw
        pos = self.pos
        size = len(raw)
        try:
            (ncols,) = _I16.unpack_from(raw, pos)
            pos += 2
            values: list[Value] = []
            append = values.append
            for _ in range(ncols):
                kind = raw[pos]
                pos += 1
                if kind == 0x74:  # 't' text
                    (n,) = _I32.unpack_from(raw, pos)
                    pos += 4
                    end = pos + n
                    if n < 0 or end > size:
                        self.pos = pos
                        raise self.fail(f"value of {n} bytes runs past the end of the frame")
                    append(raw[pos:end].decode("utf-8"))
                    pos = end
                elif kind == 0x6E:  # 'n' null
                    append(None)
                elif kind == 0x75:  # 'u' unchanged TOAST: the value is not in the WAL
                    append(UNCHANGED_TOAST)
                elif kind == 0x62:  # 'b' binary
                    (n,) = _I32.unpack_from(raw, pos)
                    pos += 4
                    end = pos + n
                    if n < 0 or end > size:
                        self.pos = pos
                        raise self.fail(f"value of {n} bytes runs past the end of the frame")
                    append(raw[pos:end])
                    pos = end
                else:
                    self.pos = pos - 1
                    raise self.fail(f"unknown tuple value kind {chr(kind)!r} (byte 0x{kind:02x})")
        except (IndexError, struct.error):
            self.pos = pos
            raise self.fail("frame ends early inside the tuple data") from None
        self.pos = pos
        return tuple(values)

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} unexpected trailing bytes")


def _begin(f: _Frame) -> Begin:
    final_lsn, ts, xid = f.unpack(_BEGIN)
    return Begin(final_lsn=Lsn(final_lsn), commit_ts_us=ts, xid=xid)


def _commit(f: _Frame) -> Commit:
    flags, commit_lsn, end_lsn, ts = f.unpack(_COMMIT)
    return Commit(flags=flags, commit_lsn=Lsn(commit_lsn), end_lsn=Lsn(end_lsn), commit_ts_us=ts)


def _origin(f: _Frame) -> Origin:
    (lsn,) = f.unpack(_U64)
    return Origin(commit_lsn=Lsn(lsn), name=f.cstring())


def _relation(f: _Frame) -> Relation:
    (oid,) = f.unpack(_U32)
    schema = f.cstring()
    name = f.cstring()
    ident_byte = f.byte()
    identity = _IDENTITIES.get(ident_byte)
    if identity is None:
        raise f.fail(f"unknown replica identity {chr(ident_byte)!r}")
    (ncols,) = f.unpack(_I16)
    cols = []
    for _ in range(ncols):
        flags = f.byte()
        cname = f.cstring()
        type_oid, typmod = f.unpack(_COLUMN_TAIL)
        cols.append(Column(name=cname, type_oid=type_oid, typmod=typmod, is_key=bool(flags & 1)))
    return Relation(oid=oid, schema=schema, name=name, replica_identity=identity, columns=tuple(cols))


def _type(f: _Frame) -> Type:
    (oid,) = f.unpack(_U32)
    return Type(oid=oid, schema=f.cstring(), name=f.cstring())


def _insert(f: _Frame) -> Insert:
    (oid,) = f.unpack(_U32)
    marker = f.byte()
    if marker != 0x4E:  # 'N'
        raise f.fail(f"expected new tuple marker 'N', got {chr(marker)!r}")
    return Insert(relation_oid=oid, new=f.tuple_data())


def _update(f: _Frame) -> Update:
    (oid,) = f.unpack(_U32)
    marker = f.byte()
    old_kind = None
    old = None
    if marker in (0x4B, 0x4F):  # 'K' old key, 'O' whole old row
        old_kind = chr(marker)
        old = f.tuple_data()
        marker = f.byte()
    if marker != 0x4E:
        raise f.fail(f"expected new tuple marker 'N', got {chr(marker)!r}")
    return Update(relation_oid=oid, old_kind=old_kind, old=old, new=f.tuple_data())


def _delete(f: _Frame) -> Delete:
    (oid,) = f.unpack(_U32)
    marker = f.byte()
    if marker not in (0x4B, 0x4F):
        raise f.fail(f"expected old tuple marker 'K' or 'O', got {chr(marker)!r}")
    return Delete(relation_oid=oid, old_kind=chr(marker), old=f.tuple_data())


def _truncate(f: _Frame) -> Truncate:
    (nrels,) = f.unpack(_U32)
    options = f.byte()
    oids = tuple(f.unpack(_U32)[0] for _ in range(nrels))
    return Truncate(options=options, relation_oids=oids)


def _message(f: _Frame) -> Message:
    flags, lsn = f.unpack(_MESSAGE_HEAD)
    prefix = f.cstring()
    (n,) = f.unpack(_I32)
    return Message(transactional=bool(flags & 1), lsn=Lsn(lsn), prefix=prefix, content=bytes(f.take(n)))


_DECODERS = {
    ord("B"): _begin, ord("C"): _commit, ord("O"): _origin, ord("R"): _relation, ord("Y"): _type,
    ord("I"): _insert, ord("U"): _update, ord("D"): _delete, ord("T"): _truncate, ord("M"): _message,
}


def decode_message(data: bytes | memoryview, lsn: Lsn | int | None = None) -> PgOutputMessage:
    """Decode one pgoutput v1 frame. `lsn` (the row's LSN from the peek) only enriches error messages.

    Raises DecodeError for an empty or truncated frame, trailing bytes, or a message type outside protocol
    version 1 (e.g. the streaming messages 'S', 'E', 'c', 'A' of version 2+, which we never ask for).
    """
    if not len(data):
        raise _Frame(b"", lsn).fail("empty frame")
    f = _Frame(data, lsn)
    decoder = _DECODERS.get(f.buf[0])
    if decoder is None:
        b = f.buf[0]
        where = f" at LSN {Lsn.parse(lsn)}" if lsn is not None else ""
        raise DecodeError(f"unknown pgoutput message type {chr(b)!r} (byte 0x{b:02x}){where}; slotlake reads "
                          "protocol version 1 without streaming: check the peek uses proto_version '1'")
    try:
        msg = decoder(f)
    except UnicodeDecodeError as e:
        raise f.fail(f"text is not valid UTF-8 ({e.reason}); the peek must run with client_encoding UTF8") from None
    f.done()
    return msg  # type: ignore[return-value]  # every entry of the decoder table returns a Message


def pg_timestamp_to_unix_us(ts_us: int) -> int:
    """PostgreSQL timestamps (microseconds since 2000-01-01 UTC) to microseconds since the Unix epoch."""
    return ts_us + PG_EPOCH_UNIX_US
