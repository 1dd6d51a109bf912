"""One run at a time per source: a PostgreSQL session advisory lock on the source database.

Two runs that write the same source's lake or move its slot at once (a CLI sync while the DAG runs, two in-place
replays, a resync during a sync) could archive the same commits twice or interleave Delta writes. Every writer
takes `source_lock` first; the second one waits up to `sources.<name>.lock_timeout_s`, then stops with a
`SourceBusyError` naming the holder (what it runs, its pid and host, since when).

Why an advisory lock on the source: it works across machines (Airflow workers, a laptop running the CLI), needs
no lock server, and PostgreSQL releases it when the holding session ends, also when the process is killed, so a
crash never leaves a stale lock. The key is (a slotlake constant, hashtext(slot name)) in the source database:
the slot is what a run consumes, and a slot belongs to one database. The session is autocommit and idle while it
holds the lock, so it holds no snapshot and no transaction.

Who takes it (README "Operations"): the CLI's `sync`, `resync` and in-place `replay` for their whole run, Spark
apps included (their subprocesses run while the CLI's session holds the lock); the sync DAG's tasks each for
their own stage (preflight, extract, decode, merge; the report only reads); the replay DAG's in-place runs.
Within one process the lock is re-entrant (the CLI's sync calls the same task functions as the DAG).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import psycopg

from slotlake.config import SourceConfig
from slotlake.errors import SourceBusyError
from slotlake.source.connection import connect, scalar

log = logging.getLogger(__name__)

LOCK_CLASS = 0x534C4B45  # "SLKE": the first key of every slotlake advisory lock
_POLL_S = 1.0
_held: dict[str, int] = {}  # slot -> re-entry depth, for locks this process holds


@dataclass(frozen=True)
class LockHolder:
    """Who holds a source's lock, as pg_stat_activity shows the holding session."""

    what: str  # the holder's application_name, e.g. "slotlake sync shop pid 1234 on host-a"
    since: datetime | None  # when the holder's session started (None when the role may not see it)
    backend_pid: int

    def describe(self) -> str:
        since = f", since {self.since.isoformat(timespec='seconds')}" if self.since else ""
        return f"{self.what or 'an unnamed session'} (backend pid {self.backend_pid}{since})"


def holder_name(what: str, source: str) -> str:
    """The application_name of a lock session: what runs, for which source, in which process on which host.
    PostgreSQL keeps 63 bytes of it."""
    return f"slotlake {what} {source} pid {os.getpid()} on {socket.gethostname()}"[:63]


def _try_lock(conn: psycopg.Connection, slot: str) -> bool:
    return bool(scalar(conn, "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, slot)))


def lock_holder(conn: psycopg.Connection, slot: str) -> LockHolder | None:
    """The session holding the lock of `slot`, if any (pg_locks: the two-int4 key form has objsubid 2)."""
    row = conn.execute(
        "SELECT a.application_name, a.backend_start, l.pid FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s::int4::oid AND l.objid = hashtext(%s)::oid",
        (LOCK_CLASS, slot)).fetchone()
    return LockHolder(what=row[0] or "", since=row[1], backend_pid=row[2]) if row else None


def busy_message(source: SourceConfig, holder: LockHolder | None, waited_s: float) -> str:
    """The one-line error when the lock could not be taken in time. Pure."""
    who = holder.describe() if holder else "another session (it has just released it; run again)"
    waited = f"waited {waited_s:.0f} s; " if waited_s >= 1 else ""
    return (f"source {source.name} is being synced by another run: {who}; {waited}wait for it to finish and run "
            f"again, or raise sources.{source.name}.lock_timeout_s to wait longer")


@contextmanager
def source_lock(source: SourceConfig, what: str, *, timeout_s: float | None = None) -> Iterator[None]:
    """Hold `source`'s run lock for the `with` block; `what` names the holder (sync, extract, replay, ...).

    Waits up to `timeout_s` (default `source.lock_timeout_s`; 0 = do not wait) and raises SourceBusyError naming
    the holder. Re-entrant within a process. Released when the block ends, or by PostgreSQL when the process dies.
    """
    if _held.get(source.slot):
        _held[source.slot] += 1
        try:
            yield
        finally:
            _held[source.slot] -= 1
        return
    timeout = source.lock_timeout_s if timeout_s is None else timeout_s
    conn = connect(source)
    try:
        conn.execute("SELECT set_config('application_name', %s, false)", (holder_name(what, source.name),))
        started = time.monotonic()
        logged = False
        while not _try_lock(conn, source.slot):
            waited = time.monotonic() - started
            holder = lock_holder(conn, source.slot)
            if waited >= timeout:
                raise SourceBusyError(busy_message(source, holder, waited))
            if not logged:
                log.warning("%s %s: waiting up to %d s for %s to finish", what, source.name, timeout,
                            holder.describe() if holder else "another run")
                logged = True
            time.sleep(min(_POLL_S, max(timeout - waited, 0.01)))
        _held[source.slot] = 1
        log.info("%s %s: holding the source's run lock", what, source.name)
        try:
            yield
        finally:
            _held.pop(source.slot, None)
            try:
                conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (LOCK_CLASS, source.slot))
            except psycopg.Error:  # the session is gone: PostgreSQL released the lock with it
                pass
    finally:
        conn.close()
