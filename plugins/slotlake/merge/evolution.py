"""Schema evolution of a gold table: pure decisions over the column layouts one merge run meets.

A run's silver rows of one table may carry several layouts (each change is decoded with the Relation in force at
its LSN). Starting from the gold table's columns as of its watermark, the layouts are walked in commit order and
every gold column is followed by identity: a name kept is the same column; a rename known from a DDL event (same
attnum, new name) moves the gold column with its data; a name that disappears is a dropped column (kept in gold,
NULL from then on, or dropped with `on_drop_column: drop`); a new name is an added column. Without DDL events a
rename cannot be seen: it becomes a drop plus an add (and the run says so).

Types are Spark SQL type text, as `decode.types.gold_type` gives them and `DataType.simpleString()` prints them.
The result (`Evolution`) says which Delta DDL the gold table needs before the merge (add, rename, widen, drop) and,
per layout, where each gold column's value comes from. `constant_default` turns a PostgreSQL default expression
into the text value PostgreSQL gave the existing rows, when it is a constant.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slotlake.contracts import type_tree
from slotlake.decode.types import DECIMAL, NUMERIC, STRING, NumericTypmod, gold_type
from slotlake.errors import MergeError
from slotlake.merge.plan import TableShape

if TYPE_CHECKING:
    from slotlake.source.ddl import TableDef


@dataclass(frozen=True)
class ColumnHistoryEvent:
    """What DDL events say about one column change: a rename (same attnum, new name) or an add with its default."""

    commit_lsn: int
    kind: str  # rename | add | seen (a column in the first definition known of the table: maybe just added)
    name: str  # the new name (rename) or the added column's name
    old_name: str | None = None  # rename only
    default: str | None = None  # add only: pg_get_expr of the default, None when there is none


@dataclass(frozen=True)
class AddedColumn:
    name: str
    dtype: str  # Spark SQL type text
    existing_rows: str | None  # text value PostgreSQL gave the rows that existed at the ADD (None: NULL)
    note: str | None  # what slotlake could not see about the existing rows' value, for the run report


@dataclass(frozen=True)
class Evolution:
    """How one run evolves a gold table, and how each layout's values map onto the gold columns."""

    columns: tuple[str, ...]  # gold source columns after the run, in gold order
    types: tuple[str, ...]  # Spark SQL type text
    adds: tuple[AddedColumn, ...]
    renames: tuple[tuple[str, str], ...]  # (old, new), in order
    widen: tuple[tuple[str, str], ...]  # gold column (final name) -> its new, wider type
    drops: tuple[str, ...]  # gold columns dropped with their data (on_drop_column: drop)
    dropped_kept: tuple[str, ...]  # columns the source dropped in this run, kept in gold (NULL from then on)
    # per layout: per gold column, the position in that layout's columns, or None (value: `fill`)
    positions: tuple[tuple[int | None, ...], ...]
    # per layout: per gold column, the text value used when the layout lacks the column (None: NULL)
    fills: tuple[tuple[str | None, ...], ...]
    notes: tuple[str, ...]

    @property
    def changes_schema(self) -> bool:
        return bool(self.adds or self.renames or self.widen or self.drops)


_INTEGRAL: dict[str, int] = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}
_DIGITS = {1: 3, 2: 5, 3: 10, 4: 20}  # decimal digits of the largest value of each integral type


def _decimal(t: str) -> tuple[int, int] | None:
    tree = type_tree(t)
    return (tree[1], tree[2]) if tree[0] == "decimal" else None


def holds(wide: str, narrow: str) -> bool:
    """True when every value of `narrow` fits `wide` exactly (so a narrower source type keeps the gold type)."""
    if wide == narrow:
        return True
    if wide in _INTEGRAL and narrow in _INTEGRAL:
        return _INTEGRAL[wide] >= _INTEGRAL[narrow]
    if wide == "double" and narrow in ("float", "tinyint", "smallint", "int"):
        return True
    w = _decimal(wide)
    if w is None:
        return False
    n = _decimal(narrow)
    if n is not None:
        return w[1] >= n[1] and w[0] - w[1] >= n[0] - n[1]
    if narrow in _INTEGRAL:
        return w[0] - w[1] >= _DIGITS[_INTEGRAL[narrow]]
    return False


_NUMBER = re.compile(r"^\(?(-?\d+(\.\d+)?([eE][-+]?\d+)?)\)?(::[a-z0-9_ .\"()]+)?$")
_QUOTED = re.compile(r"^'((?:[^']|'')*)'(::[a-z0-9_ .\"()\[\]]+)*$", re.IGNORECASE)


