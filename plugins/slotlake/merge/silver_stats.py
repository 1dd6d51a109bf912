"""Which tables silver holds changes of in an LSN window, answered from its files' statistics (pure logic).

Every silver file's Delta statistics bound its rows' `schema_name`, `table_name`, `commit_lsn` and `commit_end_lsn`
(contracts.SILVER_STATS_COLUMNS), and the decode writes each table's rows of a batch to files of their own. So the
files' minimum and maximum values tell, without a Spark job, that a table has no change in a merge's window (no file
can hold one) and, in the usual case, which tables have some. A merge run asks before it plans a table: a table
without changes then costs no Spark query at all (a source of 200 tables where 4 changed runs 4 table merges,
not 200). These are the same bounds Delta's own data skipping reads to pick the files of a filtered query, so the
answer "no file" here is the answer Spark's query would give; a file without statistics may hold anything.

Strings: Delta keeps the first 32 characters of a string statistic; a cut maximum gets a tie-breaker character
(U+007F) appended, so it is no longer the value's prefix. A cut bound is compared by its prefix only.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slotlake.names import TableName

_TIE_BREAKER = "\x7f"  # appended by Delta to a cut string maximum


@dataclass(frozen=True)
class SilverFileStats:
    """One silver file's bounds; None where the file has no statistic for the column."""

    schema_min: str | None
    schema_max: str | None
    table_min: str | None
    table_max: str | None
    commit_lsn_min: int | None
    commit_end_lsn_max: int | None
    path: str | None = None  # relative to the table, as the Delta log names it
    commit_lsn_max: int | None = None
    commit_end_lsn_min: int | None = None

    def in_window(self, after: int | None, upto: int) -> bool:
        """Whether the file may hold a change with `commit_end_lsn > after` (None: no lower bound) and
        `commit_lsn <= upto`: the window a merge reads (`merge/job.py`)."""
        if self.commit_lsn_min is not None and self.commit_lsn_min > upto:
            return False
        return after is None or self.commit_end_lsn_max is None or self.commit_end_lsn_max > after

    def inside(self, after: int | None, upto: int) -> bool:
        """Whether every row of the file lies in the window (`in_window`'s), so all of it is read."""
        if self.commit_lsn_max is None or self.commit_lsn_max > upto:
            return False
        return after is None or (self.commit_end_lsn_min is not None and self.commit_end_lsn_min > after)

    def may_hold(self, table: TableName) -> bool:
        """Whether the file may hold rows of `table`."""
        return _within(table.schema, self.schema_min, self.schema_max) and \
            _within(table.name, self.table_min, self.table_max)

    def only_table(self) -> TableName | None:
        """The one table every row of the file belongs to, when the statistics say so exactly (equal, uncut
        bounds); else None."""
        if self.schema_min is None or self.table_min is None:
            return None
        if self.schema_min != self.schema_max or self.table_min != self.table_max:
            return None
        return TableName(self.schema_min, self.table_min)


def _within(value: str, lo: str | None, hi: str | None) -> bool:
    """Whether `value` may lie in [lo, hi] (None: unbounded). A cut minimum is a prefix of the true one, so
    `lo <= value` holds for every value in range; a cut maximum (prefix + tie-breaker) only bounds the prefix."""
    if lo is not None and value < lo:
        return False
    if hi is None:
        return True
    if hi.endswith(_TIE_BREAKER):
        prefix = hi[:-len(_TIE_BREAKER)]
        return value[:len(prefix)] <= prefix
    return value <= hi


def has_changes(files: Iterable[SilverFileStats], table: TableName, after: int | None, upto: int) -> bool:
    """False when no silver file can hold a change of `table` in (after, upto] (see `SilverFileStats.in_window`):
    the table's merge has nothing to do. True means "may have": Spark reads the files to count."""
    return any(f.in_window(after, upto) and f.may_hold(table) for f in files)


def files_to_read(files: Iterable[SilverFileStats], table: TableName, after: int | None, upto: int) -> list[str] | None:
    """The paths of the files that may hold a change of `table` in (after, upto]: the files Delta's data skipping
    picks for the merge's filtered read (the same bounds); None when one has no path."""
    out: list[str] = []
    for f in files:
        if f.in_window(after, upto) and f.may_hold(table):
            if f.path is None:
                return None
            out.append(f.path)
    return out


def tables_in_window(files: Iterable[SilverFileStats], after: int | None, upto: int) -> set[TableName] | None:
    """The tables with files in the window, when every such file names its one table exactly; None when one does
    not (cut names, files of several tables, no statistics): then only a Spark query can say."""
    found: set[TableName] = set()
    for f in files:
        if not f.in_window(after, upto):
            continue
        only = f.only_table()
        if only is None:
            return None
        found.add(only)
    return found


def files_of(files: Iterable[SilverFileStats], table: TableName, after: int | None, upto: int) -> list[str] | None:
    """The paths of the files holding `table`'s changes in (after, upto], when each of them holds that table only
    and lies wholly inside the window (so their layout summaries add up to the window's, decode/layouts.py); None
    when one does not, or has no path."""
    out: list[str] = []
    for f in files:
        if not (f.in_window(after, upto) and f.may_hold(table)):
            continue
        if f.path is None or f.only_table() != table or not f.inside(after, upto):
            return None
        out.append(f.path)
    return out
