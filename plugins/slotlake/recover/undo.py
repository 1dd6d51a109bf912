"""`slotlake undo SOURCE --xid N | --commit-lsn L [--out FILE]`: the SQL that reverts one transaction on the source.

    silver ──(the transaction's rows: xid N or commit LSN L)──▶ tables touched, refusals (TRUNCATE, keyless)
    per table: scratch := gold@R (greatest recorded end R <= L-1) + silver (R, L-1]    (replay's machinery)
               ── version b: the state just before the transaction
               scratch += the transaction's own rows                                    (the merge engine)
               ── version a: the state just after it
    removed = b EXCEPT ALL a, added = a EXCEPT ALL b  (typed, Arrow)  ──▶ render_script ──▶ SQL

The states are built without Spark where `undo_in_process` can (the in-process replay and merge: no key change
of a row with an unchanged TOAST value or schema change in the transaction, no `spark` passed), else by Spark's.
The merge engine builds both states either way, so a DEFAULT-identity delete (which carries only the key) gets its
full before-image, unchanged TOAST columns keep their values, a key change is a row gone under the old key and a
row added under the new one, and several changes of one row in the transaction collapse to (before, after).

The script (pure text, `render_script`) runs in ONE transaction: it locks the tables (EXCLUSIVE: others may read,
nobody writes until it ends), checks every row the transaction left against its after-image (keyed table: the row
under its key equals it column by column; a row the transaction deleted: nothing under its key; FULL identity:
the number of identical rows is what the transaction left), and RAISEs naming the table and the key on the
first difference, so a later change is never overwritten and nothing is changed. Then it deletes the rows the
transaction added, sets back the rows it updated (only the columns that differ), and re-inserts what it removed.
Values are rendered from gold's typed values as `'text'::type` with the type name from `_catalog`.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from slotlake import delta_log, storage
from slotlake.config import Config
from slotlake.contracts import STAGE_DECODE, CommitMeta
from slotlake.errors import SlotlakeError
from slotlake.lake import LakePaths, table_dir
from slotlake.lsn import Lsn
from slotlake.names import TableName, spark_ident

log = logging.getLogger(__name__)

# Types without a btree equality operator: their rows are compared through their text form.
_NO_EQUALITY = {"json", "xml", "point", "lseg", "path", "polygon", "line", "box", "circle"}
_CHECKS_PER_BLOCK = 500  # checks per DO block: a plpgsql body per block, not one for a million rows


class UndoError(SlotlakeError):
    """The transaction cannot be undone as asked (not found, TRUNCATE, keyless table, ...)."""


# ---- what the script is made of (pure) ---------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    name: str
    type_name: str | None  # `_catalog` type name (`int4`, `_text`, `myschema.mood`); None: no cast


@dataclass(frozen=True)
class TableUndo:
    """One table's share of the undo: rows as dicts of column name -> typed value (as Arrow gives them)."""

    table: TableName
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # key column names; () = REPLICA IDENTITY FULL (the whole row identifies it)
    removed: tuple[dict[str, Any], ...]  # rows the transaction took away (before-images), with multiplicity
    added: tuple[dict[str, Any], ...]  # rows it left (after-images), with multiplicity
    after_counts: tuple[int, ...] = ()  # FULL only: per distinct row of removed + added (first-seen order),
    #                                   how many identical rows the transaction left
    moved: tuple[tuple[KeyText, KeyText], ...] = ()  # keyed: (old key, new key) of each key change, as text


KeyText = tuple[str | None, ...]
"""A key as PostgreSQL's text of each key column (silver's form), in key column order."""


@dataclass(frozen=True)
class TransactionRef:
    source: str
    xid: int
    commit_lsn: Lsn
    commit_end_lsn: Lsn
    commit_ts: datetime


