"""Recovered tables back into PostgreSQL: CREATE TABLE with the historical columns, types and key, then COPY.

The table definition comes from the `_catalog` version valid at the recovered commit LSN (`CatalogVersion`):
column names and order, the type (built-in types by OID and typmod through the target's own `format_type`, so
`numeric(12,2)`, `varchar(100)`, `timestamp(3) with time zone` come back exactly; other types by the name the
catalog recorded), and the key: a PRIMARY KEY for REPLICA IDENTITY DEFAULT, a UNIQUE constraint for USING INDEX
(no key for FULL / NOTHING), and NOT NULL where `_catalog` recorded it (`CatalogColumn.nullable` False: known
from the bootstrap read and DDL events, not from Relation messages). A non-built-in type (enum, domain) must
exist in the target: recover does not create it (its definition is not in `_catalog`) and fails naming it. All
tables of one recovery are written in ONE transaction: either every table is
there, or none is (and with `replace`, the old tables are still there).

Rows are streamed into `COPY ... FROM STDIN` as they come (an iterator), never collected whole. The session's
TimeZone is UTC: the rows carry UTC timestamps.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from slotlake.catalog import BUILTIN_TYPE_NAMES, CatalogVersion
from slotlake.errors import RecoverError
from slotlake.names import TableName
from slotlake.source.connection import table_ident

log = logging.getLogger(__name__)

_PROGRESS_ROWS = 1_000_000


@dataclass(frozen=True)
class TableLoad:
    """One table to write: its name in the target, its historical definition, and its rows (in column order)."""

    into: TableName
    version: CatalogVersion
    rows: Iterable[Sequence[Any]]


def _connect(conninfo: str, password: str | None = None):
    import psycopg

    if password is not None:
        return psycopg.connect(conninfo, options="-c TimeZone=UTC", password=password)
    return psycopg.connect(conninfo, options="-c TimeZone=UTC")


def refuse_existing(conninfo: str, password: str | None, names: Sequence[TableName]) -> None:
    """Raise RecoverError naming the target tables that already exist (recover never overwrites without replace)."""
    with _connect(conninfo, password) as conn:
        there = [n for n in names
                 if conn.execute("SELECT to_regclass(%s)", (sql.Identifier(*n).as_string(conn),)).fetchone()[0]]
    if there:
        raise RecoverError(f"{', '.join(str(n) for n in there)} already exist(s) in the target database; pass "
                           "--replace to overwrite, or choose another --into-schema")


def key_clause(version: CatalogVersion) -> sql.Composable | None:
    """PRIMARY KEY (DEFAULT identity) or UNIQUE (USING INDEX) over the key columns; None without a key. Pure."""
    keys = [c.name for c in sorted(version.columns, key=lambda c: c.position) if c.is_key]
    if not keys:
        return None
    kind = {"d": "PRIMARY KEY", "i": "UNIQUE"}.get(version.replica_identity)
    if kind is None:
        return None
    return sql.SQL(kind + " ({})").format(sql.SQL(", ").join(map(sql.Identifier, keys)))


def create_table(into: TableName, columns: Sequence[tuple[str, str]], key: sql.Composable | None) -> sql.Composed:
    """CREATE TABLE into (col type, ..., key). `columns`: (name, SQL type text as format_type gives it). Pure."""
    parts: list[sql.Composable] = [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(type_sql))
                                   for name, type_sql in columns]
    if key is not None:
        parts.append(key)
    return sql.SQL("CREATE TABLE {} ({})").format(table_ident(into), sql.SQL(", ").join(parts))


def custom_type_sql(type_name: str) -> str:
    """A non-built-in type as the catalog recorded it (`schema.name`, or a bare name) as SQL text. Pure."""
    schema, _, name = type_name.rpartition(".")
    return sql.Identifier(*([schema, name] if schema else [name])).as_string(None)


def column_types(conn, version: CatalogVersion) -> list[tuple[str, str]]:
    """(name, SQL type) of each column in position order; built-in types via the target's format_type()."""
    cols = sorted(version.columns, key=lambda c: c.position)
    builtin = [c for c in cols if c.type_oid in BUILTIN_TYPE_NAMES]
    formatted = dict(zip([c.name for c in builtin], (r[0] for r in conn.execute(
        "SELECT format_type(o, t) FROM unnest(%s::oid[], %s::int[]) WITH ORDINALITY AS u(o, t, n) ORDER BY n",
        ([c.type_oid for c in builtin], [c.typmod for c in builtin])).fetchall())))
    out = []
    for c in cols:
        if c.name in formatted:
            out.append((c.name, formatted[c.name]))
        elif c.type_name:
            type_sql = custom_type_sql(c.type_name)
            if conn.execute("SELECT to_regtype(%s)", (type_sql,)).fetchone()[0] is None:
                # An enum or domain lives in the source database only; its definition is not in _catalog.
                raise RecoverError(f"type {c.type_name} of {TableName(version.schema_name, version.table_name)}."
                                   f"{c.name} does not exist in the target database; create it there first (CREATE "
                                   "TYPE ..., as on the source) or recover --to a Delta folder")
            out.append((c.name, type_sql))
        else:
            raise RecoverError(f"{version.schema_name}.{version.table_name}.{c.name}: type OID {c.type_oid} has no "
                               "recorded name in _catalog; create the table yourself and load the Delta recovery")
    return out


