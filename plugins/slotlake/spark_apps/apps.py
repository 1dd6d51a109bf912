"""The entry points of the Spark apps in `spark_apps/`: one `main(stage)` for all of them.

Every app takes `--config F --source S` (plus its own arguments), loads the config, starts the Delta-enabled
SparkSession, runs one job function, prints its summary, and turns a SlotlakeError into one line on stderr and
exit code 1 (`slotlake.spark.submit.failure_line` picks that line out of the app's output).

    decode    bronze -> silver/changes + _catalog + _ddl_log         (slotlake.decode.job.run_decode)
    merge     silver/changes -> gold, by replica identity            (slotlake.merge.job.run_merge)
    sync      decode then merge in ONE Spark application (the CLI's `slotlake sync`: one JVM start, not two)
    snapshot  complete initial copies in bronze/snapshot -> gold     (slotlake.merge.snapshot_job.load_snapshots)
    replay    re-decode an archived range and rebuild tables         (slotlake.recover.replay_job.run_replay)
    recover   tables as of one commit LSN into Delta or PostgreSQL   (slotlake.recover.point_job.run_recover)
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

Runner = Callable[["object", "object", argparse.Namespace], list[str]]  # (spark, cfg, args) -> lines to print


@dataclass(frozen=True)
class AppSpec:
    description: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Runner


def _no_args(parser: argparse.ArgumentParser) -> None:
    pass


def _tables_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", default="", help="comma-separated schema.table list (default: every table)")


def _replay_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="from_", required=True, help="LSN (16/B374D848) or ISO timestamp (UTC)")
    parser.add_argument("--to", required=True, help="LSN or ISO timestamp (UTC)")
    _tables_arg(parser)
    parser.add_argument("--dest", default="", help="write <dest>/<schema>/<table> instead of rebuilding in place")


def _decode(spark, cfg, args) -> list[str]:
    from slotlake.decode.job import run_decode

    r = run_decode(spark, cfg, args.source)
    return ([f"decoded {r.files_decoded} bronze files, {r.changes_written} changes, {r.catalog_versions_added} new "
             f"catalog versions, {r.ddl_events} DDL events; silver at {r.end_lsn}"]
            + [f"warning: {w}" for w in r.warnings])


def _merge(spark, cfg, args) -> list[str]:
    from slotlake.merge.job import run_merge
    from slotlake.merge.plan import parse_tables

    return [run_merge(spark, cfg, args.source, parse_tables(getattr(args, "tables", ""))).summary()]


# The sync app's last line: each stage's own time in its driver (bench/e2e.py reads it with `sync_stages`; the
# app's start is the rest of its time).
_SYNC_STAGES = re.compile(r"sync stages: decode ([0-9.]+)s, merge ([0-9.]+)s")


def sync_stages(line: str) -> dict[str, float] | None:
    """{"decode": s, "merge": s} of a sync app's stage line (anywhere in `line`), else None."""
    m = _SYNC_STAGES.search(line)
    return {"decode": float(m.group(1)), "merge": float(m.group(2))} if m else None


def _sync(spark, cfg, args) -> list[str]:
    started = time.monotonic()
    lines = _decode(spark, cfg, args)
    decoded = time.monotonic()
    lines += _merge(spark, cfg, args)
    return lines + [f"sync stages: decode {decoded - started:.2f}s, merge {time.monotonic() - decoded:.2f}s"]


def _snapshot(spark, cfg, args) -> list[str]:
    from slotlake.merge.snapshot_job import load_snapshots
    from slotlake.names import TableName

    tables = [str(t) for t in TableName.parse_list(args.tables)] or None
    done = [x for x in load_snapshots(spark, cfg, args.source, tables) if x.gold_version is not None]
    return [f"snapshot load {args.source}: {len(done)} table(s) loaded, {sum(x.rows for x in done)} rows"
            + "".join(f"; {x.table}: {x.rows} rows -> gold version {x.gold_version}" for x in done)]


def _replay(spark, cfg, args) -> list[str]:
    from slotlake.names import TableName
    from slotlake.recover.replay import request
    from slotlake.recover.replay_job import run_replay

    tables = [str(t) for t in TableName.parse_list(args.tables)] or None
    result = run_replay(spark, cfg, request(args.source, args.from_, args.to, tables, args.dest or None))
    return [result.summary()] + [
        f"  {TableName(t.schema_name, t.table_name)}: {t.rows} rows from base {t.base_lsn} "
        f"(gold version {t.base_version}) -> {t.target}" for t in result.tables]


