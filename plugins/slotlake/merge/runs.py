"""The `_runs` table written and read without Spark: a merge run's rows appended with delta-rs, and the end of the last
complete run read from its Delta log. Spark's merge (`merge/job.py`) and the in-process one share these."""
from __future__ import annotations

import logging
from collections.abc import Sequence

from slotlake import contracts, delta_log
from slotlake.contracts import STAGE_RUNS as RUNS_STAGE
from slotlake.lake import LakePaths
from slotlake.lsn import Lsn
from slotlake.merge.watermarks import runs_tables_at
from slotlake.spark.session import error_summary

log = logging.getLogger(__name__)


def append_runs_directly(runs_path: str, rows: Sequence[tuple], end: Lsn, user_metadata: str | None) -> bool:
    """Append `rows` to `_runs` with delta-rs, with `user_metadata` as the commit's userMetadata (a Spark append's
    Python rows cost a job and a Python worker's start at the end of every run: bench/README.md, "Small batches
    decode in the driver"); on an s3a lake its log entry is a conditional PUT (`storage.delta_rs_options`). False,
    nothing written, when delta-rs cannot: a lake it does not read here, a table with other columns than
    `contracts.RUNS`, a protocol delta-rs does not write; the caller appends with Spark."""
    if not delta_log.readable(runs_path):
        return False
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties

    schema = contracts.arrow_schema(contracts.RUNS)
    try:
        table = delta_log.delta_rs_table(runs_path)
        if [f.name for f in table.schema().fields] != schema.names:
            return False
        data = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)
        write_deltalake(table, data, mode="append", commit_properties=CommitProperties(
            custom_metadata={"userMetadata": user_metadata} if user_metadata else None))
    except Exception as e:
        present = runs_tables_at(runs_path, end)
        if present is not None and all((r[1], r[2]) in present for r in rows):
            return True  # committed; what failed came after the commit (a checkpoint, say)
        log.info("_runs not appended to with delta-rs (%s); Spark appends", error_summary(e))
        return False
    return True


def last_complete_run(paths: LakePaths, end: Lsn) -> Lsn | None:
    """The end of the last merge run over every table (the `_runs` commit marked so), read from `_runs`'s Delta log
    without Spark; None when there is none, it is past `end` (silver was rebuilt), or the log is not readable here."""
    if not delta_log.readable(paths.runs) or not delta_log.is_delta_table(paths.runs):
        return None
    since = delta_log.stage_end(paths.runs, RUNS_STAGE)
    return since if since is not None and since <= end else None
