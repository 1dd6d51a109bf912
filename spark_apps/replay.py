"""Spark app: replay one source's archived changes over an LSN/time range (see slotlake.replay).

    spark-submit spark_apps/replay.py --config F --source S --from X --to Y [--tables a.b,c.d] [--dest PATH]

Prints the run summary; exits non-zero with one line on failure.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

# spark-submit does not install the package: put plugins/ on the path (the same place Airflow uses).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))
# Python workers must run this interpreter (it has pyarrow and slotlake), not whatever python3 is on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from slotlake.config import load_config  # noqa: E402
from slotlake.errors import SlotlakeError  # noqa: E402
from slotlake.replay import request  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replay.py", description="re-decode an archived range and rebuild tables")
    parser.add_argument("--config", help="slotlake YAML (default: $SLOTLAKE_CONFIG)")
    parser.add_argument("--source", required=True)
    parser.add_argument("--from", dest="from_", required=True, help="LSN (16/B374D848) or ISO timestamp (UTC)")
    parser.add_argument("--to", required=True, help="LSN or ISO timestamp (UTC)")
    parser.add_argument("--tables", default="", help="comma-separated schema.table list (default: every table)")
    parser.add_argument("--dest", default="", help="write <dest>/<schema>/<table> instead of rebuilding in place")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from slotlake.spark.replay_job import run_replay
        from slotlake.spark.session import get_spark

        cfg = load_config(args.config)
        cfg.source(args.source)
        tables = [t for t in args.tables.split(",") if t.strip()] or None
        req = request(args.source, args.from_, args.to, tables, args.dest or None)
        spark = get_spark(f"slotlake-replay-{args.source}", cfg.spark.master, cfg.spark.conf)
        try:
            result = run_replay(spark, cfg, req)
        finally:
            spark.stop()
    except SlotlakeError as e:
        print(f"slotlake replay {args.source}: {e}", file=sys.stderr)
        return 1
    print(result.summary())
    for t in result.tables:
        print(f"  {t.schema_name}.{t.table_name}: {t.rows} rows from base {t.base_lsn} (gold version "
              f"{t.base_version}) -> {t.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
