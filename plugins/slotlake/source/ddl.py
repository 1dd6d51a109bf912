"""DDL capture: install/remove the event triggers of `sql/ddl_capture.sql`, and parse the events they emit.

The triggers call `pg_logical_emit_message(true, 'slotlake.ddl', <json>)` after table DDL, so each DDL arrives
in the pgoutput stream as a Message at its exact commit. `parse_ddl_event` turns one such payload into a
`DdlEvent`; it is pure (bytes in, values out) because the decode stage calls it on Spark executors. The
bootstrap read in `catalog_read.py` produces the same `TableDef` values from `pg_catalog`.

Installing needs a superuser (PostgreSQL only lets superusers create event triggers).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotlake.contracts import ReplicaIdentity
from slotlake.errors import DecodeError, PreflightError
from slotlake.names import TableName

if TYPE_CHECKING:  # psycopg is not needed to parse events (Spark executors)
    import psycopg

log = logging.getLogger(__name__)


FORMAT_VERSION = 1
"""The JSON format version this parser reads (the `version` key written by sql/ddl_capture.sql)."""

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"  # package data (plugins/slotlake/sql; `sql/` in a checkout)
INSTALL_SQL = SQL_DIR / "ddl_capture.sql"
UNINSTALL_SQL = SQL_DIR / "ddl_capture_uninstall.sql"
TRIGGER_NAMES = ("slotlake_ddl_command_end", "slotlake_sql_drop")


@dataclass(frozen=True, slots=True)
class ColumnDef:
    """One live column of a table, as in pg_attribute."""

    attnum: int  # stable across renames and never reused: tells a rename from drop + add
    name: str
    type_oid: int
    type_name: str  # format_type(atttypid, atttypmod), names qualified as seen from search_path pg_catalog
    typmod: int  # -1 when none
    not_null: bool
    default: str | None  # pg_get_expr of the default; None when there is none
    is_key: bool  # part of the replica identity key, as pgoutput's Relation message flags it
    generated: str = ""  # '' or 's' (stored generated: pgoutput before PostgreSQL 18 leaves it out)
    identity: str = ""  # '' or 'a' (ALWAYS) or 'd' (BY DEFAULT)


@dataclass(frozen=True, slots=True)
class TableDef:
    """A table's full definition at one point in time (a DDL commit or the bootstrap read)."""

    oid: int
    schema: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[ColumnDef, ...]  # attnum order, dropped columns left out
    kind: str = "r"  # 'r' table, 'p' partitioned table
    # Whether the publication sends stored generated columns (PostgreSQL 18+, publish_generated_columns = stored).
    # Not part of the definition itself: set from the source's publication (see catalog_read.generated_published).
    generated_published: bool = False

    @property
    def qualified_name(self) -> str:
        """The canonical `schema.table` (str(TableName): quoted where the name needs it)."""
        return str(TableName(self.schema, self.name))

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.is_key)

    @property
    def replicated_columns(self) -> tuple[ColumnDef, ...]:
        """The columns pgoutput sends, in Relation-message order: stored generated columns only when the
        publication publishes them (`generated_published`: PostgreSQL 18+ with publish_generated_columns = stored).
        Position i+1 here is the `_catalog` column position."""
        return tuple(c for c in self.columns if not c.generated or self.generated_published)


@dataclass(frozen=True, slots=True)
class DroppedTable:
    oid: int
    schema: str
    name: str  # the last name it had


@dataclass(frozen=True, slots=True)
class DdlObject:
    """One object a command touched (a row of pg_event_trigger_ddl_commands or, for drops, the dropped object)."""

    command_tag: str
    object_type: str  # 'table', 'table column', 'index', 'sequence', ...
    schema: str | None
    identity: str  # e.g. 'public.orders' or 'public.orders.amount'
    oid: int


