"""Spark app: decode new bronze files of one source into silver/changes and _catalog.

    spark-submit spark_apps/decode.py --config F --source S
    .venv/bin/python spark_apps/decode.py --config F --source S
"""
from __future__ import annotations

import os
import sys

# The slotlake package lives in plugins/ (as for Airflow); with --py-files it is already importable.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins"))

# Python workers must run this interpreter (it has pyarrow and slotlake), not whatever python3 is on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import argparse  # noqa: E402
import logging  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from slotlake.config import load_config
    from slotlake.errors import SlotlakeError
    from slotlake.spark.decode_job import run_decode
    from slotlake.spark.session import get_spark

    parser = argparse.ArgumentParser(description="decode bronze -> silver/changes + _catalog")
    parser.add_argument("--config", default=None, help="config YAML (default: $SLOTLAKE_CONFIG)")
    parser.add_argument("--source", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        cfg.source(args.source)
        spark = get_spark(f"slotlake-decode-{args.source}", cfg.spark.master, cfg.spark.conf)
        try:
            result = run_decode(spark, cfg, args.source)
        finally:
            spark.stop()
    except SlotlakeError as e:
        print(f"slotlake decode {args.source}: {e}", file=sys.stderr)
        return 1
    print(f"decoded {result.files_decoded} bronze files, {result.changes_written} changes, "
          f"{result.catalog_versions_added} new catalog versions, {result.ddl_events} DDL events; "
          f"silver at {result.end_lsn}")
    for w in result.warnings:
        print(f"warning: {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
