"""The bootstrap read of pg_catalog: every table's definition at slot creation, for the first `_catalog` versions.

It yields the same `TableDef` values as the DDL events (slotlake.source.ddl): the query below builds the very
JSON shape that `slotlake.table_def` in sql/ddl_capture.sql builds, and both go through `table_def_from_json`
(tests/integration/test_ddl_capture.py checks the two agree). Unlike the DDL capture it needs no superuser and
no installed objects, so it works on every source.

For definitions that match the slot's consistent point exactly, call it inside the transaction that imported
the slot's exported snapshot (REPEATABLE READ + SET TRANSACTION SNAPSHOT): catalog rows are read under that
snapshot like any table.
"""
from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from slotlake import storage
from slotlake.bronze import bronze_path
from slotlake.errors import DecodeError, PreflightError, SlotlakeError
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.source.ddl import INSTALL_SQL, TableDef, table_def_from_json

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

_SELECT_BEGIN, _SELECT_END = "-- table_def select: begin", "-- table_def select: end"
# The table filter of a bootstrap read; the SELECT before it is slotlake.table_def's (`_table_defs_query`).
_TABLE_DEFS_WHERE = """ WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 't'
   AND CASE WHEN %(all)s
            THEN n.nspname NOT IN ('pg_catalog', 'information_schema', 'slotlake') AND n.nspname !~ '^pg_toast'
                 AND n.nspname !~ '^pg_temp_'
            ELSE (n.nspname, c.relname) IN (SELECT s, t FROM unnest(%(schemas)s::text[], %(names)s::text[]) AS u(s, t))
       END
 ORDER BY n.nspname, c.relname
"""


@functools.cache
def _table_defs_query() -> str:
    """slotlake.table_def's SELECT, taken from sql/ddl_capture.sql (one definition: the DDL events and the bootstrap
    read describe a table with the same keys and expressions), over the tables `_TABLE_DEFS_WHERE` picks."""
    text = INSTALL_SQL.read_text(encoding="utf-8")
    try:
        start = text.index("\n", text.index(_SELECT_BEGIN)) + 1
        end = text.index(_SELECT_END, start)
    except ValueError:
        raise PreflightError(f"{INSTALL_SQL} lacks the '{_SELECT_BEGIN}' / '{_SELECT_END}' markers; "
                             "reinstall the slotlake package") from None
    return text[start:end] + _TABLE_DEFS_WHERE


