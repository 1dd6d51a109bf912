"""What the lake records about initial copies: generations (one per slot start), publication records, and each
table's copies with their manifests (docs/internals.md "Snapshot"; the copy itself: `source/snapshot.py`).

Files under `<lake>/<source>/bronze/snapshot/`: `_generations/<C>.json`, `_publications/<publication>.json`, and
`<schema>.<table>/<copy id>/manifest.json` beside the copy's `part-NNNNN.parquet` files. Every record is written
atomically (a temporary file, fsync, rename, fsync of the folder).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotlake import bronze
from slotlake.config import SourceConfig
from slotlake.errors import PreflightError
from slotlake.lake import LakePaths, name_of_segment, path_segment
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.source.visibility import CopySnapshot

MANIFEST = "manifest.json"
GENERATIONS = "_generations"
PUBLICATIONS = "_publications"  # when a publication created after the slot may be read with it
SNAPSHOT_PROPERTY = "slotlake.snapshot"  # gold table property naming the copy the table was loaded from

# ---- records ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Generation:
    """One slot's start: the consistent point C every copy of this generation is joined at (watermark C - 1)."""

    slot: str
    consistent_point: Lsn
    reason: str  # "new source" | "resync" | "recovered" (slot found without a record)
    created_at: str
    # How far the earlier slots' archive reached when this slot was created (`bronze.covered_lsn`); None for the
    # first slot, or a record written before slotlake kept it. Between it and C nothing was archived.
    archived_to: Lsn | None = None

    @property
    def watermark(self) -> Lsn:
        # A commit record starting exactly at C is streamed, not in the snapshot: applied commits are those < C.
        return Lsn(int(self.consistent_point) - 1)


@dataclass(frozen=True)
class TableCopy:
    """The manifest of one copy of one table (JSON in `manifest.json`)."""

    table: str  # canonical schema.table (str(TableName))
    copy_id: str  # folder name: hex16 of the LSN the copy joins at (C, or the WAL position at a fresh snapshot)
    generation: str  # hex16 of the generation's consistent point
    kind: str  # "exported" (the slot's snapshot) | "current" (own snapshot, filtered by visibility)
    watermark: Lsn  # gold's watermark after loading this copy
    snapshot: str  # pg_current_snapshot() text the copy was read under
    lsn_after: Lsn  # WAL insert position read right after that snapshot was taken
    replica_identity: str
    columns: tuple[dict[str, Any], ...]  # name, type_oid, type_name, typmod, is_key, not_null
    reltuples: int
    parts_total: int
    parts: tuple[dict[str, Any], ...] = ()  # {"index", "name", "rows", "bytes"}
    complete: bool = False
    started_at: str = ""
    finished_at: str | None = None

    @property
    def rows(self) -> int:
        return sum(p["rows"] for p in self.parts)

    @property
    def copy_snapshot(self) -> CopySnapshot | None:
        """The visibility filter the merge needs (None for a copy under the slot's own snapshot)."""
        return CopySnapshot.parse(self.snapshot, self.lsn_after) if self.kind == "current" else None

    def loaded_in(self, gold_property: Mapping[str, Any] | None) -> bool:
        """Whether a gold table whose `slotlake.snapshot` property is `gold_property` was loaded from this copy."""
        return gold_property is not None and bool(gold_property) and (
            gold_property.get("copy_id"), gold_property.get("generation")) == (self.copy_id, self.generation)

    def to_json(self) -> str:
        doc = {k: (str(v) if isinstance(v, Lsn) else v) for k, v in self.__dict__.items()}
        doc["columns"] = list(self.columns)
        doc["parts"] = list(self.parts)
        doc["version"] = 1
        return json.dumps(doc, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TableCopy:
        doc = json.loads(text)
        doc.pop("version", None)
        doc["watermark"] = Lsn.parse(doc["watermark"])
        doc["lsn_after"] = Lsn.parse(doc["lsn_after"])
        doc["columns"] = tuple(doc["columns"])
        doc["parts"] = tuple(doc["parts"])
        return cls(**doc)


# ---- lake layout ------------------------------------------------------------------------------------------------

def snapshot_dir(lake_root: str) -> Path:
    """`<lake>/<source>/bronze/snapshot` (local filesystem, like bronze)."""
    return bronze.local_dir(LakePaths(lake_root.rstrip("/")).snapshots)


def copy_folder(table: str) -> str:
    """`<schema>.<table>`, each name encoded by `path_segment` (plain names as they are)."""
    schema, name = TableName.parse(table)
    return f"{path_segment(schema)}.{path_segment(name)}"


def table_of_copy_folder(folder: str) -> str | None:
    """The canonical table name whose copies live in `folder` (None: not a folder `copy_folder` makes)."""
    schema, dot, name = folder.partition(".")
    parts = (name_of_segment(schema), name_of_segment(name)) if dot else (None, None)
    return str(TableName(parts[0], parts[1])) if parts[0] and parts[1] else None


def copy_dir(lake_root: str, table: str, copy_id: str) -> Path:
    return snapshot_dir(lake_root) / copy_folder(table) / copy_id


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def generations(lake_root: str) -> list[Generation]:
    """Recorded slot generations, oldest first."""
    folder = snapshot_dir(lake_root) / GENERATIONS
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("*.json")):
        doc = json.loads(p.read_text(encoding="utf-8"))
        out.append(Generation(slot=doc["slot"], consistent_point=Lsn.parse(doc["consistent_point"]),
                              reason=doc["reason"], created_at=doc["created_at"],
                              archived_to=Lsn.parse(doc["archived_to"]) if doc.get("archived_to") else None))
    return sorted(out, key=lambda g: int(g.consistent_point))


