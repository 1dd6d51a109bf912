"""The spark-submit entry points, one file per Spark app: `spark-submit <this folder>/<stage>.py --config F ...`.

They ship inside the package (so an installed slotlake can submit them) and all call `slotlake.spark_apps.apps.main`.
"""