def value_text(value: Any) -> str:
    """A typed gold value as PostgreSQL reads it back (input syntax). Pure."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, Decimal):
        return "NaN" if value.is_nan() else format(value, "f")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return "{" + ",".join("NULL" if v is None else '"' + value_text(v).replace("\\", "\\\\").replace('"', '\\"')
                              + '"' for v in value) + "}"
    return str(value)


def string_literal(text: str) -> str:
    """A standard SQL string literal (the script sets standard_conforming_strings = on)."""
    return "'" + text.replace("'", "''") + "'"


def type_sql(type_name: str) -> str:
    """A `_catalog` type name as SQL: `int4` -> "int4", `s.mood` -> "s"."mood" (names.quote on each part)."""
    if "." in type_name or '"' in type_name:
        return _table_sql(TableName.parse(type_name))
    return ident(type_name)


def sql_literal(value: Any, column: Column) -> str:
    """`'text'::type` for a value (NULL::type for None). Pure."""
    lit = "NULL" if value is None else string_literal(value_text(value))
    return f"{lit}::{type_sql(column.type_name)}" if column.type_name else lit


def _same(column: Column, value: Any) -> str:
    """A condition true when the column holds `value` (NULL included)."""
    if value is None:
        return f"{ident(column.name)} IS NULL"
    base = (column.type_name or "").lstrip("_").split(".")[-1]
    if base in _NO_EQUALITY:
        return f"{ident(column.name)}::text = ({sql_literal(value, column)})::text"
    return f"{ident(column.name)} = {sql_literal(value, column)}"


def _key_text(t: TableUndo, row: dict[str, Any]) -> str:
    cols = t.key or tuple(c.name for c in t.columns)
    shown = ", ".join("NULL" if row[c] is None else value_text(row[c]) for c in cols)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return f"({', '.join(ident(c) for c in cols)})=({shown})"


def _row_key(t: TableUndo, row: dict[str, Any]) -> tuple[str, ...]:
    """A hashable identity of a row (its key, or every column for FULL) from the rendered values."""
    return tuple(sql_literal(row[c.name], c) for c in t.columns if not t.key or c.name in t.key)


def _where(t: TableUndo, row: dict[str, Any], full: bool) -> str:
    cols = [c for c in t.columns if full or c.name in t.key]
    return " AND ".join(_same(c, row[c.name]) for c in cols)


def _check(message: str, count_sql: str, want: int) -> str:
    return (f"  IF ({count_sql}) <> {want} THEN\n"
            f"    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = {string_literal(message)};\n  END IF;")


def plan_statements(ref: TransactionRef, t: TableUndo) -> tuple[list[str], list[str], list[str], list[str]]:
    """(checks, deletes, updates, inserts) for one table. Pure."""
    name = _table_sql(t.table)
    since = f"since transaction {ref.xid} (commit {ref.commit_lsn})"
    nothing = "; nothing was undone (the transaction is rolled back)"
    checks: list[str] = []
    deletes: list[str] = []
    updates: list[str] = []
    inserts: list[str] = []
    if not t.key:  # FULL: rows are values; duplicates count
        distinct: dict[tuple[str, ...], dict[str, Any]] = {}
        removed: Counter = Counter()
        added: Counter = Counter()
        for rows, counter in ((t.removed, removed), (t.added, added)):
            for r in rows:
                k = _row_key(t, r)
                distinct.setdefault(k, r)
                counter[k] += 1
        for (k, row), n_after in zip(distinct.items(), t.after_counts):
            where = _where(t, row, full=True)
            checks.append(_check(f"slotlake undo: {t.table} row {_key_text(t, row)}: {n_after} identical row(s) "
                                 f"expected as the transaction left them, found another number: changed {since}"
                                 f"{nothing}", f"SELECT count(*) FROM {name} WHERE {where}", n_after))
            extra = added[k] - removed[k]
            if extra > 0:
                deletes.append(f"DELETE FROM {name} WHERE ctid IN (SELECT ctid FROM {name} WHERE {where} "
                               f"LIMIT {extra});")
            for _ in range(-extra):
                inserts.append(_insert(name, t, row))
        return checks, deletes, updates, inserts
    before = {_row_key(t, r): r for r in t.removed}
    after = {_row_key(t, r): r for r in t.added}
    # A key change (old key gone, new key added) is set back by one UPDATE when the transaction's silver rows
    # name both keys in a text the typed values render to (int, text, uuid, ...); else DELETE + INSERT.
    gone = {_key_as_text(t, r): k for k, r in before.items() if k not in after}
    new = {_key_as_text(t, r): k for k, r in after.items() if k not in before}
    moved_from = {new[n]: gone.pop(o) for o, n in t.moved if o in gone and n in new}
    for k, row in after.items():
        checks.append(_check(f"slotlake undo: {t.table} row {_key_text(t, row)} changed {since} (it no longer "
                             f"equals the transaction's after-image){nothing}",
                             f"SELECT count(*) FROM {name} WHERE {_where(t, row, full=True)}", 1))
        if k in before or k in moved_from:
            old = before[moved_from.get(k, k)]
            sets = [f"{ident(c.name)} = {sql_literal(old[c.name], c)}" for c in t.columns
                    if _differs(old[c.name], row[c.name])]
            if sets:
                updates.append(f"UPDATE {name} SET {', '.join(sets)} WHERE {_where(t, row, full=False)};")
        else:
            deletes.append(f"DELETE FROM {name} WHERE {_where(t, row, full=False)};")
    back = set(moved_from.values())
    for k, row in before.items():
        if k not in after:
            checks.append(_check(f"slotlake undo: {t.table} row {_key_text(t, row)} was inserted again {since}"
                                 f"{nothing}", f"SELECT count(*) FROM {name} WHERE {_where(t, row, full=False)}", 0))
            if k not in back:
                inserts.append(_insert(name, t, row))
    return checks, deletes, updates, inserts


def _key_as_text(t: TableUndo, row: dict[str, Any]) -> KeyText:
    return tuple(None if row[c] is None else value_text(row[c]) for c in t.key)


def key_moves(changes: Sequence[tuple[str, KeyText | None, KeyText | None]]) -> tuple[tuple[KeyText, KeyText], ...]:
    """(op, old key, new key) of one table's changes in transaction order -> the net key changes
    (first key, last key) of the rows whose key changed and that still exist. Pure."""
    origin: dict[KeyText, KeyText] = {}
    for op, old, new in changes:
        if op == "U" and old is not None and new is not None and old != new:
            origin[new] = origin.pop(old, old)
        elif op == "D" and old is not None:
            origin.pop(old, None)
    return tuple((o, n) for n, o in origin.items() if o != n)


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return False
    return a != b or type(a) is not type(b)


def ident(name: str) -> str:
    """An identifier always double-quoted (also reserved words and names that need no quotes)."""
    return '"' + name.replace('"', '""') + '"'


def _table_sql(table: TableName) -> str:
    return f"{ident(table.schema)}.{ident(table.name)}"


def _insert(name: str, t: TableUndo, row: dict[str, Any]) -> str:
    cols = ", ".join(ident(c.name) for c in t.columns)
    vals = ", ".join(sql_literal(row[c.name], c) for c in t.columns)
    return f"INSERT INTO {name} ({cols}) OVERRIDING SYSTEM VALUE VALUES ({vals});"


def _dollar_tag(body: str) -> str:
    tag, i = "$slotlake_undo$", 0
    while tag in body:
        i += 1
        tag = f"$slotlake_undo_{i}$"
    return tag


def render_script(ref: TransactionRef, tables: Sequence[TableUndo]) -> str:
    """The undo script: one transaction that checks every row, then reverts it. Pure."""
    checks: list[str] = []
    deletes: list[str] = []
    updates: list[str] = []
    inserts: list[str] = []
    summary = []
    for t in sorted(tables, key=lambda x: x.table):
        c, d, u, i = plan_statements(ref, t)
        checks += c
        deletes += d
        updates += u
        inserts += i
        summary.append(f"--   {t.table}: {len(d)} delete(s), {len(u)} update(s), {len(i)} insert(s)")
    out = [f"-- slotlake undo of transaction {ref.xid} on source {ref.source}: commit LSN {ref.commit_lsn}, "
           f"end {ref.commit_end_lsn}, committed {ref.commit_ts.isoformat()}",
           *summary,
           "-- Runs as one transaction: if any row changed since, it stops with an error naming the table and key",
           "-- and changes nothing. Run it with: psql -v ON_ERROR_STOP=1 -f <this file> <database>",
           "BEGIN;",
           "SET LOCAL standard_conforming_strings = on;"]
    for t in sorted(tables, key=lambda x: x.table):
        out.append(f"LOCK TABLE {_table_sql(t.table)} IN EXCLUSIVE MODE;")
    for start in range(0, len(checks), _CHECKS_PER_BLOCK):
        body = "BEGIN\n" + "\n".join(checks[start:start + _CHECKS_PER_BLOCK]) + "\nEND\n"
        tag = _dollar_tag(body)
        out.append(f"DO {tag}\n{body}{tag};")
    out += deletes + updates + inserts
    out.append("COMMIT;")
    return "\n".join(out) + "\n"


# ---- finding the transaction (delta-rs) --------------------------------------------------------------------

_TX_COLUMNS = ["commit_lsn", "commit_end_lsn", "commit_ts", "xid", "seq", "rel_oid", "schema_name", "table_name",
               "op", "replica_identity", "columns", "key_columns", "old", "new"]


@dataclass(frozen=True)
class TableTouched:
    table: TableName
    rel_oid: int
    replica_identity: str
    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    moved: tuple[tuple[KeyText, KeyText], ...] = ()


def find_transaction(cfg: Config, source: str, xid: int | None = None,
                     commit_lsn: Lsn | None = None) -> tuple[TransactionRef, tuple[TableTouched, ...]]:
    """The transaction's commit and the tables it touched, from silver; UndoError when it cannot be undone."""
    import pyarrow.dataset as ds

    from slotlake.recover.transactions import open_silver

    if (xid is None) == (commit_lsn is None):
        raise UndoError("give exactly one of --xid N and --commit-lsn L (see `slotlake transactions`)")
    dataset = open_silver(cfg, source).to_pyarrow_dataset()
    cond = ds.field("xid") == xid if xid is not None else ds.field("commit_lsn") == int(commit_lsn)  # type: ignore[arg-type]
    rows = dataset.to_table(columns=_TX_COLUMNS, filter=cond).to_pylist()
    what = f"xid {xid}" if xid is not None else f"commit LSN {commit_lsn}"
    if not rows:
        raise UndoError(f"{what} is not in {source}'s silver (a transaction that changed no published table, or "
                        f"not synced yet); list the candidates with `slotlake transactions {source} --from X --to Y`")
    commits = sorted({r["commit_lsn"] for r in rows})
    if len(commits) > 1:
        raise UndoError(f"{what} matches {len(commits)} commits ({', '.join(str(Lsn(c)) for c in commits)}: xids "
                        "wrap around); choose one with --commit-lsn")
    first = min(rows, key=lambda r: r["seq"])
    ts = first["commit_ts"]
    ref = TransactionRef(source, int(first["xid"]), Lsn(first["commit_lsn"]), Lsn(first["commit_end_lsn"]),
                         ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts)
    truncated = sorted({str(TableName(r["schema_name"], r["table_name"])) for r in rows if r["op"] == "T"})
    if truncated:
        raise UndoError(f"transaction {ref.xid} ({ref.commit_lsn}) truncated {', '.join(truncated)}: a TRUNCATE "
                        f"cannot be undone row by row; recover the table(s) as of {Lsn(int(ref.commit_lsn) - 1)} "
                        "instead (slotlake replay --dest / recover)")
    touched: dict[int, TableTouched] = {}
    for r in sorted(rows, key=lambda r: r["seq"]):
        name = TableName(r["schema_name"], r["table_name"])
        t = TableTouched(name, r["rel_oid"], r["replica_identity"], tuple(r["columns"]), tuple(r["key_columns"]))
        if r["rel_oid"] in touched and dataclasses.replace(touched[r["rel_oid"]], moved=()) != t:
            raise UndoError(f"transaction {ref.xid} changed the definition of {name} between its changes; undo "
                            f"it by hand or recover the table as of {Lsn(int(ref.commit_lsn) - 1)}")
        touched[r["rel_oid"]] = t
        if t.replica_identity == "f":
            continue
        if t.replica_identity == "n" or not t.key_columns:
            raise UndoError(f"{name} has no replica identity key (REPLICA IDENTITY {t.replica_identity.upper()} "
                            "without a primary key): its rows cannot be found again; set REPLICA IDENTITY FULL "
                            "(for later transactions) or recover the table instead")
    for oid, t in touched.items():
        at = [t.columns.index(c) for c in t.key_columns]

        def key(values: list[str | None] | None, at: list[int] = at) -> KeyText | None:
            return None if values is None else tuple(values[i] for i in at)

        changes = [(r["op"], key(r["old"]), key(r["new"])) for r in sorted(rows, key=lambda r: r["seq"])
                   if r["rel_oid"] == oid]
        # an update that keeps its key has no old tuple: its old key is its new key
        changes = [(op, new if op == "U" and old is None else old, new) for op, old, new in changes]
        touched[oid] = dataclasses.replace(t, moved=key_moves(changes) if t.replica_identity != "f" else ())
    return ref, tuple(sorted(touched.values(), key=lambda t: t.table))


