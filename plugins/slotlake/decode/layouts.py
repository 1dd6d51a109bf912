"""Each silver file's layout summary (pure logic): what the merge's first pass over a table's batch counts, per
column layout of the file's changes, computed by the decode's task as it writes the file.

The merge begins every table with one Spark pass over the table's silver rows in its window (`merge/job.py`): per
column layout (the relation's schema, name, columns, type OIDs, typmods, key columns and replica identity; none for
TRUNCATE rows) the number of changes, the first and last change (commit_lsn, seq), the TRUNCATEs, the plain inserts,
the changes with unchanged TOAST values and the newest commit time. The task that writes a silver file holds those
rows as Arrow arrays already, so it counts them there (a few vectorised passes per row group) and writes the result
into the file's footer (`META_LAYOUTS`). Every count is a sum, minimum or maximum, so the summaries of the files
that lie wholly inside a merge's window add up to the pass's answer, and the merge reads footers instead of silver.
A file without a summary (written by Spark's writer, or before) leaves that table to the Spark pass.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

META_LAYOUTS = "slotlake.layouts"
"""Footer key of a silver file's layout summary (`LayoutSummary.json`)."""
VERSION = 1

SHAPE_FIELDS = ("schema_name", "table_name", "columns", "type_oids", "typmods", "key_columns", "replica_identity")
"""A column layout's silver columns, in the order of the merge's `shape_col()` struct."""

Shape = tuple  # SHAPE_FIELDS' values, lists as tuples; None for TRUNCATE rows
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class LayoutGroup:
    """One column layout's changes (`shape` None: the TRUNCATE rows). `lo`/`hi`: the first and last change as
    (commit_lsn, seq); `last_ts_us`: the newest commit time, microseconds since the Unix epoch."""

    shape: Shape | None
    n: int
    lo: tuple[int, int] | None
    hi: tuple[int, int] | None
    truncs: int
    plain: int  # inserts without unchanged TOAST values
    toast: int  # changes with unchanged TOAST values
    last_ts_us: int | None
    ud: int  # updates and deletes
    old_updates: int  # updates with an old tuple (the only ones that can change a key)

    @property
    def shape_map(self) -> dict[str, Any] | None:
        return None if self.shape is None else dict(zip(SHAPE_FIELDS, self.shape, strict=True))

    @property
    def last_ts(self) -> dt.datetime | None:
        return None if self.last_ts_us is None else _EPOCH + dt.timedelta(microseconds=self.last_ts_us)

    def plus(self, other: LayoutGroup) -> LayoutGroup:
        def pick(a, b, f):
            return b if a is None else a if b is None else f(a, b)

        return LayoutGroup(self.shape, self.n + other.n, pick(self.lo, other.lo, min), pick(self.hi, other.hi, max),
                           self.truncs + other.truncs, self.plain + other.plain, self.toast + other.toast,
                           pick(self.last_ts_us, other.last_ts_us, max), self.ud + other.ud,
                           self.old_updates + other.old_updates)