def constant_default(expr: str | None) -> tuple[bool, str | None]:
    """(is a constant, its text value) for a default expression as pg_get_expr prints it.

    `'x'::text` -> (True, "x"); `0` -> (True, "0"); `NULL::integer` or no default -> (True, None);
    `now()`, `nextval('s'::regclass)`, `(1 + 2)` -> (False, None): not evaluated here. PostgreSQL fills existing
    rows with a constant default without a table rewrite; a volatile one rewrites the table, and pgoutput does not
    stream rewrites, so slotlake cannot see those values either way.
    """
    if expr is None:
        return True, None
    e = expr.strip()
    if re.fullmatch(r"(?i)null(::[a-z0-9_ .\"()\[\]]+)?", e):
        return True, None
    if re.fullmatch(r"(?i)(true|false)", e):
        return True, e.lower()
    m = _NUMBER.match(e)
    if m:
        return True, m.group(1)
    m = _QUOTED.match(e)
    if m:
        return True, m.group(1).replace("''", "'")
    return False, None


def _renames_between(prev: dict[str, int], names: Sequence[str], events: Iterable[ColumnHistoryEvent],
                     after: int, upto: int) -> list[tuple[str, str]]:
    """Renames from DDL events in (after, upto] that turn `prev` names into `names` (old gone, new present)."""
    out = []
    for ev in events:
        if ev.kind != "rename" or not (after < ev.commit_lsn <= upto):
            continue
        if ev.old_name in prev and ev.old_name not in names and ev.name in names and ev.name not in prev:
            out.append((ev.old_name, ev.name))
    return out


def plan_evolution(table: str, start: Sequence[tuple[str, str]] | None,
                   layouts: Sequence[tuple[int, TableShape]], events: Sequence[ColumnHistoryEvent], *,
                   mark: int, on_drop_column: str = "keep", ddl_capture: bool = True,
                   unconstrained_numeric: Callable[[str], str] = lambda column: DECIMAL) -> Evolution:
    """Follow the gold columns through `layouts` ((first commit LSN, shape), in commit order).

    `unconstrained_numeric(name)`: the numeric.unconstrained setting of the column called `name` in a layout.
    `start`: the gold table's (name, type) as of its watermark `mark`, or None when there is no gold table (it is
    then created with the first layout's columns). `events`: renames and adds known from DDL events (sorted by
    commit LSN). Raises MergeError for a type change Delta cannot follow, or a key / replica identity change.
    """
    if not layouts:
        raise MergeError(f"{table}: no column layout to plan")
    cols: list[str] = []
    types: list[str] = []
    live: dict[str, int] = {}  # live source column name -> gold index
    if start is None:
        first = layouts[0][1]
        for n, o, m in zip(first.columns, first.type_oids, first.typmods):
            live[n] = len(cols)
            cols.append(n)
            types.append(gold_type(o, m, unconstrained_numeric(n)))
    else:
        for n, t in start:
            live[n] = len(cols)
            cols.append(n)
            types.append(t)
    start_types = list(types)
    renames: list[tuple[str, str]] = []
    added_at: dict[int, int] = {}  # gold index -> layout index it first appears in
    dropped: dict[int, int] = {}  # gold index -> layout index it is first missing from
    layout_pos: list[dict[int, int]] = []
    prev_lsn = mark
    by_add: dict[str, ColumnHistoryEvent] = {}
    for ev in sorted(events, key=lambda e: (e.commit_lsn, e.kind != "add")):
        if ev.kind in ("add", "seen") and ev.commit_lsn > mark:
            by_add.setdefault(ev.name, ev)
    for k, (lsn, shape) in enumerate(layouts):
        names = list(shape.columns)
        for old, new in _renames_between(live, names, events, prev_lsn, lsn):
            gi = live.pop(old)
            live[new] = gi
            renames.append((cols[gi], new))
            cols[gi] = new
        pos: dict[int, int] = {}
        for p, (n, o, m) in enumerate(zip(names, shape.type_oids, shape.typmods)):
            t = gold_type(o, m, unconstrained_numeric(n))
            if n in live:
                gi = live[n]
            elif n in cols:  # a name that was dropped earlier comes back: the same gold column again
                gi = cols.index(n)
                dropped.pop(gi, None)
            else:
                gi = len(cols)
                cols.append(n)
                types.append(t)
                added_at[gi] = k
            pos[gi] = p
            if types[gi] != t and not holds(types[gi], t):
                if not holds(t, types[gi]) and o == NUMERIC and NumericTypmod.of(m).precision is None:
                    mode = unconstrained_numeric(n)
                    raise MergeError(
                        f"{table}: column {n} (numeric without precision) is {types[gi]} in gold, but "
                        f"numeric.unconstrained: {mode} maps it to {t}; an existing gold column keeps "
                        "its type (converting it in place cannot be exact: decimal(38,18) holds NULL where a value did "
                        "not fit); set it back to "
                        f"{STRING if mode == DECIMAL else DECIMAL} for this column, or rebuild the table with the new "
                        "mapping: `slotlake resync <source>`")
                if not holds(t, types[gi]):
                    raise MergeError(
                        f"{table}: column {n} changed type from {types[gi]} to {t} "
                        f"(at LSN {_lsn(lsn)}), which Delta type widening cannot follow; rebuild the table: "
                        "`slotlake resync <source>` (a new initial copy), or replay it into a new Delta table with "
                        f"`slotlake replay <source> --table {table} --from {_lsn(lsn)} --to <LSN> --dest <path>`")
                types[gi] = t
        for gi in list(live.values()):
            if gi not in pos:
                dropped.setdefault(gi, k)
        live = {cols[gi]: gi for gi in pos}
        layout_pos.append(pos)
        prev_lsn = lsn
    shapes = [s for _, s in layouts]
    ri = {s.replica_identity for s in shapes}
    if len(ri) > 1:
        raise MergeError(f"{table}: the replica identity changes within one run ({sorted(ri)}); run the merge up to "
                         "the change first, or resync the table (`slotlake resync <source>`)")
    key_ids = {tuple(sorted(next(gi for gi, p in layout_pos[k].items() if shapes[k].columns[p] == c)
                            for c in s.key_columns)) for k, s in enumerate(shapes)}
    if len(key_ids) > 1 and shapes[0].replica_identity in ("d", "i"):
        raise MergeError(f"{table}: the replica identity key changes within one run "
                         f"({[list(s.key_columns) for s in shapes]}); "
                         "resync the table (`slotlake resync <source>`)")
    notes: list[str] = []
    adds: list[AddedColumn] = []
    fills: list[list[str | None]] = [[None] * len(cols) for _ in layouts]
    for gi, k in sorted(added_at.items()):
        name = cols[gi]
        existing: str | None = None
        note = None
        added = by_add.get(name)
        if added is not None:
            const, value = constant_default(added.default)
            if const:
                existing = value
            else:
                note = (f"{table}.{name} was added with the non-constant default {added.default}: PostgreSQL rewrote "
                        "the table with a value per row, which logical decoding does not stream; rows that existed "
                        "then have NULL in gold; resync the table for the real values")
        elif not ddl_capture:
            note = (f"{table}.{name} was added (seen only through pgoutput Relation messages): rows that existed "
                    "then have NULL in gold, but may hold a default slotlake could not see; install DDL capture "
                    "(sql/ddl_capture.sql) or resync the table")
        if start is None and k == 0:
            continue  # part of the table's first definition, not an added column
        adds.append(AddedColumn(name, types[gi], existing, note))
        if note:
            notes.append(note)
        for j in range(k):  # changes before the ADD: the row gets what PostgreSQL gave existing rows
            fills[j][gi] = existing
    kept = tuple(cols[gi] for gi in sorted(dropped))
    drops: tuple[str, ...] = ()
    if on_drop_column == "drop":
        drops = kept
        kept = ()
    if not ddl_capture and renames == [] and added_at and dropped:
        notes.append(f"{table}: column(s) {[cols[g] for g in sorted(dropped)]} disappeared and "
                     f"{[cols[g] for g in sorted(added_at)]} appeared without DDL capture: a rename looks like a "
                     "drop plus an add (the old column keeps its data, the new one starts empty)")
    widen = tuple((cols[gi], types[gi]) for gi in range(len(start_types)) if types[gi] != start_types[gi])
    positions = tuple(tuple(pos.get(gi) for gi in range(len(cols))) for pos in layout_pos)
    keep = [gi for gi in range(len(cols)) if cols[gi] not in drops]
    return Evolution(
        columns=tuple(cols[g] for g in keep), types=tuple(types[g] for g in keep), adds=tuple(adds),
        renames=tuple(renames), widen=widen, drops=drops, dropped_kept=kept,
        positions=tuple(tuple(p[g] for g in keep) for p in positions),
        fills=tuple(tuple(f[g] for g in keep) for f in fills), notes=tuple(notes))


