"""Preflight: check the source can be synced, and create what is missing (publication, slot with its initial copy).

Order matters: the publication is created (or completed) before the slot, because pgoutput looks publications
up in the catalog as of each decoded change; a slot older than its publication fails to decode.
Every failure is a PreflightError (SlotLostError for a lost slot) whose message says what to do.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from slotlake import bronze
from slotlake.config import Config, SourceConfig
from slotlake.errors import PreflightError, SlotLostError
from slotlake.names import TableName
from slotlake.source.catalog_read import generated_published, list_bootstrap
from slotlake.source.connection import connect, one_row, redact, resolve_dsn, scalar, table_ident
from slotlake.source.extract import origin_option
from slotlake.source.slot import (
    PLUGIN,
    SlotInfo,
    current_wal_lsn,
    format_seconds,
    idle_slot_timeout,
    lost_slot_message,
    server_version_num,
    slot_info,
)

log = logging.getLogger(__name__)

MIN_SERVER_VERSION = 140000
_IDENTITY_NAMES = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}


@dataclass(frozen=True)
class TableInfo:
    """A published table: `replica_identity` is pgoutput's letter (d, n, f, i); `key_columns` are the columns
    that identify a row in updates and deletes (empty for FULL, where the whole old row is the key, and NOTHING)."""

    name: str  # canonical schema.table (str(TableName))
    oid: int
    replica_identity: str
    key_columns: tuple[str, ...]
    partitioned: bool = False  # relkind 'p': its rows live in its partitions


@dataclass(frozen=True)
class PreflightReport:
    source: str
    server_version: str
    server_version_num: int
    tables: tuple[TableInfo, ...]
    publication: str
    publication_created: bool
    tables_added: tuple[str, ...]  # configured tables that were added to an existing publication
    slot: SlotInfo
    slot_created: bool
    retained_wal_bytes: int | None
    warnings: tuple[str, ...]


def _table_ident(name: str) -> sql.Composable:
    return table_ident(TableName.parse(name))


def _check_server(conn: psycopg.Connection, source: SourceConfig) -> tuple[str, int]:
    version = server_version_num(conn)
    text = scalar(conn, "SHOW server_version")
    if version < MIN_SERVER_VERSION:
        raise PreflightError(f"source {source.name}: PostgreSQL {text} is too old; slotlake needs 14 or newer")
    wal_level = scalar(conn, "SHOW wal_level")
    if wal_level != "logical":
        raise PreflightError(f"source {source.name}: wal_level is {wal_level!r}; logical decoding needs "
                             "wal_level=logical: set wal_level=logical (ALTER SYSTEM SET wal_level = logical) "
                             "and restart PostgreSQL")
    return text, version


def _check_role(conn: psycopg.Connection, source: SourceConfig) -> str:
    user, replication, superuser = one_row(
        conn,
        "SELECT rolname, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user")
    if not (replication or superuser):
        raise PreflightError(f"source {source.name}: role {user} may not use replication slots; "
                             f"run ALTER ROLE {user} REPLICATION (as a superuser), or connect as a role that has it")
    return user


def _publication(conn: psycopg.Connection, name: str) -> tuple[bool, list[str]] | None:
    """(puballtables, published tables as canonical schema.table) or None if the publication does not exist."""
    row = conn.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    if row is None:
        return None
    tables = [str(TableName(s, t)) for s, t in conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2", (name,))]
    # A partitioned table added directly is listed above by its partitions unless publish_via_partition_root.
    members = [str(TableName(s, t)) for s, t in conn.execute(
        "SELECT n.nspname, c.relname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
        "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE p.pubname = %s ORDER BY 1, 2", (name,))]
    return row[0], tables + [m for m in members if m not in tables]


def _published(conn: psycopg.Connection, name: str) -> list[str]:
    """The tables of a publication known to exist (`_publication`'s second half)."""
    found = _publication(conn, name)
    if found is None:
        raise PreflightError(f"publication {name} was dropped while preflight ran; run the sync again")
    return found[1]


def _table_info(conn: psycopg.Connection, source: SourceConfig, name: str, user: str, *,
                refuse_keyless: bool = True) -> TableInfo:
    """The table's identity and key. A keyless table (DEFAULT without a primary key, USING INDEX without its
    index) is refused when `refuse_keyless`, else returned with no key columns (merged as appends)."""
    schema, table = TableName.parse(name)
    row = conn.execute(
        "SELECT c.oid, c.relreplident, c.relkind, has_table_privilege(c.oid, 'SELECT') "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (schema, table)).fetchone()
    if row is None or row[2] not in ("r", "p"):
        raise PreflightError(f"source {source.name}: table {name} does not exist in this database; "
                             f"create it, or remove it from sources.{source.name}.tables")
    oid, identity, relkind, can_select = row
    if not can_select:
        raise PreflightError(f"source {source.name}: role {user} has no SELECT on {name}; "
                             f"run GRANT SELECT ON {name} TO {user}")
    keys: tuple[str, ...] = ()
    if identity in ("d", "i"):
        # DEFAULT uses the primary key; USING INDEX the index flagged indisreplident.
        flag = "indisprimary" if identity == "d" else "indisreplident"
        keys = tuple(r[0] for r in conn.execute(
            f"SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, pos) "
            f"JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            f"WHERE i.indrelid = %s AND i.{flag} ORDER BY k.pos", (oid,)))
        if not keys and refuse_keyless:
            what = "no primary key" if identity == "d" else "its replica identity index is missing"
            raise PreflightError(
                f"source {source.name}: table {name} has REPLICA IDENTITY {_IDENTITY_NAMES[identity]} but {what}, "
                f"so its updates and deletes cannot be matched; add a primary key, or run "
                f"ALTER TABLE {name} REPLICA IDENTITY FULL, or, if its rows are only ever inserted (an event or log "
                f"table), move it from sources.{source.name}.tables to sources.{source.name}.insert_only")
    return TableInfo(name=name, oid=oid, replica_identity=identity, key_columns=keys, partitioned=relkind == "p")


def _ensure_publication(conn: psycopg.Connection, source: SourceConfig) -> tuple[list[str], bool, tuple[str, ...],
                                                                                 list[str]]:
    """Create or complete the publication; returns (tables, created, added, warnings)."""
    pub = source.publication
    warnings: list[str] = []
    existing = _publication(conn, pub)
    if existing is None and not source.tables:
        return _create_every_table_publication(conn, source), True, (), warnings
    if existing is None:
        listed = source.tables or ()
        stmt = sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH ({})").format(
            sql.Identifier(pub), sql.SQL(", ").join(_table_ident(t) for t in listed),
            sql.SQL(publication_options(server_version_num(conn))))
        try:
            conn.execute(stmt)
        except psycopg.errors.InsufficientPrivilege as e:
            raise PreflightError(f"source {source.name}: cannot create publication {pub}: {e.diag.message_primary}; "
                                 f"ask a table owner or superuser to run: {stmt.as_string(conn)}") from None
        log.info("source %s: created publication %s for %s", source.name, pub, ", ".join(listed))
        return list(listed), True, (), warnings
    all_tables, published = existing
    if not source.tables:
        if source.schemas and not all_tables:
            _add_schemas(conn, source)
            published = _published(conn, pub)
        elif not published and not all_tables and not source.insert_only:
            raise PreflightError(f"source {source.name}: publication {pub} has no tables; add tables to it "
                                 f"(ALTER PUBLICATION {pub} ADD TABLE ...) or set sources.{source.name}.tables")
        return [t for t in published if source.syncs(t)], False, (), warnings
    missing = tuple(t for t in source.tables if t not in published)
    if missing and not all_tables:
        stmt = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(pub), sql.SQL(", ").join(_table_ident(t) for t in missing))
        try:
            conn.execute(stmt)
        except psycopg.errors.InsufficientPrivilege as e:
            raise PreflightError(f"source {source.name}: cannot add {', '.join(missing)} to publication {pub}: "
                                 f"{e.diag.message_primary}; ask a table owner or superuser to run: "
                                 f"{stmt.as_string(conn)}") from None
        log.info("source %s: added %s to publication %s", source.name, ", ".join(missing), pub)
        warnings.append(f"added {', '.join(missing)} to publication {pub}: changes are captured from now on; "
                        "rows that existed before are copied by the snapshot step")
    return list(source.tables), False, missing, warnings


def _every_table_clause(source: SourceConfig) -> sql.Composable:
    if source.schemas:
        return sql.SQL("FOR TABLES IN SCHEMA {}").format(sql.SQL(", ").join(sql.Identifier(n) for n in source.schemas))
    return sql.SQL("FOR ALL TABLES")


def _check_schemas(conn: psycopg.Connection, source: SourceConfig, version: int) -> None:
    if not source.schemas:
        return
    if version < 150000:
        raise PreflightError(f"source {source.name}: sources.{source.name}.schemas needs PostgreSQL 15 or newer "
                             f"(FOR TABLES IN SCHEMA); list the tables in sources.{source.name}.tables instead")
    found = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
                                        (list(source.schemas),))}
    missing = [n for n in source.schemas if n not in found]
    if missing:
        raise PreflightError(f"source {source.name}: schema {', '.join(missing)} does not exist in this database; "
                             f"create it, or remove it from sources.{source.name}.schemas")


