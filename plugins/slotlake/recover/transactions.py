"""`slotlake transactions SOURCE --from X --to Y [--table T] [--json]`: the commits of a range, from silver.

How a user finds the bad transaction before `slotlake undo`: per commit its xid, commit LSN, commit end LSN, commit
time, and per table touched the rows inserted / updated / deleted (and TRUNCATEs). X and Y are parsed as `replay`
parses them (`slotlake.recover.replay.parse_point`) and mean the same range: an LSN bounds by commit LSN, inclusive at
both ends; a moment T stands for the last commit before it (silver's greatest `commit_lsn` with `commit_ts < T`),
so two moments A, B list the commits with `A <= commit_ts < B`, the ones `replay --from A --to B` applies.

Silver is read with delta-rs (`deltalake`), not Spark: a listing starts no JVM. Only the seven columns it needs
are read, in record batches with the commit LSN range pushed down to the Parquet files; what is kept in memory is
one counter per (transaction, table).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slotlake import delta_log
from slotlake.config import Config
from slotlake.errors import SlotlakeError
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.recover.replay import Point, parse_point, parse_table

_COLUMNS = ["commit_lsn", "commit_end_lsn", "commit_ts", "xid", "schema_name", "table_name", "op"]
_MAX_LONG = 2**63 - 1
_OPS = {"I": "inserted", "U": "updated", "D": "deleted", "T": "truncated"}


class TransactionsError(SlotlakeError):
    """Silver cannot answer (nothing decoded yet, unreadable lake)."""


@dataclass(frozen=True)
class TableCounts:
    table: TableName
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    truncated: int = 0  # TRUNCATEs of the table in the transaction (0 or 1 in practice)

    def as_dict(self) -> dict[str, Any]:
        return {"table": str(self.table), "inserted": self.inserted, "updated": self.updated,
                "deleted": self.deleted, "truncated": self.truncated}


@dataclass(frozen=True)
class Transaction:
    xid: int
    commit_lsn: Lsn
    commit_end_lsn: Lsn
    commit_ts: datetime  # aware, UTC
    tables: tuple[TableCounts, ...]  # sorted by table name

    def as_dict(self) -> dict[str, Any]:
        return {"xid": self.xid, "commit_lsn": str(self.commit_lsn), "commit_end_lsn": str(self.commit_end_lsn),
                "commit_ts": self.commit_ts.isoformat(), "tables": [t.as_dict() for t in self.tables]}


@dataclass(frozen=True)
class TransactionList:
    source: str
    from_lsn: Lsn | None  # commits with commit_lsn > from_lsn (a resolved moment) or >= it (an LSN given)
    to_lsn: Lsn
    from_inclusive: bool
    transactions: tuple[Transaction, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "from_lsn": str(self.from_lsn) if self.from_lsn is not None else None,
                "from_inclusive": self.from_inclusive, "to_lsn": str(self.to_lsn),
                "transactions": [t.as_dict() for t in self.transactions]}

    def lines(self) -> list[str]:
        """The human table: one line per (transaction, table)."""
        lo = "(start)" if self.from_lsn is None else f"{'[' if self.from_inclusive else '('}{self.from_lsn}"
        out = [f"transactions {self.source}: {len(self.transactions)} commit(s) in {lo}, {self.to_lsn}]"]
        if not self.transactions:
            return out
        head = ("xid", "commit_lsn", "commit_end_lsn", "commit_ts (UTC)", "table", "ins", "upd", "del", "trunc")
        rows = []
        for t in self.transactions:
            for i, c in enumerate(t.tables):
                first = (str(t.xid), str(t.commit_lsn), str(t.commit_end_lsn),
                         t.commit_ts.strftime("%Y-%m-%d %H:%M:%S.%f")) if i == 0 else ("", "", "", "")
                rows.append((*first, str(c.table), str(c.inserted), str(c.updated), str(c.deleted),
                             str(c.truncated)))
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        for r in (head, *rows):
            out.append("  ".join(v.ljust(w) if i < 5 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
                       .rstrip())
        return out


def summarize(rows: Iterable[dict[str, Any]], tables: Sequence[TableName] | None = None) -> tuple[Transaction, ...]:
    """Silver change rows (the `_COLUMNS`) -> one Transaction per commit, in commit LSN order. Pure.

    With `tables`, only those tables are counted and only the commits touching one of them are listed."""
    wanted = {TableName(*t) for t in tables} if tables else None
    heads: dict[int, tuple[int, int, datetime]] = {}
    counts: dict[int, dict[TableName, dict[str, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    for r in rows:
        name = TableName(r["schema_name"], r["table_name"])
        if wanted is not None and name not in wanted:
            continue
        c = r["commit_lsn"]
        heads.setdefault(c, (r["xid"], r["commit_end_lsn"], r["commit_ts"]))
        counts[c][name][_OPS[r["op"]]] += r.get("n", 1)
    out = []
    for c in sorted(heads):
        xid, end, ts = heads[c]
        out.append(Transaction(xid=int(xid), commit_lsn=Lsn(c), commit_end_lsn=Lsn(end), commit_ts=_utc(ts),
                               tables=tuple(TableCounts(n, **counts[c][n]) for n in sorted(counts[c]))))
    return tuple(out)


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def open_silver(cfg: Config, source: str):
    """The source's silver changes as a delta-rs DeltaTable; TransactionsError when there is none yet."""
    from deltalake.exceptions import TableNotFoundError

    path = LakePaths.of(cfg.lake, source).changes
    try:
        return delta_log.delta_rs_table(path)
    except TableNotFoundError:
        raise TransactionsError(f"{source}: nothing is decoded yet ({path}); run `slotlake sync {source}` "
                                "first") from None


