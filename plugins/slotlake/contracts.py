"""The data contracts between the stages, each declared once (docs/architecture.md, docs/internals.md).

Every lake table slotlake owns is a tuple of (column, Spark SQL type) pairs below. From it come the Spark DDL
string (`ddl()`: what `spark.createDataFrame` and `mapInArrow` take), the column names (`names()`) and the Arrow
schema (`arrow_schema()`: bronze files, the decoder's output batches). Gold and history tables carry the source
table's columns plus the `_slotlake_*` columns named here.

Every Delta commit slotlake makes carries `{"slotlake": {...}}` in its userMetadata: `CommitMeta`, with one
writer (`CommitMeta.json`) and one parser (`CommitMeta.parse`). `end_lsn` is the stage's watermark after the
commit; other keys depend on the stage (`after_lsn`, `history_from`, `replay`, `source`, `as_of`).

Pure: pyarrow and the LSN type only.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pyarrow as pa

from slotlake.lsn import Lsn

Columns = tuple[tuple[str, str], ...]

class ReplicaIdentity(str, Enum):
    """pg_class.relreplident, as the Relation message, the catalog and silver's `replica_identity` carry it."""

    DEFAULT = "d"  # key columns of the primary key
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"  # USING INDEX


# ---- lake tables ----------------------------------------------------------------------------------------------

BRONZE: Columns = (("lsn", "long"), ("xid", "long"), ("data", "binary"), ("ord", "long"))
"""A bronze Parquet file: the rows of pg_logical_slot_peek_binary_changes, `ord` their position in the peek."""

SILVER: Columns = (
    ("commit_lsn", "long"), ("commit_end_lsn", "long"), ("commit_ts", "timestamp"), ("xid", "long"), ("seq", "int"),
    ("lsn", "long"), ("rel_oid", "long"), ("schema_name", "string"), ("table_name", "string"), ("op", "string"),
    ("replica_identity", "string"), ("columns", "array<string>"), ("key_columns", "array<string>"),
    ("type_oids", "array<int>"), ("typmods", "array<int>"), ("old_kind", "string"), ("old", "array<string>"),
    ("new", "array<string>"), ("unchanged", "array<int>"), ("truncate_options", "int"), ("bronze_file", "string"),
)
"""`silver/changes`: one row per row change or TRUNCATE (the decoder's `frames.SilverChange`, same order)."""

SILVER_STATS_COLUMNS = 10
"""Delta collects column statistics for silver's first columns only, up to `op`: the LSNs, xid, seq, relation and
table name that every reader filters silver by (data skipping). The arrays and values after them are never
filtered on; their statistics cost the decode's write ~10% (bench/README.md, "2026-11-27")."""

SILVER_PROPERTIES: Mapping[str, str] = {"delta.dataSkippingNumIndexedCols": str(SILVER_STATS_COLUMNS)}
"""Table properties of a silver-shaped Delta table (`silver/changes`, a replay's re-decoded changes), set when the
table is created (an existing table keeps its own)."""

DECODED: Columns = (("kind", "string"), *SILVER, ("content", "binary"))
"""The decoder's output rows before Spark splits them (`decode.decoded`: what each kind of row carries)."""

CATALOG: Columns = (
    ("rel_oid", "long"), ("schema_name", "string"), ("table_name", "string"), ("version", "int"),
    ("valid_from_lsn", "long"), ("valid_to_lsn", "long"), ("replica_identity", "string"),
    ("columns", "array<struct<position:int, name:string, type_oid:int, type_name:string, typmod:int, "
                "nullable:boolean, is_key:boolean>>"),
    ("origin", "string"),
)
"""`_catalog`: every table's schema with the LSN range it was valid for."""

DDL_LOG: Columns = (
    ("commit_lsn", "long"), ("commit_end_lsn", "long"), ("commit_ts", "timestamp"), ("xid", "long"), ("lsn", "long"),
    ("event", "string"), ("command_tag", "string"), ("ddl", "string"), ("ddl_truncated", "boolean"),
    ("object_identity", "string"), ("tables", "array<string>"), ("dropped", "array<string>"),
    ("event_json", "string"), ("bronze_file", "string"),
)
"""`_ddl_log`: the DDL events the capture triggers emitted."""

