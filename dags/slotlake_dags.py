"""slotlake's Airflow DAGs: one set per source of the config named by $SLOTLAKE_CONFIG.

Kept thin and cheap to parse: it reads the YAML config and builds DAG objects; no database, no Spark.
"""
import logging
import os

log = logging.getLogger(__name__)

if os.environ.get("SLOTLAKE_CONFIG"):
    from slotlake.airflow.dag_factory import build_dags
    from slotlake.config import load_config

    globals().update(build_dags(load_config()))
else:
    log.warning("SLOTLAKE_CONFIG is not set: no slotlake DAGs (point it at your slotlake.yaml)")
