"""The app's side of a sync's early start (slotlake.spark.early.wait_for_decision): it waits for the caller's word,
and gives up when the caller or its own parent process is gone. Real processes, no Spark."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from slotlake.spark.early import GO, STOP, _say, wait_for_decision


def test_waits_for_the_callers_word(tmp_path):
    path = tmp_path / "decision"
    for word in (GO, STOP):
        path.unlink(missing_ok=True)
        timer = threading.Timer(0.3, _say, (path, word))
        timer.start()
        t = time.monotonic()
        assert wait_for_decision(str(path), os.getpid()) == word
        assert time.monotonic() - t >= 0.25  # it waited for the word, not returned at once
        timer.join()


def test_gives_up_when_the_caller_is_gone(tmp_path):
    caller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    threading.Thread(target=caller.wait).start()  # reaped when it exits, as a shell reaps a killed sync
    t = time.monotonic()
    assert wait_for_decision(str(tmp_path / "decision"), caller.pid) == ""
    assert time.monotonic() - t >= 0.3


def test_an_unknown_word_is_not_taken(tmp_path):
    path = tmp_path / "decision"
    path.write_text("maybe")
    caller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    threading.Thread(target=caller.wait).start()
    assert wait_for_decision(str(path), caller.pid) == ""