def _recover_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--as-of", dest="as_of", required=True, help="LSN or ISO time (UTC unless zoned)")
    _tables_arg(parser)
    to = parser.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-delta", help="write <path>/<schema>/<table> Delta tables")
    to.add_argument("--to-postgres", help="libpq conninfo WITHOUT the password (PGPASSWORD carries it)")
    parser.add_argument("--into-schema", default=None)
    parser.add_argument("--replace", action="store_true")
    parser.add_argument("--result", default="", help="also write the result as JSON to this file")


def _recover(spark, cfg, args) -> list[str]:
    import json

    from slotlake.names import TableName
    from slotlake.recover.point import DEFAULT_INTO_SCHEMA, RecoverRequest
    from slotlake.recover.point_job import run_recover
    from slotlake.recover.replay import parse_point

    req = RecoverRequest(source=args.source, as_of=parse_point(args.as_of, "--as-of"),
                         tables=TableName.parse_list(args.tables), to_delta=args.to_delta,
                         to_postgres=args.to_postgres, into_schema=args.into_schema or DEFAULT_INTO_SCHEMA,
                         replace=args.replace)
    result = run_recover(spark, cfg, req)
    if args.result:
        with open(args.result, "w") as f:
            json.dump(result.as_dict(), f)
    return result.lines()


APPS: dict[str, AppSpec] = {
    "decode": AppSpec("decode bronze -> silver/changes + _catalog", _no_args, _decode),
    "merge": AppSpec("silver/changes -> gold, by replica identity", _tables_arg, _merge),
    "sync": AppSpec("decode bronze -> silver, then merge silver -> gold, in one Spark application", _no_args, _sync),
    "snapshot": AppSpec("bronze/snapshot copies -> gold", _tables_arg, _snapshot),
    "replay": AppSpec("re-decode an archived range and rebuild tables", _replay_args, _replay),
    "recover": AppSpec("tables as of one commit LSN into Delta or PostgreSQL", _recover_args, _recover),
}


def parse_app_args(stage: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The `stage` app's arguments (`--config F --source S` and its own); argparse exits on bad ones."""
    spec = APPS[stage]
    parser = argparse.ArgumentParser(prog=f"{stage}.py", description=spec.description)
    parser.add_argument("--config", default=None, help="slotlake YAML (default: $SLOTLAKE_CONFIG)")
    parser.add_argument("--source", required=True)
    # Started before its input is ready (slotlake.spark.early): wait for the caller's go once Spark is up.
    parser.add_argument("--wait-for", dest="wait_for", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--caller-pid", dest="caller_pid", type=int, default=0, help=argparse.SUPPRESS)
    spec.add_args(parser)
    return parser.parse_args(argv)


def main(stage: str, argv: list[str] | None = None) -> int:
    """Run the `stage` app with `argv` (default: sys.argv[1:]); returns the process exit code."""
    # Python workers must run this interpreter (it has pyarrow and slotlake), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args = parse_app_args(stage, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from slotlake.config import load_config
    from slotlake.errors import SlotlakeError
    from slotlake.spark.session import get_spark

    try:
        cfg = load_config(args.config)
        cfg.source(args.source)  # unknown source: the error names the known ones
        spark = get_spark(f"slotlake-{stage}-{args.source}", cfg.spark.master, cfg.spark.conf, storage=cfg.storage)
        try:
            if args.wait_for:
                from slotlake.spark.early import EXIT_CALLER_GONE, GO, wait_for_decision

                spark.range(1).count()  # the scheduler's start and first job, while the caller still works
                decision = wait_for_decision(args.wait_for, args.caller_pid)
                if decision != GO:
                    print(f"slotlake {stage} {args.source}: "
                          + ("told to stop before starting: nothing was done" if decision else
                             "the sync that started this app is gone: nothing was done"), file=sys.stderr)
                    return 0 if decision else EXIT_CALLER_GONE
            lines = APPS[stage].run(spark, cfg, args)
        finally:
            spark.stop()
    except SlotlakeError as e:
        print(f"slotlake {stage} {args.source}: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0