def current_generation(lake_root: str) -> Generation | None:
    gens = generations(lake_root)
    return gens[-1] if gens else None


def record_generation(lake_root: str, gen: Generation) -> None:
    path = snapshot_dir(lake_root) / GENERATIONS / f"{gen.consistent_point.hex16}.json"
    write_atomic(path, json.dumps({"slot": gen.slot, "consistent_point": str(gen.consistent_point),
                                    "reason": gen.reason, "created_at": gen.created_at,
                                    "archived_to": str(gen.archived_to) if gen.archived_to else None}, indent=1))


def publication_record(lake_root: str, publication: str) -> Path:
    return snapshot_dir(lake_root) / PUBLICATIONS / f"{publication}.json"


def publication_start(lake_root: str, slot: str, publication: str) -> Lsn | None:
    """From which WAL position `slot` may be read with `publication` (None: from anywhere, it predates the slot).

    A publication created after its slot cannot be named when the slot decodes changes from before it: up to
    PostgreSQL 17 pgoutput stops with 'publication ... does not exist'. The extract reads up to this position
    without it (`record_publication_start` says why nothing is lost). Raises PreflightError while the record is
    unfinished (a preflight died while creating the publication; the next preflight finishes it)."""
    path = publication_record(lake_root, publication)
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc["slot"] != slot:
        return None
    if doc["from_lsn"] is None:
        raise PreflightError(f"publication {publication} was being created when a preflight stopped; run "
                             "`slotlake sync` again (its preflight finishes it)")
    return Lsn.parse(doc["from_lsn"])


def publication_pending(lake_root: str, slot: str, publication: str) -> bool:
    path = publication_record(lake_root, publication)
    if not path.is_file():
        return False
    doc = json.loads(path.read_text(encoding="utf-8"))
    return doc["slot"] == slot and doc["from_lsn"] is None


def mark_publication_pending(lake_root: str, slot: str, publication: str) -> None:
    """Written before a publication is created for an existing slot, so a crash in between is noticed."""
    write_atomic(publication_record(lake_root, publication),
                  json.dumps({"publication": publication, "slot": slot, "from_lsn": None}))


def table_copies(lake_root: str, table: str) -> list[TableCopy]:
    """Every copy of `table` with a manifest, oldest first."""
    folder = snapshot_dir(lake_root) / copy_folder(table)
    if not folder.is_dir():
        return []
    out = []
    for m in sorted(folder.glob(f"*/{MANIFEST}")):
        out.append(TableCopy.from_json(m.read_text(encoding="utf-8")))
    return out


def complete_copy(lake_root: str, table: str, generation: Generation) -> TableCopy | None:
    """The newest complete copy of `table` joined to `generation` (None: the table still needs a copy)."""
    done = [c for c in table_copies(lake_root, table)
            if c.complete and c.generation == generation.consistent_point.hex16]
    return done[-1] if done else None


def part_paths(lake_root: str, copy: TableCopy) -> list[str]:
    folder = copy_dir(lake_root, copy.table, copy.copy_id)
    return [str(folder / p["name"]) for p in sorted(copy.parts, key=lambda p: p["index"])]


def copied_tables(lake_root: str) -> list[str]:
    """Every table (canonical name) with a copy folder under bronze/snapshot/, sorted."""
    folder = snapshot_dir(lake_root)
    if not folder.is_dir():
        return []
    names = (table_of_copy_folder(p.name) for p in folder.iterdir()
             if p.is_dir() and p.name not in (GENERATIONS, PUBLICATIONS))
    return sorted(n for n in names if n is not None)


def load_candidates(lake_root: str, source: SourceConfig) -> list[str]:
    """The tables whose copies the gold load looks at: the listed ones, else every copied table the source syncs."""
    return list(source.listed_tables or [t for t in copied_tables(lake_root) if source.syncs(t)])


def pending_loads(lake_root: str, tables: list[str]) -> Iterator[TableCopy]:
    """Complete copies of the current generation (what the gold load reads); tables without one are skipped."""
    gen = current_generation(lake_root)
    if gen is None:
        return
    for t in tables:
        c = complete_copy(lake_root, t, gen)
        if c is not None:
            yield c
