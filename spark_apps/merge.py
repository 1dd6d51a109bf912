"""Spark app: merge silver/changes into the gold tables of one source.

    spark-submit spark_apps/merge.py --config slotlake.yaml --source shop [--tables public.orders,public.items]
    .venv/bin/python spark_apps/merge.py --config slotlake.yaml --source shop

Prints the run summary; exits non-zero with one line on failure.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

# spark-submit does not install the package: put plugins/ on the path (the same place Airflow uses).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))

from slotlake.config import load_config  # noqa: E402
from slotlake.errors import SlotlakeError  # noqa: E402
from slotlake.merge.plan import parse_tables  # noqa: E402
from slotlake.spark.merge_job import run_merge  # noqa: E402
from slotlake.spark.session import get_spark  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="merge.py", description="silver/changes -> gold, by replica identity")
    parser.add_argument("--config", help="slotlake YAML (default: $SLOTLAKE_CONFIG)")
    parser.add_argument("--source", required=True)
    parser.add_argument("--tables", help="comma-separated schema.table list (default: every table)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        src = cfg.source(args.source)
        tables = parse_tables(args.tables)
        spark = get_spark(f"slotlake-merge-{src.name}", master=cfg.spark.master, extra=cfg.spark.conf)
        report = run_merge(spark, cfg, src.name, tables)
    except SlotlakeError as e:
        print(f"slotlake merge: {e}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
