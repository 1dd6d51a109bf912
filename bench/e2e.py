"""Benchmark: end-to-end changes/s of one sync for a pgbench workload (about 1 M row changes by default).

    .venv/bin/python bench/e2e.py                      # pgbench -i -s 1, then ~1 M row changes (tpcb-like)
    .venv/bin/python bench/e2e.py --changes 200000     # a shorter run
    .venv/bin/python bench/e2e.py --server             # the Spark apps in a long-lived `slotlake spark-server`
    .venv/bin/python bench/e2e.py --auto-server        # `spark.server: auto`: the first sync starts that server
    .venv/bin/python bench/e2e.py --server --bursts 2  # the same burst twice: the second shows a warm driver

Starts a throw-away LocalPostgres, `pgbench -i` (pgbench_history gets REPLICA IDENTITY FULL: it has no key),
a first `sync` (publication, slot, initial copy of the pgbench tables: timed, not counted), then the built-in
tpcb-like script (`pgbench -t`, each transaction = 3 UPDATEs + 1 INSERT = 4 row changes), then one more sync with
its stages timed separately, the same functions the CLI and the DAG run (after the raw pull of the same slot,
the baseline: `COPY (SELECT ... pg_logical_slot_peek_binary_changes ...) TO STDOUT` read into nothing):
  preflight + extract   in a spawned child, whose VmHWM is the extract's peak RSS (the Spark app's JVM is
                        another process)
  decode, merge         in process (a batch of at most `spark.in_process_bytes`: `slotlake.merge.in_process`,
                        no JVM; --in-process-bytes 0 turns it off), else
                        one Spark app that decodes then merges, as `slotlake sync` runs them (the timed sync is
                        `slotlake sync`'s own function in a spawned child): a spark-submit started once the
                        extract has archived its first file (its JVM start overlaps the extract; what is left of
                        it after the extract is counted in the decode; the app prints its merge's own time);
                        with --server, in a `slotlake spark-server` started once before the first sync (config
                        spark.server); with --auto-server, `spark.server: auto`: the first sync (the initial
                        copy) starts it; with --separate-apps, the extract, then a decode app and a merge app,
                        as the sync DAG's three tasks run them
Then `slotlake replay --dest` of the same LSN range, and the same replay in place (a backfill's rate per change;
`--no-replay` skips them): the replayed tables must equal gold row for row, and gold PostgreSQL, at the end; and
`slotlake recover` of the 4 tables as of the middle of that range, in process and by the Spark app (the same rows).
Then the fixed cost: an idle `sync` (nothing new since the last one) and a sync of ~1,000 row changes over the 4
tables (250 tpcb-like transactions), each `--repeat` times as `.venv/bin/slotlake sync` in a new process
(interpreter start and imports included), reported as the median and every run.
changes/s = row changes (silver rows written by this decode) / stage seconds; MB/s = the pgoutput bytes the extract
archived / stage seconds (one base for every stage, so the figures compare). At the end gold is compared with
PostgreSQL: the small tables row by row (tests/oracle.py), the big ones by count and column sums.
The machine's load average is printed with the figures: on a shared machine, compare runs at similar load.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from extract import baseline, run_in_child  # noqa: E402  (bench/extract.py: the raw pull of slotlake_bench)

from slotlake import delta_log  # noqa: E402
from slotlake.config import load_config  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake.lsn import Lsn  # noqa: E402
from slotlake.spark_apps.apps import sync_stages  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.memory import peak_rss_mb  # noqa: E402
from slotlake_dev.pgbench import pgbench, pgbench_db  # noqa: E402
from sparkserver import free_port, spark_server  # noqa: E402  (tests/sparkserver.py)

TABLES = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]
KEYED = TABLES[:3]  # pgbench_history has no key: its inserts are appends, which deletion vectors do not change
CHANGES_PER_TXN = 4  # tpcb-like: UPDATE accounts, tellers, branches; INSERT history


def _config(lake: str, dsn: str, server: str | None = None, event_log: str | None = None,
            conf: dict[str, str] | None = None, tables: list[str] | None = None, deletion_vectors: bool = False,
            in_process_bytes: int | None = None):
    """The Spark apps read the config from a file, so the bench writes one next to the lake (`conf`: spark.conf,
    `tables`: the source's table list, TABLES by default; `deletion_vectors`: that option for the keyed tables;
    `in_process_bytes`: spark.in_process_bytes, None for its default)."""
    path = Path(lake).parent / "slotlake.yaml"
    if not path.exists():
        spark = {"master": "local[2]", **({"server": server} if server else {}), "conf": dict(conf or {})}
        if in_process_bytes is not None:
            spark["in_process_bytes"] = in_process_bytes
        if event_log:  # Spark's event log of every app: where each second goes (bench/README.md "Profile")
            spark["conf"].update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log})
        path.write_text(json.dumps({"lake": lake, "spark": spark,
                                    "sources": {"bench": {"dsn": dsn, "tables": tables or TABLES,
                                                          "deletion_vectors": KEYED if deletion_vectors
                                                          else False}}}))  # JSON is YAML
    return load_config(str(path))


def _child_extract(lake: str, dsn: str, out: mp.Queue) -> None:
    from slotlake.pipeline import task_extract, task_preflight

    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    cfg = _config(lake, dsn)
    t0 = time.perf_counter()
    task_preflight(cfg, "bench")
    extracted = task_extract(cfg, "bench")
    out.put({"seconds": time.perf_counter() - t0, "rows": extracted.get("rows"), "bytes": extracted.get("bytes"),
             "max_rss_mb": peak_rss_mb()})


def _child_sync(lake: str, dsn: str, out: mp.Queue) -> None:
    from slotlake.pipeline import sync

    logging.basicConfig(level=logging.WARNING, format="  %(message)s")
    # what the in-process path did, and why it handed a slice to Spark
    for name in ("slotlake.pipeline", "slotlake.decode.job", "slotlake.merge.in_process"):
        logging.getLogger(name).setLevel(logging.INFO)
    cfg = _config(lake, dsn)
    with capture_stage_line() as found:
        report = sync(cfg, "bench")
    if not found and "spark" in report.step_seconds:
        raise SystemExit("the sync app printed no 'sync stages:' line")
    # decoded in the sync's process (config spark.in_process_bytes): its steps hold the decode and merge
    merge = found[-1]["merge"] if found and "spark" in report.step_seconds else None
    out.put({"steps": dict(report.step_seconds), "merge": merge, "rows": report.archived_changes,
             "bytes": report.archived_bytes, "max_rss_mb": peak_rss_mb()})


def timed_sync(lake: str, dsn: str) -> dict:
    """`slotlake sync`'s own function in a spawned child (its VmHWM: the extract's peak; the Spark app is a process
    of its own or runs in the server): its steps' seconds, and the merge's own time from the app's output."""
    return run_in_child(_child_sync, lake, dsn)


