"""A replay without Spark: the same result as `replay_job.run_replay`, in the caller's process.

    X, Y ──(timestamps: silver's commits, read with pyarrow)──▶ LSNs, checked as `check_range` checks them
    per table: base R = greatest recorded end LSN <= X        (`_runs` and gold's own commits, read with delta-rs)
    gold@R ──(delta-rs time travel, streamed)──▶ a new table: <dest>/<schema>/<table>, or in place a scratch one
    --dest:   bronze (min R, Y] ──slice by slice (`decode.job.in_process_slice`)──▶ scratch silver (a commit a
              slice); after each slice, `merge.in_process.merge_into` the new tables up to the slice's end
    in place: bronze (min R, Y] widened to whole silver and bronze files (`_whole_files`) re-decoded into silver's
              folder a slice at a time and, in one commit, put in place of silver's files of that range
              (`silver_write.replace_files`); the new tables merged from silver slice by slice up to
              silver's end, then each written over its gold table in one commit (history kept;
              userMetadata end_lsn = silver's end, "replay": {...})

The Spark replay ran 35,677 changes/s where the sync runs 150-176k/s in process (bench/README.md): a backfill of a
day paid the JVM start and Spark's MERGE for every interval. On an s3a lake the same, from local copies of each
slice's bronze files, with the scratch tables in a local temporary folder and every write to the lake a delta-rs
commit with a conditional PUT (as the sync's in-process stages). A replay declines (returns None; a `--dest` replay
removes the tables it wrote; the caller runs the Spark app, which does the whole replay again) wherever the sync's
in-process stages would: a bronze file over a slice, a file without the extract's frame
summary, a DDL event or several column layouts in a table's window, a batch only Spark merges exactly
(`merge.in_process`), a gold table with column mapping; and for a table without a recorded
state at X (Spark creates it), or in place a silver file without commit LSN statistics. An in-place replay that
declines after replacing silver's rows leaves them re-derived (what the Spark app writes again) and gold as it was
or rebuilt: both are what a replay gives, so the Spark app finishes it.

A gold table with deletion vectors (config `deletion_vectors`) is read as of its base with the rows its vectors
delete left out (`dv_merge.LiveRows`); the copies are written without vectors (the batches rewrite their rows, as a
table without vectors gets them), so a `--dest` replay's tables have none, and in place each rebuilt table is
written over gold by `dv_merge.overwrite` (delta-rs does not write such a table), which keeps gold's vectors on;
one with a feature `overwrite` does not write (append-only, CHECK constraints, ...) declines before any write.
"""
from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from slotlake import contracts, delta_log, storage
from slotlake.bronze import BronzeFile, list_bronze
from slotlake.config import Config
from slotlake.contracts import STAGE_DECODE, STAGE_MERGE, CommitMeta
from slotlake.lake import LakePaths, table_dir
from slotlake.lsn import Lsn
from slotlake.merge.in_process import Declined, open_dataset
from slotlake.merge.silver_stats import SilverFileStats
from slotlake.names import TableName
from slotlake.recover.replay import Point, ReplayRequest
from slotlake.recover.replay_job import (
    ReplayResult,
    TableReplay,
    base_at,
    check_range,
    recorded_ends,
    replay_meta,
    tables_to_rebuild,
)

log = logging.getLogger(__name__)


def scratch_folder(paths: LakePaths, kind: str) -> str:
    """A new folder for the scratch tables of one in-process `kind` run (replay, recover, undo): the lake's own
    (`LakePaths.scratch`) on a local lake; on an s3a lake a local temporary folder, since those tables are written
    and read only by this process, never by Spark. The caller removes it (`Files.remove_tree`)."""
    if storage.is_s3(paths.root):
        return tempfile.mkdtemp(prefix=f"slotlake-{kind}-")
    return paths.scratch(kind)


