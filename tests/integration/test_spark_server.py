"""`slotlake spark-server` (config `spark.server`): the sync's Spark apps run in one long-lived Spark driver
instead of a spark-submit each. A real server process, real CLI syncs against a real PostgreSQL; gold is compared
with PostgreSQL after every sync. Also: a failing app leaves the server serving, other slotlake code is refused,
and a sync whose server is gone falls back to spark-submit with a warning."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from sparkserver import free_port, spark_server  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow,
              pytest.mark.spark_submit]  # its own server in the config, and the fallback to spark-submit

SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")
SOURCE = "shop"
TABLES = ["public.items", "public.hist"]


def _sync(cfg: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([SLOTLAKE, "--config", str(cfg), "sync", SOURCE], capture_output=True, text=True,
                         timeout=1200, env={**os.environ, "PYTHONPATH": str(ROOT / "plugins"), **(env or {})})
    assert out.returncode == 0, f"sync failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stderr


def _request(port: int, message: dict) -> list[dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        s.sendall((json.dumps(message) + "\n").encode())
        return [json.loads(line) for line in s.makefile("r")]


def _assert_gold(cfg_path: Path, dsn: str) -> None:
    paths = LakePaths.of(str(cfg_path.parent / "lake"), SOURCE)
    for t in TABLES:
        assert_gold_equals_pg(paths.gold(*t.split(".")), dsn, t)


def test_syncs_run_in_the_spark_server_and_fall_back_when_it_is_gone(pg_db, tmp_path):
    port = free_port()
    cfg = tmp_path / "slotlake.yaml"
    cfg.write_text(json.dumps({"lake": str(tmp_path / "lake"),
                               "spark": {"master": "local[1]", "server": f"127.0.0.1:{port}", "in_process_bytes": 0},
                               "sources": {SOURCE: {"dsn": pg_db, "tables": TABLES}}}))
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE hist (a int, b text)")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO hist VALUES (1, 'x'), (1, 'x')")

    log_path = tmp_path / "server.log"
    with spark_server(cfg, log_path) as server:
        log = _sync(cfg)  # slot, initial copy, its load
        assert "on the Spark server at" in log and "submitting slotlake-" not in log, log[-3000:]
        _assert_gold(cfg, pg_db)
        for i in range(2):  # later syncs reuse the same driver
            with psycopg.connect(pg_db, autocommit=True) as conn:
                conn.execute("UPDATE items SET name = name || '!' WHERE id %% 3 = %s", (i,))
                conn.execute("DELETE FROM items WHERE id = %s", (10 + i,))
                conn.execute("INSERT INTO hist VALUES (2, 'y'), (2, 'y'), (1, 'x')")
                conn.execute("DELETE FROM hist WHERE ctid = (SELECT min(ctid) FROM hist WHERE a = 1)")
            log = _sync(cfg)
            assert "finished on the Spark server" in log and "submitting slotlake-" not in log, log[-3000:]
            _assert_gold(cfg, pg_db)

        # A request from other slotlake code is refused (the server would run stale code for it).
        reply = _request(port, {"stage": "sync", "argv": ["--config", str(cfg), "--source", SOURCE], "code": "x"})
        assert reply[-1]["exit"] == 2 and "restart `slotlake spark-server`" in reply[-1]["error"], reply
        # An app that fails reports one line and leaves the server serving.
        from slotlake.spark.code import code_digest

        reply = _request(port, {"stage": "merge", "argv": ["--config", str(cfg), "--source", "nope"],
                                "code": code_digest()})
        assert reply[-1]["exit"] == 1 and "unknown source 'nope'" in reply[-1]["error"], reply
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("UPDATE items SET name = 'after a failed app' WHERE id = 1")
        log = _sync(cfg)
        assert "finished on the Spark server" in log, log[-3000:]
        _assert_gold(cfg, pg_db)

        # The server's JVM dies: the next sync is refused by the server (not failed) and runs with spark-submit;
        # the server stops with exit code 1 for its supervisor to restart it.
        jvm = subprocess.run(["pgrep", "-P", str(server.pid), "-f", "java"], capture_output=True, text=True)
        assert jvm.stdout.split(), f"no JVM child of the spark-server process {server.pid}"
        for pid in jvm.stdout.split():
            os.kill(int(pid), 9)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("UPDATE items SET name = 'after the JVM died' WHERE id = 2")
        log = _sync(cfg)
        assert "SparkContext is gone" in log and "submitting slotlake-sync-shop" in log, log[-3000:]
        _assert_gold(cfg, pg_db)
        assert server.wait(120) == 1, log_path.read_text()[-3000:]

    # No server at all: the sync warns and runs its apps with spark-submit; nothing is lost.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (1000, 'no server')")
        conn.execute("INSERT INTO hist VALUES (3, 'z')")
    log = _sync(cfg)
    assert (f"no slotlake Spark server at 127.0.0.1:{port}" in log
            and "submitting slotlake-sync-shop" in log), log[-3000:]
    _assert_gold(cfg, pg_db)


def test_auto_server_starts_once_is_reused_and_stops_when_idle(pg_db, tmp_path):
    """`spark.server: auto`: the first sync starts a server in the background, the next sync (a new process) runs
    in the same one, and with no app for `server_idle_minutes` it stops and removes its state file."""
    from slotlake.config import load_config
    from slotlake.spark.auto_server import server_key
    from slotlake.spark.submit import spark_app

    cfg = tmp_path / "slotlake.yaml"
    cfg.write_text(json.dumps({"lake": str(tmp_path / "lake"),
                               "spark": {"master": "local[1]", "server": "auto", "server_idle_minutes": 0.5,
                                         "in_process_bytes": 0},
                               "sources": {SOURCE: {"dsn": pg_db, "tables": TABLES}}}))
    state = tmp_path / "state"
    info = state / "spark-servers" / f"{server_key(spark_app(load_config(str(cfg)), SOURCE, 'sync'))}.json"
    env = {"SLOTLAKE_STATE_DIR": str(state)}
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE hist (a int, b text)")
        conn.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g")
    pid = None
    try:
        log = _sync(cfg, env)  # slot, initial copy: starts the server
        assert "starting a slotlake Spark server" in log and "submitting slotlake-" not in log, log[-3000:]
        pid = json.loads(info.read_text())["pid"]
        _assert_gold(cfg, pg_db)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("UPDATE items SET name = name || '!' WHERE id % 3 = 0")
            conn.execute("DELETE FROM items WHERE id = 7")
            conn.execute("INSERT INTO hist VALUES (2, 'y'), (2, 'y'), (1, 'x')")
        log = _sync(cfg, env)
        assert ("starting a slotlake Spark server" not in log and "finished on the Spark server" in log
                and "submitting slotlake-" not in log), log[-3000:]
        assert json.loads(info.read_text())["pid"] == pid  # the same server
        _assert_gold(cfg, pg_db)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(1)
        assert not _alive(pid), "the auto-started server did not stop after 30 s without an app"
        assert not info.exists()
        assert "no app for 30 s; stopping" in (info.parent / info.name.replace(".json", ".log")).read_text()
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, 9)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
