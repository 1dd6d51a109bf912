"""One description of a Spark app run, used by both front ends.

The CLI runs `spark_submit_command(app)` in a subprocess (`run_spark_app`); the Airflow DAG feeds the same
`SparkApp` fields to `SparkSubmitOperator` (see `slotlake.airflow.dag_factory`). Either way the app is
`slotlake/spark_apps/<stage>.py --config F --source S`, submitted with this venv's `spark-submit`, the Delta jars from
`spark_conf()`, and the slotlake package shipped as a zip for masters that are not local.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from slotlake.config import AUTO_SERVER, Config
from slotlake.errors import ConfigError, SlotlakeError
from slotlake.spark.code import PACKAGE_DIR, code_zip
from slotlake.spark.session import DIST_CLASSPATH_ENV, driver_env, local_cores, spark_conf
from slotlake.storage import StorageSettings

log = logging.getLogger(__name__)

# spark_apps/<stage>.py (slotlake.spark_apps.apps)
Stage = Literal["decode", "merge", "sync", "snapshot", "replay", "recover"]
APPS_DIR = PACKAGE_DIR / "spark_apps"  # ships inside the package: an installed slotlake submits its own files
_TAIL_LINES = 40
# The driver JVM of a spark-submit app lives for one run (a decode, a merge): JIT with C1 only. C2's compiles of
# Spark's and Delta's code take more CPU than they win back in a JVM this short-lived (bench/README.md "C1 for
# spark-submit apps": a 1,000-change sync 60 -> 51 s, a 1 M-change merge 73 -> 59 s on 2 cores). Long-lived JVMs
# (`slotlake spark-server`, an in-process session) keep the default JIT. A config's own
# `spark.driver.extraJavaOptions` replaces this. C1 alone also shrinks the JVM's default code cache from 240 MB to
# 48 MB, which a replay app of an s3a lake filled ("VirtualMachineError: Out of space in CodeCache for method handle
# intrinsic", bench/s3_sync.py, 2026-12-06): the default size is kept.
SUBMIT_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


@dataclass(frozen=True)
class SparkApp:
    """Everything needed to submit one slotlake Spark app, independent of who submits it."""

    name: str  # Spark application name, e.g. slotlake-decode-shop
    application: str  # path of the Python entry point under spark_apps/
    args: tuple[str, ...]
    master: str
    conf: Mapping[str, str]  # without spark.master: the master travels as --master (or the Airflow connection)
    ship_code: bool  # True: the slotlake package goes to the cluster as a --py-files zip
    env: Mapping[str, str] = field(default_factory=dict)
    spark_submit: str = ""
    stage: str = ""  # decode, merge, sync, ... (spark_apps/<stage>.py)
    server: str | None = None  # host:port of a `slotlake spark-server` to run the app in, or "auto" (spark.server)
    server_idle_minutes: float = 120.0  # "auto": how long the server it starts waits for the next app
    # What `conf` was built from (config `spark.conf` and `storage`): `on_master` builds it again for another master.
    user_conf: Mapping[str, str] = field(default_factory=dict)
    storage: StorageSettings | None = None


def app_conf(master: str, user_conf: Mapping[str, str] | None, storage: StorageSettings | None) -> dict[str, str]:
    """The `--conf` settings of an app on `master` (without spark.master, which travels as --master)."""
    conf = spark_conf(master, user_conf, storage=storage)
    conf.setdefault("spark.log.level", "WARN")  # Spark's INFO start-up chatter would bury the app's own lines
    if "spark.driver.extraJavaOptions" not in (user_conf or {}):  # with the class-data-sharing archive, if any
        conf["spark.driver.extraJavaOptions"] = " ".join(
            filter(None, (SUBMIT_DRIVER_JAVA_OPTIONS, conf.get("spark.driver.extraJavaOptions"))))
    if "spark.pyspark.python" in conf:
        # The executors' Python (the cluster nodes'); the driver runs here, in client mode: this venv's, which
        # spark-submit would otherwise replace with the executors' too.
        conf.setdefault("spark.pyspark.driver.python", sys.executable)
    conf.pop("spark.master")
    return conf


def on_master(app: SparkApp, master: str) -> SparkApp:
    """`app` submitted to `master` instead (the Airflow Spark connection's, when it differs from `spark.master`):
    its settings built for that master, the package shipped when it is not local."""
    if master == app.master:
        return app
    env = {k: v for k, v in app.env.items() if k != DIST_CLASSPATH_ENV} | driver_env(master, app.storage)
    return dataclasses.replace(app, master=master, conf=app_conf(master, app.user_conf, app.storage), env=env,
                               ship_code=not is_local_master(master))


def is_local_master(master: str) -> bool:
    """local, local[N], local[*], local[N,F]: driver and executors share this machine and its venv."""
    return local_cores(master) is not None


def default_spark_submit() -> str:
    """The spark-submit of this Python environment (pyspark's), so Spark and the driver Python match."""
    return str(Path(sys.prefix) / "bin" / "spark-submit")


def spark_app(cfg: Config, source_name: str, stage: Stage, *, tables: Sequence[str] | None = None) -> SparkApp:
    """Describe the decode or merge app run for one source. The config must come from a file (its path is an arg)."""
    cfg.source(source_name)  # unknown source -> ConfigError naming the known ones
    if not cfg.path:
        raise ConfigError("the Spark apps read the config from a file: load it with load_config(path)")
    application = APPS_DIR / f"{stage}.py"
    args: list[str] = ["--config", cfg.path, "--source", source_name]
    if tables:
        args += ["--tables", ",".join(tables)]
    master = cfg.spark.master
    env = {
        "SLOTLAKE_UNDER_SPARK_SUBMIT": "1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    if cfg.path:
        env["SLOTLAKE_CONFIG"] = cfg.path
    env.update(driver_env(master, cfg.storage))
    return SparkApp(name=f"slotlake-{stage}-{source_name}", application=str(application), args=tuple(args),
                    master=master, conf=app_conf(master, cfg.spark.conf, cfg.storage),
                    ship_code=not is_local_master(master), env=env, user_conf=dict(cfg.spark.conf), storage=cfg.storage,
                    spark_submit=cfg.spark.spark_submit or default_spark_submit(), stage=stage,
                    server=cfg.spark.server, server_idle_minutes=cfg.spark.server_idle_minutes)


def spark_submit_command(app: SparkApp, *, py_files: str | None = None) -> list[str]:
    """The spark-submit command line for `app`. `py_files` defaults to `code_zip()` when the app ships code."""
    cmd = [app.spark_submit, "--master", app.master, "--name", app.name]
    for k, v in app.conf.items():
        cmd += ["--conf", f"{k}={v}"]
    if app.ship_code:
        cmd += ["--py-files", py_files or code_zip()]
    cmd += [app.application, *app.args]
    return cmd


_ERROR_LINE = re.compile(r"(Error|Exception)(:|\b)")


def failure_line(lines: Sequence[str]) -> str:
    """The line of a failed app's output that says why: the app's own message or the last exception line."""
    for line in reversed(lines):
        if line.startswith("slotlake "):
            return line.strip()
    for line in reversed(lines):
        s = line.strip()
        if s and _ERROR_LINE.search(s) and not s.startswith(("at ", "File ", "Traceback")):
            return s
    return next((line.strip() for line in reversed(lines) if line.strip()), "(no output)")


def run_spark_app(app: SparkApp) -> None:
    """Run `app` with spark-submit, streaming its output to the log; raise SlotlakeError if it fails.

    With `spark.server` configured, the app runs in that long-lived Spark driver instead (no JVM start); when the
    server cannot take it (not running, other code), a warning says why and spark-submit runs it as usual.
    `spark.server: auto` finds the server an earlier run started for the same Spark settings, or starts one
    (`slotlake.spark.auto_server`).
    """
    if app.server:
        from slotlake.spark.server_client import run_on_server

        served: SparkApp | None = app
        if app.server == AUTO_SERVER:
            from slotlake.spark.auto_server import ensure_server

            address = ensure_server(app)
            served = dataclasses.replace(app, server=address) if address else None
        if served is not None and run_on_server(served):
            return
    start_spark_app(app).wait()


class SubmittedApp:
    """A spark-submit running in the background: a thread logs its output as it comes (and keeps the last lines);
    `wait()` returns when it ends and raises SlotlakeError if it failed."""

    def __init__(self, app: SparkApp, proc: subprocess.Popen) -> None:
        self.app, self.proc = app, proc
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._reader = threading.Thread(target=self._read, name=f"{app.name}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.tail.append(line)
            log.info("[%s] %s", self.app.name, line)

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> None:
        rc = self.proc.wait(timeout)
        self._reader.join()
        self._close_output()
        if rc != 0:
            log.error("%s failed with exit code %d; last output:\n%s", self.app.name, rc, "\n".join(self.tail))
            raise SlotlakeError(f"Spark app {self.app.name} failed (exit {rc}): {failure_line(list(self.tail))}")
        log.info("%s finished", self.app.name)

    def kill(self) -> None:
        """Stop it now (its driver and the JVM spark-submit started), and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join()
        self._close_output()

    def _close_output(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_spark_app(app: SparkApp, *extra_args: str) -> SubmittedApp:
    """Start `app` with spark-submit (`extra_args` after its own) and return at once; `.wait()` for its end."""
    if extra_args:
        app = dataclasses.replace(app, args=(*app.args, *extra_args))
    cmd = spark_submit_command(app)
    if not Path(app.spark_submit).exists():
        raise SlotlakeError(f"spark-submit not found at {app.spark_submit}; run scripts/setup.sh "
                            "or set spark.spark_submit in the config")
    log.info("submitting %s to %s (%s)", app.name, app.master, app.application)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **app.env}, errors="replace")
    return SubmittedApp(app, proc)
