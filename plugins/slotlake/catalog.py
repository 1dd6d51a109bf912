"""The multi-version catalog `<lake>/<source>/_catalog` (docs/internals.md "Catalog").

One row per (relation, version). A Relation message starts a new version only when its definition (table name,
column names, type OIDs, typmods, key flags, replica identity) differs from the relation's latest version; the
previous version is then closed (`valid_to_lsn`). pgoutput re-sends every relation in every decoding session,
so almost all Relation messages are repeats and change nothing.

The versioning is pure (`apply_relations`); `read_catalog`/`write_catalog` do the Spark I/O. The catalog is small
(one row per table version), so it is read to the driver and rewritten whole in one idempotent Delta commit.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from slotlake.decode.messages import Relation
from slotlake.lsn import Lsn

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
class RelationDefinition:
    """A Relation message seen in the stream, with the commit LSN (and message LSN) of its transaction."""

    commit_lsn: int
    lsn: int
    relation: Relation


def _signature(schema: str, table: str, replica_identity: str,
               columns: Iterable[tuple[str, int, int, bool]]) -> tuple:
    return (schema, table, replica_identity, tuple(columns))


def version_signature(v: CatalogVersion) -> tuple:
    return _signature(v.schema_name, v.table_name, v.replica_identity,
                      ((c.name, c.type_oid, c.typmod, c.is_key) for c in v.columns))


def relation_signature(r: Relation) -> tuple:
    return _signature(r.schema, r.name, r.replica_identity.value,
                      ((c.name, c.type_oid, c.typmod, c.is_key) for c in r.columns))


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


def apply_relations(current: Iterable[CatalogVersion], seen: Iterable[RelationDefinition],
                    custom_types: Mapping[int, str]) -> tuple[list[CatalogVersion], int]:
    """The catalog after the Relation messages `seen`; returns (all versions, number of versions added).

    Idempotent: a definition at or before the relation's latest `valid_from_lsn` that matches a version already
    starting there is skipped, so decoding the same bronze again adds nothing.
    """
    by_rel: dict[int, list[CatalogVersion]] = {}
    for v in current:
        by_rel.setdefault(v.rel_oid, []).append(v)
    for versions in by_rel.values():
        versions.sort(key=lambda v: v.version)
    added = 0
    for d in sorted(seen, key=lambda d: (d.commit_lsn, d.lsn)):
        rel = d.relation
        versions = by_rel.setdefault(rel.oid, [])
        latest = versions[-1] if versions else None
        sig = relation_signature(rel)
        if latest is not None:
            if d.commit_lsn < latest.valid_from_lsn:
                continue  # already covered by a later version (a re-run over older bronze)
            if d.commit_lsn == latest.valid_from_lsn and any(
                    v.valid_from_lsn == d.commit_lsn and version_signature(v) == sig for v in versions):
                continue
            if version_signature(latest) == sig:
                continue  # the usual case: a repeat sent at the start of a decoding session
        nullable = {c.name: c.nullable for c in latest.columns} if latest else {}
        cols = tuple(
            CatalogColumn(position=i + 1, name=c.name, type_oid=c.type_oid,
                          type_name=type_name(c.type_oid, custom_types, latest), typmod=c.typmod,
                          nullable=nullable.get(c.name), is_key=c.is_key)
            for i, c in enumerate(rel.columns))
        if latest is not None:
            versions[-1] = replace(latest, valid_to_lsn=d.commit_lsn)
        versions.append(CatalogVersion(
            rel_oid=rel.oid, schema_name=rel.schema, table_name=rel.name,
            version=(latest.version + 1) if latest else 1, valid_from_lsn=d.commit_lsn, valid_to_lsn=None,
            replica_identity=rel.replica_identity.value, columns=cols, origin="relation"))
        added += 1
        log.info("catalog: %s.%s (oid %d) version %d from %s", rel.schema, rel.name, rel.oid,
                 versions[-1].version, Lsn(d.commit_lsn))
    out = [v for versions in by_rel.values() for v in versions]
    out.sort(key=lambda v: (v.rel_oid, v.version))
    return out, added


def version_at(versions: Iterable[CatalogVersion], rel_oid: int, lsn: int) -> CatalogVersion | None:
    """The version of `rel_oid` valid at commit LSN `lsn` (valid_from <= lsn < valid_to)."""
    for v in versions:
        if v.rel_oid == rel_oid and v.valid_from_lsn <= lsn and (v.valid_to_lsn is None or lsn < v.valid_to_lsn):
            return v
    return None


# ---- Spark I/O ----

CATALOG_DDL = (
    "rel_oid long, schema_name string, table_name string, version int, valid_from_lsn long, valid_to_lsn long, "
    "replica_identity string, columns array<struct<position:int, name:string, type_oid:int, type_name:string, "
    "typmod:int, nullable:boolean, is_key:boolean>>, origin string"
)


def read_catalog(spark, path: str) -> list[CatalogVersion]:
    """All versions in `_catalog` (empty if the table does not exist yet)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    out = []
    for r in spark.read.format("delta").load(path).collect():
        cols = tuple(CatalogColumn(position=c["position"], name=c["name"], type_oid=c["type_oid"],
                                   type_name=c["type_name"], typmod=c["typmod"], nullable=c["nullable"],
                                   is_key=c["is_key"]) for c in r["columns"])
        out.append(CatalogVersion(rel_oid=r["rel_oid"], schema_name=r["schema_name"], table_name=r["table_name"],
                                  version=r["version"], valid_from_lsn=r["valid_from_lsn"],
                                  valid_to_lsn=r["valid_to_lsn"], replica_identity=r["replica_identity"],
                                  columns=cols, origin=r["origin"]))
    return out


def write_catalog(spark, path: str, versions: list[CatalogVersion], *, source: str, end_lsn: Lsn) -> None:
    """Replace `_catalog` with `versions` in one Delta commit, idempotent per (source, end_lsn)."""
    rows = [(v.rel_oid, v.schema_name, v.table_name, v.version, v.valid_from_lsn, v.valid_to_lsn,
             v.replica_identity,
             [(c.position, c.name, c.type_oid, c.type_name, c.typmod, c.nullable, c.is_key) for c in v.columns],
             v.origin) for v in versions]
    df = spark.createDataFrame(rows, CATALOG_DDL)
    (df.write.format("delta").mode("overwrite")
     .option("txnAppId", f"slotlake-catalog-{source}").option("txnVersion", end_lsn.value)
     .option("userMetadata", json.dumps({"slotlake": {"end_lsn": str(end_lsn), "stage": "catalog"}}))
     .save(path))
