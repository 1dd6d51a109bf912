"""The pgoutput messages as values (protocol versions 1 and 2, no streaming of in-progress transactions).

Reference: PostgreSQL docs, "Logical Replication Message Formats". Produced by `slotlake.decode.pgoutput`.
"""
from __future__ import annotations

from dataclasses import dataclass

from slotlake.contracts import ReplicaIdentity
from slotlake.lsn import Lsn

DDL_MESSAGE_PREFIX = "slotlake.ddl"
"""The prefix of slotlake's DDL events (a transactional logical Message, written by sql/ddl_capture.sql)."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    typmod: int  # -1 when none
    is_key: bool  # part of the replica identity key (flag 1 in the Relation message)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: Lsn  # the LSN of the transaction's commit record (= Commit.commit_lsn)
    commit_ts_us: int  # microseconds since 2000-01-01 UTC (PostgreSQL epoch)
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn  # end of the commit record: the position to confirm (advance the slot to)
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    schema: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    schema: str
    name: str


# One value of a tuple: None is SQL NULL; UNCHANGED_TOAST marks an unchanged TOASTed value ('u') whose
# value is not in the WAL; text values are str (we ask for text format), binary ('b') values are bytes.
class _UnchangedToast:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = _UnchangedToast()
Value = str | bytes | None | _UnchangedToast


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old_kind: str | None  # 'K' (old key columns only, others None), 'O' (whole old row), None (no old tuple)
    old: tuple[Value, ...] | None
    new: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: str  # 'K' or 'O'
    old: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int  # bit 1: CASCADE, bit 2: RESTART IDENTITY
    relation_oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes


PgOutputMessage = Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
