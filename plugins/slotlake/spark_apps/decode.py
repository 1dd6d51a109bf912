"""Spark app `decode` (see slotlake.spark_apps.apps for what each app does).

    spark-submit slotlake/spark_apps/decode.py --config F --source S

Prints the run summary; exits non-zero with one line on failure.
"""
import os
import sys

if __name__ == "__main__":
    # spark-submit runs this file as a script: put the folder holding the slotlake package first on the path
    # (plugins/ in a checkout, site-packages when installed), so `slotlake` is this file's own package.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from slotlake.spark_apps.apps import main

    sys.exit(main("decode"))