QUARANTINE: Columns = (
    ("schema_name", "string"), ("table_name", "string"), ("column_name", "string"), ("type_oid", "int"),
    ("raw_value", "string"), ("reason", "string"), ("commit_lsn", "long"), ("xid", "long"), ("seq", "int"),
    ("detected_at", "timestamp"),
    # The row's replica identity key (column -> PostgreSQL text); the whole row for FULL / NOTHING identity.
    # Added after the first release: older _quarantine tables get it by ALTER TABLE ADD COLUMNS.
    ("row_key", "map<string,string>"),
)
"""`_quarantine`: values the merge could not convert to their column's type (stored as NULL in gold)."""

RUNS: Columns = (
    ("run_end_lsn", "long"), ("schema_name", "string"), ("table_name", "string"), ("gold_version", "long"),
    ("finished_at", "timestamp"),  # when the run's every table had merged (one value per run)
    # Added after the first release (the status view's durations, throughput and lag): older _runs tables get
    # them by ALTER TABLE ADD COLUMNS, and their earlier rows read NULL there.
    ("started_at", "timestamp"),  # when this run's merge of the table began
    ("changes", "long"),  # silver rows of the table the run applied (0: the table was already up to date)
    ("last_commit_ts", "timestamp"),  # commit time of the newest change applied (NULL: none); lag = finished - it
)
"""`_runs`: per merge run and table, the gold version it left, when, and how much it applied."""

RUNS_COMPLETE_PROPERTY = "slotlake.runs.completeEnd"
"""`_runs` table property set, to the run's end LSN, by the commit that marks a complete run when every row of that
end was already there (an append of nothing commits nothing; docs/internals.md "Runs")."""

# Gold: the source table's columns, then these.
LSN_COL = "_slotlake_lsn"  # commit LSN of the row's last change
COMMIT_TS_COL = "_slotlake_commit_ts"
DELETED_COL = "_slotlake_deleted"  # soft deletes only
DUP_COL = "_slotlake_dup"  # FULL / NOTHING identity: the copy number among identical rows
# History (`gold_history/<schema>/<table>`): gold's columns, then these.
VALID_FROM_LSN_COL = "_slotlake_valid_from_lsn"
VALID_TO_LSN_COL = "_slotlake_valid_to_lsn"  # NULL while the version is current
VALID_FROM_TS_COL = "_slotlake_valid_from_ts"
VALID_TO_TS_COL = "_slotlake_valid_to_ts"
OP_COL = "_slotlake_op"  # I / U of the change that opened the version; S: the gold row history started from


@dataclass(frozen=True)
class Field:
    """A column of a table whose columns depend on the source (gold, history): its name, its type as Spark SQL
    text (`type_tree` reads it; `DataType.simpleString()` prints it) and whether it may be NULL."""

    name: str
    type: str
    nullable: bool = True


Schema = tuple[Field, ...]


def names(columns: Columns) -> list[str]:
    return [n for n, _ in columns]


def ddl(columns: Columns) -> str:
    """`a long, b array<string>`: the schema as Spark takes it."""
    return ", ".join(f"{n} {t}" for n, t in columns)