def catalog_types(cfg: Config, source: str, rel_oid: int, at: Lsn) -> dict[str, str | None]:
    """Column name -> `_catalog` type name of the table version valid at `at` (empty when unknown)."""
    import pyarrow.dataset as ds
    from deltalake.exceptions import TableNotFoundError

    try:
        cat = delta_log.delta_rs_table(LakePaths.of(cfg.lake, source).catalog).to_pyarrow_dataset()
    except TableNotFoundError:
        return {}
    rows = cat.to_table(columns=["version", "valid_from_lsn", "columns"],
                        filter=(ds.field("rel_oid") == rel_oid) & (ds.field("valid_from_lsn") <= int(at))).to_pylist()
    if not rows:
        return {}
    best = max(rows, key=lambda r: (r["valid_from_lsn"], r["version"]))
    return {c["name"]: c["type_name"] for c in best["columns"]}


# ---- the states before and after (Spark; `undo_in_process` without it) ----------------------------------------

def _table_undo(spark, cfg: Config, ref: TransactionRef, touched: TableTouched, scratch: str) -> TableUndo:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from slotlake.decode.job import SILVER_COLUMNS
    from slotlake.merge.job import run_merge
    from slotlake.recover.replay_job import base_at, build_states, recorded_ends, recorded_runs

    source = ref.source
    paths = LakePaths.of(cfg.lake, source)
    s, t = touched.table
    target = table_dir(f"{scratch}/state", s, t)
    just_before = Lsn(int(ref.commit_lsn) - 1)
    base = base_at(recorded_ends(spark, recorded_runs(spark, paths.runs, (s, t)), paths.gold(s, t), s, t),
                   just_before)
    # The state just before: gold at its last recorded end <= L-1, plus silver's commits up to L-1.
    build_states(spark, cfg, source, {(s, t): base}, paths.gold, lambda *_: target, paths.changes, just_before)
    before_version = (DeltaTable.forPath(spark, target).history(1).collect()[0]["version"]
                      if DeltaTable.isDeltaTable(spark, target) else None)
    # Then the transaction alone, from a scratch silver holding only its rows (its end LSN is its watermark).
    tx_changes = f"{scratch}/changes/{uuid.uuid4().hex[:8]}"
    (spark.read.format("delta").load(paths.changes)
     .where((F.col("commit_lsn") == int(ref.commit_lsn)) & (F.col("rel_oid") == touched.rel_oid))
     .select(*SILVER_COLUMNS).write.format("delta").mode("overwrite")
     .option("userMetadata", CommitMeta(STAGE_DECODE, ref.commit_end_lsn).json())
     .save(tx_changes))
    run_merge(spark, cfg, source, [touched.table], silver_path=tx_changes, gold_path_for=lambda *_: target,
              end_lsn=ref.commit_end_lsn)
    after = spark.read.format("delta").load(target)
    names = list(touched.columns)
    missing = [c for c in names if c not in after.columns]
    if missing:
        raise UndoError(f"{touched.table}: columns {', '.join(missing)} of the transaction's time are not in the "
                        "lake's table; undo it by hand")
    cols_of = [F.col(spark_ident(c)) for c in names]

    def live(df):  # delete_mode soft keeps deleted rows, flagged
        return df.where(~F.col("_slotlake_deleted")) if "_slotlake_deleted" in df.columns else df

    a = live(after).select(*cols_of)
    b = (live(spark.read.format("delta").option("versionAsOf", before_version).load(target)).select(*cols_of)
         if before_version is not None else spark.createDataFrame([], a.schema))
    removed, added = b.exceptAll(a), a.exceptAll(b)

    def count_after(rows: list[dict[str, Any]], key) -> list[int]:
        counts = a.groupBy(*cols_of).count()
        wanted = spark.createDataFrame([tuple(r[c] for c in names) for r in rows], a.schema)
        cond = [wanted[spark_ident(c)].eqNullSafe(counts[spark_ident(c)]) for c in names]
        joined = wanted.join(counts, cond, "left").select(*[wanted[spark_ident(c)] for c in names], counts["count"])
        got = {key(r): r["count"] or 0 for r in joined.toArrow().to_pylist()}
        return [got.get(key(r), 0) for r in rows]

    return _assemble(cfg, ref, touched, removed.toArrow().to_pylist(), added.toArrow().to_pylist(), count_after)


