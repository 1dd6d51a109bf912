"""The multi-version catalog `<lake>/<source>/_catalog` (docs/internals.md "Catalog").

One row per (relation, version). A Relation message starts a new version only when its definition (table name,
column names, type OIDs, typmods, key flags, replica identity) differs from the relation's latest version; the
previous version is then closed (`valid_to_lsn`). pgoutput re-sends every relation in every decoding session,
so almost all Relation messages are repeats and change nothing.

The versioning is pure (`apply_definitions`); `read_catalog`/`write_catalog` do the Spark I/O. The catalog is small
(one row per table version), so it is read to the driver and rewritten whole in one idempotent Delta commit.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slotlake import contracts, delta_log
from slotlake.contracts import STAGE_CATALOG, CommitMeta
from slotlake.lsn import Lsn

if TYPE_CHECKING:
    from slotlake.source.ddl import TableDef

log = logging.getLogger(__name__)

# Names of built-in types (pg_type.oid is fixed for these); custom types come from Type messages.
BUILTIN_TYPE_NAMES: dict[int, str] = {
    16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 23: "int4", 24: "regproc",
    25: "text", 26: "oid", 28: "xid", 114: "json", 142: "xml", 194: "pg_node_tree", 600: "point", 601: "lseg",
    602: "path", 603: "box", 604: "polygon", 628: "line", 650: "cidr", 700: "float4", 701: "float8",
    718: "circle", 774: "macaddr8", 790: "money", 829: "macaddr", 869: "inet", 1000: "_bool", 1001: "_bytea",
    1005: "_int2", 1007: "_int4", 1009: "_text", 1014: "_bpchar", 1015: "_varchar", 1016: "_int8",
    1021: "_float4", 1022: "_float8", 1028: "_oid", 1042: "bpchar", 1043: "varchar", 1082: "date", 1083: "time",
    1114: "timestamp", 1115: "_timestamp", 1182: "_date", 1184: "timestamptz", 1185: "_timestamptz",
    1186: "interval", 1231: "_numeric", 1266: "timetz", 1560: "bit", 1562: "varbit", 1700: "numeric",
    2950: "uuid", 2951: "_uuid", 3220: "pg_lsn", 3614: "tsvector", 3615: "tsquery", 3802: "jsonb",
    3807: "_jsonb", 3904: "int4range", 3906: "numrange", 3908: "tsrange", 3910: "tstzrange", 3912: "daterange",
    3926: "int8range", 4451: "int4multirange", 4536: "nummultirange", 4532: "datemultirange", 199: "_json",
}


@dataclass(frozen=True)
class CatalogColumn:
    position: int  # 1-based position among the relation's live columns (the Relation message order)
    name: str
    type_oid: int
    type_name: str | None  # None: a custom type whose Type message was never seen
    typmod: int
    nullable: bool | None  # Relation messages do not carry it: inherited from the previous version, else None
    is_key: bool


@dataclass(frozen=True)
class CatalogVersion:
    rel_oid: int
    schema_name: str
    table_name: str
    version: int
    valid_from_lsn: int
    valid_to_lsn: int | None  # None: still valid
    replica_identity: str
    columns: tuple[CatalogColumn, ...]
    origin: str  # bootstrap | relation | ddl


@dataclass(frozen=True)
class TableDefinition:
    """One relation's definition as of a commit LSN: from a Relation message, a DDL event or the bootstrap read.

    `dropped` marks a DROP (from a `sql_drop` DDL event): it closes the relation's open version.
    """

    commit_lsn: int
    lsn: int  # the message's own LSN: orders two definitions within one transaction
    rel_oid: int
    schema_name: str
    table_name: str
    replica_identity: str
    columns: tuple[CatalogColumn, ...]
    origin: str  # relation | ddl | bootstrap
    dropped: bool = False


def table_def_definition(commit_lsn: int, lsn: int, table: TableDef, origin: str) -> TableDefinition:
    """A `TableDef` (DDL event or bootstrap read) as a definition: only the columns pgoutput sends, in its order."""
    cols = tuple(CatalogColumn(position=i + 1, name=c.name, type_oid=c.type_oid,
                               type_name=BUILTIN_TYPE_NAMES.get(c.type_oid, c.type_name), typmod=c.typmod,
                               nullable=not c.not_null, is_key=c.is_key)
                 for i, c in enumerate(table.replicated_columns))
    return TableDefinition(commit_lsn=commit_lsn, lsn=lsn, rel_oid=table.oid, schema_name=table.schema,
                           table_name=table.name, replica_identity=table.replica_identity.value, columns=cols,
                           origin=origin)


def drop_definition(commit_lsn: int, lsn: int, oid: int, schema: str, name: str) -> TableDefinition:
    return TableDefinition(commit_lsn=commit_lsn, lsn=lsn, rel_oid=oid, schema_name=schema, table_name=name,
                           replica_identity="", columns=(), origin="ddl", dropped=True)


def _signature(schema: str, table: str, replica_identity: str, columns: Iterable[CatalogColumn]) -> tuple:
    # What makes a new version. Not type_name/nullable: a Relation message cannot tell those.
    return (schema, table, replica_identity, tuple((c.name, c.type_oid, c.typmod, c.is_key) for c in columns))


def version_signature(v: CatalogVersion | TableDefinition) -> tuple:
    return _signature(v.schema_name, v.table_name, v.replica_identity, v.columns)


def type_name(oid: int, custom: Mapping[int, str], previous: CatalogVersion | None = None) -> str | None:
    """Built-in name, else `schema.name` from a Type message, else what the previous version recorded."""
    if oid in BUILTIN_TYPE_NAMES:
        return BUILTIN_TYPE_NAMES[oid]
    if oid in custom:
        return custom[oid]
    if previous is not None:
        for c in previous.columns:
            if c.type_oid == oid and c.type_name:
                return c.type_name
    return None


def apply_definitions(current: Iterable[CatalogVersion],
                      definitions: Iterable[TableDefinition]) -> tuple[list[CatalogVersion], int]:
    """The catalog after `definitions`; returns (all versions, number of versions added or closed by a drop).

    Idempotent: a definition older than the relation's latest version, or equal to a version already starting
    at its commit LSN, is skipped, so decoding the same bronze again changes nothing.
    """
    by_rel: dict[int, list[CatalogVersion]] = {}
    for v in current:
        by_rel.setdefault(v.rel_oid, []).append(v)
    for versions in by_rel.values():
        versions.sort(key=lambda v: v.version)
    changed = 0
    for d in sorted(definitions, key=lambda d: (d.commit_lsn, d.lsn)):
        versions = by_rel.setdefault(d.rel_oid, [])
        latest = versions[-1] if versions else None
        if d.dropped:
            if latest is not None and latest.valid_to_lsn is None and d.commit_lsn >= latest.valid_from_lsn:
                versions[-1] = replace(latest, valid_to_lsn=d.commit_lsn)
                changed += 1
                log.info("catalog: %s.%s (oid %d) dropped at %s", d.schema_name, d.table_name, d.rel_oid,
                         Lsn(d.commit_lsn))
            continue
        sig = version_signature(d)
        if latest is not None:
            if d.commit_lsn < latest.valid_from_lsn or (latest.valid_to_lsn is not None
                                                        and d.commit_lsn < latest.valid_to_lsn):
                continue  # already covered (a re-run over older bronze), or from before the relation was dropped
            if d.commit_lsn == latest.valid_from_lsn and any(
                    v.valid_from_lsn == d.commit_lsn and version_signature(v) == sig for v in versions):
                continue
            if latest.valid_to_lsn is None and version_signature(latest) == sig:
                continue  # the usual case: a repeat sent at the start of a decoding session
        nullable = {c.name: c.nullable for c in latest.columns} if latest else {}
        cols = tuple(replace(c, type_name=c.type_name or type_name(c.type_oid, {}, latest),
                             nullable=c.nullable if c.nullable is not None else nullable.get(c.name))
                     for c in d.columns)
        if latest is not None and latest.valid_to_lsn is None:
            versions[-1] = replace(latest, valid_to_lsn=d.commit_lsn)
        versions.append(CatalogVersion(
            rel_oid=d.rel_oid, schema_name=d.schema_name, table_name=d.table_name,
            version=(latest.version + 1) if latest else 1, valid_from_lsn=d.commit_lsn, valid_to_lsn=None,
            replica_identity=d.replica_identity, columns=cols, origin=d.origin))
        changed += 1
        log.info("catalog: %s.%s (oid %d) version %d from %s (%s)", d.schema_name, d.table_name, d.rel_oid,
                 versions[-1].version, Lsn(d.commit_lsn), d.origin)
    out = [v for versions in by_rel.values() for v in versions]
    out.sort(key=lambda v: (v.rel_oid, v.version))
    return out, changed


def only_new_tables(current: Iterable[CatalogVersion], versions: Iterable[CatalogVersion]) -> bool:
    """Whether `versions` (`apply_definitions` of `current`) keep every current version as it is and add only the
    bootstrap definitions of relations `current` does not hold: a new source's first sync. Such a
    change needs no schema change anywhere downstream (`decode_in_process` writes it without Spark)."""
    before = set(current)
    known = {v.rel_oid for v in before}
    after = list(versions)
    return before <= set(after) and all(v.origin == "bootstrap" and v.rel_oid not in known
                                        for v in after if v not in before)


def version_at(versions: Iterable[CatalogVersion], rel_oid: int, lsn: int) -> CatalogVersion | None:
    """The version of `rel_oid` valid at commit LSN `lsn` (valid_from <= lsn < valid_to)."""
    for v in versions:
        if v.rel_oid == rel_oid and v.valid_from_lsn <= lsn and (v.valid_to_lsn is None or lsn < v.valid_to_lsn):
            return v
    return None


# ---- Spark I/O ----

CATALOG_DDL = contracts.ddl(contracts.CATALOG)


def read_catalog(spark, path: str) -> list[CatalogVersion]:
    """All versions in `_catalog` (empty if the table does not exist yet).

    The catalog is read with delta-rs, on a local or an s3a lake (a few hundred rows: no Spark jobs, no Delta
    snapshot to build in the JVM); Spark reads it elsewhere (other lake schemes)."""
    if delta_log.readable(path) and delta_log.has_commits(path):
        rows = delta_log.delta_rs_table(path).to_pyarrow_table().to_pylist()
    elif spark is None and delta_log.readable(path):
        return []  # no table yet (read without a session: `decode_in_process`)
    else:
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, path):
            return []
        rows = spark.read.format("delta").load(path).collect()
    out = []
    for r in rows:
        cols = tuple(CatalogColumn(position=c["position"], name=c["name"], type_oid=c["type_oid"],
                                   type_name=c["type_name"], typmod=c["typmod"], nullable=c["nullable"],
                                   is_key=c["is_key"]) for c in r["columns"])
        out.append(CatalogVersion(rel_oid=r["rel_oid"], schema_name=r["schema_name"], table_name=r["table_name"],
                                  version=r["version"], valid_from_lsn=r["valid_from_lsn"],
                                  valid_to_lsn=r["valid_to_lsn"], replica_identity=r["replica_identity"],
                                  columns=cols, origin=r["origin"]))
    return out


def catalog_app_id(source: str) -> str:
    """The idempotent-write transaction id of `_catalog`'s commits (its version: the decode run's end LSN)."""
    return f"slotlake-catalog-{source}"


def write_catalog(spark, path: str, versions: list[CatalogVersion], *, source: str, end_lsn: Lsn) -> None:
    """Replace `_catalog` with `versions` in one Delta commit, idempotent per (source, end_lsn). `spark` None: with
    delta-rs in this process (a local or an s3a lake: `decode_in_process`), the same rows, transaction and
    userMetadata."""
    rows = [(v.rel_oid, v.schema_name, v.table_name, v.version, v.valid_from_lsn, v.valid_to_lsn,
             v.replica_identity,
             [(c.position, c.name, c.type_oid, c.type_name, c.typmod, c.nullable, c.is_key) for c in v.columns],
             v.origin) for v in versions]
    if spark is None:
        _write_catalog_here(path, rows, source=source, end_lsn=end_lsn)
        return
    df = spark.createDataFrame(rows, CATALOG_DDL)
    (df.write.format("delta").mode("overwrite")
     .option("txnAppId", catalog_app_id(source)).option("txnVersion", end_lsn.value)
     .option("userMetadata", CommitMeta(STAGE_CATALOG, end_lsn).json())
     .save(path))


def _write_catalog_here(path: str, rows: list[tuple], *, source: str, end_lsn: Lsn) -> None:
    """`write_catalog`'s commit with delta-rs: an overwrite (a new table the first time) with the same idempotent-
    write transaction as Spark's writer, so a re-run, or a Spark decode after it, skips it."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.exceptions import TableNotFoundError
    from deltalake.transaction import CommitProperties, Transaction

    from slotlake import storage

    schema = contracts.arrow_schema(contracts.CATALOG)
    names = [n for n, _ in contracts.CATALOG]
    column_names = [f.name for f in schema.field("columns").type.value_type]
    docs = [dict(zip(names, r)) for r in rows]
    for d in docs:
        d["columns"] = [dict(zip(column_names, c)) for c in d["columns"]]
    data = pa.Table.from_pylist(docs, schema=schema)
    app_id = catalog_app_id(source)
    props = CommitProperties(custom_metadata={"userMetadata": CommitMeta(STAGE_CATALOG, end_lsn).json()},
                             app_transactions=[Transaction(app_id, end_lsn.value)])
    try:
        table = delta_log.delta_rs_table(path)
    except TableNotFoundError:
        uri, options = storage.delta_rs_table_args(path)
        write_deltalake(uri, data, mode="overwrite", storage_options=options or None, commit_properties=props)
        return
    done = table.transaction_version(app_id)
    if done is not None and done >= end_lsn.value:
        return  # this run's catalog commit is in already
    target = pa.schema(table.schema().to_arrow())  # a table Spark created: its own Arrow form of the same schema
    write_deltalake(table, data.cast(target), mode="overwrite", commit_properties=props)
