"""SQL and the server's clock for the tests whose changes must fall in given minutes (the replay DAG's intervals):
commit timestamps are the server's real time, so the tests wait on it, not on this process's clock."""
from __future__ import annotations

import time
from datetime import UTC, datetime

import psycopg


def run_sql(dsn: str, *statements: str) -> None:
    """Each statement in its own committed transaction (synchronous commit: the WAL is flushed when it returns)."""
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        for s in statements:
            conn.execute(s)


def server_now(dsn: str) -> datetime:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0].astimezone(UTC)


def sleep_past(dsn: str, moment: datetime) -> None:
    """Sleep until the server clock (which stamps the commits) is past `moment` by a second."""
    while (left := (moment - server_now(dsn)).total_seconds() + 1) > 0:
        time.sleep(min(left, 5))
