"""Replay: rebuild tables from the archived changes of an LSN (or time) range, with the historical catalog.

    slotlake replay SOURCE --from X --to Y [--table T ...] [--dest PATH]

X and Y are LSNs (`16/B374D848`) or ISO timestamps (UTC when they carry no zone). A timestamp T stands for the
last commit before it: the greatest silver `commit_lsn` whose `commit_ts < T`, so `--from A --to B` covers the
commits with `A <= commit_ts < B` (an Airflow data interval). The work runs in the Spark app
`spark_apps/replay.py` (`slotlake.recover.replay_job.run_replay`), or for a replay it can do exactly in the
caller's process without a JVM (`slotlake.recover.replay_in_process`; `slotlake.recover.replay_run.replay` chooses);
this module parses the points, the same way for the CLI and (with templated arguments) the
`slotlake_replay__<source>` DAG.

- `--dest PATH`: `<PATH>/<schema>/<table>` becomes a new Delta table holding the table's state at Y: gold as of
  the greatest recorded end LSN R <= X (time travel; empty when there is none), plus the changes with
  R < commit_end_lsn, commit_lsn <= Y, re-decoded from bronze into a scratch silver table, applied by the merge engine.
- in place: silver's rows for (R, Y] are re-derived from bronze (one Delta commit), and each selected gold table
  is rebuilt from its state at R to silver's end and written back in one Delta commit (history kept).
  Running it twice gives the same result.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from slotlake.errors import ConfigError
from slotlake.lsn import Lsn
from slotlake.names import TableName

log = logging.getLogger(__name__)

_LSN = re.compile(r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$")

Point = Lsn | datetime
"""A replay boundary: an LSN, or a moment (tz-aware, UTC) resolved to the last commit before it."""


def parse_point(text: str, what: str = "--from") -> Point:
    """`16/B374D848` -> Lsn; `2024-03-01T09:14:00[+02:00]` / `2024-03-01 09:14` -> aware datetime (UTC if no zone).

    Raises ConfigError naming the option and both accepted forms.
    """
    s = text.strip()
    if _LSN.match(s):
        return Lsn.parse(s)
    try:
        t = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
    except ValueError:
        raise ConfigError(f"{what} {text!r} is neither an LSN (like 16/B374D848) nor an ISO timestamp "
                          "(like 2024-03-01T09:14:00, UTC unless it carries a zone)") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def format_point(p: Point) -> str:
    return str(p) if isinstance(p, Lsn) else p.isoformat()


def parse_table(name: str) -> TableName:
    """A `--table` argument, read as PostgreSQL reads `schema.table` (see slotlake.names)."""
    try:
        return TableName.parse(name)
    except ConfigError as e:
        raise ConfigError(f"--table {e}") from None


@dataclass(frozen=True)
class ReplayRequest:
    """What to replay, as the CLI, the DAG and the Spark app pass it around."""

    source: str
    from_: Point
    to: Point
    tables: tuple[TableName, ...] | None = None  # None: every table of the source
    dest: str | None = None  # None: in place

    def args(self) -> list[str]:
        """The replay Spark app's arguments after `--config F --source S`."""
        out = ["--from", format_point(self.from_), "--to", format_point(self.to)]
        if self.tables:
            out += ["--tables", ",".join(str(TableName(*t)) for t in self.tables)]
        if self.dest:
            out += ["--dest", self.dest]
        return out


def request(source: str, from_: str, to: str, tables: Sequence[str] | None = None,
            dest: str | None = None) -> ReplayRequest:
    """Parse and check the user's arguments (no I/O): raises ConfigError with the fix."""
    f, t = parse_point(from_, "--from"), parse_point(to, "--to")
    if type(f) is type(t) and f > t:  # type: ignore[operator]
        raise ConfigError(f"--from {from_} is after --to {to}; swap them")
    names = tuple(parse_table(n) for n in tables) if tables else None
    return ReplayRequest(source=source, from_=f, to=t, tables=names, dest=dest.strip() if dest else None)
