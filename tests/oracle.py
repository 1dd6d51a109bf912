"""The end-to-end oracle: a gold Delta table must equal its PostgreSQL table, row by row.

`assert_gold_equals_pg(gold_path, dsn, "public.orders")` (or `'"Sales Dept"."Order Items"'`: the
table as PostgreSQL reads it, `slotlake.names.TableName`) reads both sides typed (PostgreSQL through
psycopg with UTC session settings, gold through delta-rs's Arrow tables so timestamps and decimals arrive exact),
turns every value into a canonical text form, and compares the two rows as multisets (duplicate rows count: a
REPLICA IDENTITY FULL table may hold identical rows). Columns the pipeline adds (`_slotlake_*`) are ignored;
rows marked `_slotlake_deleted` (delete_mode soft) are left out. Column sets must match exactly.

Where the PostgreSQL type has a natural Spark type, the gold value's Python type is checked too (an int column
stored as text fails even if the text matches). Other types compare through PostgreSQL's text form.
`numeric_text` names the numeric columns gold keeps as text (`numeric.unconstrained: string`): those must be
strings in gold, equal to PostgreSQL's own text character for character (`1.50` is not `1.5`; NaN, Infinity).
"""
from __future__ import annotations

import collections
import datetime as dt
import decimal
import json
import math
import uuid
from collections.abc import Collection
from typing import Any

import psycopg
from psycopg import sql

from slotlake.names import TableName, spark_ident
from slotlake.source.connection import table_ident

# PostgreSQL type name -> the Python types a correct gold value may have (as read from Arrow).
_TYPED: dict[str, tuple[type, ...]] = {
    "int2": (int,), "int4": (int,), "int8": (int,), "oid": (int,),
    "float4": (float,), "float8": (float,),
    "bool": (bool,),
    "numeric": (decimal.Decimal,),
    "date": (dt.date,),
    "timestamp": (dt.datetime,), "timestamptz": (dt.datetime,),
    "bytea": (bytes,),
    "text": (str,), "varchar": (str,), "bpchar": (str,), "name": (str,),
    "json": (str, dict, list), "jsonb": (str, dict, list),
    "uuid": (str, uuid.UUID),
}


def _typed(pg_type: str) -> bool:
    return pg_type in _TYPED or (pg_type.startswith("_") and pg_type[1:] in _TYPED)


def canonical(value: Any, pg_type: str) -> str | None:
    """One text form per value, equal on both sides exactly when the values are equal."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return repr(float(value)) if pg_type == "float8" else repr(float(f"{value:.9g}"))
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            return "NaN"
        # normalize() rounds to the context precision (28 digits by default): give it room for any numeric
        return format(value.normalize(decimal.Context(prec=200_000)), "f") if value != 0 else "0"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if pg_type in ("json", "jsonb"):
        parsed = json.loads(value) if isinstance(value, str) else value
        return json.dumps(parsed, sort_keys=True, separators=(",", ":"))
    if isinstance(value, (list, tuple)):
        return json.dumps([canonical(v, pg_type.lstrip("_")) for v in value])
    if isinstance(value, dict):
        return json.dumps({str(k): canonical(v, "") for k, v in sorted(value.items())})
    return str(value)


def pg_columns(conn: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    """(column, type name) in table order, dropped columns excluded."""
    schema, name = TableName.parse(table)
    rows = conn.execute(
        """SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid
           WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""",
        (schema, name)).fetchall()
    assert rows, f"table {table} not found in PostgreSQL"
    return [(r[0], r[1]) for r in rows]


def pg_rows(dsn: str, table: str, numeric_text: Collection[str] = ()) -> tuple[list[tuple[str, str]], list[tuple]]:
    with psycopg.connect(dsn, options="-c TimeZone=UTC -c extra_float_digits=3 -c IntervalStyle=iso_8601 "
                                      "-c DateStyle=ISO") as conn:
        cols = pg_columns(conn, table)
        types = dict(cols)
        for c in numeric_text:
            assert types.get(c) in ("numeric", "_numeric"), f"{table}.{c} is not a numeric column: {types.get(c)}"

        # Typed where the PostgreSQL type has a natural Spark type (arrays of those too); otherwise the type's
        # output function (format %s), which is exactly the text pgoutput sends. `numeric_text` columns: numeric's
        # output function too (numeric::text is it; numeric[]::text[] applies it to each element).
        # (format('%s', NULL) is '', so NULL stays NULL through a CASE)
        def expr(c: str, t: str) -> sql.Composable:
            if c in numeric_text:
                return sql.SQL("{}::text" + ("[]" if t.startswith("_") else "")).format(sql.Identifier(c))
            if _typed(t):
                return sql.Identifier(c)
            return sql.SQL("CASE WHEN {c} IS NOT NULL THEN format('%s', {c}) END").format(c=sql.Identifier(c))

        select = sql.SQL(", ").join(expr(c, t) for c, t in cols)
        rows = conn.execute(sql.SQL("SELECT {} FROM {}").format(select, table_ident(TableName.parse(table)))).fetchall()
    return cols, rows


def gold_rows(spark: Any, gold_path: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Gold's rows through Arrow (exact decimals, UTC timestamps), soft-deleted rows left out."""
    df = spark.read.format("delta").load(gold_path)
    if "_slotlake_deleted" in df.columns:
        df = df.where("NOT coalesce(_slotlake_deleted, false)")
    data = [c for c in df.columns if not c.startswith("_slotlake_")]
    return data, df.select(*[spark_ident(c) for c in data]).toArrow().to_pylist()


