"""Gold schema evolution in the merge (docs/internals.md "Gold: schema evolution"): the layouts a batch's changes
were written in, the plan over all of them, gold's schema brought to it, and each change typed to gold's columns.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from slotlake import delta_log
from slotlake.config import SchemaChanges
from slotlake.decode.layouts import SHAPE_FIELDS
from slotlake.errors import MergeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.evolution import ColumnHistoryEvent, Evolution, column_events
from slotlake.merge.plan import (
    COLUMN_MAPPING,
    DELETION_VECTORS,
    KeyStrategy,
    TablePlan,
    TableShape,
    needs_column_mapping,
    plan_table,
)
from slotlake.merge.typed_values import typed_value
from slotlake.names import spark_ident as _q
from slotlake.spark.schemas import spark_type

log = logging.getLogger(__name__)

TEXT_OID = 25

Layout = tuple[tuple[int, int], TableShape]  # ((commit_lsn, seq) of its first change, shape)


def _shape_of(schema: str, table: str, s) -> TableShape:
    return TableShape(schema, table, tuple(s["columns"]), tuple(s["type_oids"]), tuple(s["typmods"]),
                      tuple(s["key_columns"] or ()), s["replica_identity"])


def shape_col() -> Column:
    return F.struct(*SHAPE_FIELDS)


def layouts_of(batch: DataFrame, spans: list) -> list[Layout]:
    """The column layouts of the batch's row changes in commit order, each with the id of its first change.

    `spans`: per layout of the row changes (shape row, lo, hi), lo/hi its first and last (commit_lsn, seq) (the
    merge's one pass over the batch).
    Usually one. Several when the source's schema changed: one per switch, so a layout that comes back (a column
    added and dropped again) is a new entry. Only small summaries reach the driver.
    """
    rows = batch.where(F.col("op") != "T")
    shape = shape_col().alias("shape")
    spans = sorted(spans, key=lambda r: r[1])
    if all(a[2] < b[1] for a, b in zip(spans, spans[1:])):
        return [(lo, _shape_of(s["schema_name"], s["table_name"], s)) for s, lo, _ in spans]
    # A layout comes back: find every switch (one row per transaction and layout, ordered; a small result).
    per_tx = rows.groupBy("commit_lsn", shape).agg(F.min("seq").alias("lo"))
    w = Window.orderBy("commit_lsn", "lo")
    switches = (per_tx.withColumn("prev", F.lag("shape").over(w))
                .where(F.col("prev").isNull() | (F.col("prev") != F.col("shape")))
                .orderBy("commit_lsn", "lo").collect())
    return [((int(r["commit_lsn"]), int(r["lo"])), _shape_of(r["shape"]["schema_name"], r["shape"]["table_name"],
                                                            r["shape"])) for r in switches]


def gold_at_watermark(session: SparkSession, gold: str, marked_version: int | None) -> list[tuple[str, str]]:
    """Gold's source columns (name, Spark SQL type text) as of its newest watermarked commit (the state the run
    starts from; without one, the table's first version, the empty table slotlake created).

    Not the latest schema: a run that died after evolving the schema (ALTERs are their own commits) and before
    its merge commit must see the same start again, so the re-run makes the same decisions (defaults included).
    """
    from delta.tables import DeltaTable

    version = marked_version
    if version is None:
        version = min(r["version"] for r in DeltaTable.forPath(session, gold).history().select("version").collect())
    local = delta_log.schema_at(gold, version) if delta_log.readable(gold) else None
    if local is not None:  # the log's schema: no Spark job to resolve a time-travel snapshot
        fields = StructType.fromJson(local).fields
    else:
        fields = session.read.format("delta").option("versionAsOf", version).load(gold).schema.fields
    return [(f.name, f.dataType.simpleString()) for f in fields if not f.name.startswith("_slotlake_")]


@dataclass(frozen=True)
class TableDefinitions:
    """The bootstrap read's and the DDL events' table definitions up to a run's end, read once per run (not per
    table: each read of `_ddl_log` is several Spark jobs)."""

    definitions: tuple[tuple[int, Any], ...]  # (commit LSN, TableDef)
    captured: bool  # DDL capture in use: `_ddl_log` holds events

    def column_events(self, schema: str, table: str) -> tuple[list[ColumnHistoryEvent], bool]:
        """Renames and adds of the table, and whether DDL capture is in use."""
        return column_events(list(self.definitions), schema, table), self.captured


def table_definitions(session: SparkSession, paths: LakePaths, end: Lsn) -> TableDefinitions:
    from delta.tables import DeltaTable

    from slotlake.decode.job import ddl_log_path
    from slotlake.source.catalog_read import as_published, list_bootstrap
    from slotlake.source.ddl import parse_ddl_event

    boots = list_bootstrap(paths.root)
    definitions = [(b.lsn.value, t) for b in boots for t in b.tables]
    log_path = ddl_log_path(paths)
    captured = False
    if DeltaTable.isDeltaTable(session, log_path):
        events = session.read.format("delta").load(log_path).where(F.col("commit_lsn") <= int(end))
        captured = events.limit(1).count() > 0
        for r in events.where(F.size("tables") > 0).select("commit_lsn", "lsn", "event_json") \
                .orderBy("commit_lsn", "lsn").collect():
            definitions += [(int(r["commit_lsn"]), as_published(t, boots, int(r["commit_lsn"])))
                            for t in parse_ddl_event(r["event_json"].encode("utf-8")).tables]
    return TableDefinitions(tuple(definitions), captured)


def unified_plan(name: str, evo: Evolution, shapes: list[TableShape], delete_mode: str,
                  unconstrained_numeric: Callable[[str], str], *, keyless_appends: bool = False) -> TablePlan:
    """The plan over gold's columns after the run: type of the newest layout holding each column, its keys."""
    oids, mods = [], []
    for i in range(len(evo.columns)):
        where = [(k, at) for k, p in enumerate(evo.positions) if (at := p[i]) is not None]
        if where:
            k, at = where[-1]
            oids.append(shapes[k].type_oids[at])
            mods.append(shapes[k].typmods[at])
        else:  # a column the source dropped: never typed again (its values are NULL from now on)
            oids.append(TEXT_OID)
            mods.append(-1)
    last = shapes[-1]
    gold_of = {p: evo.columns[i] for i, p in enumerate(evo.positions[-1]) if p is not None}
    keys = tuple(gold_of[last.columns.index(k)] for k in last.key_columns)
    shape = TableShape(last.schema_name, last.table_name, evo.columns, tuple(oids), tuple(mods), keys,
                       last.replica_identity)
    return plan_table(shape, delete_mode, unconstrained_numeric, keyless_appends=keyless_appends)


