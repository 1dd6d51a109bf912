"""The raw archive (`<lake>/<source>/bronze/`): file naming, listing, atomic placement.

Contract (docs/internals.md "Bronze"): one Parquet file per peek call, holding whole transactions, named
`<start.hex16>_<end.hex16>.parquet` (start = the slot's confirmed position before the call, end = the end LSN of
the last commit in the file), so lexical order is LSN order. A file is written under a hidden `.tmp` name,
flushed, fsynced, renamed into place and the directory fsynced: a name without the dot is always complete.
Files are never modified after placement. Bronze lives on the local filesystem (or a mount of it), or on S3 (an
s3a:// lake): there a file is written to a local scratch file and placed with ONE conditional PUT
(`If-None-Match: *`, `storage.S3Files.put_new_file`), so an object name is complete when it exists and is never
replaced (a second writer of the same name gets 412 and fails).

Coverage markers (`bronze/_covered/<lsn.hex16>.json`): an extract that moves the slot past the end of its last
bronze file (its peek found nothing more up to `upto_lsn`) first places a marker saying so, the same way as a
bronze file. Every commit whose commit LSN is at most `covered_lsn()` is then in bronze, so a replay may end
there. Markers hold no changes: crash recovery (`max_archived_end`) and decoding ignore them.

`lake_root` everywhere in this module is the *source's* lake root, `<lake>/<source>` (`LakePaths.root`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from slotlake import storage
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
META_FRAMES = "slotlake.frames"
"""The file's frame summary (`FrameSummary` as JSON), written by the extract; a file without it (written before,
or by other means) is summarized by the decode's Spark aggregation instead."""

BIG_TXN_MIN_ROWS = 100_000
"""Transactions a frame summary lists with their Commit's LSNs: those spanning more frames than this. The decode
needs those over half of what a task holds (`decode.commit_ends.MAX_HELD_ROWS` // 2), so this must stay below."""


@dataclass(frozen=True)
class FrameSummary:
    """What the decode needs to know of a bronze file's frames before decoding them (`decode.job.BronzeSummary`
    per file): the xids of the transactions with Relation, Type or logical-message frames; the transactions
    spanning more than `BIG_TXN_MIN_ROWS` rows (commit LSN, end LSN, rows: frames from Begin to Commit, plus one
    row per relation after a TRUNCATE's first); the Insert/Update/Delete frames per relation OID."""

    meta_xids: tuple[int | None, ...]
    big: tuple[tuple[int, int, int], ...]
    per_oid: Mapping[int, int]

    def json(self) -> str:
        return json.dumps({"v": 1, "meta_xids": list(self.meta_xids), "big": [list(b) for b in self.big],
                           "per_oid": {str(k): v for k, v in self.per_oid.items()},
                           "big_min_rows": BIG_TXN_MIN_ROWS}, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | bytes | None) -> FrameSummary | None:
        """The summary of `json()`; None when absent or of another version or threshold (then not used)."""
        if not text:
            return None
        d = json.loads(text)
        if d.get("v") != 1 or d.get("big_min_rows") != BIG_TXN_MIN_ROWS:
            return None
        return cls(meta_xids=tuple(d["meta_xids"]), big=tuple((int(c), int(e), int(r)) for c, e, r in d["big"]),
                   per_oid={int(k): int(v) for k, v in d["per_oid"].items()})


def read_frame_summary(path: str) -> FrameSummary | None:
    """The frame summary in the footer of the local bronze file `path`, None when it has none."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path).metadata or {}
    return FrameSummary.parse(meta.get(META_FRAMES.encode()))


def read_txn_frames(path: str, xids: set[int]):
    """The rows (lsn, xid, data, ord) of the local bronze file `path` whose transaction is one of `xids`, as a
    pyarrow Table in file order, reading only the row groups whose xid statistics can hold one of them (the
    frames of a few transactions, not the whole file)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from slotlake import contracts

    columns = [name for name, _ in contracts.BRONZE]
    f = pq.ParquetFile(path)
    at = f.schema_arrow.get_field_index("xid")
    lo, hi = min(xids), max(xids)
    groups = []
    for g in range(f.metadata.num_row_groups):
        stats = f.metadata.row_group(g).column(at).statistics
        if stats is not None and stats.has_min_max and (stats.max < lo or stats.min > hi):
            continue
        groups.append(g)
    table = f.read_row_groups(groups, columns=columns) if groups else f.schema_arrow.empty_table().select(columns)
    return table.filter(pc.is_in(table["xid"], value_set=pa.array(sorted(xids), pa.int64())))


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
    """The local bronze folder of a source (`lake_root` = `<lake>/<source>`); on S3 see `bronze_path`."""
    return local_dir(LakePaths(lake_root.rstrip("/")).bronze)


def bronze_path(lake_root: str) -> str:
    """The bronze folder of a source as a lake path (local or s3a://)."""
    return LakePaths(lake_root.rstrip("/")).bronze


def local_dir(path: str) -> Path:
    """A local bronze path (`LakePaths.bronze`, `.snapshots`) as a folder; an s3a:// lake goes through `storage`."""
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif "://" in path:
        raise ExtractError(f"{path} is not on the local filesystem; the lake's files on S3 are read and written "
                           "through slotlake.storage (lake: s3a://bucket/prefix)")
    return Path(path)