def _create_every_table_publication(conn: psycopg.Connection, source: SourceConfig) -> list[str]:
    """No table list: the publication follows every table (or every table of `schemas`), including tables
    created later, as Debezium's `publication.autocreate.mode=all_tables` does. Needs a superuser."""
    pub = source.publication
    stmt = sql.SQL("CREATE PUBLICATION {} {} WITH ({})").format(
        sql.Identifier(pub), _every_table_clause(source), sql.SQL(publication_options(server_version_num(conn))))
    try:
        conn.execute(stmt)
    except psycopg.errors.InsufficientPrivilege as e:
        raise PreflightError(f"source {source.name}: cannot create publication {pub}: {e.diag.message_primary}; "
                             f"ask a superuser to run: {stmt.as_string(conn)}, or set sources.{source.name}.tables "
                             "(a publication for listed tables needs only ownership of them)") from None
    log.info("source %s: created publication %s %s", source.name, pub,
             "for schemas " + ", ".join(source.schemas) if source.schemas else "for all tables")
    return [t for t in _published(conn, pub) if source.syncs(t)]


def _add_schemas(conn: psycopg.Connection, source: SourceConfig) -> None:
    """Add the configured schemas an existing publication lacks."""
    pub = source.publication
    present = {r[0] for r in conn.execute(
        "SELECT n.nspname FROM pg_publication_namespace pn JOIN pg_publication p ON p.oid = pn.pnpubid "
        "JOIN pg_namespace n ON n.oid = pn.pnnspid WHERE p.pubname = %s", (pub,))}
    missing = [n for n in source.schemas or () if n not in present]
    if not missing:
        return
    stmt = sql.SQL("ALTER PUBLICATION {} ADD TABLES IN SCHEMA {}").format(
        sql.Identifier(pub), sql.SQL(", ").join(sql.Identifier(n) for n in missing))
    try:
        conn.execute(stmt)
    except psycopg.errors.InsufficientPrivilege as e:
        raise PreflightError(f"source {source.name}: cannot add schema {', '.join(missing)} to publication {pub}: "
                             f"{e.diag.message_primary}; ask a superuser to run: {stmt.as_string(conn)}") from None
    log.info("source %s: added schema %s to publication %s", source.name, ", ".join(missing), pub)