def load_tables(conninfo: str, loads: Iterable[TableLoad], replace: bool, password: str | None = None) -> list[int]:
    """Create and fill every table in one transaction; returns the rows written per table (in order).

    Without `replace` an existing table aborts the whole transaction (CREATE TABLE fails) with RecoverError."""
    import psycopg

    counts: list[int] = []
    with _connect(conninfo, password) as conn:
        for load in loads:
            schema = load.into.schema
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            if replace:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table_ident(load.into)))
            types = column_types(conn, load.version)
            try:
                conn.execute(create_table(load.into, types, key_clause(load.version)))
            except psycopg.errors.DuplicateTable:
                raise RecoverError(f"{load.into} already exists in the target database; pass --replace to "
                                   "overwrite, or choose another --into-schema") from None
            counts.append(_copy(conn, load.into, [n for n, _ in types], load.rows))
            _set_not_null(conn, load.into, load.version)
        conn.commit()
    return counts


def _set_not_null(conn, into: TableName, version: CatalogVersion) -> None:
    """NOT NULL on the columns `_catalog` knows were NOT NULL at the point (nullable False; unknown: left as is).

    After the COPY and in a savepoint: a column added with NOT NULL DEFAULT holds NULL in gold for rows no change
    has carried since (the table rewrite is not streamed), and the recovery must not fail on it."""
    import psycopg

    cols = [c.name for c in sorted(version.columns, key=lambda c: c.position) if c.nullable is False]
    if not cols:
        return
    stmt = sql.SQL("ALTER TABLE {} {}").format(table_ident(into), sql.SQL(", ").join(
        sql.SQL("ALTER COLUMN {} SET NOT NULL").format(sql.Identifier(c)) for c in cols))
    try:
        with conn.transaction():
            conn.execute(stmt)
    except psycopg.errors.NotNullViolation:
        log.warning("recover: %s: left %s nullable: the recovered rows hold NULL there (a column added with a "
                    "default the change stream never carried)", into, ", ".join(cols))


def _copy(conn, into: TableName, columns: list[str], rows: Iterable[Sequence[Any]]) -> int:
    started = time.monotonic()
    n = 0
    stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(table_ident(into),
                                                     sql.SQL(", ").join(map(sql.Identifier, columns)))
    with conn.cursor().copy(stmt) as copy:
        for row in _checked(rows, len(columns)):
            copy.write_row(row)
            n += 1
            if n % _PROGRESS_ROWS == 0:
                log.info("recover: %s: %d rows copied (%.0f rows/s)", into, n,
                         n / max(time.monotonic() - started, 1e-9))
    log.info("recover: %s: %d rows copied in %.1fs", into, n, time.monotonic() - started)
    return n


def _checked(rows: Iterable[Sequence[Any]], width: int) -> Iterator[Sequence[Any]]:
    for row in rows:
        if len(row) != width:  # a bug, not bad data: never write a shifted row
            raise RecoverError(f"internal: a row with {len(row)} values for {width} columns")
        yield row