def gold_rows_delta_rs(gold_path: str) -> tuple[list[str], list[dict[str, Any]]]:
    """`gold_rows` read through delta-rs (`deltalake`) instead of Spark, as a Polars or DuckDB user would."""
    import pyarrow.compute as pc

    from delta_readers import read_delta_rs

    table = read_delta_rs(gold_path)
    if "_slotlake_deleted" in table.column_names:
        table = table.filter(pc.invert(pc.fill_null(table["_slotlake_deleted"], False)))
    data = [c for c in table.column_names if not c.startswith("_slotlake_")]
    return data, table.select(data).to_pylist()


def assert_gold_equals_pg(gold_path: str, dsn: str, table: str, *, numeric_text: Collection[str] = (),
                          reader: str = "delta-rs", spark: Any | None = None) -> int:
    """Assert gold == PostgreSQL for `table` (schema.table); returns the row count compared. `numeric_text`: the
    numeric columns gold must hold as PostgreSQL's exact text (numeric.unconstrained: string).
    Gold is read with delta-rs (`deltalake`): no Spark query per comparison. That Spark reads every Delta table the
    same is checked once per test, at its end (tests/conftest.py `delta_readers_agree`: every table under its
    `tmp_path`; `delta_readers.assert_all_readers_agree` for lakes a module shares). `reader="spark"` reads gold
    with Spark instead (`spark`, else a session started here): for a table delta-rs refuses on purpose (an
    opted-in reader feature)."""
    if reader == "delta-rs":
        gold_cols, got_rows = gold_rows_delta_rs(gold_path)
    else:
        if spark is None:
            from slotlake.spark.session import get_spark

            spark = get_spark("slotlake-oracle", "local[2]")
        gold_cols, got_rows = gold_rows(spark, gold_path)
    cols, want_rows = pg_rows(dsn, table, numeric_text)
    assert sorted(gold_cols) == sorted(c for c, _ in cols), (
        f"{table}: gold columns {sorted(gold_cols)} != PostgreSQL columns {sorted(c for c, _ in cols)}")
    for row in got_rows:
        for c, t in cols:
            v = row[c]
            if v is not None and c in numeric_text:
                text = isinstance(v, str) or (isinstance(v, list) and all(e is None or isinstance(e, str) for e in v))
                assert text, f"{table}.{c}: numeric kept as text landed in gold as {type(v).__name__} ({v!r})"
            elif v is not None and t.startswith("_") and _typed(t):
                assert isinstance(v, list), f"{table}.{c}: PostgreSQL array {t} landed in gold as {type(v).__name__}"
            elif v is not None and t in _TYPED:
                assert isinstance(v, _TYPED[t]) and not (t != "bool" and isinstance(v, bool)), (
                    f"{table}.{c}: PostgreSQL type {t} landed in gold as {type(v).__name__} ({v!r})")
    want = collections.Counter(tuple(canonical(v, t) for v, (_, t) in zip(r, cols)) for r in want_rows)
    got = collections.Counter(tuple(canonical(r[c], t) if _typed(t) else (None if r[c] is None else str(r[c]))
                                    for c, t in cols) for r in got_rows)
    if want != got:
        missing = list((want - got).elements())[:5]
        extra = list((got - want).elements())[:5]
        names = [c for c, _ in cols]
        raise AssertionError(
            f"{table}: gold differs from PostgreSQL ({sum(want.values())} rows in PostgreSQL, "
            f"{sum(got.values())} in gold)\ncolumns: {names}\nin PostgreSQL, not gold: {missing}\n"
            f"in gold, not PostgreSQL: {extra}")
    return sum(want.values())