def _ensure_insert_only_publication(conn: psycopg.Connection, cfg: Config, source: SourceConfig) -> bool:
    """Create or complete `<publication>_insert_only` for the `insert_only` tables: it publishes inserts and
    truncates only, so PostgreSQL keeps accepting UPDATE and DELETE on keyless tables in it (a publication that
    publishes them makes PostgreSQL reject them). Returns whether it was created."""
    if not source.insert_only:
        return False
    from slotlake.source import copies, snapshot

    pub = source.insert_only_publication
    root = f"{cfg.lake.rstrip('/')}/{source.name}"
    slot_exists = slot_info(conn, source.slot) is not None
    row = conn.execute("SELECT pubupdate OR pubdelete, pubviaroot FROM pg_publication WHERE pubname = %s",
                       (pub,)).fetchone()
    if row is None:
        # The same options as the main publication (generated columns on 18: one catalog flag for the slot).
        stmt = sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert, truncate', {})").format(
            sql.Identifier(pub), sql.SQL(", ").join(_table_ident(t) for t in source.insert_only),
            sql.SQL(publication_options(server_version_num(conn))))
        created = True
    else:
        if row[0] or not row[1]:
            fix = sql.SQL("ALTER PUBLICATION {} SET (publish = 'insert, truncate', "
                          "publish_via_partition_root = true)").format(sql.Identifier(pub)).as_string(conn)
            raise PreflightError(f"source {source.name}: publication {pub} (for sources.{source.name}.insert_only) "
                                 "must publish inserts and truncates only, under the partition root's name; "
                                 f"run: {fix}")
        if copies.publication_pending(root, source.slot, pub):
            snapshot.record_publication_start(conn, root, source, pub)
        published = _published(conn, pub)
        missing = [t for t in source.insert_only if t not in published]
        if not missing:
            return False
        stmt = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(pub), sql.SQL(", ").join(_table_ident(t) for t in missing))
        created = False
    if created and slot_exists:
        copies.mark_publication_pending(root, source.slot, pub)
    try:
        conn.execute(stmt)
    except psycopg.errors.InsufficientPrivilege as e:
        raise PreflightError(f"source {source.name}: cannot prepare publication {pub}: {e.diag.message_primary}; "
                             f"ask a table owner or superuser to run: {stmt.as_string(conn)}") from None
    if created and slot_exists:
        snapshot.record_publication_start(conn, root, source, pub)
    log.info("source %s: %s publication %s (inserts and truncates) for %s", source.name,
             "created" if created else "completed", pub, ", ".join(source.insert_only))
    return created