@dataclass(frozen=True, slots=True)
class DdlEvent:
    """One `slotlake.ddl` message: what ran, and the resulting definition of every table it touched."""

    version: int
    event: str  # 'ddl_command_end', 'sql_drop' or 'error'
    command_tag: str
    query: str | None  # the client's whole query string (current_query()), capped at 64 KiB
    query_truncated: bool
    objects: tuple[DdlObject, ...]
    tables: tuple[TableDef, ...]  # new definitions (ddl_command_end)
    dropped: tuple[DroppedTable, ...]  # dropped tables (sql_drop)
    error: str | None = None  # event 'error': the capture failed; the DDL went ahead without a definition

    @property
    def is_error(self) -> bool:
        return self.event == "error"

    @property
    def object_identity(self) -> str | None:
        """Identity of the first table-like object the command touched, else of its first object."""
        for o in self.objects:
            if o.object_type in ("table", "table column"):
                return o.identity
        return self.objects[0].identity if self.objects else None


_EVENTS = ("ddl_command_end", "sql_drop", "error")
_IDENTITIES = {r.value: r for r in ReplicaIdentity}


class _Reader:
    """Typed access to the JSON with errors that name the field; the payload is cited only in the error."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, what: str) -> DecodeError:
        return DecodeError(f"slotlake.ddl event: {self.where}: {what}; the event does not follow the format of "
                           f"sql/ddl_capture.sql version {FORMAT_VERSION} (reinstall it with install_ddl_capture)")

    def get(self, obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if not isinstance(obj, Mapping):
            raise self.fail(f"expected an object, got {type(obj).__name__}")
        value = obj.get(key)
        if value is None:
            if optional:
                return None
            raise self.fail(f"{key!r} is missing")
        # bool is an int in Python: never accept true/false where a number belongs
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise self.fail(f"{key!r} must be {_kind_name(kind)}, got {value!r}")
        return value

    def items(self, obj: Mapping[str, Any], key: str) -> list[Any]:
        value = self.get(obj, key, list, optional=True)
        return [] if value is None else value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join({"str": "a string", "int": "an integer", "bool": "a boolean", "list": "a list",
                        "dict": "an object"}.get(k.__name__, k.__name__) for k in _as_tuple(kind))


def table_def_from_json(obj: Mapping[str, Any], where: str = "table") -> TableDef:
    """Build a `TableDef` from the `<table>` JSON shape shared by the DDL events and the bootstrap read."""
    r = _Reader(where)
    ident = r.get(obj, "replica_identity", str)
    if ident not in _IDENTITIES:
        raise r.fail(f"replica_identity must be one of d, n, f, i, got {ident!r}")
    columns = []
    for i, col in enumerate(r.items(obj, "columns")):
        c = _Reader(f"{where}.columns[{i}]")
        columns.append(ColumnDef(
            attnum=c.get(col, "attnum", int), name=c.get(col, "name", str),
            type_oid=c.get(col, "type_oid", int), type_name=c.get(col, "type_name", str),
            typmod=c.get(col, "typmod", int), not_null=c.get(col, "not_null", bool),
            default=c.get(col, "default", str, optional=True), is_key=c.get(col, "is_key", bool),
            generated=c.get(col, "generated", str, optional=True) or "",
            identity=c.get(col, "identity", str, optional=True) or ""))
    attnums = [c.attnum for c in columns]
    if attnums != sorted(set(attnums)):
        raise r.fail(f"column attnums must be unique and ascending, got {attnums}")
    return TableDef(oid=r.get(obj, "oid", int), schema=r.get(obj, "schema", str), name=r.get(obj, "name", str),
                    replica_identity=_IDENTITIES[ident], columns=tuple(columns),
                    kind=r.get(obj, "kind", str, optional=True) or "r")


def parse_ddl_event(content: bytes | memoryview) -> DdlEvent:
    """Parse the content of one pgoutput Message with prefix `slotlake.ddl`. Pure.

    Raises DecodeError when the content is not UTF-8 JSON in the documented format, or was written by a newer
    version of sql/ddl_capture.sql than this code reads.
    """
    r = _Reader("payload")
    try:
        obj = json.loads(bytes(content).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise r.fail(f"not UTF-8 JSON ({e})") from None
    version = r.get(obj, "version", int)
    if version > FORMAT_VERSION:
        raise DecodeError(f"slotlake.ddl event has format version {version}, this slotlake reads up to "
                          f"{FORMAT_VERSION}: upgrade slotlake on the decode side before the capture SQL")
    if version < 1:
        raise r.fail(f"version must be >= 1, got {version}")
    event = r.get(obj, "event", str)
    if event not in _EVENTS:
        raise r.fail(f"event must be one of {', '.join(_EVENTS)}, got {event!r}")
    objects = []
    for i, o in enumerate(r.items(obj, "objects")):
        q = _Reader(f"objects[{i}]")
        objects.append(DdlObject(command_tag=q.get(o, "command_tag", str), object_type=q.get(o, "object_type", str),
                                 schema=q.get(o, "schema", str, optional=True), identity=q.get(o, "identity", str),
                                 oid=q.get(o, "oid", int)))
    dropped = []
    for i, d in enumerate(r.items(obj, "dropped")):
        q = _Reader(f"dropped[{i}]")
        dropped.append(DroppedTable(oid=q.get(d, "oid", int), schema=q.get(d, "schema", str),
                                    name=q.get(d, "name", str)))
    error = None
    if event == "error":
        err = r.get(obj, "error", dict)
        q = _Reader("error")
        error = (f"{q.get(err, 'sqlstate', str, optional=True) or '?'}: "
                 f"{q.get(err, 'message', str, optional=True) or ''}")
    return DdlEvent(
        version=version, event=event, command_tag=r.get(obj, "command_tag", str),
        query=r.get(obj, "query", str, optional=True),
        query_truncated=bool(r.get(obj, "query_truncated", bool, optional=True)),
        objects=tuple(objects),
        tables=tuple(table_def_from_json(t, f"tables[{i}]") for i, t in enumerate(r.items(obj, "tables"))),
        dropped=tuple(dropped), error=error)


def _run_script(conn: psycopg.Connection, path: Path, action: str) -> None:
    import psycopg

    try:
        script = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PreflightError(f"cannot {action} the DDL capture: {path} is not readable ({e.strerror}); "
                             "reinstall the slotlake package (its sql/ folder is package data)") from None
    try:
        # One transaction: either the capture is fully (re)installed/removed or nothing changed.
        with conn.transaction():
            conn.execute(script)
    except psycopg.errors.InsufficientPrivilege as e:
        raise PreflightError(f"cannot {action} the DDL capture: {e.diag.message_primary} (event triggers need a "
                             "superuser; run sql/ddl_capture.sql as one, or go without DDL capture: the catalog "
                             "then learns schema changes from pgoutput Relation messages only)") from None


def install_ddl_capture(conn: psycopg.Connection) -> None:
    """Install (or upgrade in place) the event triggers in the connected database. Idempotent. Superuser only.

    Runs in one transaction (a savepoint if `conn` is already in one, then the caller's commit makes it stick).
    Raises PreflightError when the role may not create event triggers.
    """
    _run_script(conn, INSTALL_SQL, "install")
    log.info("DDL capture installed (event triggers %s)", ", ".join(TRIGGER_NAMES))


def uninstall_ddl_capture(conn: psycopg.Connection) -> None:
    """Remove the event triggers and their functions. Safe when not installed."""
    _run_script(conn, UNINSTALL_SQL, "uninstall")
    log.info("DDL capture removed")


def ddl_capture_installed(conn: psycopg.Connection) -> bool:
    """True when both event triggers exist and are enabled, i.e. table DDL will arrive in the stream."""
    from psycopg.rows import tuple_row

    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT count(*) FROM pg_catalog.pg_event_trigger WHERE evtname = ANY(%s) AND evtenabled <> 'D'",
                    [list(TRIGGER_NAMES)])
        row = cur.fetchone()
    return row is not None and row[0] == len(TRIGGER_NAMES)