def replay_in_process(cfg: Config, req: ReplayRequest) -> ReplayResult | None:
    """`run_replay` without Spark (module doc); None when it declines (the reason logged; the caller runs the Spark
    app). Raises ReplayError as `run_replay` does for a range it cannot rebuild. An in-place replay must hold the
    source's run lock, as the Spark app's caller does."""
    from slotlake.merge.watermarks import row_count, runs_ends

    started = time.monotonic()
    source = req.source
    src = cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    if not cfg.spark.in_process_bytes or not delta_log.readable(paths.changes) \
            or not delta_log.is_delta_table(paths.changes):
        return None
    silver_end = delta_log.stage_end(paths.changes, STAGE_DECODE)
    if silver_end is None:
        return None  # (Spark's history tells it, or the app says nothing is decoded)
    try:
        frm, to = _resolve(paths.changes, req.from_), _resolve(paths.changes, req.to)
        check_range(req, paths, frm, to, silver_end)
        runs = runs_ends(paths.runs)
        if runs is None:
            raise Declined("`_runs` cannot be read with delta-rs")
        names = tables_to_rebuild(None, cfg, req, None, runs)
        found = {n: base_at(recorded_ends(None, runs, paths.gold(*n), *n), frm) for n in names}
        bases = {n: b for n, b in found.items() if b is not None}
        if not found or len(bases) < len(found):
            raise Declined("a table without a recorded state at or before --from (Spark builds it from the first "
                            "archived change)")
    except Declined as why:
        log.info("replay %s in this process declined (%s): Spark replays", source, why)
        return None
    after = min(b[0] for b in bases.values())
    known = set(bases) if not req.tables and not src.tables else None  # every table: others must have no change
    tables = [TableName(*n) for n in sorted(bases)]
    scratch = scratch_folder(paths, "replay")  # the re-decoded changes, in place the rebuilt tables
    dest = req.dest
    targets = {n: table_dir(dest if dest is not None else f"{scratch}/gold", *n) for n in bases}
    try:
        for (s, t), base in sorted(bases.items()):  # first: a gold table only Spark reads declines before any write
            _copy_state(paths.gold(s, t), base, targets[(s, t)])
            if dest is None:  # and in place one only Spark writes
                _check_writable(paths.gold(s, t))
        if dest is not None:
            decoded, slices = _decode_and_merge(cfg, source, paths, tables, lambda s, t: targets[(s, t)],
                                                f"{scratch}/changes", after, to, known)
        else:
            decoded = _replace_silver(cfg, req, paths, after, to, silver_end, frm, known)
            slices = _merge_silver(cfg, req, paths, tables, lambda s, t: targets[(s, t)], after, silver_end)
            _write_back(paths, targets, replay_meta(silver_end, STAGE_MERGE, req, frm, to))
    except Declined as why:
        log.info("replay %s in this process declined (%s): Spark replays", source, why)
        if dest is not None:
            for target in targets.values():
                storage.files_for(target).remove_tree(target)
        return None
    finally:
        storage.files_for(scratch).remove_tree(scratch)
    written = {n: targets[n] if dest is not None else paths.gold(*n) for n in bases}
    result = ReplayResult(source=source, from_lsn=frm, to_lsn=to, changes_redecoded=decoded, in_place=dest is None,
                          tables=tuple(TableReplay(s, t, b[0], b[1], written[(s, t)], row_count(written[(s, t)]) or 0)
                                       for (s, t), b in sorted(bases.items())))
    log.info("%s (in this process, %d slice(s), %.1fs)", result.summary(), slices, time.monotonic() - started)
    return result


def apply_range(cfg: Config, source: str, names: Sequence[TableName], gold_of, after: Lsn, to: Lsn,
                scratch: str) -> int | None:
    """The archived changes with after < commit_end_lsn, commit_lsn <= to re-decoded from bronze into a scratch
    silver table under `scratch`, slice by slice, each merged into the `gold_of` tables of `names` (which exist,
    holding a watermark) up to its end, as a `--dest` replay does. Returns the changes re-decoded; None when this
    process declines (the reason logged; whatever it merged stays in the `gold_of` tables)."""
    paths = LakePaths.of(cfg.lake, source)
    try:
        decoded, _ = _decode_and_merge(cfg, source, paths, names, gold_of, f"{scratch}/changes", after, to, None)
    except Declined as why:
        log.info("apply %s (%s, %s] in this process declined (%s)", source, after, to, why)
        return None
    return decoded


