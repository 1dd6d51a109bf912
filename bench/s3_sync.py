"""Benchmark: idle and ~1,000-change `slotlake sync` runs on an s3a lake (a real S3-compatible server, `moto_server`)
next to the same runs on a local lake, in one run.

    .venv/bin/python bench/s3_sync.py                 # 3 idle and 3 1,000-change syncs of each variant
    .venv/bin/python bench/s3_sync.py --repeat 5

Starts a throw-away PostgreSQL with `pgbench -i -s 1` (`pgbench_history` REPLICA IDENTITY FULL), a `moto_server`
(tests/s3server.py; dummy credentials in this process's environment only) and three sources on the database, each
with its own slot, publication, config and lake:
- `local`: a local lake, the default config (decode and merge of a small batch in the CLI's own process);
- `s3`: `lake: s3a://<bucket>/lake`, the default config (every non-idle sync spark-submits its Spark app);
- `s3auto`: the same on another bucket with `spark.server: auto` (the first run starts a Spark driver that later
  runs reuse; stopped at the end).
Each is synced once (slot + initial copy, timed, not counted); then, `--repeat` times: 250 tpcb-like pgbench
transactions (1,000 row changes over the 4 tables, into every slot), a sync of each, an idle sync of each. Every
sync is a whole `slotlake sync` process timed from outside; reported as the median and every run, with the
sync's own report line of the last run. At the end every gold table is compared with PostgreSQL row by row
(delta-rs, through the endpoint for the s3a lakes).
"""
from __future__ import annotations

import argparse
import contextlib
import json
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

from oracle import assert_gold_equals_pg  # noqa: E402
from s3server import TEST_CREDENTIALS, MotoServer  # noqa: E402
from slotlake.config import load_config  # noqa: E402
from slotlake.lake import LakePaths  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.pgbench import pgbench, pgbench_db  # noqa: E402

TABLES = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]
VARIANTS = ("local", "s3", "s3auto")


def write_config(tmp: Path, dsn: str, source: str, moto: MotoServer) -> Path:
    """`tmp/<source>.yaml`: the source with its own slot, publication and lake (JSON is YAML)."""
    spark: dict = {"master": "local[2]"}
    doc: dict = {"spark": spark, "sources": {source: {
        "dsn": dsn, "tables": TABLES, "slot": f"slotlake_{source}", "publication": f"slotlake_{source}"}}}
    if source == "local":
        doc["lake"] = str(tmp / source / "lake")
    else:
        doc["lake"] = f"s3a://{moto.new_bucket()}/lake"
        doc["storage"] = {"endpoint": moto.endpoint, "region": "us-east-1", "path_style": True}
    if source == "s3auto":
        spark["server"] = "auto"
    cfg = tmp / f"{source}.yaml"
    cfg.write_text(json.dumps(doc))
    return cfg


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
    args = ap.parse_args()
    load_start = os.getloadavg()
    os.environ.update(TEST_CREDENTIALS)  # moto accepts any; the CLI and Spark processes inherit them
    runs: dict[str, dict[str, list[float]]] = {v: {"idle": [], "1,000 changes": []} for v in VARIANTS}
    last: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-s3-") as tmp, LocalPostgres() as pg, \
            contextlib.ExitStack() as stack:
        os.environ["SLOTLAKE_STATE_DIR"] = str(Path(tmp) / "state")  # the auto server's pid, address and log
        moto = MotoServer().start()
        stack.callback(moto.stop)
        dsn = pgbench_db(pg, 1)
        cfgs = {v: write_config(Path(tmp), dsn, v, moto) for v in VARIANTS}
        from slotlake.spark.auto_server import stop_server
        from slotlake.spark.submit import spark_app

        auto = load_config(str(cfgs["s3auto"]))
        stack.callback(stop_server, spark_app(auto, "s3auto", "sync"))
        for v, cfg in cfgs.items():
            secs, _ = timed_sync(cfg, v)
            print(f"{v}: first sync (slot + initial copy) {secs:.1f}s", flush=True)
        for i in range(args.repeat):
            pgbench(pg, "-n", "-c", "1", "-t", "250")
            for v, cfg in cfgs.items():
                secs, last[v] = timed_sync(cfg, v)
                runs[v]["1,000 changes"].append(secs)
            for v, cfg in cfgs.items():
                runs[v]["idle"].append(timed_sync(cfg, v)[0])
            print(f"round {i + 1}: " + ", ".join(f"{v} {runs[v]['1,000 changes'][-1]:.1f}s / idle "
                                                 f"{runs[v]['idle'][-1]:.1f}s" for v in VARIANTS), flush=True)
        for v, cfg in cfgs.items():
            c = load_config(str(cfg))  # an s3a lake's endpoint for delta-rs (storage.configure)
            paths = LakePaths.of(c.lake, v)
            for t in TABLES:
                assert_gold_equals_pg(paths.gold(*t.split(".")), dsn, t)
        print("gold == PostgreSQL: every table of the three lakes, row by row")
    print()
    print(f"{'variant':8} {'idle s (median)':>16} {'1,000-change s (median)':>24}  every run")
    for v in VARIANTS:
        idle, small = runs[v]["idle"], runs[v]["1,000 changes"]
        print(f"{v:8} {statistics.median(idle):16.1f} {statistics.median(small):24.1f}  idle "
              f"{', '.join(f'{x:.1f}' for x in idle)}; 1,000 {', '.join(f'{x:.1f}' for x in small)}")
    for v in VARIANTS:
        print(f"last 1,000-change sync of {v}: {last.get(v)}")
    end = os.getloadavg()
    print(f"load average (1/5/15 min): start {'/'.join(f'{x:.1f}' for x in load_start)}, "
          f"end {'/'.join(f'{x:.1f}' for x in end)} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
