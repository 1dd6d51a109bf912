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
import os as _os
import sys as _sys

from slotlake.lsn import Lsn

__all__ = ["Lsn"]

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
ARROW_POOL = "jemalloc"
"""The Arrow memory pool slotlake's processes allocate from, unless `ARROW_DEFAULT_MEMORY_POOL` names another.
pyarrow's default, mimalloc, returned and re-faulted the big buffers of a decode so often that the in-process
decode of a 310,000-change burst took 2.8-4.7 s (half of it system time) against 1.4-1.8 s with jemalloc or the
system allocator, and a lower peak RSS (bench/README.md, "The Arrow memory pool")."""


def _use_arrow_pool() -> None:
    """Make `ARROW_POOL` the default pool of this process and of the processes it starts (Spark's Python workers,
    `slotlake` children), the user's own `ARROW_DEFAULT_MEMORY_POOL` aside: through that variable, which Arrow reads
    when it first allocates, and through `pyarrow.set_memory_pool` when pyarrow is imported already (without
    importing it here: `import slotlake` stays cheap for DAG parsing). A pyarrow built without jemalloc keeps its
    own pool."""
    if _os.environ.get(ARROW_POOL_ENV):
        return
    _os.environ[ARROW_POOL_ENV] = ARROW_POOL
    pa = _sys.modules.get("pyarrow")
    if pa is not None:
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow built without jemalloc
            pass


_use_arrow_pool()
