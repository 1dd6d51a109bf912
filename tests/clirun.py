"""The `slotlake` console script as the integration tests run it: a new process, with or without a failpoint."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from slotlake import failpoints
from slotlake.config import SPARK_SERVER_ENV

ROOT = Path(__file__).resolve().parents[1]
SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")

# Failpoints that kill the Spark app's own process: they need a spark-submit of their own (a kill inside this
# worker's warm Spark server would kill the server, and the server does not see the client's environment).
APP_FAILPOINTS = frozenset({failpoints.DECODE_AFTER_CATALOG, failpoints.MERGE_AFTER_HISTORY,
                            failpoints.MERGE_AFTER_FIRST_TABLE})

# A Spark app started by `slotlake.spark.submit.run_spark_app`: "submitting slotlake-merge-shop-... to ..." with
# spark-submit, "running slotlake-merge-shop-... on the Spark server at ..." on a server.
_LAUNCH = re.compile(r"(?:submitting|running) slotlake-(\w+)-")


def cli_env(failpoint: str | None = None, server: bool = True) -> dict[str, str]:
    """This process's environment for a `slotlake` child, with `failpoint` set (or none); without the test worker's
    Spark server when not `server` (its Spark apps are spark-submits)."""
    env = {k: v for k, v in os.environ.items() if k != failpoints.ENV}
    if failpoint:
        env[failpoints.ENV] = failpoint
        if failpoint in APP_FAILPOINTS:
            env.pop(SPARK_SERVER_ENV, None)
    if not server:
        env.pop(SPARK_SERVER_ENV, None)
    return env


def slotlake(cfg: Path | str, *args: str, failpoint: str | None = None, server: bool = True,
             timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """`slotlake --config CFG ARGS...` in a new process; its result whatever the exit code."""
    return subprocess.run([SLOTLAKE, "--config", str(cfg), *args], capture_output=True, text=True,
                          timeout=timeout, env=cli_env(failpoint, server), check=False)


def launched_apps(log: str) -> list[str]:
    """The stages of the Spark apps a run's log says it started (spark-submit or the Spark server), in order."""
    return _LAUNCH.findall(log)


def sync_ok(cfg: Path | str, source: str, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """`slotlake sync SOURCE ARGS...`, which must succeed (else the test fails with the end of its output)."""
    out = slotlake(cfg, "sync", source, *args, timeout=timeout)
    assert out.returncode == 0, f"sync failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


def sync_crashes(cfg: Path | str, source: str, failpoint: str, *args: str,
                 timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """`slotlake sync SOURCE ARGS...` with `failpoint` set, which must stop it (a non-zero exit)."""
    out = slotlake(cfg, "sync", source, *args, failpoint=failpoint, timeout=timeout)
    assert out.returncode != 0, f"failpoint {failpoint} did not stop the sync:\n{(out.stdout + out.stderr)[-3000:]}"
    return out