def _resolve(changes_path: str, point: Point) -> Lsn:
    """`replay_job.resolve` read with pyarrow: an LSN as is; a moment T -> the greatest silver commit LSN with
    commit_ts < T, else the LSN just before silver's first commit (0 for an empty silver)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if isinstance(point, Lsn):
        return point
    data = delta_log.delta_rs_table(changes_path).to_pyarrow_dataset(
        parquet_read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"))
    moment = pa.scalar(point, pa.timestamp("us", tz="UTC"))
    before = pc.max(data.to_table(columns=["commit_lsn"],
                                  filter=ds.field("commit_ts") < moment).column("commit_lsn")).as_py()
    if before is not None:
        return Lsn(before)
    first = pc.min(data.to_table(columns=["commit_lsn"]).column("commit_lsn")).as_py()
    return Lsn(max(first - 1, 0)) if first is not None else Lsn(0)


def _copy_state(gold: str, base: tuple[Lsn, int], target: str) -> None:
    """`target` := a new Delta table holding gold as of version `base[1]` (time travel), its commit marked with the
    merge watermark `base[0]` (what `replay_job.build_states` writes with Spark). Streamed batch by batch. A gold
    table with deletion vectors is read without the rows they delete; the copy is written without vectors."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.exceptions import DeltaError
    from deltalake.transaction import CommitProperties

    storage.files_for(target).remove_tree(target)  # a new table, as Spark's replay makes it
    try:
        data = open_dataset(gold, base[1])
        uri, options = storage.delta_rs_table_args(target)
        write_deltalake(uri, data.scanner(batch_size=65_536).to_reader(), mode="overwrite",
                        storage_options=options or None, commit_properties=CommitProperties(
                            custom_metadata={"userMetadata": CommitMeta(STAGE_MERGE, base[0]).json()}))
    except (DeltaError, pa.ArrowException, OSError) as e:  # (Spark's reader may still read it: it decides)
        raise Declined(f"{gold} as of version {base[1]} not copied with delta-rs ({type(e).__name__}: {e})") from None


def _decode_and_merge(cfg: Config, source: str, paths: LakePaths, names: Sequence[TableName], gold_of,
                      scratch_changes: str, after: Lsn, to: Lsn,
                      known: set[tuple[str, str]] | None) -> tuple[int, int]:
    """The re-decode of (after, to] from bronze into `scratch_changes`, slice by slice, each slice merged into the
    `gold_of` tables before the next is read (memory is bounded by a slice). `known`: for a replay of every table,
    the tables with a state; a synced table with changes outside it declines (Spark builds it). Returns (changes
    re-decoded, slices)."""
    from slotlake.merge.in_process import merge_into

    decoded = slices = 0
    for chunk, summary, last in _slices(cfg, _range_files(paths, after, to)):
        end = to if last else min(chunk[-1].end_lsn, to)
        decoded += _decode_slice(cfg, source, chunk, summary, scratch_changes, after, to, end, first=slices == 0,
                                 known=known)
        slices += 1
        if merge_into(cfg, source, scratch_changes, names, gold_of, end,
                      lambda mark, upto: _ddl_between(paths, mark, upto)) is None:
            raise Declined("a batch the in-process merge declined (logged above)")
    return decoded, slices


def _replace_silver(cfg: Config, req: ReplayRequest, paths: LakePaths, after: Lsn, to: Lsn, silver_end: Lsn,
                    frm: Lsn, known: set[tuple[str, str]] | None) -> int:
    """In place: silver's rows with lo < commit_end_lsn <= hi := the ones re-decoded from bronze, in one commit
    keeping silver's watermark; (lo, hi] is (after, to] widened to whole silver files (`_whole_files`: a file is
    replaced whole or not at all; its rows re-decoded are the same unless the decoder changed, which is what an
    in-place replay is for). Returns the rows re-decoded."""
    from slotlake.decode import silver_write
    from slotlake.decode.job import MAX_HELD_ROWS, place_files
    from slotlake.merge.watermarks import silver_file_stats

    if to <= after:
        return 0  # no change in range: silver keeps its rows
    stats = silver_file_stats(paths.changes)
    if stats is None:
        raise Declined("silver's file statistics cannot be read")
    archived = list_bronze(paths.root)
    ends = sorted(f.end_lsn.value for f in archived if f.end_lsn <= silver_end)
    lo, hi, removed = _whole_files(stats, ends, after.value, to.value)
    bronze = [f for f in archived if f.end_lsn.value > lo and f.start_lsn.value < hi]
    if not bronze:
        return 0
    # Written a slice at a time, as the sync's decode writes them: a silver file then spans at most a slice, so the
    # merges below can stop between slices (`_merge_ends`) and each holds at most a slice's changes; and never
    # across the end of a file it replaces (a run's end), so the next interval's replay starts at a file's edge
    # and re-derives only its own runs (else each replay of a backfill would re-derive every interval before it).
    replaced = set(removed)
    cuts = {_bronze_end(ends, f.commit_end_lsn_max) for f in stats if f.path in replaced}
    written: list[dict] = []
    try:
        for group in _split_at(bronze, cuts):
            for chunk, summary, _ in _slices(cfg, group):
                written += place_files(None, chunk, summary, MAX_HELD_ROWS, paths.changes, window=(lo, hi),
                                       in_driver=True)
        if known is not None:
            _check_known(cfg, req.source, written, known)
    except Declined:
        for f in written:  # not committed: nothing refers to them
            storage.files_for(paths.changes).remove(storage.join(paths.changes, f["path"]))
        raise
    silver_write.replace_files(paths.changes, written, removed,
                               user_metadata=replay_meta(silver_end, STAGE_DECODE, req, frm, to))
    rows = sum(int(f["rows"]) for f in written)
    log.info("replay %s: re-decoded %d change(s) of %d bronze file(s) in (%s, %s] in place of %d silver file(s)",
             req.source, rows, len(bronze), Lsn(lo), Lsn(hi), len(removed))
    return rows


