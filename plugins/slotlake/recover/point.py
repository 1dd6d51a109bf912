"""The recover request: what to recover, as of which point, to where (parsing and checks are pure; `recover` runs it).

    slotlake recover SOURCE --as-of POINT --table T [--table T ...] --to DEST [--into-schema S] [--replace]

- POINT is an LSN (`16/B374D848`) or an ISO time (UTC unless it carries a zone). Both resolve to one commit LSN:
  the greatest commit LSN in silver that is <= the LSN, or whose commit time is <= the time (the last commit at or
  before it). Every selected table is recovered at that same commit LSN: a consistent multi-table view.
- DEST a path or URI: one Delta table per table at `DEST/<schema>/<table>` (names encoded as in `slotlake.lake`).
- DEST `postgresql://...`: tables `<into-schema>.<table>` created with the columns and types of the table at the
  point (from `_catalog`) and its key, filled with COPY. The password never reaches a command line or a log: it
  is taken out of the URL here and handed to the Spark app as PGPASSWORD in its environment.
- An existing target table is never overwritten unless `replace`.

`slotlake.recover.recover_run.recover` runs it: in the caller's process where `point_in_process` can do it exactly
(no JVM), else in the Spark app `spark_apps/recover.py` (`slotlake.recover.point_job.run_recover`). Both start from
the nearest gold version at or before the point and apply only the archived changes after it (the replay
machinery: `replay_in_process`, `replay_job`).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slotlake.catalog import CatalogVersion
from slotlake.errors import ConfigError, RecoverError
from slotlake.lsn import Lsn
from slotlake.names import TableName
from slotlake.recover.replay import Point, format_point, parse_point, parse_table

log = logging.getLogger(__name__)

DEFAULT_INTO_SCHEMA = "recovered"
# What `--as-of` accepts, as a JSON-schema pattern (the DAG's form validates with it; `parse_point` decides).
AS_OF_PATTERN = (r"^\s*([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}|"
                 r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
                 r"([T ]([01][0-9]|2[0-3])(:[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?)?)?"
                 r"(Z|[+-]([01][0-9]|2[0-3])(:?[0-5][0-9])?)?)\s*$")
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(dest: str) -> bool:
    return dest.strip().lower().startswith(_POSTGRES_SCHEMES)


def split_password(url: str) -> tuple[str, str | None]:
    """`postgresql://u:pw@h/db?...` -> (libpq conninfo without the password, the password or None). Pure.

    The error never repeats the URL: it may hold the password."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(url.strip())
    except ProgrammingError:
        raise ConfigError("--to is not a valid PostgreSQL URL; expected postgresql://user@host:port/dbname") from None
    password = params.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in params.items()}), (str(password) if password is not None else None)


@dataclass(frozen=True)
class RecoverRequest:
    """What to recover, as the CLI, the DAG and the Spark app pass it around (never holds a password)."""

    source: str
    as_of: Point
    tables: tuple[TableName, ...]
    to_delta: str | None = None  # DEST path/URI
    to_postgres: str | None = None  # libpq conninfo, password removed
    into_schema: str = DEFAULT_INTO_SCHEMA
    replace: bool = False

    @property
    def target(self) -> str:
        return "postgres" if self.to_postgres is not None else "delta"

    def postgres_table(self, table: TableName) -> TableName:
        return TableName(self.into_schema, table.name)

    def args(self) -> list[str]:
        """The recover Spark app's arguments after `--config F --source S`."""
        out = ["--as-of", format_point(self.as_of), "--tables", ",".join(str(t) for t in self.tables)]
        if self.to_postgres is not None:
            out += ["--to-postgres", self.to_postgres, "--into-schema", self.into_schema]
        else:
            out += ["--to-delta", str(self.to_delta)]
        return out + (["--replace"] if self.replace else [])


def request(source: str, as_of: str, tables: Sequence[str] | None, to: str, into_schema: str | None = None,
            replace: bool = False) -> tuple[RecoverRequest, str | None]:
    """Parse and check the user's arguments (no I/O): (request, the target's password or None).

    Raises ConfigError naming the option and the fix."""
    point = parse_point(as_of, "--as-of")
    if not tables:
        raise ConfigError("recover needs at least one --table schema.table")
    names = tuple(dict.fromkeys(parse_table(t) for t in tables))
    dest = (to or "").strip()
    if not dest:
        raise ConfigError("--to is required: a folder/URI for Delta tables, or a postgresql:// URL")
    if not is_postgres_url(dest):
        if into_schema:
            raise ConfigError("--into-schema applies only to a postgresql:// --to; drop it for a Delta destination")
        return RecoverRequest(source, point, names, to_delta=dest, replace=replace), None
    schema = (into_schema or DEFAULT_INTO_SCHEMA).strip()
    if not schema:
        raise ConfigError("--into-schema is empty; give a schema name (default: recovered)")
    by_name: dict[str, TableName] = {}
    for n in names:
        if n.name in by_name:
            raise ConfigError(f"{by_name[n.name]} and {n} would both become {TableName(schema, n.name)}; "
                              "recover them in separate runs with different --into-schema")
        by_name[n.name] = n
    conninfo, password = split_password(dest)
    return RecoverRequest(source, point, names, to_postgres=conninfo, into_schema=schema, replace=replace), password


