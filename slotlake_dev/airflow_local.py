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
from slotlake.spark.session import CHECKOUT as REPO_ROOT

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
