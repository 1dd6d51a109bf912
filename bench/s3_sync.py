"""Benchmark: idle and ~1,000-change `slotlake sync` runs on an s3a lake (a real S3-compatible server, `moto_server`)
next to the same runs on a local lake, in one run.

    .venv/bin/python bench/s3_sync.py                 # 3 idle and 3 1,000-change syncs of each variant
    .venv/bin/python bench/s3_sync.py --repeat 5
    .venv/bin/python bench/s3_sync.py --transactions 25000 --repeat 1   # 100,000-change syncs

Starts a throw-away PostgreSQL with `pgbench -i -s 1` (`pgbench_history` REPLICA IDENTITY FULL), a `moto_server`
(tests/s3server.py; dummy credentials in this process's environment only) and three sources on the database, each
with its own slot, publication, config and lake:
- `local`: a local lake, the default config (decode and merge of a small batch in the CLI's own process);
- `s3`: `lake: s3a://<bucket>/lake`, the default config (the same in process, on S3);
- `s3spark`: the same on another bucket with `spark.in_process_bytes: 0`: every sync with changes spark-submits its
  Spark app (what every s3a sync did before the in-process path took S3 lakes);
- `s3auto`: the same on a third bucket with `spark.server: auto` (the first run starts a Spark driver that later
  runs reuse where Spark is needed; stopped at the end).
Each is synced once (slot + initial copy, timed, not counted); then, `--repeat` times: `--transactions` (250)
tpcb-like pgbench transactions (4 row changes each over the 4 tables, into every slot), a sync of each, an idle sync
of each. Then the last round's range is replayed in place (`slotlake replay SRC --from A --to B`, as the replay
DAG backfills an interval), timed the same way. Every
sync is a whole `slotlake sync` process timed from outside; reported as the median and every run, with the
sync's own report line of the last run. At the end (after the replays) every gold table is compared with
PostgreSQL row by row (delta-rs, through the endpoint for the s3a lakes).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support
sys.path.append(str(ROOT / "tests"))  # oracle.py, s3server.py

from variants import write_config  # noqa: E402

from oracle import assert_gold_equals_pg  # noqa: E402
from s3server import TEST_CREDENTIALS, MotoServer  # noqa: E402
from slotlake.config import load_config  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.pgbench import pgbench, pgbench_db  # noqa: E402

TABLES = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]
VARIANTS = ("local", "s3", "s3spark", "s3auto")


def config_of(tmp: Path, dsn: str, source: str, moto: MotoServer) -> Path:
    """The variant's config (`variants.write_config`): a local lake, or a new bucket with the endpoint's settings."""
    if source == "local":
        return write_config(tmp, dsn, source, TABLES, None)
    storage = {"endpoint": moto.endpoint, "region": "us-east-1", "path_style": True}
    return write_config(tmp, dsn, source, TABLES, 0 if source == "s3spark" else None,
                        lake=f"s3a://{moto.new_bucket()}/lake", storage=storage,
                        server="auto" if source == "s3auto" else None)


def silver_end(cfg: Path, source: str) -> str:
    """The source's silver decode watermark (its lake's Delta log, read without Spark)."""
    from slotlake import delta_log

    c = load_config(str(cfg))  # an s3a lake's endpoint (storage.configure)
    return str(delta_log.stage_end(LakePaths.of(c.lake, source).changes, "decode"))


def timed_sync(cfg: Path, source: str) -> tuple[float, str]:
    """One `slotlake sync` process: its wall time and its report line."""
    t = time.perf_counter()
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "slotlake"), "--config", str(cfg), "sync", source],
                         capture_output=True, text=True, check=False)
    secs = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"sync {source} failed:\n{out.stderr[-3000:]}")
    report = [x for x in out.stderr.splitlines() if f"sync {source}: archived" in x]
    return secs, report[-1].split(": ", 1)[-1] if report else "(no report line)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="idle and 1,000-change syncs of each (default 3)")
    ap.add_argument("--transactions", type=int, default=250,
                    help="pgbench transactions before each sync, 4 row changes each (default 250: 1,000 changes)")
    args = ap.parse_args()
    batch = f"{4 * args.transactions:,} changes"
    load_start = os.getloadavg()
    os.environ.update(TEST_CREDENTIALS)  # moto accepts any; the CLI and Spark processes inherit them
    runs: dict[str, dict[str, list[float]]] = {v: {"idle": [], batch: []} for v in VARIANTS}
    last: dict[str, str] = {}
    replays: dict[str, float] = {}
    how: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-s3-") as tmp, LocalPostgres() as pg, \
            contextlib.ExitStack() as stack:
        os.environ["SLOTLAKE_STATE_DIR"] = str(Path(tmp) / "state")  # the auto server's pid, address and log
        moto = MotoServer().start()
        stack.callback(moto.stop)
        dsn = pgbench_db(pg, 1)
        cfgs = {v: config_of(Path(tmp), dsn, v, moto) for v in VARIANTS}
        from slotlake.spark.auto_server import stop_server
        from slotlake.spark.submit import spark_app

        auto = load_config(str(cfgs["s3auto"]))
        stack.callback(stop_server, spark_app(auto, "s3auto", "sync"))
        for v, cfg in cfgs.items():
            secs, _ = timed_sync(cfg, v)
            print(f"{v}: first sync (slot + initial copy) {secs:.1f}s", flush=True)
        for i in range(args.repeat):
            pgbench(pg, "-n", "-c", "1", "-t", str(args.transactions))
            if i == args.repeat - 1:
                before = {v: silver_end(cfg, v) for v, cfg in cfgs.items()}
            for v, cfg in cfgs.items():
                secs, last[v] = timed_sync(cfg, v)
                runs[v][batch].append(secs)
            for v, cfg in cfgs.items():
                runs[v]["idle"].append(timed_sync(cfg, v)[0])
            print(f"round {i + 1}: " + ", ".join(f"{v} {runs[v][batch][-1]:.1f}s / idle "
                                                 f"{runs[v]['idle'][-1]:.1f}s" for v in VARIANTS), flush=True)
        # the last round's range replayed in place (the replay DAG's backfill of an interval), each variant its way
        for v, cfg in cfgs.items():
            frm, to = before[v], silver_end(cfg, v)
            t = time.perf_counter()
            out = subprocess.run([str(ROOT / ".venv" / "bin" / "slotlake"), "--config", str(cfg), "replay", v,
                                  "--from", frm, "--to", to], capture_output=True, text=True, check=False)
            replays[v] = time.perf_counter() - t
            if out.returncode != 0:
                raise SystemExit(f"replay {v} failed:\n{out.stderr[-3000:]}")
            how[v] = "in process" if "(in this process, " in out.stderr else "Spark app"
        for v, cfg in cfgs.items():
            c = load_config(str(cfg))  # an s3a lake's endpoint for delta-rs (storage.configure)
            paths = LakePaths.of(c.lake, v)
            for t in TABLES:
                assert_gold_equals_pg(paths.gold(*t.split(".")), dsn, t)
        print(f"gold == PostgreSQL: every table of the {len(VARIANTS)} lakes, row by row")
    print()
    print(f"{'variant':8} {'idle s (median)':>16} {batch + ' s (median)':>26}  every run")
    for v in VARIANTS:
        idle, small = runs[v]["idle"], runs[v][batch]
        print(f"{v:8} {statistics.median(idle):16.1f} {statistics.median(small):26.1f}  idle "
              f"{', '.join(f'{x:.1f}' for x in idle)}; {batch} {', '.join(f'{x:.1f}' for x in small)}"
              f" ({4 * args.transactions / statistics.median(small):,.0f} changes/s)")
    for v in VARIANTS:
        print(f"last sync of {batch} of {v}: {last.get(v)}")
    for v in VARIANTS:
        print(f"in-place replay of the last round's {batch} of {v}: {replays[v]:.1f}s ({how[v]}; "
              f"{4 * args.transactions / replays[v]:,.0f} changes/s)")
    end = os.getloadavg()
    print(f"load average (1/5/15 min): start {'/'.join(f'{x:.1f}' for x in load_start)}, "
          f"end {'/'.join(f'{x:.1f}' for x in end)} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
