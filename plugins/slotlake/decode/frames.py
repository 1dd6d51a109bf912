"""Turn an ordered stream of bronze rows into silver change records (docs/internals.md "Silver changes"). Pure.

State is bounded: the current transaction's Begin, the Relation messages of the current bronze file, and type
names. Nothing of a transaction's rows is buffered, so a 10-million-row transaction streams in flat memory.

The price of not buffering: a change row is emitted before its transaction's Commit arrives, so the stream
cannot fill `commit_end_lsn` itself. It emits a `SeenCommit` per transaction instead; the decode job joins
those onto the changes by `commit_lsn` (Spark does that join, spilling to disk as needed).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from slotlake.decode.messages import (
    DDL_MESSAGE_PREFIX,
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    Relation,
    Truncate,
    Type,
    Update,
    Value,
)
from slotlake.decode.pgoutput import decode_message, pg_timestamp_to_unix_us
from slotlake.errors import DecodeError
from slotlake.lsn import Lsn


@dataclass(frozen=True, slots=True)
class BronzeRow:
    """One row of a bronze file (docs/internals.md "Bronze"), plus the file's name."""

    lsn: int
    xid: int
    data: bytes
    ord: int
    file: str


@dataclass(frozen=True, slots=True)
class SilverChange:
    """One row of silver/changes, minus `commit_end_lsn` (see the module docstring)."""

    commit_lsn: int
    commit_ts_us: int  # microseconds since the Unix epoch, UTC
    xid: int
    seq: int
    lsn: int
    rel_oid: int
    schema_name: str
    table_name: str
    op: str  # I U D T
    replica_identity: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    typmods: tuple[int, ...]
    old_kind: str | None
    old: tuple[str | None, ...] | None
    new: tuple[str | None, ...] | None
    unchanged: tuple[int, ...]
    truncate_options: int | None
    bronze_file: str


@dataclass(frozen=True, slots=True)
class SeenCommit:
    commit_lsn: int
    end_lsn: int
    xid: int
    bronze_file: str


@dataclass(frozen=True, slots=True)
class SeenRelation:
    """A Relation message and the commit LSN of the transaction it arrived in (feeds the catalog)."""

    commit_lsn: int
    lsn: int  # the message's own LSN: orders two definitions within one transaction
    relation: Relation
    bronze_file: str


@dataclass(frozen=True, slots=True)
class SeenType:
    commit_lsn: int
    type: Type
    bronze_file: str


@dataclass(frozen=True, slots=True)
class SeenDdl:
    """A `slotlake.ddl` logical message (DDL event, see docs/internals.md "DDL events") inside a transaction."""

    commit_lsn: int
    lsn: int
    content: bytes
    bronze_file: str
    xid: int = 0
    commit_ts_us: int = 0  # microseconds since the Unix epoch, UTC


StreamItem = SilverChange | SeenCommit | SeenRelation | SeenType | SeenDdl


def _text_values(values: tuple[Value, ...], row: BronzeRow,
                 what: str) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """Values as text (None = NULL) and the positions of unchanged-TOAST values."""
    if UNCHANGED_TOAST not in values and bytes not in map(type, values):
        return values, ()  # type: ignore[return-value]  # the usual case, checked at C speed: all text or NULL
    out: list[str | None] = []
    unchanged: list[int] = []
    for i, v in enumerate(values):
        if v is UNCHANGED_TOAST:
            unchanged.append(i)
            out.append(None)
        elif isinstance(v, bytes):
            raise DecodeError(f"{row.file} ord {row.ord} (LSN {Lsn(row.lsn)}): binary value in the {what} tuple; "
                              "slotlake reads text values: the peek must not set binary 'true'")
        else:
            out.append(v)  # type: ignore[arg-type]
    return tuple(out), tuple(unchanged)