def _assemble(cfg: Config, ref: TransactionRef, touched: TableTouched, removed_rows: list[dict[str, Any]],
              added_rows: list[dict[str, Any]], count_after) -> TableUndo:
    """One table's `TableUndo` from the rows the transaction removed and added (Spark's states or
    `undo_in_process`'s); for FULL identity with `count_after(rows, key)`: how many rows equal to each (by `key`,
    `_row_key`) the table held right after the transaction."""
    types = catalog_types(cfg, ref.source, touched.rel_oid, ref.commit_lsn)
    cols = tuple(Column(c, types.get(c)) for c in touched.columns)
    key = () if touched.replica_identity == "f" else touched.key_columns
    undo = TableUndo(touched.table, cols, key, tuple(removed_rows), tuple(added_rows), moved=touched.moved)
    if key:
        return undo
    # FULL: how many identical rows the transaction left, per distinct row it added or removed.
    distinct: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in (*removed_rows, *added_rows):
        distinct.setdefault(_row_key(undo, r), r)
    if not distinct:
        return undo
    return dataclasses.replace(undo, after_counts=tuple(count_after(list(distinct.values()),
                                                                    lambda r: _row_key(undo, r))))


def _tables_in_process(cfg: Config, ref: TransactionRef, touched: Sequence[TableTouched],
                       scratch: str) -> tuple[TableUndo, ...] | None:
    """Every table's `TableUndo` from states built without Spark (`undo_in_process`); None when that declines for
    one of them (the Spark states then do all)."""
    from slotlake.recover.undo_in_process import transaction_states

    out = []
    for i, t in enumerate(touched):
        try:
            got = transaction_states(cfg, ref.source, t.table, t.columns, ref.commit_lsn, f"{scratch}/{i}")
        except KeyError as missing:
            raise UndoError(f"{t.table}: columns {missing.args[0]} of the transaction's time are not in the "
                            "lake's table; undo it by hand") from None
        if got is None:
            log.info("undo %s: the states of %s are Spark's", ref.source, t.table)
            return None
        out.append(_assemble(cfg, ref, t, *got))
    return tuple(out)


