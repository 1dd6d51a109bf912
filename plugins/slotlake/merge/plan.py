"""Planning a gold merge: pure decisions made on the driver before Spark touches the data.

From a table's shape in the batch (columns, types, key flags, replica identity) and the source settings this
decides how rows are identified (`KeyStrategy`), what the gold schema is, and which Delta commit settings make
the merge an idempotent, watermarked commit (DESIGN.md invariant 4).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from slotlake.contracts import (  # gold's and history's columns: declared in contracts, used here
    COMMIT_TS_COL,
    DELETED_COL,
    DUP_COL,
    LSN_COL,
    OP_COL,
    STAGE_HISTORY,
    VALID_FROM_LSN_COL,
    VALID_FROM_TS_COL,
    VALID_TO_LSN_COL,
    VALID_TO_TS_COL,
    CommitMeta,
    Field,
    Schema,
)
from slotlake.decode.types import DECIMAL, gold_type
from slotlake.errors import ConfigError, MergeError
from slotlake.lsn import Lsn
from slotlake.names import TableName

HISTORY_STAGE = STAGE_HISTORY

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
COLUMN_MAPPING = "delta.columnMapping.mode"
# Delta's deletion vectors (config `deletion_vectors`): a MERGE marks the rows it changes in a file instead of
# rewriting the file. Adds the `deletionVectors` reader feature (README "Big gold tables": who reads it).
DELETION_VECTORS = "delta.enableDeletionVectors"
# Delta refuses these in column names unless the table maps columns by name (physical names are then generated).
_NEEDS_MAPPING = frozenset(" ,;{}()\n\t=")


class KeyStrategy(str, Enum):
    """How a change finds its gold row."""

    KEYED = "keyed"  # REPLICA IDENTITY DEFAULT / USING INDEX: the key-flagged columns
    FULL_ROW = "full_row"  # REPLICA IDENTITY FULL: the whole old row, identical rows told apart by _slotlake_dup
    INSERT_ONLY = "insert_only"  # REPLICA IDENTITY NOTHING: updates and deletes cannot be applied


@dataclass(frozen=True)
class TableShape:
    """A table's definition as the silver rows of one batch carry it."""

    schema_name: str
    table_name: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    typmods: tuple[int, ...]
    key_columns: tuple[str, ...]
    replica_identity: str  # d, n, f, i

    @property
    def qualified(self) -> str:
        """The canonical `schema.table` (str(TableName): quoted where the name needs it)."""
        return str(TableName(self.schema_name, self.table_name))


@dataclass(frozen=True)
class TablePlan:
    """Everything the Spark job needs to merge one table."""

    shape: TableShape
    strategy: KeyStrategy
    key_positions: tuple[int, ...]  # indexes into shape.columns (KEYED only)
    soft_delete: bool
    # per column of shape.columns: numeric.unconstrained (decimal | string) from the config; () = all decimal
    unconstrained_numeric: tuple[str, ...] = ()

    def numeric_mode(self, i: int) -> str:
        """numeric.unconstrained of column i (it matters only for a numeric without precision)."""
        return self.unconstrained_numeric[i] if self.unconstrained_numeric else DECIMAL

    @property
    def gold_schema(self) -> Schema:
        return gold_schema(self.shape, self.strategy, self.soft_delete, self.unconstrained_numeric)