def _lsn(value: int) -> str:
    from slotlake.lsn import Lsn

    return str(Lsn(value))


def column_events(definitions: Sequence[tuple[int, TableDef]], schema: str, table: str) -> list[ColumnHistoryEvent]:
    """Renames and adds of `schema.table` from its full definitions over time ((commit LSN, TableDef): the bootstrap
    read and the DDL events), told apart by attnum: same attnum with a new name is a rename, a new attnum an add."""
    oids = {d.oid for _, d in definitions if d.schema == schema and d.name == table}
    out: list[ColumnHistoryEvent] = []
    for oid in oids:
        prev = None
        for lsn, d in sorted(((at, d) for at, d in definitions if d.oid == oid), key=lambda x: x[0]):
            if prev is None:  # no earlier definition to compare with: what it says of each column
                out += [ColumnHistoryEvent(lsn, "seen", c.name, default=c.default) for c in d.replicated_columns]
            else:
                before = {c.attnum: c for c in prev.replicated_columns}
                for c in d.replicated_columns:
                    old = before.get(c.attnum)
                    if old is None:
                        out.append(ColumnHistoryEvent(lsn, "add", c.name, default=c.default))
                    elif old.name != c.name:
                        out.append(ColumnHistoryEvent(lsn, "rename", c.name, old_name=old.name))
            prev = d
    out.sort(key=lambda e: e.commit_lsn)
    return out
