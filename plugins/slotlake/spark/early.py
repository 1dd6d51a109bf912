"""A sync's Spark app started while its extract still runs: the JVM's start overlaps the extract's work.

`slotlake sync` with spark-submit (no `spark.server`) runs one app, `sync` (decode, then merge), after the extract.
Its JVM start, the loading of Spark's and Delta's classes and its first Spark job take seconds of the run; the
extract of a large backlog takes as long or longer and keeps only one core busy on the Python side. So once the
extract has archived its first file (the decode is certain to be due), `EarlySyncApp.start` submits the app with
`--wait-for FILE --caller-pid PID`: it starts its SparkSession, runs one small job and waits. After the extract:

    go    the decode and merge are due: the app runs them (`EarlySyncApp.run` waits for its end)
    stop  anything else (the extract failed, only a merge is due): the app stops its session and exits 0

The app reads nothing of the lake before `go`, so it sees exactly what a spark-submit started after the extract
would. It also stops (exit 3) when the caller's pid or its own JVM is gone, so a killed sync leaves no app behind.
Nothing is started for an extract that archives nothing: an idle sync still starts no JVM.
"""
from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from slotlake.spark.auto_server import process_alive
from slotlake.spark.submit import SparkApp, SubmittedApp, start_spark_app

log = logging.getLogger(__name__)

GO, STOP = "go", "stop"
WAIT_FOR_ARG, CALLER_PID_ARG = "--wait-for", "--caller-pid"
POLL_S = 0.05
STOP_TIMEOUT_S = 60.0  # a told-to-stop app that has not exited by then is killed
EXIT_CALLER_GONE = 3


def _say(path: Path, word: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(word)
    os.replace(tmp, path)  # the app never reads half a word


class EarlySyncApp:
    """The CLI's side. `start()` once the extract has archived a file; then exactly one of `run()` (go) or
    `close()` (stop; also what leaving the `with` block does)."""

    def __init__(self, make_app: Callable[[], SparkApp]) -> None:
        self._make_app = make_app  # built when started: a sync with nothing to archive builds nothing
        self.started: SubmittedApp | None = None
        self._dir: tempfile.TemporaryDirectory | None = None
        self._done = False

    @property
    def _path(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "decision"

    def start(self) -> None:
        if self.started is not None or self._done:
            return
        try:
            app = self._make_app()
            self._dir = tempfile.TemporaryDirectory(prefix="slotlake-sync-")
            self.started = start_spark_app(app, WAIT_FOR_ARG, str(self._path), CALLER_PID_ARG, str(os.getpid()))
        except Exception as e:  # noqa: BLE001  (the sync starts its app after the extract instead)
            log.warning("could not start the sync's Spark app during the extract (%s); it starts after it", e)
            self._cleanup()
            self.started = None

    def run(self) -> bool:
        """Tell a started app to decode and merge and wait for its end (SlotlakeError if it failed). False: it was
        not started (or had already ended): the caller runs the app itself."""
        if self.started is None or self._done:
            return False
        self._done = True
        try:
            if not self.started.running():  # it died while waiting: its own output says why
                self.started.wait()
                log.warning("%s ended before the extract finished; starting it again", self.started.app.name)
                return False
            _say(self._path, GO)
            self.started.wait()
            return True
        finally:
            self._cleanup()

    def close(self) -> None:
        """Tell a started app to stop, without touching the lake, and reap it."""
        if self.started is None or self._done:
            self._cleanup()
            return
        self._done = True
        try:
            _say(self._path, STOP)
            try:
                self.started.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s of being told to: killing it", self.started.app.name,
                            STOP_TIMEOUT_S)
        finally:
            self.started.kill()  # reaps it; kills it first if it still runs (a timeout, an interrupt)
            self._cleanup()

    def _cleanup(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> EarlySyncApp:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_for_decision(path: str, caller_pid: int) -> str:
    """The app's side: GO or STOP, whichever the caller writes to `path`; "" if the caller or this driver's JVM
    (its parent process) goes away first."""
    parent = os.getppid()
    p = Path(path)
    while True:
        try:
            word = p.read_text().strip()
        except FileNotFoundError:
            word = ""
        if word in (GO, STOP):
            return word
        if os.getppid() != parent or not process_alive(caller_pid):
            return ""
        time.sleep(POLL_S)
