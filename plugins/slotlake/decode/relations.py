"""A pgoutput Relation message as a catalog definition: what the decode adds to `_catalog` (docs/internals.md
"Catalog"). Pure."""
from __future__ import annotations

from collections.abc import Mapping

from slotlake.catalog import CatalogColumn, TableDefinition, type_name
from slotlake.decode.messages import Relation


def relation_definition(commit_lsn: int, lsn: int, rel: Relation, custom_types: Mapping[int, str]) -> TableDefinition:
    """A Relation message as a definition (nullability unknown; type names resolved later if custom)."""
    cols = tuple(CatalogColumn(position=i + 1, name=c.name, type_oid=c.type_oid,
                               type_name=type_name(c.type_oid, custom_types), typmod=c.typmod, nullable=None,
                               is_key=c.is_key) for i, c in enumerate(rel.columns))
    return TableDefinition(commit_lsn=commit_lsn, lsn=lsn, rel_oid=rel.oid, schema_name=rel.schema,
                           table_name=rel.name, replica_identity=rel.replica_identity.value, columns=cols,
                           origin="relation")
