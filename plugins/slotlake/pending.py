"""What a sync still has to do after its extract, decided from the lake's watermarks without Spark.

A sync with nothing new should not pay a JVM start. Every stage records how far it got (docs/internals.md):

    bronze      file names carry their end LSN                           -> bronze_end
    silver      each decode commit's userMetadata.end_lsn                -> silver_end
    _catalog    each catalog commit's userMetadata.end_lsn               -> catalog_end
    _runs       the commit of a complete merge run (every table merged)  -> merged_end
    gold        `slotlake.snapshot` property: the initial copy loaded    -> unloaded copies

    decode is due  when bronze ends past silver_end, or a bootstrap catalog read (bronze/catalog/) past silver_end
                   is past catalog_end (the decode puts it in `_catalog` even without bronze files);
    merge is due   when a decode is due, when silver_end is not merged_end (a merge died halfway, failed, or never
                   ran), or when a complete initial copy of the current slot generation is not loaded into gold.

`merged_end` rather than each gold table's watermark: a table without changes in a run keeps its older watermark,
so only the run as a whole says that every table is at silver's end. Anything this module cannot read (a lake on
an object store other than S3, a log written by an older slotlake) counts as due: Spark then decides, as before.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from slotlake import delta_log
from slotlake.config import Config
from slotlake.contracts import STAGE_CATALOG, STAGE_DECODE, STAGE_RUNS
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn

log = logging.getLogger(__name__)

RUNS_STAGE = STAGE_RUNS  # userMetadata stage of the `_runs` commit of a complete merge run


@dataclass(frozen=True)
class LakeWatermarks:
    """How far each stage of one source's lake got, read from file names and Delta commit records."""

    bronze_end: Lsn | None  # end LSN of the newest bronze file (None: bronze empty)
    silver_end: Lsn | None  # newest decode commit's end LSN (None: nothing decoded yet)
    silver_exists: bool  # silver/changes is a Delta table (with or without a decode commit)
    catalog_end: Lsn | None  # newest `_catalog` commit's end LSN
    bootstrap_lsns: tuple[Lsn, ...]  # LSNs of the bootstrap catalog reads in bronze/catalog/
    merged_end: Lsn | None  # end LSN of the last complete merge run (`_runs` commit)
    unloaded_copies: tuple[str, ...]  # tables whose complete initial copy is not in gold yet


@dataclass(frozen=True)
class PendingWork:
    """Why the decode and the merge must run (None: nothing for that stage), or why it could not be told."""

    decode: str | None
    merge: str | None
    at: Lsn | None = None  # silver's end when nothing is due

    @property
    def idle(self) -> bool:
        return self.decode is None and self.merge is None

    def describe(self) -> str:
        if self.idle:
            return f"decode and merge skipped: nothing new (bronze, silver, catalog and gold all at {self.at})"
        if self.decode is None:
            return f"merge due: {self.merge}"
        return f"decode and merge due: {self.decode}" + (f"; {self.merge}" if self.merge else "")

    def as_dict(self) -> dict[str, str | None]:
        return {"decode": self.decode, "merge": self.merge, "at": None if self.at is None else str(self.at),
                "summary": self.describe()}

    @classmethod
    def from_dict(cls, doc: dict) -> PendingWork:
        return cls(doc.get("decode"), doc.get("merge"), Lsn.parse(doc["at"]) if doc.get("at") else None)


def pending_work(w: LakeWatermarks) -> PendingWork:
    """The decision (pure): what is due given the watermarks."""
    decode = None
    if w.silver_exists and w.silver_end is None:
        decode = "silver has no decode commit (its watermark is unknown)"
    elif w.bronze_end is not None and (w.silver_end is None or w.bronze_end > w.silver_end):
        decode = f"bronze holds changes up to {w.bronze_end}, silver is at {w.silver_end}"
    else:
        fresh = [b for b in w.bootstrap_lsns if w.silver_end is None or b > w.silver_end]
        if fresh and (w.catalog_end is None or max(fresh) > w.catalog_end):
            decode = f"the bootstrap catalog read at {max(fresh)} is not in _catalog yet"
    merge = []
    if w.unloaded_copies:
        merge.append(f"the initial copy of {', '.join(w.unloaded_copies)} is not loaded into gold yet")
    if w.silver_end is not None and w.merged_end != w.silver_end:
        merge.append(f"silver is at {w.silver_end}, the last complete merge run at {w.merged_end}")
    return PendingWork(decode, "; ".join(merge) or None, None if decode or merge else w.silver_end)


def read_watermarks(cfg: Config, source_name: str) -> LakeWatermarks | None:
    """The watermarks of the lake, read from its Delta logs and files without a JVM, on a local or an s3a lake
    (None for another scheme: its logs need Spark)."""
    from slotlake import bronze
    from slotlake.names import TableName
    from slotlake.source.catalog_read import list_bootstrap
    from slotlake.source.copies import load_candidates, pending_loads, snapshot_doc

    src = cfg.source(source_name)
    paths = LakePaths.of(cfg.lake, source_name)
    if not delta_log.readable(paths.root):
        return None

    unloaded = []
    for copy in pending_loads(paths.root, load_candidates(paths.root, src)):
        if not copy.loaded_in(snapshot_doc(delta_log.table_properties(paths.gold(*TableName.parse(copy.table))))):
            unloaded.append(copy.table)
    return LakeWatermarks(
        bronze_end=bronze.max_archived_end(paths.root),
        silver_end=delta_log.stage_end(paths.changes, STAGE_DECODE),
        silver_exists=delta_log.is_delta_table(paths.changes),
        catalog_end=delta_log.stage_end(paths.catalog, STAGE_CATALOG),
        bootstrap_lsns=tuple(b.lsn for b in list_bootstrap(paths.root)),
        merged_end=delta_log.stage_end(paths.runs, RUNS_STAGE),
        unloaded_copies=tuple(unloaded))


def pending_after_extract(cfg: Config, source_name: str) -> PendingWork:
    """What the Spark apps must do after this run's extract (everything, when the lake cannot be read here)."""
    w = read_watermarks(cfg, source_name)
    if w is None:
        return PendingWork("the lake is neither local nor s3a: its Delta logs are read by Spark", None)
    return pending_work(w)
