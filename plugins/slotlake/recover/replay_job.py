"""The replay Spark work (see slotlake.recover.replay for the semantics): resolve X/Y, re-decode, rebuild.

    X, Y ──(timestamps: last silver commit before them)──▶ LSNs
    per table: base R = greatest recorded end LSN <= X (`_runs`, and the gold table's own slotlake commits)
    bronze ──decode_range (R_min, Y]──▶ scratch silver ──┬─ --dest: gold@R (time travel) + merge(R, Y] ──▶ dest
                                                         └─ in place: silver (R_min, Y] replaced (replaceWhere),
                                                            gold@R + merge(R, silver end] ──▶ gold (overwrite)
Scratch tables live under `<lake>/<source>/_replay/<run id>/` and are removed afterwards.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from slotlake import delta_log
from slotlake.bronze import covered_lsn, max_archived_end
from slotlake.config import Config
from slotlake.contracts import STAGE_MERGE, CommitMeta
from slotlake.decode.job import decode_range, decode_watermark
from slotlake.errors import SlotlakeError
from slotlake.lake import LakePaths, table_dir
from slotlake.lsn import Lsn
from slotlake.merge.plan import COLUMN_MAPPING, needs_column_mapping, watermark_of
from slotlake.merge.watermarks import row_count, runs_ends
from slotlake.names import TableName
from slotlake.recover.replay import Point, ReplayRequest, format_point

log = logging.getLogger(__name__)

RecordedRuns = dict[tuple[str, str], list[tuple[Lsn, int]]]
"""`_runs`'s (end LSN, gold version) pairs per (schema, table): `recorded_runs`."""


class ReplayError(SlotlakeError):
    """A replay cannot run as asked (nothing archived in range, unknown table, ...)."""


@dataclass(frozen=True)
class TableReplay:
    schema_name: str
    table_name: str
    base_lsn: Lsn | None  # the recorded end LSN the rebuild started from (None: empty table)
    base_version: int | None  # the gold Delta version read by time travel
    target: str  # the Delta table written
    rows: int  # rows in the result


@dataclass(frozen=True)
class ReplayResult:
    source: str
    from_lsn: Lsn
    to_lsn: Lsn
    changes_redecoded: int
    in_place: bool
    tables: tuple[TableReplay, ...]

    def summary(self) -> str:
        where = "in place" if self.in_place else "into " + ", ".join(t.target for t in self.tables)
        return (f"replay {self.source}: ({self.from_lsn}, {self.to_lsn}] re-decoded {self.changes_redecoded} "
                f"change(s); rebuilt {len(self.tables)} table(s) {where}")


# ---- resolving X and Y -------------------------------------------------------------------------------------

def resolve(spark, changes_path: str, point: Point) -> Lsn:
    """An LSN as is; a moment T -> the greatest commit LSN in silver with commit_ts < T.

    With no commit before T, the LSN just before silver's first commit: the state before any decoded change
    (the initial copy, when the slot was created with one). Commit timestamps follow commit order closely but
    not strictly; LSN order is what a replay applies.
    """
    from pyspark.sql import functions as F

    if isinstance(point, Lsn):
        return point
    naive_utc = point.replace(tzinfo=None)  # the session time zone is UTC (slotlake.spark.session)
    got = (spark.read.format("delta").load(changes_path)
           .agg(F.max(F.when(F.col("commit_ts") < F.lit(naive_utc), F.col("commit_lsn"))), F.min("commit_lsn"))
           .collect()[0])
    if got[0] is not None:
        return Lsn(got[0])
    return Lsn(max(got[1] - 1, 0)) if got[1] is not None else Lsn(0)


# ---- bases: the state a rebuild starts from ----------------------------------------------------------------