class ChangeStreamDecoder:
    """Feed bronze rows in (file, ord) order with `feed`; it yields stream items. One instance per task.

    Each bronze file is one decoding session: pgoutput sends a Relation before the first change of each
    relation in a session (and again after DDL), so relations are forgotten when the file changes.
    """

    def __init__(self) -> None:
        # decode/vector.py's BatchDecoder reads this state and sets _begin/_seq after the runs it decodes itself.
        self._file: str | None = None
        self._relations: dict[int, Relation] = {}
        self._begin: Begin | None = None
        self._seq = 0
        # Per relation: the last definition emitted, to avoid sending the same one per file to the catalog.
        self._emitted: dict[int, Relation] = {}
        self._descriptions: dict[int, tuple] = {}

    def _error(self, row: BronzeRow, what: str) -> DecodeError:
        return DecodeError(f"bronze file {row.file}, ord {row.ord}, LSN {Lsn(row.lsn)}: {what}")

    def feed(self, row: BronzeRow) -> Iterator[StreamItem]:
        if row.file != self._file:
            if self._begin is not None:
                raise self._error(row, f"file {self._file} ended inside transaction {self._begin.xid} "
                                       "(bronze files must hold whole transactions)")
            self._file = row.file
            self._relations = {}
        msg = decode_message(row.data, row.lsn)
        kind = type(msg)
        if kind is Insert or kind is Update or kind is Delete:
            yield self._change(row, msg)  # type: ignore[arg-type]
        elif kind is Begin:
            if self._begin is not None:
                raise self._error(row, f"Begin of xid {msg.xid} inside transaction {self._begin.xid}")  # type: ignore[union-attr]
            self._begin = msg  # type: ignore[assignment]
            self._seq = 0
        elif kind is Commit:
            begin = self._require_txn(row)
            if msg.commit_lsn != begin.final_lsn:  # type: ignore[union-attr]
                raise self._error(row, f"Commit LSN {msg.commit_lsn} does not match Begin final LSN "  # type: ignore[union-attr]
                                       f"{begin.final_lsn}")
            yield SeenCommit(commit_lsn=begin.final_lsn.value, end_lsn=msg.end_lsn.value,  # type: ignore[union-attr]
                             xid=begin.xid, bronze_file=row.file)
            self._begin = None
        elif kind is Relation:
            begin = self._require_txn(row)
            self._relations[msg.oid] = msg  # type: ignore[union-attr,assignment]
            if self._emitted.get(msg.oid) != msg:  # type: ignore[union-attr]
                self._emitted[msg.oid] = msg  # type: ignore[union-attr,assignment]
                yield SeenRelation(commit_lsn=begin.final_lsn.value, lsn=row.lsn, relation=msg, bronze_file=row.file)  # type: ignore[arg-type]
        elif kind is Type:
            begin = self._require_txn(row)
            yield SeenType(commit_lsn=begin.final_lsn.value, type=msg, bronze_file=row.file)  # type: ignore[arg-type]
        elif kind is Truncate:
            yield from self._truncate(row, msg)  # type: ignore[arg-type]
        elif kind is Message:
            # DDL events feed the catalog; other logical messages (and non-transactional ones, which may
            # follow a file's last Commit) carry nothing slotlake uses.
            if msg.prefix == DDL_MESSAGE_PREFIX and msg.transactional:  # type: ignore[union-attr]
                begin = self._require_txn(row)
                yield SeenDdl(commit_lsn=begin.final_lsn.value, lsn=row.lsn, content=msg.content,  # type: ignore[union-attr]
                              bronze_file=row.file, xid=begin.xid,
                              commit_ts_us=pg_timestamp_to_unix_us(begin.commit_ts_us))
        elif kind is Origin:
            pass  # replication origins carry no row change
        else:  # pragma: no cover - decode_message returns only the kinds above
            raise self._error(row, f"unexpected message {kind.__name__}")

    def finish(self, last: BronzeRow | None) -> None:
        """Call after the last row: a stream may not end inside a transaction."""
        if self._begin is not None and last is not None:
            raise self._error(last, f"stream ended inside transaction {self._begin.xid} "
                                    "(bronze files must hold whole transactions)")

    def _require_txn(self, row: BronzeRow) -> Begin:
        if self._begin is None:
            raise self._error(row, "message outside a transaction (no Begin before it in this file)")
        return self._begin

    def _relation(self, row: BronzeRow, oid: int) -> Relation:
        rel = self._relations.get(oid)
        if rel is None:
            raise self._error(row, f"change for relation OID {oid} before its Relation message in this file")
        return rel

    def _record(self, row: BronzeRow, rel: Relation, op: str, **values) -> SilverChange:
        begin = self._require_txn(row)
        seq = self._seq
        self._seq += 1
        names, keys, oids, typmods = self._described(rel)
        return SilverChange(
            commit_lsn=begin.final_lsn.value, commit_ts_us=pg_timestamp_to_unix_us(begin.commit_ts_us),
            xid=begin.xid, seq=seq, lsn=row.lsn, rel_oid=rel.oid, schema_name=rel.schema, table_name=rel.name,
            op=op, replica_identity=rel.replica_identity.value, columns=names, key_columns=keys, type_oids=oids,
            typmods=typmods, bronze_file=row.file, **values)

    def _described(self, rel: Relation) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
        # Computed once per Relation message, not per row.
        got = self._descriptions.get(rel.oid)
        if got is None or got[0] is not rel:
            cols = rel.columns
            got = (rel, (tuple(c.name for c in cols), tuple(c.name for c in cols if c.is_key),
                         tuple(c.type_oid for c in cols), tuple(c.typmod for c in cols)))
            self._descriptions[rel.oid] = got
        return got[1]

    def _change(self, row: BronzeRow, msg: Insert | Update | Delete) -> SilverChange:
        rel = self._relation(row, msg.relation_oid)
        old_kind = old = new = None
        unchanged: tuple[int, ...] = ()
        old_values: tuple[Value, ...] | None
        if isinstance(msg, Delete):
            op, old_kind = "D", msg.old_kind
            old_values = msg.old
        else:
            op = "I" if isinstance(msg, Insert) else "U"
            new, unchanged = _text_values(msg.new, row, "new")
            if len(new) != len(rel.columns):
                raise self._error(row, f"new tuple has {len(new)} values but {rel.schema}.{rel.name} has "
                                       f"{len(rel.columns)} columns")
            old_values = msg.old if isinstance(msg, Update) else None
            old_kind = msg.old_kind if isinstance(msg, Update) else None
        if old_values is not None:
            old, old_unchanged = _text_values(old_values, row, "old")
            if old_unchanged:
                # Never write a placeholder or a NULL for a value we do not have (invariant 7).
                raise self._error(row, f"unchanged-TOAST value in the old tuple of {rel.schema}.{rel.name}")
        return self._record(row, rel, op, old_kind=old_kind, old=old, new=new, unchanged=unchanged,
                            truncate_options=None)

    def _truncate(self, row: BronzeRow, msg: Truncate) -> Iterator[SilverChange]:
        for oid in msg.relation_oids:
            rel = self._relation(row, oid)
            yield self._record(row, rel, "T", old_kind=None, old=None, new=None, unchanged=(),
                               truncate_options=msg.options)


def decode_stream(rows: Iterable[BronzeRow]) -> Iterator[StreamItem]:
    """Decode bronze rows given in (file, ord) order. Raises DecodeError if a file ends inside a transaction."""
    decoder = ChangeStreamDecoder()
    last: BronzeRow | None = None
    for row in rows:
        last = row
        yield from decoder.feed(row)
    decoder.finish(last)