def preflight_and_extract(lake: str, dsn: str) -> dict:
    return run_in_child(_child_extract, lake, dsn)


def decoded_rows(paths: LakePaths, since_version: int) -> int:
    return sum(c.metrics.get("numOutputRows", 0) for c in delta_log.commits(paths.changes) if c.version > since_version)


def compare(spark, paths: LakePaths, dsn: str) -> list[str]:
    from oracle import assert_gold_equals_pg

    lines = []
    for table in ("public.pgbench_branches", "public.pgbench_tellers"):
        n = assert_gold_equals_pg(paths.gold(*table.split(".")), dsn, table)
        lines.append(f"{table}: {n} rows equal (oracle)")
    sums = {"public.pgbench_accounts": "count(*), sum(aid), sum(bid), sum(abalance)",
            "public.pgbench_history": "count(*), sum(tid), sum(bid), sum(aid), sum(delta), "
                                      "sum((extract(epoch from mtime) * 1000000)::numeric)"}
    with psycopg.connect(dsn) as conn:
        for table, exprs in sums.items():
            pg = tuple(int(v or 0) for v in conn.execute(f"SELECT {exprs} FROM {table}").fetchone())
            # microseconds summed exactly on both sides (a bigint sum of 250k epochs would overflow)
            spark_exprs = exprs.replace("sum((extract(epoch from mtime) * 1000000)::numeric)",
                                        "sum(cast(unix_micros(cast(mtime as timestamp)) as decimal(38,0)))")
            gold = spark.read.format("delta").load(paths.gold(*table.split("."))).selectExpr(
                *spark_exprs.split(", ")).collect()[0]
            gold = tuple(int(v or 0) for v in gold)
            if gold != pg:
                raise SystemExit(f"{table}: gold {gold} != PostgreSQL {pg}")
            lines.append(f"{table}: {pg[0]} rows, count and column sums equal")
    return lines