def recorded_runs(spark, runs_path: str,
                  table: tuple[str, str] | None = None) -> RecordedRuns:
    """`_runs`'s (end LSN, gold version) pairs per table (of `table` only, when given), in ONE read of `_runs`:
    every run adds a file to it (a year of hourly runs: 8,760), so a read per table multiplied that."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    read = runs_ends(runs_path)  # delta-rs, without a Spark job
    if read is not None:
        return read if table is None else {k: v for k, v in read.items() if k == table}
    out: RecordedRuns = {}
    if not DeltaTable.isDeltaTable(spark, runs_path):
        return out
    df = spark.read.format("delta").load(runs_path)
    if table is not None:
        df = df.where((F.col("schema_name") == table[0]) & (F.col("table_name") == table[1]))
    for r in df.select("schema_name", "table_name", "run_end_lsn", "gold_version").collect():
        out.setdefault((r["schema_name"], r["table_name"]), []).append((Lsn(r["run_end_lsn"]), r["gold_version"]))
    return out


def recorded_ends(spark, runs: RecordedRuns, gold_path: str, schema: str,
                  table: str) -> list[tuple[Lsn, int]]:
    """(end LSN, gold Delta version) pairs at which the table's state is known: its `_runs` rows (`runs`, from
    `recorded_runs`) and the gold table's own slotlake commits (merges, and the initial-copy load that `_runs`
    does not list)."""
    from delta.tables import DeltaTable

    out: dict = {}
    if delta_log.readable(gold_path):  # the JSON commits, without a Spark job (what Delta's history lists)
        if not delta_log.is_delta_table(gold_path):
            return []
        history = [(c.version, c.meta.end_lsn if c.meta else None, c.operation)
                   for c in delta_log.commits(gold_path)]
    else:
        if not DeltaTable.isDeltaTable(spark, gold_path):
            return []
        history = [(h["version"], watermark_of(h["userMetadata"]), h["operation"]) for h in
                   DeltaTable.forPath(spark, gold_path).history().select("version", "userMetadata",
                                                                         "operation").collect()]
    for version, end, operation in history:
        if end is not None and operation != "RESTORE":
            out[(end, version)] = None
    live = {h[0] for h in history}
    for end, version in runs.get((schema, table), []):
        if version in live:  # a version VACUUM/log cleanup removed cannot be read back
            out[(end, version)] = None
    return sorted(out, key=lambda p: (p[0], p[1]))


def base_at(ends: list[tuple[Lsn, int]], lsn: Lsn) -> tuple[Lsn, int] | None:
    """The latest (end, version) with end <= lsn, else None. Pure."""
    best = None
    for end, version in ends:
        if end <= lsn and (best is None or (end, version) > best):
            best = (end, version)
    return best


# ---- the run -----------------------------------------------------------------------------------------------

def _delete_path(spark, path: str) -> None:
    """Remove a folder on any Hadoop filesystem (local, s3a, abfs): scratch tables and replaced --dest tables."""
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(p, True)


def replay_meta(end: Lsn, stage: str, req: ReplayRequest, frm: Lsn, to: Lsn) -> str:
    """A replay's commit metadata: the stage's watermark `end`, and the range replayed (resolved and as asked)."""
    return CommitMeta(stage, end, {"replay": {"from": str(frm), "to": str(to),
                                              "asked": [format_point(req.from_), format_point(req.to)]}}).json()


def tables_to_rebuild(spark, cfg: Config, req: ReplayRequest, scratch_changes: str | None,
                      runs: RecordedRuns) -> list[tuple[str, str]]:
    """The tables to rebuild: those asked, else the config's list, else those `_runs` names and those with changes
    in `scratch_changes` (None: before the re-decode, `_runs`'s alone)."""
    if req.tables:
        return list(req.tables)
    src = cfg.source(req.source)
    if src.listed_tables:
        return [TableName.parse(t) for t in src.listed_tables]
    names = set(runs)
    if scratch_changes is not None:
        names |= {(r[0], r[1]) for r in spark.read.format("delta").load(scratch_changes)
                  .select("schema_name", "table_name").distinct().collect()}
    return sorted(n for n in names if src.syncs(f"{n[0]}.{n[1]}"))


def build_states(spark, cfg: Config, source: str, bases: dict[tuple[str, str], tuple[Lsn, int] | None],
                 gold_of: Callable[[str, str], str], target_of: Callable[[str, str], str], silver: str,
                 end: Lsn) -> None:
    """Each table's `target_of(s, t)` := its gold (`gold_of(s, t)`) as of its base (time travel; nothing when None)
    + the changes of `silver` up to `end`. The bases are copied first, then one merge runs over every table
    (tables merge concurrently there, as in a sync)."""
    from slotlake.merge.job import run_merge

    for name, base in sorted(bases.items()):  # (two at a time measured no faster on 2 cores: bench/README.md)
        target = target_of(*name)
        _delete_path(spark, target)  # a new table: no data and no idempotent-write ids of an earlier run
        if base is None:
            continue
        state = spark.read.format("delta").option("versionAsOf", base[1]).load(gold_of(*name))
        writer = (state.write.format("delta").mode("overwrite")
                  .option("userMetadata", CommitMeta(STAGE_MERGE, base[0]).json()))
        if needs_column_mapping(state.columns):
            writer = writer.option(COLUMN_MAPPING, "name")
        writer.save(target)
    if bases:
        run_merge(spark, cfg, source, [TableName(s, t) for s, t in sorted(bases)], silver_path=silver,
                  gold_path_for=target_of, end_lsn=end)


def check_range(req: ReplayRequest, paths: LakePaths, frm: Lsn, to: Lsn, silver_end: Lsn) -> None:
    """ReplayError unless (frm, to] is a range this replay can rebuild: in order, archived in bronze, and (in place)
    decoded in silver."""
    source = req.source
    # Bronze covers every commit up to `covered`: its last file's end, or further where an extract found
    # nothing more and recorded how far it looked (a coverage marker).
    covered = covered_lsn(paths.root)
    if frm > to:
        raise ReplayError(f"replay {source}: --from resolves to {frm}, after --to ({to})")
    if covered is None or to > covered:
        raise ReplayError(f"replay {source}: --to {format_point(req.to)} ({to}) is past what bronze holds "
                          f"({covered}); run `slotlake sync {source}` first or choose an earlier --to")
    if req.dest is None and to > silver_end and silver_end != max_archived_end(paths.root):
        # (silver at bronze's last file: every commit up to `covered` is decoded)
        raise ReplayError(f"replay {source}: --to {to} is past silver ({silver_end}); decode first (slotlake sync)")


def run_replay(spark, cfg: Config, req: ReplayRequest) -> ReplayResult:
    """Replay `req` (see slotlake.recover.replay). Raises ReplayError when the range is not archived/decoded."""
    from delta.tables import DeltaTable

    started = time.monotonic()
    source = req.source
    cfg.source(source)
    paths = LakePaths.of(cfg.lake, source)
    silver_end = decode_watermark(spark, paths.changes, source)
    if silver_end is None:
        raise ReplayError(f"replay {source}: nothing is decoded yet ({paths.changes}); run `slotlake sync {source}`")
    frm, to = resolve(spark, paths.changes, req.from_), resolve(spark, paths.changes, req.to)
    check_range(req, paths, frm, to, silver_end)
    scratch = paths.scratch("replay")
    scratch_changes = f"{scratch}/changes"
    every = not req.tables and not cfg.source(source).tables
    try:
        runs = recorded_runs(spark, paths.runs)  # every table's recorded ends, in one read of `_runs`
        names = tables_to_rebuild(spark, cfg, req, None, runs)
        bases = {(s, t): base_at(recorded_ends(spark, runs, paths.gold(s, t), s, t), frm) for s, t in names}
        # Re-decode from the earliest base (from the start of bronze if a table has none).
        after = min((b[0] for b in bases.values() if b), default=None) if all(bases.values()) else None
        decoded = decode_range(spark, cfg, source, after, to, scratch_changes)
        if every:
            extra = [n for n in tables_to_rebuild(spark, cfg, req, scratch_changes, runs) if n not in bases]
            if extra:  # tables no run recorded yet: built from the first archived change
                bases.update({n: None for n in extra})
                if after is not None:
                    after = None
                    decoded = decode_range(spark, cfg, source, None, to, scratch_changes)
        results = []
        if req.dest is not None:
            dest = req.dest
            build_states(spark, cfg, source, bases, paths.gold, lambda s, t: table_dir(dest, s, t), scratch_changes,
                         to)
            results = [_result(spark, s, t, base, table_dir(dest, s, t)) for (s, t), base in sorted(bases.items())]
        else:
            _replace_silver(spark, scratch_changes, paths.changes, after, to, silver_end, req, frm)
            build_states(spark, cfg, source, bases, paths.gold, lambda s, t: table_dir(f"{scratch}/gold", s, t),
                         paths.changes, silver_end)
            for (s, t), base in sorted(bases.items()):
                gold = paths.gold(s, t)
                rebuilt = table_dir(f"{scratch}/gold", s, t)
                df = spark.read.format("delta").load(rebuilt) if DeltaTable.isDeltaTable(spark, rebuilt) else None
                if df is None:
                    continue  # no state and no change: nothing to write
                (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                 .option("userMetadata", replay_meta(silver_end, "merge", req, frm, to)).save(gold))
                results.append(_result(spark, s, t, base, gold))
    finally:
        _delete_path(spark, scratch)
    result = ReplayResult(source=source, from_lsn=frm, to_lsn=to, changes_redecoded=decoded.changes_written,
                          in_place=req.dest is None, tables=tuple(results))
    log.info("%s (%.1fs)", result.summary(), time.monotonic() - started)
    return result


def _replace_silver(spark, scratch_changes: str, changes: str, after: Lsn | None, to: Lsn, silver_end: Lsn,
                    req: ReplayRequest, frm: Lsn) -> None:
    """Silver's rows with after < commit_end_lsn, commit_lsn <= to := the re-decoded ones, in one commit; the watermark
    stays."""
    from slotlake.decode.job import SILVER_COLUMNS

    cond = f"commit_lsn <= {int(to)}" + (f" AND commit_end_lsn > {int(after)}" if after is not None else "")
    (spark.read.format("delta").load(scratch_changes).select(*SILVER_COLUMNS)
     .write.format("delta").mode("overwrite").option("replaceWhere", cond)
     .option("userMetadata", replay_meta(silver_end, "decode", req, frm, to)).save(changes))


def _result(spark, s: str, t: str, base: tuple[Lsn, int] | None, target: str) -> TableReplay:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, target):
        return TableReplay(s, t, base[0] if base else None, base[1] if base else None, target, 0)
    rows = row_count(target)  # the files' statistics, without a Spark job
    if rows is None:
        rows = spark.read.format("delta").load(target).count()
    return TableReplay(s, t, base[0] if base else None, base[1] if base else None, target, rows)

