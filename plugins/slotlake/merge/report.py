"""What a merge run reports, per table and for the run: the same values from Spark's merge (`merge/job.py`) and the
in-process one (`merge/in_process.py`). Pure: no Spark, no Delta, so the in-process paths do not import Spark."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from slotlake.lsn import Lsn
from slotlake.names import TableName


@dataclass(frozen=True)
class TableMergeResult:
    schema_name: str
    table_name: str
    changes: int  # silver rows of the table in (watermark, run end]
    gold_version: int | None  # Delta version after the run (None: no gold table yet)
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    quarantined: int = 0  # values the gold type cannot hold (raw text in _quarantine)
    unapplied: int = 0  # updates/deletes of a REPLICA IDENTITY NOTHING table (cannot be applied)
    truncated: bool = False
    up_to_date: bool = False  # the table's watermark was already at the run end: nothing done
    schema_changes: tuple[str, ...] = ()  # what the run did to the gold schema ("added c", "renamed a to b", ...)
    notes: tuple[str, ...] = ()  # what slotlake could not see (e.g. defaults of columns added without DDL capture)
    started_at: datetime | None = None  # when the run's merge of this table began (UTC)
    last_commit_ts: datetime | None = None  # commit time of the newest change applied (UTC); None: no change


@dataclass(frozen=True)
class MergeReport:
    source: str
    end_lsn: Lsn | None  # None: silver has no decoded changes yet
    tables: tuple[TableMergeResult, ...]
    dropped_tables: tuple[str, ...] = ()  # tables the catalog marks dropped: no changes any more, gold kept

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(n for t in self.tables for n in t.notes)

    @property
    def quarantined(self) -> int:
        return sum(t.quarantined for t in self.tables)

    @property
    def unapplied(self) -> int:
        return sum(t.unapplied for t in self.tables)

    def summary(self) -> str:
        changed = sum(t.changes for t in self.tables)
        out = (f"merge {self.source}: {len(self.tables)} table(s) at {self.end_lsn}, {changed} change(s), "
               f"{self.quarantined} quarantined value(s), {self.unapplied} unapplied change(s)")
        evolved = [f"{TableName(t.schema_name, t.table_name)}: {', '.join(t.schema_changes)}" for t in self.tables
                   if t.schema_changes]
        if evolved:
            out += "; schema changes: " + "; ".join(evolved)
        if self.dropped_tables:
            out += "; dropped in the source (gold kept): " + ", ".join(self.dropped_tables)
        if self.notes:
            out += "; NOTE: " + " | ".join(self.notes)
        return out