_ARROW_SIMPLE = {
    "long": pa.int64(), "bigint": pa.int64(), "int": pa.int32(), "smallint": pa.int16(), "tinyint": pa.int8(),
    "float": pa.float32(), "double": pa.float64(), "string": pa.string(), "boolean": pa.bool_(),
    "binary": pa.binary(), "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),  # Spark's TimestampType in Arrow
    "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def _split_top(text: str) -> list[str]:
    """Split on the commas outside <...> and (...)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "<(") - (ch in ">)")
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


TypeTree = tuple
"""("long",) | ("decimal", precision, scale) | ("array", elem) | ("map", key, value)
| ("struct", ((name, tree), ...))"""


def type_tree(spark_type: str) -> TypeTree:
    """A column type (Spark SQL type text: the contracts above, and gold's types as `DataType.simpleString()`
    prints them), parsed: the one reading both `arrow_type` and the Spark side (`slotlake.spark.schemas`) convert
    from."""
    t = spark_type.strip()
    if t in _ARROW_SIMPLE:
        return (t,)
    m = _DECIMAL.fullmatch(t)
    if m:
        return ("decimal", int(m.group(1)), int(m.group(2)))
    if t.startswith("array<") and t.endswith(">"):
        return ("array", type_tree(t[len("array<"):-1]))
    if t.startswith("map<") and t.endswith(">"):
        key, value = _split_top(t[len("map<"):-1])
        return ("map", type_tree(key), type_tree(value))
    if t.startswith("struct<") and t.endswith(">"):
        fields = [f.split(":", 1) for f in _split_top(t[len("struct<"):-1])]
        return ("struct", tuple((n.strip(), type_tree(ft)) for n, ft in fields))
    raise ValueError(f"unknown column type {spark_type!r}; add it to slotlake.contracts")


def arrow_type(spark_type: str | TypeTree) -> pa.DataType:
    tree = type_tree(spark_type) if isinstance(spark_type, str) else spark_type
    kind = tree[0]
    if kind == "array":
        return pa.list_(arrow_type(tree[1]))
    if kind == "map":
        return pa.map_(arrow_type(tree[1]), arrow_type(tree[2]))
    if kind == "struct":
        return pa.struct([pa.field(n, arrow_type(sub)) for n, sub in tree[1]])
    if kind == "decimal":
        return pa.decimal128(tree[1], tree[2])
    return _ARROW_SIMPLE[kind]


def arrow_schema(columns: Columns) -> pa.Schema:
    return pa.schema([(n, arrow_type(t)) for n, t in columns])


# ---- commit metadata ------------------------------------------------------------------------------------------

META_KEY = "slotlake"
STAGE_DECODE = "decode"  # silver/changes
STAGE_DDL_LOG = "ddl_log"
STAGE_CATALOG = "catalog"
STAGE_MERGE = "merge"  # gold
STAGE_SNAPSHOT = "snapshot"  # gold: the load of an initial copy
STAGE_HISTORY = "history"
STAGE_RUNS = "runs"
STAGE_RECOVER = "recover"


@dataclass(frozen=True)
class CommitMeta:
    """The `{"slotlake": {...}}` object of a Delta commit's userMetadata."""

    stage: str | None
    end_lsn: Lsn | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # the stage's other keys, as JSON values

    def json(self) -> str:
        body: dict[str, Any] = {} if self.end_lsn is None else {"end_lsn": str(self.end_lsn)}
        body["stage"] = self.stage
        body.update(self.extra)
        return json.dumps({META_KEY: body}, separators=(",", ":"))

    def get(self, key: str) -> Any:
        return self.extra.get(key)

    @classmethod
    def parse(cls, user_metadata: str | None) -> CommitMeta | None:
        """The record a commit's userMetadata holds; None for no metadata, someone else's, or not JSON.
        An `end_lsn` that is not an LSN reads as None (not a watermark)."""
        if not user_metadata:
            return None
        try:
            doc: Any = json.loads(user_metadata)
        except ValueError:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get(META_KEY), dict):
            return None
        body = doc[META_KEY]
        end: Lsn | None
        try:
            end = Lsn.parse(body["end_lsn"]) if body.get("end_lsn") is not None else None
        except (ValueError, TypeError):
            end = None
        stage = body.get("stage")
        return cls(stage=stage if isinstance(stage, str) else None, end_lsn=end,
                   extra={k: v for k, v in body.items() if k not in ("end_lsn", "stage")})

    def fields(self) -> dict[str, Any]:
        """The object as written (for reports): end_lsn as text, stage, the other keys."""
        return json.loads(self.json())[META_KEY]
