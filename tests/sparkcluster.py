"""A real Spark standalone cluster for tests: a master and one worker started with the venv's `spark-class` on
127.0.0.1 (free ports), and a Python for its executors that has every dependency but not slotlake, so a job can
only import slotlake from the zip the driver ships (`--py-files` / `addPyFile`)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sparkserver import free_port

ROOT = Path(__file__).resolve().parents[1]
SPARK_CLASS = str(ROOT / ".venv" / "bin" / "spark-class")


@dataclass(frozen=True)
class Cluster:
    master: str  # spark://127.0.0.1:<port>
    port: int
    ui: str  # the master's web UI (its /json/ state)
    work_dir: Path  # the worker's folder: one app-*/<executor>/ folder per executor, with the files shipped to it

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=10) as r:
            return json.load(r)

    def completed_apps(self) -> list[dict]:
        return self.state().get("completedapps", [])

    def executor_files(self) -> set[str]:
        """The names of the files in every executor folder of the worker (shipped jars and zips, logs)."""
        return {p.name for p in self.work_dir.glob("app-*/*/*")}


def _clean_env(log_dir: Path) -> dict[str, str]:
    # No PYTHONPATH of the caller: the cluster's processes know nothing of this checkout. SPARK_HOME is the venv's
    # pyspark (spark-class would look for it with whatever `python3` is first on PATH).
    import pyspark

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env.update(SPARK_HOME=str(Path(pyspark.__file__).parent), SPARK_LOG_DIR=str(log_dir),
               SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    return env


def _wait(what: str, ok, proc: subprocess.Popen, log: Path, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if ok():
                return
        except (OSError, ValueError):  # not listening yet, or a web UI answering before its first state (empty
            pass                       # body: JSONDecodeError; seen once in CI on 2026-12-06)
        assert proc.poll() is None, f"{what} exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not up in {seconds:.0f} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


@contextlib.contextmanager
def standalone_cluster(base: Path, cores: int = 1, memory: str = "2g") -> Iterator[Cluster]:
    """A master and a worker of `cores` cores, running until the block ends."""
    base.mkdir(parents=True, exist_ok=True)
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = _clean_env(base / "logs")
    procs: list[subprocess.Popen] = []
    try:
        master_log = base / "master.log"
        master = subprocess.Popen(
            [SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui_port)],
            stdout=master_log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(master)
        cluster = Cluster(master=f"spark://127.0.0.1:{port}", port=port, ui=f"http://127.0.0.1:{ui_port}",
                          work_dir=base / "work")
        _wait("the Spark master", lambda: cluster.state()["status"] == "ALIVE", master, master_log)
        worker_log = base / "worker.log"
        worker = subprocess.Popen(
            [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", cluster.master, "--host", "127.0.0.1",
             "--cores", str(cores), "--memory", memory, "--work-dir", str(cluster.work_dir),
             "--webui-port", str(worker_ui)],
            stdout=worker_log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        procs.append(worker)
        _wait("the Spark worker", lambda: cluster.state()["aliveworkers"] == 1, worker, worker_log)
        yield cluster
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)


def executor_python(folder: Path) -> str:
    """A Python for the executors: a venv that sees this venv's packages (pyspark, pyarrow, psycopg, ...) through a
    plain path, so the editable slotlake install (a .pth file of this venv, not processed there) is not among them.
    Returns its interpreter; raises if it can import slotlake after all (the test would prove nothing)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "slotlake-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([str(python), "-c", "import pyspark, pyarrow\nimport slotlake"], capture_output=True,
                           text=True, env=env, cwd=folder)
    assert "No module named 'slotlake'" in probe.stderr, f"the executor Python must lack slotlake: {probe.stderr}"
    return str(python)
