"""`slotlake recover`'s run (the CLI and the recover DAG): in this process where it can be done exactly, else the
recover Spark app.

See slotlake.recover.point for what a recovery does; `point_in_process` for the runs done without a JVM.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Sequence

from slotlake.config import Config
from slotlake.recover.point import RecoverResult, request

log = logging.getLogger(__name__)


def recover(cfg: Config, source: str, as_of: str, tables: Sequence[str] | None, to: str,
            into_schema: str | None = None, replace: bool = False) -> RecoverResult:
    """Recover (slotlake.recover.point); raises SlotlakeError on failure. It runs in this process where
    `slotlake.recover.point_in_process` can do it exactly (a local lake, a replay to the point the in-process replay
    takes, no history table), else the recover Spark app runs (spark-submit, as every slotlake stage).

    Reads the lake only, so it takes no run lock and runs alongside syncs. An existing PostgreSQL target table is
    refused here, before any work, unless `replace`."""
    from slotlake.recover.point_in_process import recover_in_process
    from slotlake.spark.submit import run_spark_app, spark_app

    req, password = request(source, as_of, tables, to, into_schema, replace)
    cfg.source(source)
    if req.to_delta is not None and "://" not in req.to_delta:
        # The Spark app (and an Airflow worker) may run elsewhere than the caller's directory.
        req = dataclasses.replace(req, to_delta=os.path.abspath(req.to_delta))
    if req.to_postgres is not None and not req.replace:
        from slotlake.recover.to_postgres import refuse_existing

        refuse_existing(req.to_postgres, password, [req.postgres_table(t) for t in req.tables])
    result = recover_in_process(cfg, req, password)
    if result is None:  # declined (the reason logged): the Spark app does the whole recovery
        app = spark_app(cfg, source, "recover")  # spark_apps/recover.py
        fd, result_path = tempfile.mkstemp(prefix="slotlake-recover-", suffix=".json")
        os.close(fd)
        env = dict(app.env)
        if password is not None:
            env["PGPASSWORD"] = password  # libpq reads it; never on the command line
        try:
            run_spark_app(dataclasses.replace(app, args=(*app.args, *req.args(), "--result", result_path), env=env))
            with open(result_path) as f:
                result = RecoverResult.from_dict(json.load(f))
        finally:
            os.unlink(result_path)
    for line in result.lines():
        log.info("%s", line)
    return result