def _bronze_end(bronze_ends: Sequence[int], lsn: int | None) -> int | None:
    """The end of the bronze file holding a commit that ends at `lsn` (`bronze_ends` sorted); None past the last."""
    import bisect

    i = bisect.bisect_left(bronze_ends, lsn) if lsn is not None else len(bronze_ends)
    return bronze_ends[i] if i < len(bronze_ends) else None


def _split_at(files: Sequence[BronzeFile], cuts: set[int | None]) -> list[list[BronzeFile]]:
    """`files` (in LSN order) in runs, each ending at a file whose end LSN is in `cuts` (or the last). Pure."""
    groups: list[list[BronzeFile]] = [[]]
    for f in files:
        groups[-1].append(f)
        if f.end_lsn.value in cuts:
            groups.append([])
    return [g for g in groups if g]


def _whole_files(stats: Sequence[SilverFileStats], bronze_ends: Sequence[int], after: int,
                 to: int) -> tuple[int, int, list[str]]:
    """(lo, hi, the silver files inside): the smallest range (lo, hi] of commit end LSNs holding (after, to] such
    that hi is a bronze file's end (`bronze_ends`, sorted: a file's commits are re-decoded whole) and every silver
    file lies inside or outside it. Declined for a file without commit LSN statistics or a range past the last
    decoded bronze file. Pure."""
    import bisect

    def file_end(lsn: int) -> int:  # the end of the bronze file holding a commit that ends at `lsn`
        i = bisect.bisect_left(bronze_ends, lsn)
        if i == len(bronze_ends):
            raise Declined(f"{Lsn(lsn)} is past the last decoded bronze file")
        return bronze_ends[i]

    bounds = []
    for f in stats:
        if f.commit_end_lsn_min is None or f.commit_end_lsn_max is None or f.path is None:
            raise Declined("a silver file without commit LSN statistics")
        bounds.append((f.commit_end_lsn_min, f.commit_end_lsn_max, f.path))
    lo, hi = after, file_end(max(to, after + 1))
    while True:
        wider = False
        for e_min, e_max, _ in bounds:
            if e_min <= lo < e_max:
                lo, wider = e_min - 1, True
            if e_min <= hi < e_max:
                hi, wider = file_end(e_max), True
        if not wider:
            return lo, hi, [p for e_min, e_max, p in bounds if e_min > lo and e_max <= hi]


def _merge_silver(cfg: Config, req: ReplayRequest, paths: LakePaths, names: Sequence[TableName], gold_of,
                  after: Lsn, silver_end: Lsn) -> int:
    """In place: silver's changes in (after, silver's end] merged into the `gold_of` tables, about a slice's worth
    at a time, each up to a point no silver file holds changes on both sides of (`_merge_ends`). Returns the
    slices."""
    import pyarrow.parquet as pq

    from slotlake.decode.job import SLICE_MAX_ROWS
    from slotlake.merge.in_process import merge_into
    from slotlake.merge.watermarks import silver_file_stats

    stats = silver_file_stats(paths.changes)
    if stats is None:
        raise Declined("silver's file statistics cannot be read")
    bronze = []
    for f in list_bronze(paths.root):
        if after < f.end_lsn <= silver_end:
            fs, where = storage.arrow_files(f.path)
            bronze.append((f.end_lsn.value, storage.files_for(f.path).size(f.path),
                           pq.read_metadata(where, filesystem=fs).num_rows))
    ends = _merge_ends(stats, bronze, after.value, silver_end.value, cfg.spark.in_process_bytes, SLICE_MAX_ROWS)
    for end in ends:
        if merge_into(cfg, req.source, paths.changes, names, gold_of, Lsn(end),
                      lambda mark, upto: _ddl_between(paths, mark, upto)) is None:
            raise Declined("a batch the in-process merge declined (logged above)")
    return len(ends)


