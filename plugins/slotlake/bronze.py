"""The raw archive (`<lake>/<source>/bronze/`): file naming, listing, atomic placement.

Contract (docs/internals.md "Bronze"): one Parquet file per peek call, holding whole transactions, named
`<start.hex16>_<end.hex16>.parquet` (start = the slot's confirmed position before the call, end = the end LSN of
the last commit in the file), so lexical order is LSN order. A file is written under a hidden `.tmp` name,
flushed, fsynced, renamed into place and the directory fsynced: a name without the dot is always complete.
Files are never modified after placement. Bronze lives on the local filesystem (or a mount of it).

Coverage markers (`bronze/_covered/<lsn.hex16>.json`): an extract that moves the slot past the end of its last
bronze file (its peek found nothing more up to `upto_lsn`) first places a marker saying so, the same way as a
bronze file. Every commit whose commit LSN is at most `covered_lsn()` is then in bronze, so a replay may end
there. Markers hold no changes: crash recovery (`max_archived_end`) and decoding ignore them.

`lake_root` everywhere in this module is the *source's* lake root, `<lake>/<source>` (`LakePaths.root`).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from slotlake.errors import ExtractError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn

COLUMNS = ("lsn", "xid", "data", "ord")
_NAME = re.compile(r"^([0-9A-F]{16})_([0-9A-F]{16})\.parquet$")
_COVERED_DIR = "_covered"
_COVERED_NAME = re.compile(r"^([0-9A-F]{16})\.json$")

# Parquet key-value metadata keys.
META_START = "slotlake.start_lsn"
META_END = "slotlake.end_lsn"
META_SLOT = "slotlake.slot"
META_ROWS = "slotlake.rows"


@dataclass(frozen=True)
class BronzeFile:
    """A placed (complete, immutable) bronze file."""

    path: str
    start_lsn: Lsn
    end_lsn: Lsn

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def bronze_name(start: Lsn, end: Lsn) -> str:
    """`<start.hex16>_<end.hex16>.parquet`."""
    return f"{start.hex16}_{end.hex16}.parquet"


def bronze_dir(lake_root: str) -> Path:
    """The local bronze folder of a source (`lake_root` = `<lake>/<source>`)."""
    return local_dir(LakePaths(lake_root.rstrip("/")).bronze)


def local_dir(path: str) -> Path:
    """A bronze path (`LakePaths.bronze`, `.snapshots`) as a local folder; the extract writes local files only."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif "://" in path:
        raise ExtractError(f"bronze must be on a local filesystem (or a mount), got {path}; "
                           "set `lake:` to a local path")
    return Path(path)


def parse_bronze_name(name: str) -> tuple[Lsn, Lsn] | None:
    """(start, end) of a placed bronze file name; None for anything else (temporary files included)."""
    m = _NAME.match(name)
    return (Lsn(int(m.group(1), 16)), Lsn(int(m.group(2), 16))) if m else None


def list_bronze(lake_root: str) -> list[BronzeFile]:
    """Placed bronze files sorted by end LSN; hidden `.tmp` files (a write in progress or abandoned) are ignored."""
    folder = bronze_dir(lake_root)
    if not folder.is_dir():
        return []
    files = []
    for entry in os.scandir(folder):
        parsed = parse_bronze_name(entry.name)
        if parsed and entry.is_file():
            files.append(BronzeFile(start_lsn=parsed[0], end_lsn=parsed[1], path=entry.path))
    return sorted(files, key=lambda f: (f.end_lsn, f.start_lsn))


def max_archived_end(lake_root: str) -> Lsn | None:
    """The end LSN of the newest placed bronze file: every commit up to it is archived. None if bronze is empty."""
    files = list_bronze(lake_root)
    return files[-1].end_lsn if files else None


def tmp_path(lake_root: str, start: Lsn) -> Path:
    """Where a file starting at `start` is written before its end is known: `.<start.hex16>_pending.parquet.tmp`."""
    folder = bronze_dir(lake_root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f".{start.hex16}_pending.parquet.tmp"


def remove_abandoned(lake_root: str) -> list[str]:
    """Delete `.tmp` files left by a run that died while writing (never placed, so never archived)."""
    folder = bronze_dir(lake_root)
    if not folder.is_dir():
        return []
    removed = []
    for entry in os.scandir(folder):
        if entry.name.startswith(".") and entry.name.endswith(".tmp"):
            os.unlink(entry.path)
            removed.append(entry.name)
    return removed


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def place(tmp: Path, start: Lsn, end: Lsn) -> BronzeFile:
    """Make a fully written `tmp` file durable and visible as `<start>_<end>.parquet`.

    fsync the data, rename (atomic on POSIX), fsync the folder so the rename itself survives a crash.
    Refuses to overwrite: bronze files are immutable.
    """
    final = tmp.parent / bronze_name(start, end)
    if final.exists():
        raise ExtractError(f"bronze file {final} already exists; bronze files are immutable "
                           "(two extracts running at once on the same source?)")
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    _fsync_dir(tmp.parent)
    return BronzeFile(start_lsn=start, end_lsn=end, path=str(final))


# ---- coverage markers ----------------------------------------------------------------------------------------

def covered_dir(lake_root: str) -> Path:
    return bronze_dir(lake_root) / _COVERED_DIR


def list_covered(lake_root: str) -> list[Lsn]:
    """The LSNs of the placed coverage markers, ascending (hidden `.tmp` files ignored)."""
    folder = covered_dir(lake_root)
    if not folder.is_dir():
        return []
    return sorted(Lsn(int(m.group(1), 16)) for m in (_COVERED_NAME.match(e.name) for e in os.scandir(folder)) if m)


def covered_lsn(lake_root: str) -> Lsn | None:
    """How far bronze covers the WAL: every commit with commit LSN <= this is archived. The greater of the newest
    bronze file's end and the newest coverage marker; None when neither exists."""
    ends = [x for x in (max_archived_end(lake_root), max(list_covered(lake_root), default=None)) if x is not None]
    return max(ends) if ends else None


def place_covered(lake_root: str, covered: Lsn, *, slot: str, upto: Lsn) -> Path:
    """Durably record that every commit up to `covered` is archived (call only once the bronze files holding them
    are placed, and before the slot moves past them): written hidden, fsynced, renamed, folder fsynced.

    Older markers are then removed: the newest says all they said. A crash before that leaves them; harmless."""
    folder = covered_dir(lake_root)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{covered.hex16}.json"
    if not final.exists():
        tmp = folder / f".{covered.hex16}.json.tmp"
        body = {"format": 1, "covered_lsn": str(covered), "upto_lsn": str(upto), "slot": slot,
                "written_at": datetime.now(UTC).isoformat()}
        with open(tmp, "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        _fsync_dir(folder)
    for older in list_covered(lake_root):
        if older < covered:
            (folder / f"{older.hex16}.json").unlink(missing_ok=True)
    return final
