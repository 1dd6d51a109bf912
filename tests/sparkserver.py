"""A real `slotlake spark-server` process for tests: started on a free port of 127.0.0.1, stopped after."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOTLAKE = str(ROOT / ".venv" / "bin" / "slotlake")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def spark_server(config: Path, log_path: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """`slotlake --config CONFIG spark-server` (its spark.server address), running once it says it listens."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins"), **(env or {})}
    proc = subprocess.Popen([SLOTLAKE, "--config", str(config), "spark-server"], stdout=log_path.open("w"),
                            stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        while "listening on" not in log_path.read_text():
            assert proc.poll() is None, f"spark-server exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "spark-server did not start in 10 min"
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        proc.wait(120)
