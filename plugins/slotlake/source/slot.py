"""Replication slot SQL: read a slot's state, create it, advance it. All slot SQL lives here."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg

from slotlake.errors import PreflightError
from slotlake.lsn import Lsn
from slotlake.source.connection import scalar

log = logging.getLogger(__name__)

PLUGIN = "pgoutput"


@dataclass(frozen=True)
class SlotInfo:
    """One row of pg_replication_slots. Version-dependent columns are None where the server lacks them."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active: bool
    wal_status: str | None  # reserved | extended | unreserved | lost
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    conflicting: bool | None = None  # PG 16+
    # PG 17+: wal_removed, rows_removed, wal_level_insufficient; 18+ also idle_timeout
    invalidation_reason: str | None = None
    inactive_since: str | None = None  # PG 17+: when the slot was last released (ISO time), None while active

    @property
    def invalidated(self) -> str | None:
        """Why the slot can no longer be used (None if it can)."""
        if self.invalidation_reason:
            return self.invalidation_reason
        if self.wal_status == "lost":
            return "wal_removed"
        if self.conflicting:
            return "conflicting with recovery"
        return None


def server_version_num(conn: psycopg.Connection) -> int:
    return int(scalar(conn, "SHOW server_version_num"))


def _lsn(value: object) -> Lsn | None:
    return None if value is None else Lsn.parse(str(value))


def slot_info(conn: psycopg.Connection, slot: str) -> SlotInfo | None:
    """The slot's state, or None when no slot of that name exists."""
    version = server_version_num(conn)
    extra = []
    if version >= 160000:
        extra.append("conflicting")
    if version >= 170000:
        extra += ["invalidation_reason", "inactive_since"]
    cols = ", ".join(["slot_name", "plugin", "slot_type", "database", "active", "wal_status",
                      "restart_lsn::text", "confirmed_flush_lsn::text", *extra])
    row = conn.execute(f"SELECT {cols} FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        return None
    named = dict(zip(extra, row[8:]))
    since = named.get("inactive_since")
    return SlotInfo(name=row[0], plugin=row[1], slot_type=row[2], database=row[3], active=row[4],
                    wal_status=row[5], restart_lsn=_lsn(row[6]), confirmed_flush_lsn=_lsn(row[7]),
                    conflicting=named.get("conflicting"), invalidation_reason=named.get("invalidation_reason"),
                    inactive_since=since.isoformat() if since is not None else None)


def idle_slot_timeout(conn: psycopg.Connection) -> int | None:
    """The server's `idle_replication_slot_timeout` in seconds (PostgreSQL 18+; 0 = off), None before 18.

    A checkpoint invalidates a slot unused for longer than this, and slotlake's slot is unused between runs.
    """
    if server_version_num(conn) < 180000:
        return None
    return int(scalar(conn, "SELECT setting FROM pg_settings WHERE name = 'idle_replication_slot_timeout'"))


def format_seconds(seconds: int) -> str:
    """60 -> '1min', 5400 -> '90min', 7200 -> '2h', 45 -> '45s' (PostgreSQL's own units)."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def lost_slot_message(info: SlotInfo, source_name: str, idle_timeout: int | None = None) -> str:
    """What an invalidated slot means for the lake, and what to do (preflight and extract raise it)."""
    reason = info.invalidated
    lost = f"changes after {info.confirmed_flush_lsn} are lost" if info.confirmed_flush_lsn else "changes are lost"
    fix = f"run `slotlake resync {source_name}`"
    if reason == "wal_removed":
        return f"slot {info.name} was invalidated ({reason}): the server removed WAL the slot still needed, so " \
               f"{lost}; {fix}"
    if reason == "idle_timeout":
        limit = f" ({format_seconds(idle_timeout)})" if idle_timeout else ""
        return f"slot {info.name} was invalidated ({reason}): it was unused for longer than the server's " \
               f"idle_replication_slot_timeout{limit}, so {lost}; {fix}, then sync more often than that or raise " \
               "idle_replication_slot_timeout"
    return f"slot {info.name} was invalidated ({reason}): it can no longer be read, so {lost}; {fix}"


def create_slot(conn: psycopg.Connection, slot: str) -> Lsn:
    """Create a logical slot with pgoutput in the connection's database; returns its consistent point."""
    lsn = Lsn.parse(scalar(conn, "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)", (slot, PLUGIN)))
    log.info("created replication slot %s (pgoutput) at %s", slot, lsn)
    return lsn


def advance_slot(conn: psycopg.Connection, slot: str, lsn: Lsn) -> Lsn:
    """Move the slot's confirmed position to `lsn` (never backwards; PostgreSQL ignores an earlier LSN).

    Returns the position the slot reports afterwards.
    """
    return Lsn.parse(scalar(conn, "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
                            (slot, str(lsn))))


def current_wal_lsn(conn: psycopg.Connection) -> Lsn:
    """The server's current WAL write position, pg_current_wal_lsn() (on a standby: the last replayed position):
    what `status` and preflight compare the slot against.

    Asynchronous commits (synchronous_commit=off) can be ahead of it for up to wal_writer_delay; decoding stops
    at the flushed position anyway, so such a commit simply falls into the next run.
    """
    text = scalar(conn, "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                        "ELSE pg_current_wal_lsn() END::text")
    if text is None:
        raise PreflightError("the server reports no WAL position (a standby that has not replayed anything yet)")
    return Lsn.parse(text)


def current_flush_lsn(conn: psycopg.Connection) -> Lsn:
    """The WAL position flushed to disk: logical decoding never reads past it, so a run's `upto_lsn`."""
    return Lsn.parse(scalar(conn, "SELECT pg_current_wal_flush_lsn()::text"))