def generated_published(conn: psycopg.Connection, publication: str) -> bool:
    """Whether `publication` sends stored generated columns: PostgreSQL 18+ with publish_generated_columns = stored
    (slotlake creates its publications that way on 18). Before 18 pgoutput never sends them."""
    if conn.info.server_version < 180000:
        return False
    row = conn.execute("SELECT pubgencols = 's' FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    return bool(row and row[0])


def read_table_defs(conn: psycopg.Connection, tables: list[str] | None = None, *,
                    generated_published: bool = False) -> list[TableDef]:
    """Definitions of `tables` ("schema.table" as PostgreSQL reads it: `TableName.parse`), or of
    every ordinary and partitioned table outside the system schemas when None. Ordered by schema, name.
    `generated_published`: the publication sends stored generated columns (`generated_published()`).

    Raises PreflightError naming every requested table that does not exist.
    """
    return [replace(d, generated_published=generated_published) for d, _ in _read(conn, tables)]


def _read(conn: psycopg.Connection, tables: list[str] | None) -> list[tuple[TableDef, dict]]:
    """(definition, its JSON object) per table: the JSON is what `archive_bootstrap` keeps."""
    from psycopg.rows import tuple_row

    try:
        pairs = [TableName.parse(t) for t in tables] if tables is not None else []
    except SlotlakeError as e:
        raise PreflightError(f"table {e}") from None
    params = {"all": tables is None, "schemas": [s for s, _ in pairs], "names": [t for _, t in pairs]}
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        # Pin search_path as sql/ddl_capture.sql does, so format_type/pg_get_expr qualify names identically;
        # restored below because SET LOCAL inside a savepoint would outlive it in the caller's transaction.
        cur.execute("SELECT current_setting('search_path')")
        old_path = cur.fetchone()[0]  # type: ignore[index]  # SELECT current_setting(...) returns one row
        cur.execute("SELECT set_config('search_path', 'pg_catalog, pg_temp', true)")
        cur.execute(_table_defs_query(), params)
        rows = cur.fetchall()
        cur.execute("SELECT set_config('search_path', %s, true)", [old_path])
    defs = [(table_def_from_json(row[0], f"pg_catalog read of {TableName(row[0].get('schema'), row[0].get('name'))}"),
             row[0]) for row in rows]
    if tables is not None:
        found = {(d.schema, d.name) for d, _ in defs}
        missing = [str(p) for p in pairs if p not in found]
        if missing:
            raise PreflightError(f"table(s) not found in the source database: {', '.join(missing)}; check `tables:` "
                                 "in the config (names are schema.table, unquoted names folded to lower case, "
                                 "\"Quoted\" names as written; ordinary or partitioned tables only)")
    log.info("read %d table definition(s) from pg_catalog", len(defs))
    return defs


# ---- the bootstrap archive: <lake>/<source>/bronze/catalog/<lsn hex16>.json ----

BOOTSTRAP_DIR = "catalog"  # under bronze/
BOOTSTRAP_FORMAT = 1


@dataclass(frozen=True)
class BootstrapCatalog:
    """The definitions read from pg_catalog when a slot was created, valid from the slot's consistent point."""

    lsn: Lsn  # the slot's consistent point: the first `_catalog` versions start here
    tables: tuple[TableDef, ...]
    path: str
    generated_published: bool = False  # the publication sent stored generated columns when the slot was created


def bootstrap_dir(lake_root: str) -> str:
    """`<lake>/<source>/bronze/catalog` (`lake_root` = `<lake>/<source>`, as in slotlake.bronze), local or s3a://."""
    return storage.join(bronze_path(lake_root), BOOTSTRAP_DIR)


def archive_bootstrap(conn: psycopg.Connection, lake_root: str, tables: list[str] | None, lsn: Lsn, *,
                      generated_published: bool = False) -> str:
    """Read the definitions of `tables` (None: every user table) and archive them as valid from `lsn`.

    Call it at slot creation, inside the transaction that imported the slot's exported snapshot, with
    `lsn` = the slot's consistent point: the definitions then are exactly those in force at `lsn`. The decode
    job turns the file into `_catalog` versions with origin `bootstrap` (docs/internals.md "Catalog").
    `lake_root` is the source's root, `<lake>/<source>`. The file is placed atomically (`Files.write_replace`: a
    hidden `.tmp`, fsynced, renamed, folder fsynced; on S3 one PUT) like a bronze file, so the decode never reads a
    partial one; calling it again for the same `lsn` replaces the file with the same content. Returns the file's path.
    `generated_published` (whether the publication sends stored generated columns) is kept with the file: it
    holds for the slot's life (preflight refuses a publication whose setting changed), and tells which columns
    the definitions of this slot, including later DDL events, put in Relation-message order.
    """
    rows = _read(conn, tables)
    final = storage.join(bootstrap_dir(lake_root), f"{lsn.hex16}.json")
    doc = {"format": BOOTSTRAP_FORMAT, "lsn": str(lsn), "read_at": datetime.now(UTC).isoformat(),
           "publish_generated_columns": generated_published, "tables": [obj for _, obj in rows]}
    storage.files_for(final).write_replace(final, json.dumps(doc, sort_keys=True).encode("utf-8"))
    log.info("archived the definitions of %d table(s) valid from %s in %s", len(rows), lsn, final)
    return final


def list_bootstrap(lake_root: str) -> list[BootstrapCatalog]:
    """Every archived bootstrap read of the source, oldest first (hidden `.tmp` files ignored). Pure file I/O."""
    folder = bootstrap_dir(lake_root)
    files = storage.files_for(folder)
    out = []
    for name in files.list_names(folder):
        if not _BOOTSTRAP_NAME.match(name):
            continue
        path = storage.join(folder, name)
        where = f"bootstrap catalog {path}"
        try:
            doc = json.loads(files.read_bytes(path).decode("utf-8"))
        except (OSError, ValueError) as e:
            raise DecodeError(f"{where} is unreadable ({e}); restore it from a backup or delete it (the catalog "
                              "then starts at the first Relation message of each table)") from None
        if not isinstance(doc, dict) or doc.get("format") != BOOTSTRAP_FORMAT or "lsn" not in doc:
            raise DecodeError(f"{where} is not a format {BOOTSTRAP_FORMAT} bootstrap file; upgrade slotlake")
        lsn = Lsn.parse(doc["lsn"])
        if lsn.hex16 != name[:16]:
            raise DecodeError(f"{where}: its lsn {lsn} does not match its name")
        published = doc.get("publish_generated_columns") is True  # absent in files written before PostgreSQL 18
        out.append(BootstrapCatalog(lsn=lsn, path=path, generated_published=published, tables=tuple(
            replace(table_def_from_json(t, f"{where} tables[{i}]"), generated_published=published)
            for i, t in enumerate(doc.get("tables") or []))))
    return out


def as_published(table: TableDef, boots: list[BootstrapCatalog], lsn: int) -> TableDef:
    """A DDL event's definition with the publication's generated-column setting of the slot it was decoded from
    (the newest bootstrap read at or before `lsn`)."""
    flag = next((b.generated_published for b in reversed(boots) if b.lsn.value <= lsn), False)
    return replace(table, generated_published=flag)


_BOOTSTRAP_NAME = re.compile(r"^[0-9A-F]{16}\.json$")
