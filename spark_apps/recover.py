"""Spark app `recover` (see slotlake.spark.apps for what each app does).

    spark-submit spark_apps/recover.py --config F --source S --as-of P --tables a.b,c.d
        (--to-delta PATH | --to-postgres CONNINFO) [--into-schema S] [--replace] [--result FILE]

Prints the run summary; exits non-zero with one line on failure.
"""
import os
import sys

# spark-submit does not install the package: put plugins/ on the path (the same place Airflow uses).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins"))

from slotlake.spark.apps import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("recover"))
