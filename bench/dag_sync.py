"""Benchmark: the scheduled sync as Airflow runs it, `airflow dags test slotlake_sync__<source>`, idle and with
~1,000 row changes, with the DAG's `in_process` task (the default) next to the same DAG leaving everything to its
Spark tasks (`spark.in_process_bytes: 0`, what every run did before the `in_process` task), in one run.

    .venv/bin/python bench/dag_sync.py               # 3 idle and 3 1,000-change runs of each
    .venv/bin/python bench/dag_sync.py --repeat 5

Starts a throw-away PostgreSQL with `pgbench -i -s 1` (`pgbench_history` REPLICA IDENTITY FULL) and two sources
on it, `here` and `spark`, each with its own slot, lake, config and Airflow home (SQLite metadata DB, migrated
once). Each is synced once by its DAG (slot + initial copy, untimed); then, `--repeat` times: an idle DAG run of
each, 250 tpcb-like pgbench transactions (1,000 row changes over the 4 tables, into both slots), a DAG run of
each. Every run is a whole `airflow dags test` process (interpreter, Airflow start, DAG parse, every task; the
Spark tasks spark-submit with this venv's Spark), timed from outside; reported as the median and every run. At
the end every gold table of both lakes is compared with PostgreSQL row by row (delta-rs).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support
sys.path.append(str(ROOT / "tests"))  # oracle.py

from variants import VARIANTS, write_config  # noqa: E402

from oracle import assert_gold_equals_pg  # noqa: E402
from slotlake_dev.airflow_local import dags_test, local_airflow_env, migrate  # noqa: E402
from slotlake_dev.localpg import LocalPostgres  # noqa: E402
from slotlake_dev.pgbench import pgbench, pgbench_db  # noqa: E402

TABLES = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]


def setup(tmp: Path, dsn: str, source: str, in_process_bytes: int | None) -> dict[str, str]:
    """The source's config (its own lake and slot) and Airflow home; returns the environment of its DAG runs."""
    cfg = write_config(tmp, dsn, source, TABLES, in_process_bytes)
    env = local_airflow_env(tmp / source / "airflow", cfg)
    env.pop("SLOTLAKE_SPARK_SERVER", None)  # a deployment without a Spark server: spark-submit
    migrate(env)
    return env


def timed_run(env: dict[str, str], source: str) -> float:
    t = time.perf_counter()
    out = dags_test(env, f"slotlake_sync__{source}")
    assert f"sync {source}: archived" in out, f"no report line in the {source} run"
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="idle and 1,000-change DAG runs of each (default 3)")
    args = ap.parse_args()
    load_start = os.getloadavg()
    runs: dict[str, dict[str, list[float]]] = {s: {"idle": [], "1,000 changes": []} for s in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="slotlake-bench-dag-") as tmp, LocalPostgres() as pg:
        dsn = pgbench_db(pg, 1)
        envs = {s: setup(Path(tmp), dsn, s, b) for s, b in VARIANTS.items()}
        first = {s: timed_run(env, s) for s, env in envs.items()}  # slot + initial copy
        for _ in range(args.repeat):
            for s, env in envs.items():
                runs[s]["idle"].append(timed_run(env, s))
            pgbench(pg, "-n", "-b", "tpcb-like", "-c", "1", "-t", "250")  # 4 row changes each: into both slots
            for s, env in envs.items():
                runs[s]["1,000 changes"].append(timed_run(env, s))
        load_end = os.getloadavg()
        print(f"\n{'DAG run':<16} {'variant':<40} {'median s':>9}   runs")
        for kind in ("idle", "1,000 changes"):
            for s, b in VARIANTS.items():
                label = "in_process task (default)" if b is None else "Spark tasks only (in_process_bytes: 0)"
                xs = runs[s][kind]
                print(f"{kind:<16} {label:<40} {statistics.median(xs):>9.1f}   " + ", ".join(f"{x:.1f}" for x in xs))
        print("first run (slot + initial copy, Spark): " + ", ".join(f"{s} {x:.1f} s" for s, x in first.items()))
        print("load average (1/5/15 min): start " + "/".join(f"{x:.1f}" for x in load_start)
              + ", end " + "/".join(f"{x:.1f}" for x in load_end) + f" on {os.cpu_count()} CPUs", flush=True)
        for s in VARIANTS:
            for t in TABLES:
                schema, name = t.split(".")
                n = assert_gold_equals_pg(str(Path(tmp) / s / "lake" / s / "gold" / schema / name), dsn, t)
                print(f"gold == PostgreSQL ({s}): {t}: {n} rows equal")


if __name__ == "__main__":
    main()
