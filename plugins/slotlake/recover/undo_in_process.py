"""The states before and after one transaction without Spark, for `slotlake undo` (`recover/undo.py`).

    per table: state := gold@R + silver (R, L-1]      (`replay_in_process`, --dest scratch, from = to = L-1)
               ── version b: the state just before the transaction
               state += the transaction re-decoded from bronze and merged (`replay_in_process.apply_range`, (L, L])
               ── version a: the state just after it
    removed = b EXCEPT ALL a, added = a EXCEPT ALL b, over the files the transaction's merge rewrote (the others
    are in both versions and cancel out), as multisets of the columns' values

The same result as `undo._table_undo`'s Spark states, where the in-process replay and merge take the batches: a
transaction whose batch they decline (a key change of a row with an unchanged TOAST value, a schema change, ...) goes
to the Spark path, as does a table without a recorded state before it. Returns None then, nothing kept.
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from slotlake import storage
from slotlake.config import Config
from slotlake.lake import table_dir
from slotlake.lsn import Lsn
from slotlake.names import TableName

log = logging.getLogger(__name__)

Rows = list[dict[str, Any]]


def transaction_states(cfg: Config, source: str, table: TableName, columns: Sequence[str], commit_lsn: Lsn,
                       scratch: str) -> tuple[Rows, Rows, Callable[..., list[int]]] | None:
    """(rows the transaction at `commit_lsn` removed from `table`, rows it added, `count_after(rows, key)`: how
    many rows equal to each of `rows` by `key` the table held right after it), over `columns`, with soft-deleted
    rows left out; None when this process declines (logged). Raises KeyError naming the columns the state lacks."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from slotlake.recover.replay import ReplayRequest
    from slotlake.recover.replay_in_process import apply_range, replay_in_process

    before = Lsn(int(commit_lsn) - 1)
    root = f"{scratch}/state"
    if replay_in_process(cfg, ReplayRequest(source=source, from_=before, to=before, tables=(table,),
                                            dest=root)) is None:
        return None
    path = table_dir(root, *table)
    local = str(storage.local_path(path))
    before_version = DeltaTable(local).version()
    if apply_range(cfg, source, [table], lambda *_: path, commit_lsn, commit_lsn, f"{scratch}/tx") is None:
        return None
    after = DeltaTable(local)
    schema = pa.schema(after.schema().to_arrow())  # arro3's schema, as pyarrow's
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise KeyError(", ".join(missing))
    b_files = set(DeltaTable(local, version=before_version).file_uris())
    a_files = set(after.file_uris())
    removed_rows = list(_live_rows(sorted(b_files - a_files), columns, schema))
    added_rows = list(_live_rows(sorted(a_files - b_files), columns, schema))
    b, a = Counter(map(_hashable, removed_rows)), Counter(map(_hashable, added_rows))
    removed = _except_all(removed_rows, b, a)
    added = _except_all(added_rows, a, b)

    def count_after(rows: Rows, key: Callable[[dict[str, Any]], Any]) -> list[int]:
        wanted = {key(r): 0 for r in rows}
        for row in _live_rows(sorted(a_files), columns, schema):
            k = key(row)
            if k in wanted:
                wanted[k] += 1
        return [wanted[key(r)] for r in rows]

    log.info("undo %s: %s: %d row(s) removed and %d added by the transaction at %s, in this process", source, table,
             len(removed), len(added), commit_lsn)
    return removed, added, count_after


def _local(uri: str) -> str:
    """A data file's URI as delta-rs lists it (`file:///...`, percent-encoded) as a local path."""
    from urllib.parse import unquote

    return str(storage.local_path(unquote(uri) if uri.startswith("file://") else uri))


def _live_rows(files: Sequence[str], columns: Sequence[str], schema: Any) -> Iterator[dict[str, Any]]:
    """The rows of the Parquet data files `files` (URIs of one Delta table's files; `schema`: the table's, so a
    file written before a column was added reads it as NULL), `columns` only, soft-deleted rows
    (`_slotlake_deleted`) left out."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from slotlake.contracts import DELETED_COL

    if not files:
        return
    fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"))
    data = ds.dataset([_local(f) for f in files], schema=schema, format=fmt)
    live = pc.invert(pc.fill_null(ds.field(DELETED_COL), False)) if DELETED_COL in data.schema.names else None
    for batch in data.to_batches(columns=list(columns), filter=live):
        yield from batch.to_pylist()


def _hashable(value: Any) -> Any:
    """A value (a row, a list, ...) as a hashable one with Spark's equality: NULLs equal, NaN equal to NaN."""
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    return value


def _except_all(rows: Rows, have: Counter, other: Counter) -> Rows:
    """`rows` EXCEPT ALL the multiset `other` (`have`: the multiset of `rows`), in `rows`' order."""
    left = {k: n - other.get(k, 0) for k, n in have.items()}
    out = []
    for r in rows:
        k = _hashable(r)
        if left[k] > 0:
            out.append(r)
            left[k] -= 1
    return out