def with_types(schema: StructType, evo: Evolution) -> StructType:
    types = dict(zip(evo.columns, evo.types))
    return StructType([StructField(f.name, spark_type(types[f.name]) if f.name in types else f.dataType, f.nullable)
                       for f in schema.fields])


def sorted_fields(schema: StructType) -> StructType:
    return StructType(sorted(schema.fields, key=lambda f: f.name))


def evolve_gold(session: SparkSession, gold: str, name: str, evo: Evolution, plan: TablePlan,
                 modes: SchemaChanges = SchemaChanges()) -> list[str]:
    """Bring gold's schema to `evo` with Delta DDL, each step only if not done yet (a re-run repeats none).

    Returns what was done, for the report. Old rows of an added column get the value PostgreSQL gave them (its
    constant default) by an UPDATE of the rows still NULL, repeated harmlessly by a re-run. Renames, drops and
    widenings follow `modes` (config `schema_changes`): `rewrite` applies them in one rewrite of the table
    (`_rewrite_gold`), `column_mapping` / `type_widening` in place with those Delta table features.
    """
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(session, gold)
    current = {f.name: f.dataType.simpleString() for f in table.toDF().schema.fields}
    props = _LazyProperties(session, gold)  # read only when a schema change needs them (most runs have none)
    ref = f"delta.{_q(gold)}"
    done: list[str] = []
    renames = [(o, n) for o, n in evo.renames if o in current and n not in current]
    drops = [d for d in evo.drops if d in current]
    new_names = [n for _, n in renames] + [a.name for a in evo.adds if a.name not in current]
    if ((modes.rename == "column_mapping" and (renames or drops)) or needs_column_mapping(new_names)) \
            and props.get(COLUMN_MAPPING) != "name":
        # Column mapping by name: a rename or drop changes metadata only, the data files stay as they are; and
        # Delta allows names with spaces, commas, parentheses ... only under it.
        session.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('{COLUMN_MAPPING}' = 'name')")
    rewrite_renames: dict[str, str] = {}
    rewrite_drops: list[str] = []
    if modes.rename == "column_mapping":
        for old, new in renames:
            session.sql(f"ALTER TABLE {ref} RENAME COLUMN {_q(old)} TO {_q(new)}")
            current[new] = current.pop(old)
            done.append(f"renamed {old} to {new}")
    else:
        rewrite_renames = dict(renames)
        current = {rewrite_renames.get(c, c): t for c, t in current.items()}
        rewrite_drops = [d for d in evo.drops if d in current]
        done += [f"renamed {old} to {new}" for old, new in renames]
    widen = [(c, t) for c, t in evo.widen if c in current and current[c] != t]
    rewrite_widen = dict(widen) if modes.widen == "rewrite" else {}
    if rewrite_renames or rewrite_widen or rewrite_drops:
        _rewrite_gold(session, gold, rewrite_renames, rewrite_widen, rewrite_drops)
        done += [f"widened {c} to {t}" for c, t in rewrite_widen.items()]
        log.info("%s: gold table rewritten in a new Delta version (renamed %s, widened %s, dropped %s)", name,
                 rewrite_renames or "-", list(rewrite_widen) or "-", rewrite_drops or "-")
        widen = [] if rewrite_widen else widen
    if widen and props.get("delta.enableTypeWidening") != "true":
        session.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    for c, t in widen:
        try:
            session.sql(f"ALTER TABLE {ref} ALTER COLUMN {_q(c)} TYPE {t}")
        except Exception as e:  # AnalysisException: a change Delta type widening does not support
            raise MergeError(
                f"{name}: column {c} changed type from {current[c]} to {t}, which Delta "
                f"type widening cannot apply ({str(e).splitlines()[0][:200]}); rebuild the table: `slotlake resync "
                f"<source>`, or replay it into a new Delta table with `slotlake replay <source> --table {name} "
                "--from <LSN of the change> --to <LSN> --dest <path>`") from None
        done.append(f"widened {c} to {t}")
    adds = [a for a in evo.adds if a.name not in current]
    if adds:
        session.sql(f"ALTER TABLE {ref} ADD COLUMNS (" + ", ".join(
            f"{_q(a.name)} {a.dtype}" for a in adds) + ")")
        done += [f"added {a.name}" for a in adds]
    for a in evo.adds:
        if a.existing_rows is not None:
            i = plan.shape.columns.index(a.name)
            value = typed_value(F.lit(a.existing_rows), plan.shape.type_oids[i], plan.shape.typmods[i],
                                plan.numeric_mode(i))[0]
            # A fresh handle: the one above predates the ALTERs and would not know the column.
            DeltaTable.forPath(session, gold).update(F.col(_q(a.name)).isNull(),
                                                     {_q(a.name): value.cast(spark_type(a.dtype))})
    if modes.rename == "column_mapping":
        for d in drops:
            session.sql(f"ALTER TABLE {ref} DROP COLUMN {_q(d)}")
            done.append(f"dropped {d}")
    done += [f"dropped {d}" for d in rewrite_drops]
    done += [f"kept dropped column {c} (NULL from now on)" for c in evo.dropped_kept]
    for line in done:
        log.info("%s: gold schema: %s", name, line)
    return done