def shape_of(values: Iterable[Any]) -> Shape:
    """A layout's `SHAPE_FIELDS` values (lists, as Arrow, JSON and Spark give them) as a hashable Shape."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in values)


def micros(ts: dt.datetime) -> int:
    """An aware time stamp as microseconds since the Unix epoch (`LayoutGroup.last_ts_us`)."""
    return (ts - _EPOCH) // dt.timedelta(microseconds=1)


def _add_up(into: dict[Shape | None, LayoutGroup], groups: Iterable[LayoutGroup]) -> None:
    for g in groups:
        into[g.shape] = into[g.shape].plus(g) if g.shape in into else g


def combine(groups: Iterable[LayoutGroup]) -> list[LayoutGroup]:
    """Groups of the same layout added up (several files' summaries: one group per layout)."""
    out: dict[Shape | None, LayoutGroup] = {}
    _add_up(out, groups)
    return list(out.values())


@dataclass(frozen=True)
class LayoutSummary:
    groups: tuple[LayoutGroup, ...]

    def json(self) -> str:
        return json.dumps({"v": VERSION, "groups": [
            {"shape": None if g.shape is None else [list(x) if isinstance(x, tuple) else x for x in g.shape],
             "n": g.n, "lo": g.lo, "hi": g.hi, "truncs": g.truncs, "plain": g.plain, "toast": g.toast,
             "last_ts_us": g.last_ts_us, "ud": g.ud, "old_u": g.old_updates} for g in self.groups]},
            separators=(",", ":"))

    @staticmethod
    def parse(text: bytes | str | None) -> LayoutSummary | None:
        """The summary of a footer value; None for none, another version, or anything unreadable (the merge then
        asks Spark)."""
        if not text:
            return None
        try:
            d = json.loads(text)
            if d.get("v") != VERSION:
                return None
            return LayoutSummary(tuple(LayoutGroup(
                None if g["shape"] is None else shape_of(g["shape"]),
                int(g["n"]), tuple(g["lo"]) if g["lo"] is not None else None,
                tuple(g["hi"]) if g["hi"] is not None else None, int(g["truncs"]), int(g["plain"]),
                int(g["toast"]), g["last_ts_us"], int(g["ud"]), int(g["old_u"])) for g in d["groups"]))
        except (ValueError, KeyError, TypeError):
            return None


def read_layout_summary(metadata: Mapping[bytes, bytes] | None) -> LayoutSummary | None:
    """The layout summary of a Parquet file's key-value metadata."""
    return LayoutSummary.parse((metadata or {}).get(META_LAYOUTS.encode()))


class LayoutScan:
    """Counts a silver file's changes per column layout as its row groups are written (`add`); `summary()` is
    None when a batch could not be counted (the file is then left to the merge's Spark pass, never failed)."""

    def __init__(self) -> None:
        self._groups: dict[Shape | None, LayoutGroup] = {}
        self._failed = False

    def add(self, table: Any) -> None:
        if self._failed or not table.num_rows:
            return
        try:
            _add_up(self._groups, _count(table))
        except Exception:  # noqa: BLE001 - a summary is an optimisation: without it the merge asks Spark
            self._failed = True

    def summary(self) -> LayoutSummary | None:
        return None if self._failed else LayoutSummary(tuple(self._groups.values()))


def _count(table: Any) -> list[LayoutGroup]:
    """The groups of one Arrow table of silver rows (usually one layout and no TRUNCATE: one vectorised pass)."""
    import numpy as np
    import pyarrow.compute as pc

    op = table.column("op").combine_chunks()
    is_t = pc.fill_null(pc.equal(op, "T"), False)
    ntrunc = pc.sum(is_t).as_py() or 0
    out: list[LayoutGroup] = []
    if ntrunc:
        trunc = table.filter(is_t)
        out.append(LayoutGroup(None, trunc.num_rows, *_span(trunc), trunc.num_rows, 0, 0, _max_ts(trunc), 0, 0))
        table = table.filter(pc.invert(is_t))
        if not table.num_rows:
            return out
    shape_cols = [table.column(f).combine_chunks() for f in SHAPE_FIELDS]
    if all(_uniform(c) for c in shape_cols):
        first = shape_of(c[0].as_py() for c in shape_cols)
        out.append(_group(first, table))
        return out
    # Several layouts in one file (a schema change inside it): rare, counted row by row.
    keys = [shape_of(row) for row in zip(*[c.to_pylist() for c in shape_cols], strict=True)]
    index: dict[Shape, list[int]] = {}
    for i, k in enumerate(keys):
        index.setdefault(k, []).append(i)
    for k, rows in index.items():
        out.append(_group(k, table.take(np.asarray(rows, dtype=np.int64))))
    return out


def _uniform(col: Any) -> bool:
    """Whether every row of an Arrow array (scalar or list) holds the same value (NULL included)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(col)
    if col.null_count:
        return col.null_count == n
    if not pa.types.is_list(col.type):
        return len(pc.unique(col)) == 1
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    width = int(lengths[0])
    if not (lengths == width).all():
        return False
    flat = pc.list_flatten(col)
    if width == 0:
        return True
    first = flat.slice(0, width)
    tiled = first.take(pa.array(np.tile(np.arange(width, dtype=np.int64), n)))
    eq = pc.equal(flat, tiled)
    return eq.null_count == 0 and bool(pc.all(eq).as_py())


def _group(shape: Shape, rows: Any) -> LayoutGroup:
    import pyarrow.compute as pc

    lo, hi = _span(rows)
    unchanged = pc.fill_null(pc.list_value_length(rows.column("unchanged")), 0)
    op_i = pc.fill_null(pc.equal(rows.column("op"), "I"), False)
    plain = int(pc.sum(pc.and_(op_i, pc.less_equal(unchanged, 0))).as_py() or 0)
    toast = int(pc.sum(pc.greater(unchanged, 0)).as_py() or 0)
    op_u = pc.fill_null(pc.equal(rows.column("op"), "U"), False)
    ud = int(pc.sum(pc.or_(op_u, pc.fill_null(pc.equal(rows.column("op"), "D"), False))).as_py() or 0)
    old_updates = int(pc.sum(pc.and_(op_u, pc.is_valid(rows.column("old")))).as_py() or 0)
    return LayoutGroup(shape, rows.num_rows, lo, hi, 0, plain, toast, _max_ts(rows), ud, old_updates)


def _span(rows: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    """The first and last change of `rows` as (commit_lsn, seq)."""
    lsn, seq = rows.column("commit_lsn"), rows.column("seq")
    if lsn.null_count or seq.null_count:
        raise ValueError("a change without commit_lsn or seq")
    lsn_np, seq_np = lsn.to_numpy(), seq.to_numpy()
    lo_lsn, hi_lsn = int(lsn_np.min()), int(lsn_np.max())
    return (lo_lsn, int(seq_np[lsn_np == lo_lsn].min())), (hi_lsn, int(seq_np[lsn_np == hi_lsn].max()))


def _max_ts(rows: Any) -> int | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = rows.column("commit_ts")
    top = pc.max(ts.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())).as_py()
    return None if top is None else int(top)
