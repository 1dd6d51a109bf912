"""Slot status for `slotlake status`: where the slot is, how far behind, how much WAL it keeps."""
from __future__ import annotations

from dataclasses import dataclass

from slotlake.config import SourceConfig
from slotlake.lsn import Lsn
from slotlake.source.connection import connect
from slotlake.source.slot import current_wal_lsn, idle_slot_timeout, slot_info


@dataclass(frozen=True)
class SlotStatus:
    """`lag_bytes` = current WAL - confirmed_flush (changes not yet archived); `retained_wal_bytes` = current WAL
    - restart_lsn (WAL the server keeps for the slot). Both None when the slot is missing or has no position."""

    slot: str
    exists: bool
    active: bool
    wal_status: str | None
    invalidated: str | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    current_lsn: Lsn
    lag_bytes: int | None
    retained_wal_bytes: int | None
    server_version: int = 0  # server_version_num
    inactive_since: str | None = None  # PG 17+: when the slot was last used (between syncs it is unused)
    idle_replication_slot_timeout_s: int | None = None  # PG 18+ (0 = off): unused longer than this = invalidated


def slot_status(source: SourceConfig) -> SlotStatus:
    """Read the source's slot state (read-only: creates nothing)."""
    with connect(source) as conn:
        current = current_wal_lsn(conn)
        info = slot_info(conn, source.slot)
        server_version = conn.info.server_version
        idle_timeout = idle_slot_timeout(conn)
    if info is None:
        return SlotStatus(slot=source.slot, exists=False, active=False, wal_status=None, invalidated=None,
                          restart_lsn=None, confirmed_flush_lsn=None, current_lsn=current, lag_bytes=None,
                          retained_wal_bytes=None, server_version=server_version,
                          idle_replication_slot_timeout_s=idle_timeout)
    return SlotStatus(
        slot=source.slot, exists=True, active=info.active, wal_status=info.wal_status, invalidated=info.invalidated,
        restart_lsn=info.restart_lsn, confirmed_flush_lsn=info.confirmed_flush_lsn, current_lsn=current,
        lag_bytes=current - info.confirmed_flush_lsn if info.confirmed_flush_lsn is not None else None,
        retained_wal_bytes=current - info.restart_lsn if info.restart_lsn is not None else None,
        inactive_since=info.inactive_since, server_version=server_version,
        idle_replication_slot_timeout_s=idle_timeout,
    )
