"""`slotlake replay`'s run: in this process where it can be done exactly, else the replay Spark app.

See slotlake.recover.replay for what a replay does; `replay_in_process` for the runs done without a JVM.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import nullcontext

from slotlake.config import Config
from slotlake.recover.replay import request
from slotlake.recover.replay_job import ReplayResult


def replay(cfg: Config, source: str, from_: str, to: str, tables: Sequence[str] | None = None,
           dest: str | None = None) -> ReplayResult | None:
    """Replay `source` (slotlake.recover.replay); raises on failure. It runs in this process where
    `slotlake.recover.replay_in_process` can do it exactly (a local lake, every bronze file within a slice, batches
    the in-process merge takes), else the replay Spark app runs (spark-submit, as every slotlake stage). Returns
    the in-process replay's result; None when the Spark app did it (its log carries the summary).

    An in-place replay rewrites silver and gold, so it holds the source's run lock (`slotlake.source.lock`); a
    `--dest` replay only reads the lake and runs alongside syncs."""
    from slotlake.recover.replay_in_process import replay_in_process
    from slotlake.source.lock import source_lock
    from slotlake.spark.submit import run_spark_app, spark_app

    req = request(source, from_, to, tables, dest)
    cfg.source(source)
    with source_lock(cfg.source(source), "replay") if req.dest is None else nullcontext():
        done = replay_in_process(cfg, req)
        if done is not None:  # (None: declined; the Spark app does the whole replay)
            return done
        app = spark_app(cfg, source, "replay")  # spark_apps/replay.py
        run_spark_app(dataclasses.replace(app, args=(*app.args, *req.args())))
    return None
