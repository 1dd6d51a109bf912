"""The decoded-row contract: what the decode leaves per bronze row, before Spark splits it (docs/internals.md).

One Arrow schema for both decoders (`frames.ChangeStreamDecoder` row by row through `row_of`, and
`vector.BatchDecoder` batch by batch): silver's columns plus `kind`. Commit rows carry their end LSN in
`commit_end_lsn`; relation rows reuse the column-description columns; type rows put the type's oid/schema/name in
rel_oid/schema_name/table_name; DDL event rows carry the message content in `content`. Pure (pyarrow only).
"""
from __future__ import annotations

import pyarrow as pa

from slotlake.contracts import DECODED, arrow_schema
from slotlake.decode.frames import (
    SeenCommit,
    SeenDdl,
    SeenRelation,
    SeenType,
    SilverChange,
    StreamItem,
)
from slotlake.errors import DecodeError

KIND_CHANGE, KIND_COMMIT, KIND_RELATION, KIND_TYPE, KIND_DDL = "change", "commit", "relation", "type", "ddl"


def decoded_schema() -> pa.Schema:
    return _DECODED_SCHEMA


_DECODED_SCHEMA = arrow_schema(DECODED)


def row_of(item: StreamItem) -> tuple:
    """One decoded row, in `decoded_schema()` order."""
    if isinstance(item, SilverChange):
        return (KIND_CHANGE, item.commit_lsn, None, item.commit_ts_us, item.xid, item.seq, item.lsn, item.rel_oid,
                item.schema_name, item.table_name, item.op, item.replica_identity, item.columns, item.key_columns,
                item.type_oids, item.typmods, item.old_kind, item.old, item.new, item.unchanged,
                item.truncate_options, item.bronze_file, None)
    if isinstance(item, SeenCommit):
        return (KIND_COMMIT, item.commit_lsn, item.end_lsn, None, item.xid, None, None, None, None, None, None,
                None, None, None, None, None, None, None, None, None, None, item.bronze_file, None)
    if isinstance(item, SeenRelation):
        r = item.relation
        return (KIND_RELATION, item.commit_lsn, None, None, None, None, item.lsn, r.oid, r.schema, r.name, None,
                r.replica_identity.value, [c.name for c in r.columns], [c.name for c in r.columns if c.is_key],
                [c.type_oid for c in r.columns], [c.typmod for c in r.columns], None, None, None, None, None,
                item.bronze_file, None)
    if isinstance(item, SeenType):
        t = item.type
        return (KIND_TYPE, item.commit_lsn, None, None, None, None, None, t.oid, t.schema, t.name, None, None,
                None, None, None, None, None, None, None, None, None, item.bronze_file, None)
    if isinstance(item, SeenDdl):
        return (KIND_DDL, item.commit_lsn, None, item.commit_ts_us, item.xid, None, item.lsn, None, None, None, None,
                None,
                None, None, None, None, None, None, None, None, None, item.bronze_file, item.content)
    raise DecodeError(f"unexpected stream item {item!r}")  # pragma: no cover


def rows_to_batch(rows: list[tuple], schema: pa.Schema | None = None) -> pa.RecordBatch:
    """`row_of` tuples as one Arrow batch."""
    schema = schema or decoded_schema()
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=schema)
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, schema)], schema=schema)
