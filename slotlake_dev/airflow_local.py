"""A local Airflow for the demo and the tests: SQLite metadata DB in a chosen AIRFLOW_HOME, this repo's
dags/ and plugins/, no examples. Production runs use a real Airflow deployment (see docker/)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slotlake.errors import SlotlakeError
from slotlake.spark.code import CHECKOUT as REPO_ROOT

log = logging.getLogger(__name__)


def airflow_bin() -> str:
    return str(Path(sys.prefix) / "bin" / "airflow")


def local_airflow_env(home: str | Path, config_path: str | Path) -> dict[str, str]:
    """The environment for running `airflow` against this repo's DAGs with `config_path` as the slotlake config."""
    home = Path(home).resolve()
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "SLOTLAKE_CONFIG": str(Path(config_path).resolve()),
    }


def run_airflow(env: Mapping[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the venv's `airflow` CLI; on failure raise with the last lines of its output."""
    proc = subprocess.run([airflow_bin(), *args], env=dict(env), capture_output=True, text=True)
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise SlotlakeError(f"airflow {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")
    return proc


def migrate(env: Mapping[str, str]) -> None:
    """Create or upgrade the SQLite metadata DB (idempotent)."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    run_airflow(env, "db", "migrate")


def dags_test(env: Mapping[str, str], dag_id: str, logical_date: str | None = None,
              conf: Mapping[str, Any] | None = None) -> str:
    """Run one DAG run in-process with `airflow dags test` (with `conf`: the run's Params) and return its output;
    raise if the run failed.

    The full output is also kept in $AIRFLOW_HOME/dags-test-<dag_id>.log for reading after a failure.
    """
    args = ["dags", "test", dag_id, *([logical_date] if logical_date else []),
            *(["--conf", json.dumps(dict(conf))] if conf is not None else [])]
    proc = run_airflow(env, *args, check=False)
    out = proc.stdout + proc.stderr
    log_file = Path(env["AIRFLOW_HOME"]) / f"dags-test-{dag_id}.log"
    log_file.write_text(out)
    if proc.returncode != 0:
        failed = [line.strip() for line in out.splitlines() if "slotlake: error" in line or "Error" in line][-5:]
        raise SlotlakeError(f"airflow dags test {dag_id} failed (exit {proc.returncode}); full output in {log_file}; "
                            f"last errors: {' | '.join(failed) or '(none printed)'}")
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(env: Mapping[str, str], port: int) -> dict[str, str]:
    """`env` plus what a local `airflow api-server` on 127.0.0.1:`port` and its scheduler need: the execution API
    on that port, one API worker, a JWT secret for this home only, a free log-server port, a task's first call to
    the execution API given 60 s (a cold API server on SQLite can take more than the 5 s default on a loaded
    2-core machine, and the task then fails before it starts)."""
    import secrets

    return {
        **env,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": env.get("AIRFLOW__API_AUTH__JWT_SECRET") or secrets.token_hex(16),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
    }


def _wait_until_serving(port: int, proc: subprocess.Popen, log_path: Path, seconds: float = 600) -> None:
    """Until the API server answers HTTP (any status) on 127.0.0.1:`port`."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=30).close()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            pass
        if proc.poll() is not None:
            raise SlotlakeError(f"airflow api-server exited (code {proc.returncode}); see {log_path}")
        if time.monotonic() > deadline:
            raise SlotlakeError(f"airflow api-server did not answer on port {port} in {seconds:.0f} s; see {log_path}")
        time.sleep(2)


def _kill_sessions(sessions: set[int]) -> None:
    """SIGKILL whatever is left in these sessions (a task's process that outlived the scheduler that started it)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            session = int(stat.read_text().rsplit(")", 1)[1].split()[3])  # fields after "(comm)": state ppid pgrp sid
        except (OSError, IndexError, ValueError):
            continue
        if session in sessions:
            try:
                os.kill(int(stat.parent.name), 9)
            except ProcessLookupError:
                pass


class AirflowServers:
    """A real `airflow api-server` (started first, serving before the scheduler hands out a task: tasks call its
    execution API) and `airflow scheduler` for `env` (from `server_env`), each in its own session, output in
    $AIRFLOW_HOME/processes.log. Use as a context manager; leaving it stops both and every task process they
    left behind."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.port = int(self.env["AIRFLOW__API__PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(self.env["AIRFLOW_HOME"]) / "processes.log"
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> AirflowServers:
        self._log = open(self.log_path, "a")
        try:
            for cmd in (["api-server", "--port", str(self.port)], ["scheduler"]):
                self.procs.append(subprocess.Popen([airflow_bin(), *cmd], env=self.env, stdout=self._log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
                if cmd[0] == "api-server":
                    _wait_until_serving(self.port, self.procs[0], self.log_path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        _kill_sessions({p.pid for p in self.procs})
        self._log.close()

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """`airflow dags list-runs DAG_ID` as JSON (run_id, state, logical_date, ...)."""
        out = run_airflow(self.env, "dags", "list-runs", dag_id, "-o", "json", check=False).stdout
        for line in reversed(out.splitlines()):  # log lines (also starting with "[") may precede the JSON
            if line.startswith("[{") or line.strip() == "[]":
                return list(json.loads(line))
        return []