def publication_options(server_version: int) -> str:
    """The WITH options of the publications slotlake creates. Changes of a partitioned table's partitions are
    published as changes of the table itself (its name, its columns), so its gold table is the one the config
    names. From PostgreSQL 18 stored generated columns are published too, so gold has every column the table has
    (before 18 pgoutput cannot send them)."""
    options = ["publish_via_partition_root = true"]
    if server_version >= 180000:
        options.append("publish_generated_columns = stored")
    return ", ".join(options)


def _check_generated_columns(conn: psycopg.Connection, cfg: Config, source: SourceConfig) -> None:
    """The publication must still send (or not send) stored generated columns as it did when the slot was created:
    the lake's table definitions for this slot assume that setting (column positions in the change tuples)."""
    boots = list_bootstrap(f"{cfg.lake.rstrip('/')}/{source.name}")
    if not boots:
        return
    then, now = boots[-1].generated_published, generated_published(conn, source.publication)
    if then != now:
        old = "stored" if then else "none"
        raise PreflightError(
            f"source {source.name}: publication {source.publication} {'now' if now else 'no longer'} publishes "
            f"stored generated columns (publish_generated_columns), unlike when slot {source.slot} was created at "
            f"{boots[-1].lsn}; set it back (ALTER PUBLICATION {source.publication} SET (publish_generated_columns = "
            f"{old})) or run `slotlake resync {source.name}` to start over with the new setting")


def _check_partition_root(conn: psycopg.Connection, source: SourceConfig, tables: tuple[TableInfo, ...]) -> None:
    """A partitioned table must be published under its own name (publish_via_partition_root), else its changes
    arrive as changes of each partition and the table named in the config would never see them."""
    partitioned = [t.name for t in tables if t.partitioned]
    if not partitioned:
        return
    via_root = conn.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = %s",
                            (source.publication,)).fetchone()
    if via_root is not None and not via_root[0]:
        stmt = sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(
            sql.Identifier(source.publication)).as_string(conn)
        raise PreflightError(
            f"source {source.name}: {', '.join(partitioned)} is partitioned, but publication {source.publication} "
            f"publishes its changes under each partition's name, so they would never reach the table's gold table; "
            f"run: {stmt}")


def _check_slot(conn: psycopg.Connection, cfg: Config, source: SourceConfig) -> tuple[SlotInfo, bool]:
    info = slot_info(conn, source.slot)
    root = f"{cfg.lake.rstrip('/')}/{source.name}"
    if info is None:
        archived = bronze.max_archived_end(root)
        if archived is not None:
            raise SlotLostError(
                f"slot {source.slot} is missing but bronze holds changes up to {archived}: the slot existed and "
                f"was dropped, so the changes after {archived} are lost; run `slotlake resync {source.name}`")
        # A new source: the slot is created together with the initial copy of every table, under the snapshot
        # the slot exports (it exists only while the creating connection is open; see source/snapshot.py).
        from slotlake.source.snapshot import create_slot_with_snapshot

        create_slot_with_snapshot(cfg, source)
        info = slot_info(conn, source.slot)
        assert info is not None
        return info, True
    database = scalar(conn, "SELECT current_database()")
    if info.slot_type != "logical" or info.plugin != PLUGIN:
        raise PreflightError(f"source {source.name}: slot {source.slot} exists but is a {info.slot_type} slot with "
                             f"plugin {info.plugin!r}, not a logical pgoutput slot; set sources.{source.name}.slot "
                             f"to another name, or drop it (SELECT pg_drop_replication_slot('{source.slot}'))")
    if info.database != database:
        raise PreflightError(f"source {source.name}: slot {source.slot} belongs to database {info.database!r}, "
                             f"not {database!r}; set sources.{source.name}.slot to a name of its own")
    if info.invalidated:
        raise SlotLostError(lost_slot_message(info, source.name, idle_slot_timeout(conn)))
    return info, False