def set_deletion_vectors(session: SparkSession, gold: str, on: bool) -> bool:
    """Turn gold's deletion vectors on or off as the config says (`SourceConfig.uses_deletion_vectors`), if the
    table is not that way yet: one metadata commit without slotlake's watermark, like the schema ALTERs. Turning
    them off stops new ones; the reader feature and the vectors already written stay until the files are
    rewritten (README "Big gold tables"). Returns whether the table changed."""
    current = _LazyProperties(session, gold).get(DELETION_VECTORS) == "true"
    if current == on:
        return False
    session.sql(f"ALTER TABLE delta.{_q(gold)} SET TBLPROPERTIES ('{DELETION_VECTORS}' = '{str(on).lower()}')")
    log.info("%s: deletion vectors turned %s (config deletion_vectors)", gold, "on" if on else "off")
    return True


class _LazyProperties:
    """A Delta table's properties, read on first use: from the log of a local table, else with Spark."""

    def __init__(self, session: SparkSession, path: str) -> None:
        self._session, self._path = session, path
        self._props: dict[str, str] | None = None

    def get(self, key: str) -> str | None:
        if self._props is None:
            local = delta_log.table_properties(self._path) if delta_log.readable(self._path) else None
            if local is None:
                from delta.tables import DeltaTable

                local = DeltaTable.forPath(self._session, self._path).detail().select("properties").collect()[0][0]
            self._props = dict(local or {})
        return self._props.get(key)


