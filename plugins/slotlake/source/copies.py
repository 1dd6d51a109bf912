"""What the lake records about initial copies: generations (one per slot start), publication records, and each
table's copies with their manifests (docs/internals.md "Snapshot"; the copy itself: `source/snapshot.py`).

Files under `<lake>/<source>/bronze/snapshot/`: `_generations/<C>.json`, `_publications/<publication>.json`, and
`<schema>.<table>/<copy id>/manifest.json` beside the copy's `part-NNNNN.parquet` files. Every record is written
atomically (locally a temporary file, fsync, rename, fsync of the folder; on S3 one PUT), through slotlake.storage.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from slotlake import storage
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


def snapshot_doc(properties: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The `slotlake.snapshot` property (`TableCopy.property_doc`) among a gold table's properties, parsed; None
    when the table has none (or its properties are unknown: None)."""
    raw = (properties or {}).get(SNAPSHOT_PROPERTY)
    return json.loads(raw) if raw else None

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

    def property_doc(self) -> str:
        """The gold table property `slotlake.snapshot` (JSON) of a table loaded from this copy: the copy's name, and
        for a copy under its own snapshot the visibility filter the merge applies (`loaded_in` reads it)."""
        seen = self.copy_snapshot
        return json.dumps({"generation": self.generation, "copy_id": self.copy_id, "kind": self.kind,
                           "visibility": None if seen is None else json.loads(seen.to_json())},
                          separators=(",", ":"))

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

def snapshot_dir(lake_root: str) -> str:
    """`<lake>/<source>/bronze/snapshot` (a local path or s3a://, read and written through slotlake.storage)."""
    return LakePaths(lake_root.rstrip("/")).snapshots


def copy_folder(table: str) -> str:
    """`<schema>.<table>`, each name encoded by `path_segment` (plain names as they are)."""
    schema, name = TableName.parse(table)
    return f"{path_segment(schema)}.{path_segment(name)}"


def table_of_copy_folder(folder: str) -> str | None:
    """The canonical table name whose copies live in `folder` (None: not a folder `copy_folder` makes)."""
    schema, dot, name = folder.partition(".")
    parts = (name_of_segment(schema), name_of_segment(name)) if dot else (None, None)
    return str(TableName(parts[0], parts[1])) if parts[0] and parts[1] else None


def copy_dir(lake_root: str, table: str, copy_id: str) -> str:
    return storage.join(snapshot_dir(lake_root), copy_folder(table), copy_id)


def write_atomic(path: str, text: str) -> None:
    """Create or replace the record `path` atomically and durably (`Files.write_replace`)."""
    storage.files_for(path).write_replace(path, text.encode("utf-8"))


def _read_text(path: str) -> str | None:
    """The record at `path`, None when it does not exist."""
    try:
        return storage.files_for(path).read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        return None


def _json_names(folder: str) -> list[str]:
    """The placed `*.json` records in `folder` (hidden temporary files left out), sorted."""
    return [n for n in storage.files_for(folder).list_names(folder) if n.endswith(".json") and not n.startswith(".")]


def generations(lake_root: str) -> list[Generation]:
    """Recorded slot generations, oldest first."""
    folder = storage.join(snapshot_dir(lake_root), GENERATIONS)
    out = []
    for name in _json_names(folder):
        text = _read_text(storage.join(folder, name))
        if text is None:
            continue
        doc = json.loads(text)
        out.append(Generation(slot=doc["slot"], consistent_point=Lsn.parse(doc["consistent_point"]),
                              reason=doc["reason"], created_at=doc["created_at"],
                              archived_to=Lsn.parse(doc["archived_to"]) if doc.get("archived_to") else None))
    return sorted(out, key=lambda g: int(g.consistent_point))


def current_generation(lake_root: str) -> Generation | None:
    gens = generations(lake_root)
    return gens[-1] if gens else None


def record_generation(lake_root: str, gen: Generation) -> None:
    path = storage.join(snapshot_dir(lake_root), GENERATIONS, f"{gen.consistent_point.hex16}.json")
    write_atomic(path, json.dumps({"slot": gen.slot, "consistent_point": str(gen.consistent_point),
                                    "reason": gen.reason, "created_at": gen.created_at,
                                    "archived_to": str(gen.archived_to) if gen.archived_to else None}, indent=1))


def publication_record(lake_root: str, publication: str) -> str:
    return storage.join(snapshot_dir(lake_root), PUBLICATIONS, f"{publication}.json")


def publication_start(lake_root: str, slot: str, publication: str) -> Lsn | None:
    """From which WAL position `slot` may be read with `publication` (None: from anywhere, it predates the slot).

    A publication created after its slot cannot be named when the slot decodes changes from before it: up to
    PostgreSQL 17 pgoutput stops with 'publication ... does not exist'. The extract reads up to this position
    without it (`record_publication_start` says why nothing is lost). Raises PreflightError while the record is
    unfinished (a preflight died while creating the publication; the next preflight finishes it)."""
    text = _read_text(publication_record(lake_root, publication))
    if text is None:
        return None
    doc = json.loads(text)
    if doc["slot"] != slot:
        return None
    if doc["from_lsn"] is None:
        raise PreflightError(f"publication {publication} was being created when a preflight stopped; run "
                             "`slotlake sync` again (its preflight finishes it)")
    return Lsn.parse(doc["from_lsn"])


def publication_pending(lake_root: str, slot: str, publication: str) -> bool:
    text = _read_text(publication_record(lake_root, publication))
    if text is None:
        return False
    doc = json.loads(text)
    return doc["slot"] == slot and doc["from_lsn"] is None


def mark_publication_pending(lake_root: str, slot: str, publication: str) -> None:
    """Written before a publication is created for an existing slot, so a crash in between is noticed."""
    write_atomic(publication_record(lake_root, publication),
                  json.dumps({"publication": publication, "slot": slot, "from_lsn": None}))


def table_copies(lake_root: str, table: str) -> list[TableCopy]:
    """Every copy of `table` with a manifest, oldest first."""
    folder = storage.join(snapshot_dir(lake_root), copy_folder(table))
    out = []
    for copy_id in storage.files_for(folder).list_names(folder):
        text = _read_text(storage.join(folder, copy_id, MANIFEST))
        if text is not None:
            out.append(TableCopy.from_json(text))
    return out


def complete_copy(lake_root: str, table: str, generation: Generation) -> TableCopy | None:
    """The newest complete copy of `table` joined to `generation` (None: the table still needs a copy)."""
    done = [c for c in table_copies(lake_root, table)
            if c.complete and c.generation == generation.consistent_point.hex16]
    return done[-1] if done else None


def part_paths(lake_root: str, copy: TableCopy) -> list[str]:
    folder = copy_dir(lake_root, copy.table, copy.copy_id)
    return [storage.join(folder, p["name"]) for p in sorted(copy.parts, key=lambda p: p["index"])]


def copied_tables(lake_root: str) -> list[str]:
    """Every table (canonical name) with a copy folder under bronze/snapshot/, sorted."""
    folder = snapshot_dir(lake_root)
    names = (table_of_copy_folder(name) for name in storage.files_for(folder).list_names(folder)
             if name not in (GENERATIONS, PUBLICATIONS))
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
