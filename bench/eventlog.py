"""Where a Spark app's time went, from its event log (`bench/e2e.py --event-log DIR`, `spark.eventLog.enabled`).

    .venv/bin/python bench/eventlog.py DIR/eventlog_v2_local-*/events_1_*       # every SQL query of 0.3 s or more
    .venv/bin/python bench/eventlog.py FILE --min 1 --stages 13                  # and the stages of query 13

Per SQL query (execution id): its start after the app's first query, wall seconds, the task seconds of its jobs
(executor run time: on 2 cores up to twice the wall), their CPU seconds in the JVM (a Python worker's time is run
time, not JVM CPU) and Spark's description. With `--stages ID`, that query's stages: tasks, run and CPU seconds,
GC, shuffle written/read, input records and output records. Reads plain or zstd-compressed (Spark's default) logs.
"""
from __future__ import annotations

import argparse
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path


def events(path: Path) -> Iterator[dict]:
    raw = path.open("rb")
    if path.name.endswith(".zstd"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(raw)
    with io.TextIOWrapper(raw, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path, help="an event log file (events_<n>_<app>[.zstd])")
    ap.add_argument("--min", type=float, default=0.3, help="show queries of at least this many wall or task s")
    ap.add_argument("--stages", type=int, metavar="ID", help="also list the stages of this query")
    args = ap.parse_args()

    queries: dict[int, list] = {}  # id -> [start ms, end ms, description]
    query_of_stage: dict[int, int | None] = {}
    stage_name: dict[int, str] = {}
    task_s: dict[int | None, float] = defaultdict(float)
    cpu_s: dict[int | None, float] = defaultdict(float)
    stages: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events(args.file):
        kind = e["Event"]
        if kind.endswith("SQLExecutionStart"):
            queries[e["executionId"]] = [e["time"], None, e.get("description", "")[:100]]
        elif kind.endswith("SQLExecutionEnd") and e["executionId"] in queries:
            queries[e["executionId"]][1] = e["time"]
        elif kind == "SparkListenerJobStart":
            xid = e.get("Properties", {}).get("spark.sql.execution.id")
            for s in e["Stage Infos"]:
                query_of_stage[s["Stage ID"]] = int(xid) if xid is not None else None
                stage_name[s["Stage ID"]] = s["Stage Name"][:60]
        elif kind == "SparkListenerTaskEnd":
            stage = e["Stage ID"]
            q = query_of_stage.get(stage)
            m = e.get("Task Metrics") or {}
            run, cpu = m.get("Executor Run Time", 0) / 1000, m.get("Executor CPU Time", 0) / 1e9
            task_s[q] += run
            cpu_s[q] += cpu
            if args.stages is not None and q == args.stages:
                st = stages[stage]
                shuffle_w, shuffle_r = m.get("Shuffle Write Metrics", {}), m.get("Shuffle Read Metrics", {})
                st["tasks"] += 1
                st["run s"] += run
                st["cpu s"] += cpu
                st["gc s"] += m.get("JVM GC Time", 0) / 1000
                st["shuffle MB written"] += shuffle_w.get("Shuffle Bytes Written", 0) / 1e6
                read = shuffle_r.get("Remote Bytes Read", 0) + shuffle_r.get("Local Bytes Read", 0)
                st["shuffle MB read"] += read / 1e6
                st["input records"] += m.get("Input Metrics", {}).get("Records Read", 0)
                st["output records"] += m.get("Output Metrics", {}).get("Records Written", 0)
    first = min((q[0] for q in queries.values()), default=0)
    print(f"{'query':>5} {'start s':>8} {'wall s':>7} {'task s':>7} {'cpu s':>6}  description")
    for q, (start, end, desc) in sorted(queries.items()):
        wall = ((end or start) - start) / 1000
        if wall >= args.min or task_s[q] >= args.min:
            print(f"{q:5d} {(start - first) / 1000:8.1f} {wall:7.1f} {task_s[q]:7.1f} {cpu_s[q]:6.1f}  {desc}")
    print(f"task s in all queries: {sum(task_s.values()):.1f} (outside any query: {task_s[None]:.1f})")
    for stage, st in sorted(stages.items()):
        print(f"stage {stage} ({stage_name.get(stage, '')}): " + ", ".join(f"{k} {v:,.1f}" for k, v in st.items()))


if __name__ == "__main__":
    main()