def _silver_end(paths: LakePaths) -> str:
    """Silver's decode watermark (the LSN the last decode ended at)."""
    last = delta_log.latest_slotlake_commit(paths.changes, "decode")
    assert last is not None, "silver has no decode commit"
    return str(last.end_lsn)


@contextlib.contextmanager
def capture_stage_line():
    """The stage times the sync app prints (`sync stages: ...`), as its log lines pass through slotlake's logger."""
    found: list[dict[str, float]] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            stages = sync_stages(record.getMessage())
            if stages:
                found.append(stages)
            if record.levelno >= logging.WARNING:  # the rest of the app's output stays out, as before
                logging.getLogger().handle(record)

    handler, logger = Grab(logging.INFO), logging.getLogger("slotlake.spark")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


_SUMMARY_SECONDS = re.compile(r", ([0-9.]+)s \(preflight .*\)\s*$")


def cli_sync(cfg, inner: list[float] | None = None) -> float:
    """Seconds of one `slotlake sync bench` in a new process, as a user or cron runs it (imports included); the
    seconds its own summary line reports (without the interpreter's start and imports) appended to `inner`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    t = time.perf_counter()
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "slotlake"), "--config", cfg.path, "sync", "bench"],
                         check=True, capture_output=True, env=env, text=True)
    secs = time.perf_counter() - t
    said = []
    for line in (out.stdout + out.stderr).splitlines():  # the run summary's notes (e.g. a big copy-on-write MERGE)
        if "NOTE:" in line:
            print(f"  sync said: {line.strip()[:400]}")
        if m := _SUMMARY_SECONDS.search(line):
            said.append(float(m.group(1)))
    if inner is not None and said:  # (the summary is logged and printed: once each)
        inner.append(said[-1])
    return secs


# pgbench's tpcb-like script with the account drawn from the 10,000 accounts added after the initial copy
# (`--small-keys recent`, RECENT_ACCOUNTS): the rows an application changes are most often its newest ones (orders,
# sessions), and rows inserted after the copy lie in gold files of their own, not in the copy's big files.
RECENT_ACCOUNTS = 10_000
RECENT_TPCB = f"""\\set aid random(100000 * :scale + 1, 100000 * :scale + {RECENT_ACCOUNTS})
\\set bid random(1, 1 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
"""


def fixed_cost(cfg, pg: LocalPostgres, repeat: int, small_keys: str = "random",
               scale: int = 1) -> dict[str, list[float]]:
    """Seconds of an idle CLI sync and of a ~1,000-change CLI sync, `repeat` times each (they alternate). The small
    sync's accounts are drawn from all of them (`small_keys` random: pgbench's tpcb-like) or (recent) from
    RECENT_ACCOUNTS accounts inserted after the copy and synced once first (untimed)."""
    out: dict[str, list[float]] = {"idle sync": [], "1,000-change sync": [],
                                   "1,000-change sync, its own summary (no interpreter start, imports)": []}
    script = ["-b", "tpcb-like"]
    if small_keys == "recent":
        path = Path(cfg.path).parent / "recent-tpcb.sql"
        path.write_text(RECENT_TPCB)
        script = ["-f", str(path), "-s", str(scale)]  # a custom script's :scale is -s (default 1)
        n = 100_000 * scale
        with psycopg.connect(cfg.source("bench").dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO pgbench_accounts (aid, bid, abalance, filler) "
                         "SELECT g, 1, 0, '' FROM generate_series(%s::int, %s::int) g", (n + 1, n + RECENT_ACCOUNTS))
        cli_sync(cfg)
    for _ in range(repeat):
        out["idle sync"].append(cli_sync(cfg))
        pgbench(pg, "-n", *script, "-c", "1", "-t", str(1000 // CHANGES_PER_TXN))
        out["1,000-change sync"].append(cli_sync(cfg, out["1,000-change sync, its own summary (no interpreter "
                                                      "start, imports)"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=1_000_000, help="row changes to generate (default 1,000,000)")
    ap.add_argument("--scale", type=int, default=1, help="pgbench -s (100,000 accounts per unit)")
    ap.add_argument("--clients", type=int, default=4, help="pgbench -c")
    ap.add_argument("--simple-update", action="store_true",
                    help="pgbench -N for the batch (accounts updated, history inserted, tellers and branches "
                         "untouched: 2 row changes per transaction; the issue's burst) instead of tpcb-like (4)")
    ap.add_argument("--bursts", type=int, default=1,
                    help="timed bursts, each synced on its own (default 1); with a server, the later ones show a "
                         "warm driver's steady state (the first large batch after its start also compiles its code)")
    ap.add_argument("--repeat", type=int, default=3, help="idle and 1,000-change syncs to time (default 3)")
    ap.add_argument("--no-replay", dest="replay", action="store_false",
                    help="skip timing `slotlake replay` (--dest and in place) of the same range (a backfill's rate)")
    ap.add_argument("--separate-apps", action="store_true",
                    help="time the decode and the merge as two Spark apps, as the sync DAG's tasks run them "
                         "(default: one app that decodes then merges, as `slotlake sync` runs them)")
    ap.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                    help="a spark.conf setting of the config (repeatable), e.g. the driver's Java options")
    ap.add_argument("--event-log", metavar="DIR", help="write Spark's event log of every app into DIR")
    ap.add_argument("--server", action="store_true",
                    help="run the Spark apps in a `slotlake spark-server` (spark.server) started before the first "
                         "sync: its start-up is reported apart, the stages pay no JVM start")
    ap.add_argument("--deletion-vectors", action="store_true",
                    help="config `deletion_vectors: [the keyed tables]`: gold MERGEs mark changed rows instead of "
                         "rewriting files "
                         "(with --scale 100: what a small batch into a 10 M-row table costs)")
    ap.add_argument("--small-keys", choices=("random", "recent"), default="random",
                    help="the accounts the 1,000-change syncs update: random (pgbench's tpcb-like, default) or "
                         "10,000 added after the initial copy (a table whose newest rows change, e.g. orders)")
    ap.add_argument("--in-process-bytes", type=int, default=None,
                    help="config spark.in_process_bytes: batches of up to this many bronze bytes sync without a JVM "
                         "(default: the config's default, 32 MB; 0: every batch through the Spark apps)")
    ap.add_argument("--auto-server", action="store_true",
                    help="`spark.server: auto`: the first sync starts the server (inside its time), the later "
                         "ones reuse it, as scheduled syncs do; it is stopped at the end")
    ap.add_argument("--optimize", action="store_true",
                    help="after the timed small syncs: `slotlake optimize bench` (timed), what it left in "
                         "pgbench_accounts, and 5 more idle and 1,000-change syncs")
    args = ap.parse_args()
    if args.optimize and args.small_keys == "recent":
        ap.error("--optimize times its syncs with --small-keys random only (recent ones insert their accounts once)")
    if args.bursts < 1:
        ap.error("--bursts must be at least 1")
    if args.server and args.auto_server:
        ap.error("--server and --auto-server exclude each other")
    logging.basicConfig(level=logging.WARNING)
    load_start = os.getloadavg()
    txns = max(1, args.changes // (2 if args.simple_update else CHANGES_PER_TXN) // args.clients)
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-e2e-") as tmp, LocalPostgres() as pg, \
            contextlib.ExitStack() as stack:
        t = time.perf_counter()
        dsn = pgbench_db(pg, args.scale)
        init_s = time.perf_counter() - t
        lake = str(Path(tmp) / "lake")
        if args.event_log:
            Path(args.event_log).mkdir(parents=True, exist_ok=True)
        if args.auto_server:  # its state (pid, address, log) in this run's folder
            os.environ["SLOTLAKE_STATE_DIR"] = str(Path(tmp) / "state")
        cfg = _config(lake, dsn, "auto" if args.auto_server else f"127.0.0.1:{free_port()}" if args.server else None,
                      str(Path(args.event_log).resolve()) if args.event_log else None,
                      deletion_vectors=args.deletion_vectors, in_process_bytes=args.in_process_bytes,
                      conf=dict(kv.split("=", 1) for kv in args.spark_conf))
        paths = LakePaths.of(lake, "bench")
        if args.auto_server:  # stopped at the end, as `slotlake spark-server --stop` does
            from slotlake.spark.auto_server import stop_server
            from slotlake.spark.submit import spark_app

            stack.callback(stop_server, spark_app(cfg, "bench", "sync"))
        server_s, server = 0.0, None
        if args.server:  # started once, before the first sync; its start-up is reported apart
            t = time.perf_counter()
            server = stack.enter_context(spark_server(Path(cfg.path), Path(tmp) / "spark-server.log"))
            server_s = time.perf_counter() - t
        where = "Spark server" if server else "auto Spark server" if args.auto_server else "spark-submit"
        from slotlake.pipeline import sync, task_decode, task_merge

        t = time.perf_counter()
        sync(cfg, "bench")  # slot + initial copy of the pgbench_* tables
        first_s = time.perf_counter() - t
        pgbench(pg, "-n", "-c", "1", "-t", "1")  # one transaction and a sync: silver and _runs have an end, so
        sync(cfg, "bench")  # the replay below has a base point before the batch, as in a running pipeline
        bursts = []  # per burst: (pgbench s, raw pull, extract, stages, changes, silver end before it)
        for _ in range(args.bursts):  # later bursts: the same driver again, as the next scheduled sync
            t = time.perf_counter()
            pgbench(pg, "-n", *(["-N"] if args.simple_update else []), "-c", str(args.clients),
                    "-j", str(min(args.clients, 2)), "-t", str(txns))
            bench_s = time.perf_counter() - t
            silver_before = next((c.version for c in delta_log.commits(paths.changes)), -1) \
                if delta_log.is_delta_table(paths.changes) else -1
            lsn_before = _silver_end(paths)

            stages = {}
            raw = baseline(dsn)  # the same slot and publication names as bench/extract.py's baseline
            if args.separate_apps:  # the sync DAG's way: the extract, then a decode app, then a merge app
                ext = preflight_and_extract(lake, dsn)
                stages["preflight + extract"] = ext["seconds"]
                t = time.perf_counter()
                task_decode(cfg, "bench")
                stages[f"decode ({where})"] = time.perf_counter() - t
                t = time.perf_counter()
                task_merge(cfg, "bench")
                stages[f"merge ({where})"] = time.perf_counter() - t
            else:  # `slotlake sync` itself: the app's JVM starts during the extract, then decodes and merges
                ext = timed_sync(lake, dsn)
                steps = ext["steps"]
                stages["preflight + extract"] = steps["preflight"] + steps["extract"]
                if "spark" in steps:  # after the slices decoded (and merged) in the sync's process, if any
                    mixed = f"in process + {where}" if steps.get("decode") else where
                    # what is left of the app's start counts in the decode
                    stages[f"decode ({mixed})"] = steps.get("decode", 0.0) + steps["spark"] - ext["merge"]
                    stages[f"merge ({mixed})"] = steps.get("merge", 0.0) + ext["merge"]
                else:  # decoded in the sync's process; merged there too, or by a Spark merge app
                    stages["decode (in process)"] = steps["decode"]
                    merged_by = "in process" if "merge (Spark)" not in steps else \
                        f"in process + {where}" if "merge" in steps else where
                    stages[f"merge ({merged_by})"] = steps.get("merge", 0.0) + steps.get("merge (Spark)", 0.0)
            bursts.append((bench_s, raw, ext, stages, decoded_rows(paths, silver_before), lsn_before))
        bench_s, raw, ext, stages, changes, lsn_before = bursts[-1]  # the replay re-applies the last burst
        replay_s = None
        if args.replay:  # the same range again, as a backfill would: re-decoded and merged into a copy of gold
            from slotlake.recover.replay_run import replay

            t = time.perf_counter()
            replayed = replay(cfg, "bench", lsn_before, _silver_end(paths), dest=str(Path(tmp) / "replayed"))
            replay_s = time.perf_counter() - t
            replay_where = "in process" if replayed is not None else where
            t = time.perf_counter()  # the same range in place: silver's rows re-derived, gold rebuilt to its end
            replayed = replay(cfg, "bench", lsn_before, _silver_end(paths))
            in_place_s = time.perf_counter() - t
            in_place_where = "in process" if replayed is not None else where
            # the range ends at silver's end: the --dest tables hold gold's rows, and gold still does after the
            # replay in place (before the syncs below change it)
            replay_check = same_rows(paths, Path(tmp) / "replayed")
            recovered = time_recover(cfg, paths, Lsn.parse(str(lsn_before)), Path(tmp))
        fixed = fixed_cost(cfg, pg, args.repeat, args.small_keys, args.scale)
        accounts = delta_log.latest_slotlake_commit(paths.gold("public", "pgbench_accounts"))
        aged = gold_shape(paths.gold("public", "pgbench_accounts"))
        optimized = None
        if args.optimize:
            t = time.perf_counter()
            said = subprocess.run([str(ROOT / ".venv" / "bin" / "slotlake"), "--config", cfg.path, "optimize", "bench"],
                                  check=True, capture_output=True, text=True).stdout.strip().splitlines()
            optimized = (time.perf_counter() - t, said, gold_shape(paths.gold("public", "pgbench_accounts")),
                         fixed_cost(cfg, pg, 5, args.small_keys, args.scale))
        stack.close()  # stops the Spark server, if any
        load_end = os.getloadavg()
        script = "simple-update (-N)" if args.simple_update else "tpcb-like"
        print(f"\npgbench -i -s {args.scale}: {init_s:.1f}s; first sync (slot + initial copy): {first_s:.1f}s")
        if server is not None:
            print(f"slotlake spark-server start-up (once, before the first sync): {server_s:.1f}s")
        for i, (bench_s, raw, ext, stages, changes, _) in enumerate(bursts, start=1):
            mb = (ext["bytes"] or 0) / 1e6
            print(f"\nburst {i} of {len(bursts)}: pgbench {args.clients} clients x {txns} {script} transactions: "
                  f"{bench_s:.1f}s")
            print(f"row changes decoded: {changes:,}; pgoutput messages archived: {ext['rows']:,} ({mb:.1f} MB)")
            print(f"{'stage':<24} {'s':>8} {'changes/s':>11} {'MB/s':>7}")
            for name, s in [*stages.items(), ("total", sum(stages.values()))]:
                print(f"{name:<24} {s:>8.1f} {changes / s:>11,.0f} {mb / s:>7.2f}")
            print(f"{'raw pull (baseline)':<24} {raw['seconds']:>8.1f} {changes / raw['seconds']:>11,.0f} "
                  f"{mb / raw['seconds']:>7.2f}   COPY of peek_binary_changes, same slot, read into nothing")
            if "spark" in ext["steps"]:
                print(f"extract peak RSS: {ext['max_rss_mb']:.0f} MB")
            else:  # the child also decoded (and maybe merged) in process: its peak is theirs too
                print(f"sync process peak RSS (extract, in-process decode and merge): {ext['max_rss_mb']:.0f} MB")
        print()
        if replay_s is not None:
            print(f"{'replay --dest, same range':<24} {replay_s:>8.1f} {changes / replay_s:>11,.0f} "
                  f"{mb / replay_s:>7.2f}   slotlake replay bench --from {lsn_before} --to {_silver_end(paths)} "
                  f"--dest DIR ({replay_where})")
            print(f"{'replay in place':<24} {in_place_s:>8.1f} {changes / in_place_s:>11,.0f} "
                  f"{mb / in_place_s:>7.2f}   the same without --dest ({in_place_where})")
        if replay_s is not None:
            here_s, spark_s, point, rows = recovered
            print(f"{'recover, 4 tables':<24} {here_s if here_s is not None else float('nan'):>8.1f} "
                  f"{'':>11} {'':>7}   slotlake recover bench --as-of {point} (mid-range) --to DIR: in process "
                  f"({'declined' if here_s is None else f'{rows:,} rows'}); the Spark app: {spark_s:.1f} s")
        if accounts is not None and args.repeat:  # what the last small sync did to the biggest table
            m = accounts.metrics
            print(f"last 1,000-change sync ({args.small_keys} accounts), pgbench_accounts ({args.scale * 100_000:,} "
                  f"rows) {accounts.operation}: "
                  f"files removed {m.get('numTargetFilesRemoved', 0)}, added {m.get('numTargetFilesAdded', 0)}, "
                  f"rows copied {m.get('numTargetRowsCopied', 0):,}, deletion vectors added "
                  f"{m.get('numTargetDeletionVectorsAdded', 0)}, bytes written "
                  f"{format(m['numTargetBytesAdded'], ',') if 'numTargetBytesAdded' in m else '? (delta-rs)'}")
        print(f"pgbench_accounts after the syncs: {aged}")
        for name, runs in fixed.items():
            if not runs:  # --repeat 0
                continue
            print(f"{name}: median {statistics.median(runs):.1f} s (" + ", ".join(f"{x:.1f}" for x in runs) + ")")
        if optimized is not None:
            secs, said, shape, after = optimized
            print(f"slotlake optimize bench: {secs:.1f} s (CLI process): " + "; ".join(said))
            print(f"pgbench_accounts after it: {shape}")
            for name, runs in after.items():
                print(f"after optimize, {name}: median {statistics.median(runs):.1f} s ("
                      + ", ".join(f"{x:.1f}" for x in runs) + ")")
        print("load average (1/5/15 min): start " + "/".join(f"{x:.1f}" for x in load_start)
              + ", end " + "/".join(f"{x:.1f}" for x in load_end) + f" on {os.cpu_count()} CPUs", flush=True)

        from slotlake.spark.session import get_spark

        spark = get_spark("slotlake-bench-e2e", "local[2]", {"spark.sql.shuffle.partitions": "4"})
        for line in compare(spark, paths, dsn):
            print(f"gold == PostgreSQL: {line}", flush=True)
        if replay_s is not None:
            for line in replay_check:
                print(f"replay --dest == gold (after the replay in place): {line}", flush=True)
            print("recover in process == the recover Spark app: every row of the 4 tables", flush=True)


def gold_shape(path: str) -> str:
    """What the syncs left in a gold table: its live files, those with a deletion vector and the rows their
    vectors delete, and how long delta-rs's query engine takes to count its rows (it applies the vectors)."""
    from deltalake import DeltaTable, QueryBuilder

    snap = delta_log.snapshot(path)
    if snap is None:
        return "(its log is not read here)"
    vectors = [a["deletionVector"] for a in snap.files.values() if a.get("deletionVector")]
    t = time.perf_counter()
    (count,) = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT count(*) FROM t").read_all()[0]
    secs = time.perf_counter() - t
    return (f"{len(snap.files)} live files, {len(vectors)} with a deletion vector ("
            f"{sum(int(v['cardinality']) for v in vectors):,} rows deleted by them); {count.as_py():,} rows counted "
            f"by delta-rs's query engine in {secs:.2f} s")