def plan_table(shape: TableShape, delete_mode: str,
               unconstrained_numeric: Callable[[str], str] | None = None, *,
               keyless_appends: bool = False) -> TablePlan:
    """Choose the key strategy; reject shapes no merge can apply correctly. `unconstrained_numeric(column)` is the
    column's numeric.unconstrained setting (default: decimal for every column).

    `keyless_appends` (SourceConfig.keyless_appends): a table without a key (DEFAULT without a primary key) is
    merged insert-only, as appends, instead of refused: its stream holds only inserts and truncates."""
    if len(set(shape.columns)) != len(shape.columns):
        raise MergeError(f"{shape.qualified}: duplicate column names in {list(shape.columns)}")
    if not (len(shape.columns) == len(shape.type_oids) == len(shape.typmods)):
        raise MergeError(f"{shape.qualified}: silver rows have columns, type_oids and typmods of different lengths")
    reserved = [c for c in shape.columns if c.startswith("_slotlake_")]
    if reserved:
        raise MergeError(f"{shape.qualified}: column(s) {reserved} use the reserved prefix _slotlake_; rename them")
    ri = shape.replica_identity
    keys: tuple[int, ...]
    if ri == "f":
        strategy, keys = KeyStrategy.FULL_ROW, ()
    elif ri == "n":
        strategy, keys = KeyStrategy.INSERT_ONLY, ()
    elif ri in ("d", "i"):
        missing = [k for k in shape.key_columns if k not in shape.columns]
        if missing:
            raise MergeError(
                f"{shape.qualified}: key columns {missing} are not among the columns {list(shape.columns)}")
        if not shape.key_columns and not keyless_appends:
            raise MergeError(
                f"{shape.qualified}: replica identity {'DEFAULT' if ri == 'd' else 'USING INDEX'} but no key column "
                "(a table without a primary key); give it a primary key or run "
                f"ALTER TABLE {shape.qualified} REPLICA IDENTITY FULL, or list it in insert_only if its rows are "
                "only ever inserted")
        if shape.key_columns:
            strategy = KeyStrategy.KEYED
            keys = tuple(shape.columns.index(k) for k in shape.key_columns)
        else:
            strategy, keys = KeyStrategy.INSERT_ONLY, ()
    else:
        raise MergeError(f"{shape.qualified}: unknown replica identity {ri!r} (expected d, n, f or i)")
    if delete_mode not in ("hard", "soft"):
        raise MergeError(f"delete_mode {delete_mode!r} must be hard or soft")
    modes = tuple(unconstrained_numeric(c) for c in shape.columns) if unconstrained_numeric else ()
    return TablePlan(shape=shape, strategy=strategy, key_positions=keys, soft_delete=delete_mode == "soft",
                     unconstrained_numeric=modes)


def gold_schema(shape: TableShape, strategy: KeyStrategy, soft_delete: bool,
                unconstrained_numeric: tuple[str, ...] = ()) -> Schema:
    """Source columns typed by decode/types.py, then the _slotlake_ columns (docs/internals.md "Gold")."""
    modes = unconstrained_numeric or (DECIMAL,) * len(shape.columns)
    fields = [Field(n, gold_type(o, m, u)) for n, o, m, u in zip(shape.columns, shape.type_oids, shape.typmods, modes)]
    fields += [Field(LSN_COL, "bigint", False), Field(COMMIT_TS_COL, "timestamp")]
    if soft_delete:
        fields.append(Field(DELETED_COL, "boolean", False))
    if strategy is KeyStrategy.FULL_ROW:
        fields.append(Field(DUP_COL, "int", False))
    return tuple(fields)


HISTORY_VERSION_FIELDS: Schema = (
    Field(VALID_FROM_LSN_COL, "bigint", False), Field(VALID_TO_LSN_COL, "bigint"),
    Field(VALID_FROM_TS_COL, "timestamp"), Field(VALID_TO_TS_COL, "timestamp"), Field(OP_COL, "string", False),
)
"""The version columns a history table adds to the gold columns it keeps (`in_history`)."""


def in_history(gold_column: str) -> bool:
    """Whether a gold column is one of its history table's: gold's source columns (same types), `_slotlake_dup`
    for FULL tables; gold's `_slotlake_lsn`/`_commit_ts`/`_deleted` are what the version columns say."""
    return not gold_column.startswith("_slotlake_") or gold_column == DUP_COL


def history_schema(gold: Schema) -> Schema:
    """The history table of a gold table: the gold columns it keeps (`in_history`), then the version columns."""
    return tuple(f for f in gold if in_history(f.name)) + HISTORY_VERSION_FIELDS


def history_app_id(source: str, schema_name: str, table_name: str) -> str:
    return f"slotlake-history-{source}-{schema_name}.{table_name}"


def needs_column_mapping(columns: Iterable[str]) -> bool:
    """Whether a gold table with these columns must use Delta column mapping by name: PostgreSQL allows any
    character in a quoted column name, Delta's physical (Parquet) names do not allow ` ,;{}()\\n\\t=`."""
    return any(_NEEDS_MAPPING.intersection(c) for c in columns)


