"""`slotlake`: the command-line front end over the same functions the Airflow tasks call.

    slotlake [--config FILE] sync SOURCE      preflight, extract, decode, merge, report (like one DAG run)
    slotlake [--config FILE] status SOURCE    slot lag, retained WAL, wal_status, each gold table's applied LSN
    slotlake [--config FILE] resync SOURCE    after a lost slot: new slot, recopy every table, rebuild gold
    slotlake [--config FILE] replay SOURCE --from X --to Y [--table T ...] [--dest PATH]
    slotlake [--config FILE] transactions SOURCE --from X --to Y [--table T ...] [--json]
    slotlake [--config FILE] undo SOURCE --xid N | --commit-lsn L [--out FILE]
    slotlake [--config FILE] recover SOURCE --as-of POINT --table T [--table T ...] --to DEST [--into-schema S]
                                                                                              [--replace]
    slotlake [--config FILE] optimize SOURCE [--table T ...] [--json]
                                              compact gold's small files and deletion vectors (no data changed)
    slotlake [--config FILE] spark-server [--listen HOST:PORT] [--idle-minutes M] | --stop
                                              a long-lived Spark driver (config spark.server)

Each command is a `Command` in COMMANDS: a name, a help line, a function adding its arguments, and a function
that runs it. Exit 0 on success; on failure one line `slotlake: error: <message>` and exit 1 (a traceback
only with --debug).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slotlake.config import AUTO_SERVER, ENV_VAR, Config, load_config
from slotlake.errors import SlotlakeError
from slotlake.status import runs_status as runs_status  # re-exported: the CLI's answer for other lake schemes
from slotlake.status import source_status

log = logging.getLogger("slotlake.cli")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Config, argparse.Namespace], int]


def _source_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="a source name from the config's `sources:`")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of text")


def run_sync(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.pipeline import sync

    report = sync(cfg, args.source)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
        for t in report.merged:
            print(f"  {t.table}: +{t.inserted} ~{t.updated} -{t.deleted} rows, applied up to {t.applied_lsn} "
                  f"(gold version {t.gold_version})")
    return 0


def run_status(cfg: Config, args: argparse.Namespace) -> int:
    st = source_status(cfg, args.source)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"source {st['source']}   lake {st['lake']}")
    for k, v in st["slot"].items():
        print(f"  {k}: {v}")
    if not st["tables"]:
        print("  no gold tables yet (run `slotlake sync` first)")
    for t in st["tables"]:
        by = f" ({t['applied_by']})" if t.get("applied_by") else ""
        print(f"  gold {t['table']}: applied LSN {t['applied_lsn']}{by}, version {t['gold_version']}, "
              f"committed {t['committed_at']}")
    return 0


def run_resync(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.pipeline import plain
    from slotlake.source.lock import source_lock
    from slotlake.source.resync import resync
    from slotlake.spark.submit import run_spark_app, spark_app

    with source_lock(cfg.source(args.source), "resync"):
        report = resync(cfg, cfg.source(args.source))
        # Rebuild gold now (each table replaced in a new Delta version; earlier versions stay for time travel).
        run_spark_app(spark_app(cfg, args.source, "snapshot"))
    if args.json:
        print(json.dumps(plain(report), indent=2))
    else:
        print("\n".join(report.lines()))
        print(f"  gold rebuilt; the next `slotlake sync {args.source}` applies changes from "
              f"{report.snapshot.generation}")
    return 0


def _replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="a source name from the config's `sources:`")
    p.add_argument("--from", dest="from_", required=True, metavar="X", help="LSN (16/B374D848) or ISO time (UTC)")
    p.add_argument("--to", required=True, metavar="Y", help="LSN or ISO time (UTC): rebuild the state at Y")
    p.add_argument("--table", action="append", dest="tables", metavar="T", help="schema.table (repeatable; "
                   "default: every table)")
    p.add_argument("--dest", metavar="PATH", help="write <PATH>/<schema>/<table> instead of rebuilding in place")


def run_replay(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.recover.replay_run import replay

    replay(cfg, args.source, args.from_, args.to, args.tables, args.dest)
    return 0


def _transactions_args(p: argparse.ArgumentParser) -> None:
    _source_arg(p)
    p.add_argument("--from", dest="from_", required=True, metavar="X", help="LSN (inclusive) or ISO time (UTC)")
    p.add_argument("--to", required=True, metavar="Y", help="LSN (inclusive) or ISO time (UTC, exclusive)")
    p.add_argument("--table", action="append", dest="tables", metavar="T", help="schema.table (repeatable; "
                   "default: every table)")


def run_transactions(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.recover.transactions import list_transactions

    found = list_transactions(cfg, args.source, args.from_, args.to, args.tables)
    print(json.dumps(found.as_dict(), indent=2) if args.json else "\n".join(found.lines()))
    return 0


def _undo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="a source name from the config's `sources:`")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--xid", type=int, metavar="N", help="the transaction id (see `slotlake transactions`)")
    which.add_argument("--commit-lsn", metavar="L", help="the transaction's commit LSN")
    p.add_argument("--out", metavar="FILE", help="write the SQL to FILE (default: standard output)")


def run_undo(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.recover.undo import undo

    result = undo(cfg, args.source, xid=args.xid, commit_lsn=args.commit_lsn, out=args.out)
    if args.out:
        print(result.summary())
    else:
        sys.stdout.write(result.script)
    return 0


def _recover_args(p: argparse.ArgumentParser) -> None:
    _source_arg(p)
    p.add_argument("--as-of", dest="as_of", required=True, metavar="POINT",
                   help="LSN (16/B374D848) or ISO time (UTC unless zoned): the last commit at or before it")
    p.add_argument("--table", action="append", dest="tables", required=True, metavar="T",
                   help="schema.table (repeatable); all are recovered at the same commit LSN")
    p.add_argument("--to", required=True, metavar="DEST",
                   help="a folder/URI (Delta tables DEST/<schema>/<table>) or a postgresql:// URL")
    p.add_argument("--into-schema", metavar="S", help="with a postgresql:// DEST: the schema to create the tables "
                   "in (default: recovered)")
    p.add_argument("--replace", action="store_true", help="overwrite target tables that already exist")


def run_recover(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.recover.recover_run import recover

    result = recover(cfg, args.source, args.as_of, args.tables, args.to, args.into_schema, args.replace)
    print(json.dumps(result.as_dict(), indent=2) if args.json else "\n".join(result.lines()))
    return 0


def _optimize_args(p: argparse.ArgumentParser) -> None:
    _source_arg(p)
    p.add_argument("--table", action="append", dest="tables", metavar="T", help="schema.table (repeatable; "
                   "default: every gold table)")


def run_optimize(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.pipeline import optimize

    done = optimize(cfg, args.source, args.tables)
    print(json.dumps([t.as_dict() for t in done], indent=2) if args.json else "\n".join(t.line() for t in done))
    return 0


def _spark_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", metavar="HOST:PORT", help="where to listen (default: the config's spark.server; "
                   "port 0: a free one)")
    p.add_argument("--idle-minutes", type=float, metavar="M", help="stop after M minutes without an app "
                   "(default: run until SIGTERM)")
    p.add_argument("--ready-file", metavar="FILE", help="write {pid, address, code} to FILE once listening, "
                   "remove it when stopping (what `spark.server: auto` starts servers with)")
    p.add_argument("--stop", action="store_true", help="stop the server `spark.server: auto` started for this "
                   "config's Spark settings, and exit")


def run_spark_server(cfg: Config, args: argparse.Namespace) -> int:
    from slotlake.errors import ConfigError
    from slotlake.spark_apps.server import main_serve

    if args.stop:
        from slotlake.spark.auto_server import stop_server
        from slotlake.spark.submit import spark_app

        if not cfg.sources:
            raise ConfigError("spark-server --stop: the config has no source")
        pid = stop_server(spark_app(cfg, next(iter(cfg.sources)), "sync"))
        print(f"stopped the slotlake Spark server (pid {pid})" if pid else
              "no slotlake Spark server started by spark.server: auto runs for this config's Spark settings")
        return 0
    address = args.listen or cfg.spark.server
    if not address or address == AUTO_SERVER:
        raise ConfigError("spark-server: no address: pass --listen HOST:PORT or set spark.server to one in the "
                          "config (with spark.server: auto the sync starts its own server)")
    if args.idle_minutes is not None and args.idle_minutes <= 0:
        raise ConfigError("spark-server: --idle-minutes must be positive")
    return main_serve(cfg, address, idle_minutes=args.idle_minutes, ready_file=args.ready_file)


COMMANDS: tuple[Command, ...] = (
    Command("sync", "bring SOURCE's lake up to date (one run of the sync DAG)", _source_arg, run_sync),
    Command("resync", "start SOURCE over after a lost slot: new slot, recopy every table, rebuild gold",
            _source_arg, run_resync),
    Command("status", "show the slot's lag and each gold table's applied LSN", _source_arg, run_status),
    Command("replay", "re-decode SOURCE's archived changes from X to Y and rebuild tables (in place or --dest)",
            _replay_args, run_replay),
    Command("transactions", "list SOURCE's commits from X to Y with rows inserted/updated/deleted per table",
            _transactions_args, run_transactions),
    Command("undo", "write the SQL that reverts one transaction of SOURCE (checked, in one transaction)",
            _undo_args, run_undo),
    Command("recover", "SOURCE's tables as of one commit LSN or time, into Delta tables or a PostgreSQL database",
            _recover_args, run_recover),
    Command("optimize", "compact SOURCE's gold tables (small files, deletion vectors) without Spark, no data changed",
            _optimize_args, run_optimize),
    Command("spark-server", "keep one Spark driver running and run the sync's Spark apps in it (spark.server)",
            _spark_server_args, run_spark_server),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slotlake", description="Keep a Delta Lake in sync with PostgreSQL.")
    parser.add_argument("--config", metavar="FILE", help=f"the YAML config (default: ${ENV_VAR})")
    parser.add_argument("--debug", action="store_true", help="debug logging and tracebacks on errors")
    parser.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for c in COMMANDS:
        p = sub.add_parser(c.name, help=c.help, description=c.help)
        c.add_arguments(p)
        p.set_defaults(run=c.run)
    return parser


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.debug else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        return args.run(cfg, args)
    except SlotlakeError as e:
        if args.debug:
            log.exception("failed")
        print(f"slotlake: error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("slotlake: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not a user error: say so, keep it to one line unless --debug
        if args.debug:
            log.exception("failed")
        print(f"slotlake: error: unexpected {type(e).__name__}: {one_line(e)} (rerun with --debug for the "
              f"traceback)", file=sys.stderr)
        return 2


def entry() -> None:
    """The `slotlake` console script: `main()`, then the process ends without the native libraries' teardown.
    A native thread pool (Arrow's Parquet threads, apache/arrow#34314) can abort the interpreter's exit after the
    command finished ("terminate called without an active exception", SIGABRT), and the exit code would then say a
    sync that committed everything failed. Python's exit handlers still run, running threads are waited for and
    the output is flushed first."""
    import atexit
    import os
    import threading

    code = main()
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