def resolve_point(dataset, point: Point) -> Lsn:
    """An LSN as is; a moment T -> silver's greatest commit LSN with commit_ts < T (replay's rule,
    `slotlake.recover.replay_job.resolve`): with none before T, the LSN just before silver's first commit."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(point, Lsn):
        return point
    before = None
    first = None
    for batch in dataset.to_batches(columns=["commit_lsn", "commit_ts"]):
        lsns, ts = batch.column("commit_lsn"), batch.column("commit_ts")
        m = pc.min(lsns).as_py()
        if m is not None:
            first = m if first is None else min(first, m)
        moment = pa.scalar(point if ts.type.tz else point.replace(tzinfo=None), type=ts.type)  # silver: UTC
        hit = pc.max(pc.filter(lsns, pc.less(ts, moment))).as_py()
        if hit is not None:
            before = hit if before is None else max(before, hit)
    if before is not None:
        return Lsn(before)
    return Lsn(max(first - 1, 0)) if first is not None else Lsn(0)


def list_transactions(cfg: Config, source: str, from_: str, to: str,
                      tables: Sequence[str] | None = None) -> TransactionList:
    """The commits of silver in the range (see the module doc), counted per table."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    cfg.source(source)
    f, t = parse_point(from_, "--from"), parse_point(to, "--to")
    names = tuple(parse_table(n) for n in tables) if tables else None
    dataset = open_silver(cfg, source).to_pyarrow_dataset()
    lo, hi = resolve_point(dataset, f), resolve_point(dataset, t)
    inclusive = isinstance(f, Lsn)
    if lo > hi:
        raise TransactionsError(f"--from {from_} ({lo}) is after --to {to} ({hi}); swap them")
    top = min(int(hi), _MAX_LONG)  # silver's LSNs are Delta longs
    cond = (ds.field("commit_lsn") >= min(int(lo), _MAX_LONG) if inclusive
            else ds.field("commit_lsn") > min(int(lo), _MAX_LONG)) & (ds.field("commit_lsn") <= top)
    if names:
        cond = cond & ds.field("table_name").isin(sorted({n.name for n in names}))
    grouped: list = []
    for batch in dataset.to_batches(columns=_COLUMNS, filter=cond):
        if batch.num_rows == 0:
            continue
        agg = pa.Table.from_batches([batch]).group_by(_COLUMNS).aggregate([("op", "count")])
        grouped.extend(dict(r, n=r.pop("op_count")) for r in agg.to_pylist())
    return TransactionList(source, lo, hi, inclusive, summarize(grouped, names))