def version_at(versions: Iterable[CatalogVersion], table: TableName, lsn: Lsn) -> CatalogVersion | None:
    """The catalog version of `table` (by name) valid at commit LSN `lsn`; before its first version, the first one
    (the bootstrap read starts at the slot's consistent point, just after the initial copy's watermark). Pure."""
    mine = sorted((v for v in versions if (v.schema_name, v.table_name) == tuple(table)),
                  key=lambda v: (v.valid_from_lsn, v.version))
    at = [v for v in mine if v.valid_from_lsn <= lsn.value and (v.valid_to_lsn is None or lsn.value < v.valid_to_lsn)]
    if at:
        return at[-1]
    earlier = [v for v in mine if v.valid_from_lsn <= lsn.value]
    if earlier:
        return None  # dropped (or renamed away) before the point
    return mine[0] if mine else None


@dataclass(frozen=True)
class ArchiveGap:
    """WAL a resync left unarchived: the old slot archived commits up to `archived_end`, the new slot starts at its
    consistent point `resumed` (created at `resumed_at`, UTC); the state at a commit LSN strictly between
    `archived_end` and `resumed - 1` (the new copy's watermark) is unknown to the lake."""

    archived_end: Lsn
    resumed: Lsn
    resumed_at: datetime

    def holds(self, lsn: Lsn) -> bool:
        return self.archived_end.value < lsn.value < self.resumed.value - 1


def archive_gaps(bronze_ends: Iterable[Lsn], generations: Sequence[tuple[Lsn, datetime, Lsn | None]]
                 ) -> list[ArchiveGap]:
    """The gaps before each resync: every slot generation after the first, given oldest first as (consistent point,
    created at, how far the archive reached then). Where that reach was not recorded (a lake from before it was),
    the old archive is taken to end at its newest bronze file before the new consistent point, or at the old copy's
    watermark: conservative (an idle extract's coverage past its last file is not counted). Pure."""
    ends = sorted(bronze_ends)
    gaps = []
    for (prev, _, _), (point, at, reached) in zip(generations, generations[1:]):
        archived = reached if reached is not None else max(
            [e for e in ends if e.value < point.value] + [Lsn(prev.value - 1)], key=lambda e: e.value)
        if archived.value < point.value - 2:  # at least one LSN strictly inside
            gaps.append(ArchiveGap(archived, point, at))
    return gaps


def gap_error(source: str, point: Point, gap: ArchiveGap) -> RecoverError:
    return RecoverError(
        f"recover {source}: --as-of {format_point(point)} falls where the archive has nothing: the changes after "
        f"{gap.archived_end} up to the resync at {gap.resumed} ({gap.resumed_at.isoformat()}) were never archived "
        f"(the old slot was lost); choose a point at or before {gap.archived_end} or at or after {gap.resumed}")


@dataclass(frozen=True)
class RecoveredTable:
    table: str  # schema.table in the source
    rows: int
    written_to: str  # the Delta path, or schema.table in the target database


@dataclass(frozen=True)
class RecoverResult:
    source: str
    as_of: str  # as asked
    lsn: Lsn  # the resolved commit LSN
    commit_ts: datetime | None  # its commit time (None: before the first decoded commit)
    target: str  # delta | postgres
    tables: tuple[RecoveredTable, ...]
    # the tables read from their history table (gold_history) at the LSN; the others were rebuilt by replay
    from_history: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "as_of": self.as_of, "lsn": str(self.lsn),
                "commit_ts": self.commit_ts.isoformat() if self.commit_ts else None, "target": self.target,
                "tables": [dataclasses.asdict(t) for t in self.tables], "from_history": list(self.from_history)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecoverResult:
        return cls(source=d["source"], as_of=d["as_of"], lsn=Lsn.parse(d["lsn"]),
                   commit_ts=datetime.fromisoformat(d["commit_ts"]) if d["commit_ts"] else None,
                   target=d["target"], tables=tuple(RecoveredTable(**t) for t in d["tables"]),
                   from_history=tuple(d.get("from_history", ())))

    def lines(self) -> list[str]:
        when = (self.commit_ts.isoformat() if self.commit_ts
                else "none (before the first decoded commit: the initial copy's state)")
        return ([f"recover {self.source} as of {self.as_of}: commit LSN {self.lsn}, commit time {when}"]
                + [f"  {t.table}: {t.rows} rows -> {t.written_to}" + (" (from history)" if t.table in self.from_history
                                                                       else "") for t in self.tables])
