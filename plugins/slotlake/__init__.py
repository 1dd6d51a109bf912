"""slotlake: keep a Delta Lake in sync with PostgreSQL through logical decoding.

Data flow (one module group per stage):
  source/   PostgreSQL I/O: connections, preflight, slot, extract into bronze
  bronze    the raw archive: immutable Parquet files named by LSN range
  decode/   pure pgoutput decoder and PostgreSQL -> Spark type mapping
  catalog   the multi-version catalog
  merge/    merge planning by replica identity
  spark/    the Spark side (session, decode and merge jobs)
  cli, airflow/   two thin front ends over the same functions
"""
from slotlake.lsn import Lsn

__all__ = ["Lsn"]