def scratch_dir(lake_root: str) -> Path:
    """The local folder where an s3a lake's bronze files are written before their PUT (one per source lake;
    `$SLOTLAKE_WORK_DIR`, else the system's temporary folder)."""
    digest = hashlib.sha256(lake_root.rstrip("/").encode()).hexdigest()[:16]
    base = Path(os.environ.get("SLOTLAKE_WORK_DIR", tempfile.gettempdir()))
    return base / "slotlake-bronze" / digest


def parse_bronze_name(name: str) -> tuple[Lsn, Lsn] | None:
    """(start, end) of a placed bronze file name; None for anything else (temporary files included)."""
    m = _NAME.match(name)
    return (Lsn(int(m.group(1), 16)), Lsn(int(m.group(2), 16))) if m else None


def list_bronze(lake_root: str) -> list[BronzeFile]:
    """Placed bronze files sorted by end LSN; hidden `.tmp` files (a write in progress or abandoned) are ignored."""
    if storage.is_s3(lake_root):
        folder_path = bronze_path(lake_root)
        files = [BronzeFile(start_lsn=p[0], end_lsn=p[1], path=storage.join(folder_path, name))
                 for name in storage.files_for(folder_path).list_names(folder_path)
                 if (p := parse_bronze_name(name))]
        return sorted(files, key=lambda f: (f.end_lsn, f.start_lsn))
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
    """Where a file starting at `start` is written before its end is known: `.<start.hex16>_pending.parquet.tmp`
    in the bronze folder (a local lake) or in the source's local scratch folder (an s3a lake)."""
    folder = scratch_dir(lake_root) if storage.is_s3(lake_root) else bronze_dir(lake_root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f".{start.hex16}_pending.parquet.tmp"


def remove_abandoned(lake_root: str) -> list[str]:
    """Delete `.tmp` files left by a run that died while writing (never placed, so never archived)."""
    folder = scratch_dir(lake_root) if storage.is_s3(lake_root) else bronze_dir(lake_root)
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


def place(tmp: Path, start: Lsn, end: Lsn, lake_root: str | None = None) -> BronzeFile:
    """Make a fully written `tmp` file durable and visible as `<start>_<end>.parquet`.

    Local: fsync the data, rename (atomic on POSIX), fsync the folder so the rename itself survives a crash.
    S3 (`lake_root` an s3a:// source root): one conditional PUT of the whole file, then the local file is removed.
    Refuses to overwrite: bronze files are immutable.
    """
    if lake_root is not None and storage.is_s3(lake_root):
        target = storage.join(bronze_path(lake_root), bronze_name(start, end))
        try:
            storage.files_for(target).put_new_file(target, str(tmp))
        except FileExistsError:
            raise ExtractError(f"bronze file {target} already exists; bronze files are immutable "
                               "(two extracts running at once on the same source?)") from None
        return BronzeFile(start_lsn=start, end_lsn=end, path=target)
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
    if storage.is_s3(lake_root):
        folder_path = storage.join(bronze_path(lake_root), _COVERED_DIR)
        names = storage.files_for(folder_path).list_names(folder_path)
        return sorted(Lsn(int(m.group(1), 16)) for m in map(_COVERED_NAME.match, names) if m)
    folder = covered_dir(lake_root)
    if not folder.is_dir():
        return []
    return sorted(Lsn(int(m.group(1), 16)) for m in (_COVERED_NAME.match(e.name) for e in os.scandir(folder)) if m)


def covered_lsn(lake_root: str) -> Lsn | None:
    """How far bronze covers the WAL: every commit with commit LSN <= this is archived. The greater of the newest
    bronze file's end and the newest coverage marker; None when neither exists."""
    ends = [x for x in (max_archived_end(lake_root), max(list_covered(lake_root), default=None)) if x is not None]
    return max(ends) if ends else None


def _covered_body(covered: Lsn, slot: str, upto: Lsn) -> dict[str, object]:
    return {"format": 1, "covered_lsn": str(covered), "upto_lsn": str(upto), "slot": slot,
            "written_at": datetime.now(UTC).isoformat()}


def place_covered(lake_root: str, covered: Lsn, *, slot: str, upto: Lsn) -> str:
    """Durably record that every commit up to `covered` is archived (call only once the bronze files holding them
    are placed, and before the slot moves past them): written hidden, fsynced, renamed, folder fsynced.

    Older markers are then removed: the newest says all they said. A crash before that leaves them; harmless.
    On S3 the marker is one conditional PUT (an existing marker of the same LSN says the same)."""
    if storage.is_s3(lake_root):
        folder_path = storage.join(bronze_path(lake_root), _COVERED_DIR)
        target = storage.join(folder_path, f"{covered.hex16}.json")
        files = storage.files_for(target)
        try:
            files.put_new(target, json.dumps(_covered_body(covered, slot, upto)).encode())
        except FileExistsError:
            pass
        for older in list_covered(lake_root):
            if older < covered:
                files.remove(storage.join(folder_path, f"{older.hex16}.json"))
        return target
    folder = covered_dir(lake_root)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{covered.hex16}.json"
    if not final.exists():
        tmp = folder / f".{covered.hex16}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(_covered_body(covered, slot, upto), f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        _fsync_dir(folder)
    for older in list_covered(lake_root):
        if older < covered:
            (folder / f"{older.hex16}.json").unlink(missing_ok=True)
    return str(final)
