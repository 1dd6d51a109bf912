"""The source's run lock against a real PostgreSQL: re-entrant in a process, released at the end, and what the
sync DAG's SparkSubmit tasks take and give back around spark-submit (their pre_execute / post_execute hooks)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from slotlake.config import parse_config
from slotlake.source.lock import source_lock

pytestmark = pytest.mark.integration

# Another process tries the lock with no wait: prints OK or the one-line error.
_TRY = """
import sys
from slotlake.config import parse_config
from slotlake.errors import SourceBusyError
from slotlake.source.lock import source_lock
src = parse_config({"lake": "/tmp/unused", "sources": {"shop": {"dsn": sys.argv[1]}}}).source("shop")
try:
    with source_lock(src, "probe", timeout_s=0):
        print("OK")
except SourceBusyError as e:
    print(e)
"""


def other_process_tries(dsn: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", _TRY, dsn], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_lock_is_exclusive_across_processes_reentrant_within_one_and_released(pg_db):
    src = parse_config({"lake": "/tmp/unused", "sources": {"shop": {"dsn": pg_db}}}).source("shop")
    assert other_process_tries(pg_db) == "OK"
    with source_lock(src, "sync"):
        with source_lock(src, "extract"):  # the CLI's sync calls the DAG's task functions: no self-deadlock
            busy = other_process_tries(pg_db)
        assert other_process_tries(pg_db).startswith("source shop is being synced by another run")
    assert busy.startswith(f"source shop is being synced by another run: slotlake sync shop pid {os.getpid()} on "
                           f"{socket.gethostname()}")
    assert "waited" not in busy and busy.endswith("raise sources.shop.lock_timeout_s to wait longer")
    assert other_process_tries(pg_db) == "OK"  # released


def test_dag_spark_submit_tasks_hold_the_lock_while_they_run(pg_db):
    from slotlake.airflow.tasks import _release_lock, _take_lock

    src = parse_config({"lake": "/tmp/unused", "sources": {"shop": {"dsn": pg_db}}}).source("shop")
    decode = {"task": SimpleNamespace(task_id="decode", application_args=["--config", "c", "--source", "shop"]),
              "run_id": "manual__1"}
    _take_lock(src, decode)
    try:
        assert other_process_tries(pg_db).startswith("source shop is being synced by another run: slotlake decode "
                                                     "shop")
    finally:
        _release_lock(decode, None)  # post_execute(context, result); on_failure_callback(context) the same
    assert other_process_tries(pg_db) == "OK"
    # A replay into a dest folder only reads the lake: no lock; in place (empty --dest): the lock.
    to_dest = {"task": SimpleNamespace(task_id="replay", application_args=["--from", "a", "--to", "b", "--dest",
                                                                           "/tmp/x/20261123T1000Z"]), "run_id": "r"}
    _take_lock(src, to_dest)
    assert other_process_tries(pg_db) == "OK"
    _release_lock(to_dest)
    # The same task sending its app to a Spark server (tasks.spark_task): a Python task, its arguments in op_args.
    on_server = {"task": SimpleNamespace(task_id="replay", op_args=["--from", "a", "--to", "b", "--dest",
                                                                    "/tmp/x/20261123T1000Z"]), "run_id": "r"}
    _take_lock(src, on_server)
    assert other_process_tries(pg_db) == "OK"
    _release_lock(on_server)
    in_place = {"task": SimpleNamespace(task_id="replay", application_args=["--from", "a", "--to", "b", "--dest",
                                                                            ""]), "run_id": "r"}
    _take_lock(src, in_place)
    assert other_process_tries(pg_db).startswith("source shop is being synced by another run: slotlake replay")
    _release_lock(in_place)
    assert other_process_tries(pg_db) == "OK"