def run_preflight(cfg: Config, source: SourceConfig) -> PreflightReport:
    """Check the source database and prepare it (publication, slot). Raises PreflightError / SlotLostError."""
    dsn = resolve_dsn(source)
    log.info("source %s: preflight against %s", source.name, redact(dsn))
    with connect(source) as conn:
        version_text, version = _check_server(conn, source)
        origin_option(source, version)  # origin: none needs 16+: refuse before creating anything
        user = _check_role(conn, source)
        if source.tables:
            for t in source.tables:  # fail on a missing table before touching the publication
                _table_info(conn, source, t, user)
        for t in source.insert_only:
            _table_info(conn, source, t, user, refuse_keyless=False)
        _check_schemas(conn, source, version)
        tables, pub_created, added, warnings = _ensure_publication(conn, source)
        _ensure_insert_only_publication(conn, cfg, source)
        tables = tables + [t for t in source.insert_only if t not in tables]
        infos = tuple(_table_info(conn, source, t, user, refuse_keyless=not source.keyless_appends(t))
                      for t in tables)
        _check_partition_root(conn, source, infos)
        for info in infos:
            if info.replica_identity == "n":
                warnings.append(f"{info.name} has REPLICA IDENTITY NOTHING: it is synced insert-only (PostgreSQL "
                                "rejects its updates and deletes while the publication publishes them)")
            elif info.replica_identity in ("d", "i") and not info.key_columns and info.name not in source.insert_only:
                warnings.append(
                    f"{info.name} has no primary key (REPLICA IDENTITY {_IDENTITY_NAMES[info.replica_identity]}): "
                    f"PostgreSQL rejects UPDATE and DELETE on it while publication {source.publication} publishes "
                    f"them, so it is synced as appends; if the application updates or deletes its rows, run "
                    f"ALTER TABLE {info.name} REPLICA IDENTITY FULL (or add a primary key); if it only inserts, list "
                    f"it in sources.{source.name}.insert_only")
            elif info.key_columns and info.name in source.insert_only and source.tables:
                warnings.append(f"{info.name} has a key but is listed in insert_only: only its inserts and truncates "
                                f"are published, so its updates and deletes never reach gold; move it to "
                                f"sources.{source.name}.tables")
        slot, slot_created = _check_slot(conn, cfg, source)
        if not slot_created:
            _check_generated_columns(conn, cfg, source)
        retained = None
        if slot.restart_lsn is not None:
            retained = current_wal_lsn(conn) - slot.restart_lsn
            limit = cfg.extract.warn_retained_wal_mb * 1024 * 1024
            if retained > limit:
                warnings.append(f"slot {source.slot} retains {retained / 1024 / 1024:.0f} MB of WAL (more than "
                                f"extract.warn_retained_wal_mb = {cfg.extract.warn_retained_wal_mb}); run syncs "
                                "more often or raise extract.upto_nchanges / max_calls")
        idle_timeout = idle_slot_timeout(conn)
        if idle_timeout:
            warnings.append(f"the server's idle_replication_slot_timeout is {format_seconds(idle_timeout)}: slot "
                            f"{source.slot} is unused between syncs, so a checkpoint invalidates it when no sync "
                            "runs for that long (then only `slotlake resync` recovers); sync more often than that, "
                            "or set idle_replication_slot_timeout = 0")
    if not slot_created:
        # Tables without a complete initial copy in this slot's generation (added to the config, or a copy that
        # died halfway) are copied now, joined to the stream by their own snapshot (source/snapshot.py).
        from slotlake.source.snapshot import ensure_snapshots

        ensure_snapshots(cfg, source)
    for w in warnings:
        log.warning("source %s: %s", source.name, w)
    return PreflightReport(source=source.name, server_version=version_text, server_version_num=version,
                           tables=infos, publication=source.publication, publication_created=pub_created,
                           tables_added=added, slot=slot, slot_created=slot_created, retained_wal_bytes=retained,
                           warnings=tuple(warnings))