def _equal_rows(a: str | Path, b: str | Path, what: str) -> int:
    """The two Delta tables hold the same rows (`_slotlake_` columns included, read with delta-rs; a table with
    deletion vectors through its query engine, which applies them): their count; raises (`what` differs) on a
    difference."""
    import collections

    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    def read(path: str | Path) -> list[dict]:
        table = DeltaTable(str(path))
        if "deletionVectors" not in (table.protocol().reader_features or []):
            return table.to_pyarrow_table().to_pylist()
        got = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
        return got.cast(pa.schema(table.schema().to_arrow())).to_pylist()  # (view types as plain ones)

    rows = [collections.Counter(tuple(sorted(r.items())) for r in read(p)) for p in (a, b)]
    if rows[0] != rows[1]:
        raise SystemExit(f"{what} differs")
    return sum(rows[0].values())


def same_rows(paths, dest: Path) -> list[str]:
    """Each gold table's rows equal the replayed table's (`_equal_rows`); raises on a difference."""
    return [f"{schema}.{table}: "
            f"{_equal_rows(paths.gold(schema, table), dest / schema / table, f'replay --dest of {schema}.{table}')}"
            " rows equal" for schema, table in delta_log.gold_tables(paths.root)]


def time_recover(cfg, paths: LakePaths, before: Lsn, tmp: Path) -> tuple[float | None, float, Lsn, int]:
    """`slotlake recover` of the 4 tables as of the middle of the last burst's range into a Delta folder, in this
    process (`recover_in_process`; None seconds when it declines) and by the recover Spark app; the two must write
    the same rows (raises otherwise). Returns (in-process seconds, Spark seconds, the point, rows recovered)."""
    from slotlake.recover.point import request
    from slotlake.recover.point_in_process import recover_in_process
    from slotlake.recover.recover_run import recover

    point = Lsn((before.value + Lsn.parse(_silver_end(paths)).value) // 2)
    req, password = request("bench", str(point), TABLES, str(tmp / "recovered"))
    t = time.perf_counter()
    result = recover_in_process(cfg, req, password)
    here_s = time.perf_counter() - t if result is not None else None
    spark_cfg = dataclasses.replace(cfg, spark=dataclasses.replace(cfg.spark, in_process_bytes=0))
    t = time.perf_counter()
    recover(spark_cfg, "bench", str(point), TABLES, str(tmp / "recovered_spark"))
    spark_s = time.perf_counter() - t
    rows = 0
    if result is not None:
        for name in TABLES:
            schema, table = name.split(".")
            rows += _equal_rows(tmp / "recovered" / schema / table, tmp / "recovered_spark" / schema / table,
                                f"recover of {name} (in process vs the Spark app)")
    return here_s, spark_s, point, rows


if __name__ == "__main__":
    main()