def _merge_ends(stats: Sequence[SilverFileStats], bronze: Sequence[tuple[int, int, int]], after: int, end: int,
                max_bytes: int, max_rows: int) -> list[int]:
    """The ends of the merges that take silver from `after` to `end`: points no silver file holds changes on both
    sides of (by commit LSN, as a merge reads up to an end, and by commit end LSN, as the next one reads from it),
    each merge over at most `max_bytes` and `max_rows` of the bronze files (end LSN, bytes, rows) it covers where
    such a point exists (else the nearest one after). Pure."""
    def cuts_through(c: int) -> bool:
        for f in stats:
            if f.commit_lsn_min is None or f.commit_lsn_max is None or f.commit_end_lsn_min is None \
                    or f.commit_end_lsn_max is None:
                raise Declined("a silver file without commit LSN statistics")
            if f.commit_lsn_min <= c < f.commit_lsn_max or f.commit_end_lsn_min <= c < f.commit_end_lsn_max:
                return True
        return False

    import bisect
    from itertools import accumulate

    points = sorted({e for e, _, _ in bronze if after < e < end and not cuts_through(e)} | {end}) \
        if end > after else []
    files = sorted(bronze)
    at = [e for e, _, _ in files]
    sizes, counts = [0, *accumulate(b for _, b, _ in files)], [0, *accumulate(r for _, _, r in files)]

    def covered(lo: int, hi: int) -> tuple[int, int]:  # bytes and rows of the bronze files ending in (lo, hi]
        i, j = bisect.bisect_right(at, lo), bisect.bisect_right(at, hi)
        return sizes[j] - sizes[i], counts[j] - counts[i]

    out: list[int] = []
    start = after
    while start < end:
        k = bisect.bisect_right(points, start)  # the first point past `start` (`end` is the last point)
        nxt = points[k]
        for p in points[k + 1:]:
            size, rows = covered(start, p)
            if size > max_bytes or rows > max_rows:
                break
            nxt = p
        out.append(nxt)
        start = nxt
    return out


def _write_back(paths: LakePaths, rebuilt: dict[tuple[str, str], str], user_metadata: str) -> None:
    """In place: each gold table := its rebuilt table's rows, one overwrite commit (history kept) marked
    `user_metadata`, streamed batch by batch; a gold table with deletion vectors (which delta-rs does not write)
    through `dv_merge.overwrite`."""
    from deltalake import write_deltalake
    from deltalake.exceptions import SchemaMismatchError
    from deltalake.transaction import CommitProperties

    from slotlake.merge import dv_merge

    for (s, t), target in sorted(rebuilt.items()):
        data = open_dataset(target)
        if _has_vectors(paths.gold(s, t)):
            try:
                dv_merge.overwrite(paths.gold(s, t), data.scanner(batch_size=65_536).to_reader(), user_metadata)
            except dv_merge.CannotMark as e:
                raise Declined(f"{s}.{t}: gold's deletion vectors ({e})") from None
            continue
        gold, options = storage.delta_rs_table_args(paths.gold(s, t))
        try:
            write_deltalake(gold, data.scanner(batch_size=65_536).to_reader(), mode="overwrite",
                            storage_options=options or None,
                            commit_properties=CommitProperties(custom_metadata={"userMetadata": user_metadata}))
        except SchemaMismatchError as e:
            raise Declined(f"{s}.{t}: the rebuilt columns are not gold's ({e})") from None


def _has_vectors(gold: str) -> bool:
    """Whether `gold`'s protocol reads deletion vectors (delta-rs does not write the table: `dv_merge` does)."""
    return delta_log.has_deletion_vectors(delta_log.delta_rs_table(gold))


def _check_writable(gold: str) -> None:
    """Declined when `_write_back` could not write `gold` (a table with deletion vectors and a feature
    `dv_merge.overwrite` does not write): told before silver's files are replaced and the copies merged."""
    from slotlake.merge import dv_merge

    if _has_vectors(gold):
        try:
            dv_merge.check_writable(gold)
        except dv_merge.CannotMark as e:
            raise Declined(f"{gold}: gold's deletion vectors ({e})") from None