def _rewrite_gold(session: SparkSession, gold: str, renames: dict[str, str], widen: dict[str, str],
                  drops: Sequence[str]) -> None:
    """Rename, widen (`widen` by new name) and drop columns by rewriting the whole table in one new Delta version
    (overwrite + overwriteSchema).

    Why not in place: Delta type widening adds the `typeWidening` reader feature, which delta-rs (deltalake, and
    so Polars and most Python readers) refuses, and delta-rs 1.6 reads the columns of a column-mapped table that
    were renamed or added later as NULL. A plain rewrite keeps the protocol as it was. Like the ALTERs, the commit
    carries no slotlake userMetadata, so the watermark stays that of the last merge (the run's MERGE commits the
    new one); table properties and idempotent-write ids (txn actions) survive an overwrite, and earlier versions
    stay readable with time travel. Widening casts are exact: `plan_evolution` only widens to a type that holds
    every value of the old one. Cost: the table's size in I/O, once per run that needs it.
    """
    df = session.read.format("delta").load(gold)
    cols = []
    for f in df.schema.fields:
        new = renames.get(f.name, f.name)
        if new in drops:  # `drops` and `widen` name columns after the renames
            continue
        col = F.col(_q(f.name))
        cols.append((col.cast(spark_type(widen[new])) if new in widen else col).alias(new))
    df.select(*cols).write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(gold)


def typed_layouts(after: DataFrame, plan: TablePlan, evo: Evolution, layouts: list[Layout],
                   unconstrained_numeric: Callable[[str], str]) -> DataFrame:
    """`typed_changes` over gold's columns: each change typed with its own layout, cast to gold's type, and a
    column its layout lacks filled (the added column's existing-row value, else NULL). `new`/`old` are rewritten
    in gold column order so the quarantine reads them by gold position. A layout's column is typed with the
    numeric.unconstrained of its name in that layout, as `plan_evolution` typed it."""
    ncols = len(plan.shape.columns)
    need_old = set(range(ncols)) if plan.strategy is KeyStrategy.FULL_ROW else set(plan.key_positions)
    parts = []
    for k, ((lsn, seq), shape) in enumerate(layouts):
        seg = after.where((F.col("commit_lsn") > lsn) | ((F.col("commit_lsn") == lsn) & (F.col("seq") >= seq)))
        if k + 1 < len(layouts):
            (nl, ns), _ = layouts[k + 1]
            seg = seg.where((F.col("commit_lsn") < nl) | ((F.col("commit_lsn") == nl) & (F.col("seq") < ns)))
        cols: list[Column] = [F.col(c) for c in ("commit_lsn", "seq", "commit_ts", "xid", "op")]
        for i, (p, fill, type_text) in enumerate(zip(evo.positions[k], evo.fills[k], evo.types)):
            dtype = spark_type(type_text)
            if p is None:
                v = (F.lit(None).cast(dtype) if fill is None else
                     typed_value(F.lit(fill), plan.shape.type_oids[i], plan.shape.typmods[i],
                                 plan.numeric_mode(i))[0].cast(dtype))
                cols += [v.alias(f"__n{i}"), F.lit(None).cast("string").alias(f"__r{i}"), F.lit(False).alias(f"__u{i}")]
                if i in need_old:
                    cols.append(F.when(F.col("old").isNotNull(), v).alias(f"__o{i}"))
                continue
            oid, mod, mode = shape.type_oids[p], shape.typmods[p], unconstrained_numeric(shape.columns[p])
            value, reason = typed_value(F.col("new").getItem(p), oid, mod, mode)
            cols += [value.cast(dtype).alias(f"__n{i}"), reason.alias(f"__r{i}"),
                     F.coalesce(F.array_contains(F.col("unchanged"), p), F.lit(False)).alias(f"__u{i}")]
            if i in need_old:
                cols.append(typed_value(F.col("old").getItem(p), oid, mod, mode)[0].cast(dtype).alias(f"__o{i}"))

        def raw(arr: str, k: int = k) -> Column:
            return F.when(F.col(arr).isNull(), F.lit(None)).otherwise(F.array(*[
                # F.get: NULL past the end (an old tuple may hold only the key), where getItem fails under ANSI
                F.get(F.col(arr), p) if p is not None else F.lit(None).cast("string") for p in evo.positions[k]]))

        parts.append(seg.select(*cols, raw("old").alias("old"), raw("new").alias("new")))
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out
