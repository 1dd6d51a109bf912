"""`slotlake resync`: start a source over from a new slot and a new initial copy (docs/internals.md "Resync")."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from slotlake import bronze
from slotlake.config import Config, SourceConfig
from slotlake.errors import SnapshotError
from slotlake.lsn import Lsn
from slotlake.source.connection import connect
from slotlake.source.slot import SlotInfo, current_wal_lsn, slot_info
from slotlake.source.snapshot import SnapshotReport, create_slot_with_snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResyncReport:
    source: str
    old_slot: SlotInfo | None
    old_slot_dropped: bool
    old_bronze_end: Lsn | None
    snapshot: SnapshotReport

    def lines(self) -> list[str]:
        old = self.old_slot
        if old is None:
            state = "missing (dropped by hand, or never created)"
        else:
            state = (f"{old.name} wal_status={old.wal_status} invalidated={old.invalidated or 'no'} "
                     f"confirmed_flush={old.confirmed_flush_lsn}")
        out = [f"resync {self.source}: old slot: {state}" + (" (dropped)" if self.old_slot_dropped else ""),
               (f"  bronze of the old slot ends at {self.old_bronze_end} (kept as history)"
                if self.old_bronze_end is not None else "  no bronze from the old slot"),
               f"  new slot at consistent point {self.snapshot.generation}; gold is rebuilt from the copy and "
               f"changes apply from there"]
        out += [f"  copied {c.table}: {c.rows} rows in {c.parts} part(s), {c.bytes / 1e6:.1f} MB"
                for c in self.snapshot.copies]
        return out


def resync(cfg: Config, source: SourceConfig, *, workers: int | None = None,
           part_pages: int | None = None) -> ResyncReport:
    """Start the source over from a new slot: drop the old slot if it still exists, create a new one with an
    exported snapshot and copy every table (a new generation). The gold load (`load_snapshots`) then replaces
    every gold table in a new Delta version. Old bronze and silver stay as history: the new slot's LSNs are past
    every old bronze file, and the new watermark skips old silver changes."""
    root = f"{cfg.lake.rstrip('/')}/{source.name}"
    archived = bronze.max_archived_end(root)
    with connect(source) as conn:
        now = current_wal_lsn(conn)
        if archived is not None and archived > now:
            # Only possible when the server's WAL went backwards (restored from a backup): extract's crash
            # recovery would advance the new slot to the old bronze end and skip real changes.
            raise SnapshotError(f"resync {source.name}: bronze holds files up to {archived}, past the server's WAL "
                                f"position {now} (was the server restored from a backup?); move "
                                f"{bronze.bronze_path(root)} aside (keep it as history) and run resync again")
        old = slot_info(conn, source.slot)
        dropped = False
        if old is not None:
            if old.active:
                raise SnapshotError(f"resync {source.name}: slot {source.slot} is in use by another process "
                                    "(active); stop the other sync first")
            conn.execute("SELECT pg_drop_replication_slot(%s)", (source.slot,))
            dropped = True
            log.warning("resync %s: dropped slot %s (wal_status=%s, invalidated=%s, confirmed_flush=%s)",
                        source.name, source.slot, old.wal_status, old.invalidated, old.confirmed_flush_lsn)
    snap = create_slot_with_snapshot(cfg, source, reason="resync", workers=workers, part_pages=part_pages)
    report = ResyncReport(source=source.name, old_slot=old, old_slot_dropped=dropped, old_bronze_end=archived,
                          snapshot=snap)
    for line in report.lines():
        log.info("%s", line)
    return report