def schema_mismatch(existing: Schema, wanted: Schema) -> str | None:
    """A description of how an existing gold table differs from the planned one (names and types), or None."""
    have = [(f.name, f.type) for f in existing]
    want = [(f.name, f.type) for f in wanted]
    if have == want:
        return None
    return f"gold has {have}, the batch needs {want}"


# A MERGE that copied at least this many unchanged rows, and this many times the rows it changed, gets a note that
# names config `deletion_vectors` (`rewrite_note`).
REWRITE_NOTE_ROWS = 1_000_000
REWRITE_NOTE_RATIO = 100


def rewrite_note(name: TableName, metrics: dict[str, str], deletion_vectors: bool) -> str | None:
    """The run summary's note for a copy-on-write MERGE (Delta's `operationMetrics` of its commit) that rewrote
    far more unchanged rows than it changed, as updates and deletes of random keys of a big table do; None when it
    did not or the table already has deletion vectors. One line that says what to do (README, "Big gold tables")."""
    copied = int(metrics.get("numTargetRowsCopied", 0) or 0)
    changed = sum(int(metrics.get(k, 0) or 0) for k in ("numTargetRowsUpdated", "numTargetRowsDeleted"))
    if deletion_vectors or copied < REWRITE_NOTE_ROWS or copied < REWRITE_NOTE_RATIO * max(changed, 1):
        return None
    return (f"{name}: the MERGE rewrote {copied:,} unchanged gold rows to update/delete {changed:,}; if every reader "
            f"of the table reads Delta's deletion vectors (Spark, Polars, DuckDB, deltalake's QueryBuilder; not "
            f"deltalake's to_pandas()), set `deletion_vectors: ['{name}']` in the source's config to mark rows "
            f"instead (README, \"Big gold tables\")")


def merge_app_id(source: str, schema_name: str, table_name: str) -> str:
    return f"slotlake-merge-{source}-{schema_name}.{table_name}"


def merge_commit_conf(source: str, schema_name: str, table_name: str, end_lsn: Lsn) -> dict[str, str]:
    """Session settings that make the next Delta write idempotent and carry the table's new watermark."""
    return {
        TXN_APP_ID: merge_app_id(source, schema_name, table_name),
        TXN_VERSION: str(int(end_lsn)),
        USER_METADATA: stage_metadata(end_lsn, "merge"),
    }


def stage_metadata(end_lsn: Lsn, stage: str, **extra: Any) -> str:
    return CommitMeta(stage, end_lsn, extra).json()


def watermark_of(user_metadata: str | None) -> Lsn | None:
    """The end LSN a Delta commit's userMetadata records (`{"slotlake": {"end_lsn": "X/Y"}}`), else None."""
    meta = CommitMeta.parse(user_metadata)
    return meta.end_lsn if meta else None


def newest_watermark(history: list[tuple[int, str | None]]) -> tuple[int, Lsn] | None:
    """Given (version, userMetadata) pairs of a Delta table's history, the newest slotlake commit's (version,
    watermark); None when no commit carries one."""
    for version, meta in sorted(history, key=lambda h: h[0], reverse=True):
        lsn = watermark_of(meta)
        if lsn is not None:
            return version, lsn
    return None


def parse_tables(arg: str | None) -> tuple[TableName, ...] | None:
    """`--tables public.a,"S"."b,c"` -> (("public", "a"), ("S", "b,c")); None/empty -> None (all tables)."""
    if not arg:
        return None
    try:
        return TableName.parse_list(arg) or None
    except ConfigError as e:
        raise MergeError(f"--tables: {e}") from None


def copy_plan(src: Any, copy: Any) -> TablePlan:
    """The plan of an initial copy's table (`source.copies.TableCopy` of a source `src`, a `config.SourceConfig`)
    as the copy describes it: the key strategy, gold schema and `numeric.unconstrained` mapping of the merge of the
    changes after it, so the copy and those changes agree."""
    from functools import partial

    schema, table = TableName.parse(copy.table)
    shape = TableShape(schema, table, tuple(c["name"] for c in copy.columns),
                       tuple(int(c["type_oid"]) for c in copy.columns), tuple(int(c["typmod"]) for c in copy.columns),
                       tuple(c["name"] for c in copy.columns if c["is_key"]), copy.replica_identity)
    return plan_table(shape, src.delete_mode, partial(src.numeric.unconstrained_for, copy.table),
                      keyless_appends=src.keyless_appends(copy.table))
