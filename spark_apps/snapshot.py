"""Spark app: load the complete initial copies of one source (bronze/snapshot) into its gold tables.

    spark-submit spark_apps/snapshot.py --config slotlake.yaml --source shop [--tables public.orders]
    .venv/bin/python spark_apps/snapshot.py --config slotlake.yaml --source shop

Run it after the snapshot copy and before the merge. Loads nothing twice; exits non-zero with one line on failure.
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
from slotlake.spark.session import get_spark  # noqa: E402
from slotlake.spark.snapshot_job import load_snapshots  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="snapshot.py", description="bronze/snapshot copies -> gold")
    parser.add_argument("--config", help="slotlake YAML (default: $SLOTLAKE_CONFIG)")
    parser.add_argument("--source", required=True)
    parser.add_argument("--tables", help="comma-separated schema.table list (default: every table)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config)
        src = cfg.source(args.source)
        tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
        spark = get_spark(f"slotlake-snapshot-{src.name}", master=cfg.spark.master, extra=cfg.spark.conf)
        loads = load_snapshots(spark, cfg, src.name, tables)
    except SlotlakeError as e:
        print(f"slotlake snapshot: {e}", file=sys.stderr)
        return 1
    done = [x for x in loads if x.gold_version is not None]
    print(f"snapshot load {src.name}: {len(done)} table(s) loaded, {sum(x.rows for x in done)} rows"
          + "".join(f"; {x.table}: {x.rows} rows -> gold version {x.gold_version}" for x in done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