@dataclass(frozen=True)
class UndoResult:
    transaction: TransactionRef
    tables: tuple[TableUndo, ...]
    script: str
    out: str | None  # where it was written (None: returned / printed)

    def summary(self) -> str:
        rows = sum(len(t.removed) + len(t.added) for t in self.tables)
        where = f" written to {self.out}" if self.out else ""
        return (f"undo {self.transaction.source}: transaction {self.transaction.xid} (commit "
                f"{self.transaction.commit_lsn}, {self.transaction.commit_ts.isoformat()}) over "
                f"{len(self.tables)} table(s), {rows} row image(s){where}")


def undo(cfg: Config, source: str, xid: int | None = None, commit_lsn: str | None = None,
         out: str | None = None, spark=None) -> UndoResult:
    """Build the undo script of one transaction (see the module doc); writes it to `out` when given. The states
    are built without Spark where `undo_in_process` can (no `spark` given), else with `spark` or a session of the
    config's."""
    cfg.source(source)
    try:
        lsn = Lsn.parse(commit_lsn) if commit_lsn is not None else None
    except ValueError:
        raise UndoError(f"--commit-lsn {commit_lsn!r} is not an LSN (like 16/B374D848)") from None
    ref, touched = find_transaction(cfg, source, xid, lsn)
    paths = LakePaths.of(cfg.lake, source)
    here = None
    if spark is None and cfg.spark.in_process_bytes:
        from slotlake.recover.replay_in_process import scratch_folder

        scratch = scratch_folder(paths, "undo")
        try:
            here = _tables_in_process(cfg, ref, touched, scratch)
        finally:
            storage.files_for(scratch).remove_tree(scratch)
    if here is not None:
        tables = here
    else:
        from pyspark.sql import SparkSession

        from slotlake.recover.replay_job import _delete_path
        from slotlake.spark.session import get_spark

        ours = spark is None and SparkSession.getActiveSession() is None
        spark = spark or get_spark("slotlake-undo", cfg.spark.master, cfg.spark.conf, storage=cfg.storage)
        scratch = paths.scratch("undo")
        try:
            tables = tuple(_table_undo(spark, cfg, ref, t, scratch) for t in touched)
        finally:
            _delete_path(spark, scratch)
            if ours:
                spark.stop()
    script = render_script(ref, tables)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(script)
    result = UndoResult(ref, tables, script, out)
    log.info("%s", result.summary())
    return result
