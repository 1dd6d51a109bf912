"""`spark.server: auto`: the first Spark app of a run starts a `slotlake spark-server` in the background, later
runs (the next hourly sync, the next backfill interval, another CLI command) find it and skip the JVM start.

One server per Spark setup: the key is a hash of the master, the app's Spark settings, the Python environment and
the slotlake package folder, so configs with the same Spark settings share a server and others get their own. Its
state lives in `$SLOTLAKE_STATE_DIR` (default `~/.cache/slotlake/spark-servers`):

    <key>.json   {"pid", "address", "code"}: written by the server once it listens, removed when it stops
    <key>.log    the server's output (its apps' log lines also go to each client)
    <key>.lock   held while a client looks for the server or starts one, so two runs start one server

The server listens on 127.0.0.1 on a free port, stops after `spark.server_idle_minutes` without an app (default
120: an hourly schedule keeps it warm), and a client running other slotlake code (an upgrade) stops it and starts a
new one. When the server cannot be started, the app runs with spark-submit, after a warning naming the log.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slotlake.spark.code import PACKAGE_DIR, code_digest

log = logging.getLogger(__name__)

STATE_DIR_ENV = "SLOTLAKE_STATE_DIR"
START_TIMEOUT_S = 300.0  # a JVM start and the first Spark job, on a loaded machine
STOP_TIMEOUT_S = 60.0


def state_dir() -> Path:
    base = os.environ.get(STATE_DIR_ENV)
    if base:
        return Path(base) / "spark-servers"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "slotlake" / "spark-servers"


def server_key(app) -> str:
    """The server an app can run in: same master, same Spark settings, same Python environment and package."""
    ident = {"master": app.master, "conf": sorted(app.conf.items()), "python": sys.prefix,
             "package": str(PACKAGE_DIR)}
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]


def write_ready_file(path: str | Path, address: tuple[str, int], code: str) -> None:
    """The server's side: say where it listens (atomically: a client never reads half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "address": f"{address[0]}:{address[1]}", "code": code}))
    os.replace(tmp, path)


def remove_ready_file(path: str | Path) -> None:
    """The server's side, when it stops: remove its file unless another server has written it since."""
    info = _read_info(Path(path))
    if info is not None and info.get("pid") == os.getpid():
        Path(path).unlink(missing_ok=True)


def _read_info(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def process_alive(pid: int) -> bool:
    """Whether `pid` is a live process of this user (a zombie child of this process is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: not ours to use
        return False
    try:  # a zombie child of this process (it exited, nobody waited) is not alive
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def _config_path(app) -> str:
    args = list(app.args)
    return args[args.index("--config") + 1]


@contextlib.contextmanager
def _claimed(app) -> Iterator[tuple[Path, dict[str, Any] | None]]:
    """Under the exclusive lock of `app`'s server: its state file, and what the file says if its pid is alive."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = server_key(app)
    info_path = folder / f"{key}.json"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = _read_info(info_path)
        yield info_path, info if info is not None and process_alive(info["pid"]) else None


def ensure_server(app) -> str | None:
    """The address of a running server for `app`'s Spark setup, started now if there is none (or it runs other
    slotlake code); None if it could not be started (the caller uses spark-submit)."""
    with _claimed(app) as (info_path, info):
        if info is not None:
            if info.get("code") == code_digest():
                return str(info["address"])
            log.info("the Spark server pid %d runs other slotlake code (%s): stopping it", info["pid"],
                     info.get("code"))
            _stop(info["pid"])
        info_path.unlink(missing_ok=True)
        return _start(app, info_path, info_path.with_suffix(".log"))


def stop_server(app) -> int | None:
    """Stop the server `spark.server: auto` started for `app`'s Spark setup (`slotlake spark-server --stop`);
    its pid, or None if none runs."""
    if not state_dir().is_dir():
        return None
    with _claimed(app) as (info_path, info):
        if info is not None:
            _stop(info["pid"])
        info_path.unlink(missing_ok=True)
        return int(info["pid"]) if info is not None else None


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and process_alive(pid):
        time.sleep(0.2)
    if process_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _start(app, info_path: Path, log_path: Path) -> str | None:
    cmd = [sys.executable, "-m", "slotlake.cli", "--config", _config_path(app), "spark-server",
           "--listen", "127.0.0.1:0", "--idle-minutes", str(app.server_idle_minutes), "--ready-file", str(info_path)]
    env = {k: v for k, v in os.environ.items() if k != "SLOTLAKE_UNDER_SPARK_SUBMIT"}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR.parent), *filter(None, [env.get("PYTHONPATH")])])
    started = time.monotonic()
    with open(log_path, "w") as out:
        # Its own session: the server outlives this process (and an Airflow task's process group).
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)
    log.info("starting a slotlake Spark server (pid %d, log %s; it stops after %g minutes without an app)",
             proc.pid, log_path, app.server_idle_minutes)
    while time.monotonic() - started < START_TIMEOUT_S:
        info = _read_info(info_path)
        if info is not None and info["pid"] == proc.pid:
            log.info("the slotlake Spark server listens on %s (started in %.1fs)", info["address"],
                     time.monotonic() - started)
            return str(info["address"])
        if proc.poll() is not None:
            log.warning("the slotlake Spark server exited with code %d while starting (see %s): running %s with "
                        "spark-submit", proc.returncode, log_path, app.name)
            return None
        time.sleep(0.2)
    log.warning("the slotlake Spark server did not start within %.0fs (see %s): stopping it, running %s with "
                "spark-submit", START_TIMEOUT_S, log_path, app.name)
    _stop(proc.pid)
    return None