def _range_files(paths: LakePaths, after: Lsn, to: Lsn) -> list[BronzeFile]:
    from slotlake.decode.job import files_for_range

    return files_for_range(list_bronze(paths.root), after, to)


def _slices(cfg: Config, files: Sequence[BronzeFile]) -> Iterator[tuple[list[BronzeFile], Any, bool]]:
    """`files` (in LSN order) a slice at a time, as the sync decodes them (`decode.job.in_process_slice`: at most
    `spark.in_process_bytes` and a slice's rows): (the slice's files, their frame summary, whether it is the last).
    Declined at a file bigger than a slice, or without the extract's frame summary."""
    from slotlake.decode.job import MAX_HELD_ROWS, _footer_summary, _staged_bronze, in_process_slice

    todo = list(files)
    limit = cfg.spark.in_process_bytes
    while todo:
        with tempfile.TemporaryDirectory(prefix="slotlake-bronze-") as stage:
            # on an s3a lake the slice is read from local copies of its bronze files (`_staged_bronze`)
            here = (_staged_bronze(todo, stage, limit, whole=False) or []) if storage.is_s3(todo[0].path) else todo
            chunk = in_process_slice(here, limit)
            if not chunk:
                raise Declined(f"bronze file {todo[0].name} alone holds more than {limit:,} bytes or a slice's rows")
            todo = todo[len(chunk):]
            summary = _footer_summary(chunk, MAX_HELD_ROWS)
            if summary is None:
                raise Declined("a bronze file without the extract's frame summary")
            yield chunk, summary, not todo


def _decode_slice(cfg: Config, source: str, files: list[BronzeFile], summary: Any, changes_path: str, after: Lsn,
                  to: Lsn, end: Lsn, *, first: bool, known: set[tuple[str, str]] | None) -> int:
    """The changes of `files` (`summary`: their frame summary) with after < commit_end_lsn, commit_lsn <= to,
    written into the scratch silver table as one commit whose decode watermark is `end` (the first one replaces
    the table). Returns the rows added."""
    from slotlake.decode import silver_write
    from slotlake.decode.job import MAX_HELD_ROWS, place_files

    written = place_files(None, files, summary, MAX_HELD_ROWS, changes_path, window=(after.value, to.value),
                          in_driver=True)
    if known is not None:
        _check_known(cfg, source, written, known)
    meta = CommitMeta(STAGE_DECODE, end, {"after_lsn": str(after)}).json()
    if not silver_write.commit(changes_path, written, app_id=None, version=None, user_metadata=meta,
                               properties=contracts.SILVER_PROPERTIES, overwrite=first):
        raise Declined(f"{changes_path} is not a silver-shaped table")
    rows = sum(int(f["rows"]) for f in written)
    log.info("replay %s: re-decoded %d change(s) of %d bronze file(s) up to %s in this process", source, rows,
             len(files), end)
    return rows


def _check_known(cfg: Config, source: str, written: Sequence[Mapping[str, Any]],
                 known: set[tuple[str, str]]) -> None:
    """Declined when the re-decoded files hold changes of a synced table outside `known` (a replay of every table
    rebuilds it from its first archived change: Spark's). Each file holds one table's changes (`silver_write`)."""
    from slotlake.merge.silver_stats import SilverFileStats

    src = cfg.source(source)
    for f in written:
        stats = json.loads(f["stats"])
        only = SilverFileStats(stats["minValues"].get("schema_name"), stats["maxValues"].get("schema_name"),
                               stats["minValues"].get("table_name"), stats["maxValues"].get("table_name"),
                               None, None).only_table()
        if only is None:
            raise Declined("a re-decoded file's table cannot be told from its statistics")
        if (only.schema, only.name) not in known and src.syncs(str(only)):
            raise Declined(f"{only} has changes but no recorded state")


def _ddl_between(paths: LakePaths, mark: Lsn, upto: Lsn) -> bool:
    """Whether `_ddl_log` holds an event of a commit in (mark, upto] (True when it cannot be read here)."""
    import pyarrow.dataset as ds

    if not delta_log.is_delta_table(paths.ddl_log):
        return False
    try:
        rows = delta_log.delta_rs_table(paths.ddl_log).to_pyarrow_dataset().to_table(
            columns=["commit_lsn"],
            filter=(ds.field("commit_end_lsn") > int(mark)) & (ds.field("commit_lsn") <= int(upto)))
    except Exception:  # any reason: the Spark replay reads it
        return True
    return rows.num_rows > 0
