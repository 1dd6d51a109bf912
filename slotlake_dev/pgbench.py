"""pgbench against a LocalPostgres: the benchmarks' database (`bench/`), set up and loaded one way."""

from __future__ import annotations

import subprocess

import psycopg

from slotlake_dev.localpg import LocalPostgres, pg_bindir

BENCH_DB = "bench"


def pgbench(pg: LocalPostgres, *args: str) -> None:
    """Runs PostgreSQL's pgbench with `args` against the `bench` database, over TCP like any client (LocalPostgres
    runs the server as the postgres OS user); its output is dropped, its errors raise."""
    cmd = [str(pg_bindir() / "pgbench"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", pg.user, *args, BENCH_DB]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def pgbench_db(pg: LocalPostgres, scale: int, full_history: bool = True) -> str:
    """Creates the `bench` database with pgbench's tables at `scale` (100,000 accounts each) and returns its DSN.
    `pgbench_history` has no key: with `full_history` it gets REPLICA IDENTITY FULL, so its changes can be synced."""
    pg.psql(f"CREATE DATABASE {BENCH_DB}")
    pgbench(pg, "-i", "-q", "-s", str(scale))
    dsn = pg.dsn(BENCH_DB)
    if full_history:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
    return dsn
