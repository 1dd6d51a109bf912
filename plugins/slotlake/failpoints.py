"""Test-only failpoints: with `SLOTLAKE_FAILPOINT=<name>` a run stops at that point, so the tests can prove each
crash window of the stages (tests/integration/test_faults.py, test_history.py, test_extract.py, test_snapshot.py).
Unset, every check here is one environment lookup and nothing else.

    extract_after_write      source/extract.py    raises after placing a bronze file, before advancing the slot
    extract_after_files:N    source/extract.py    raises after N files were placed and the slot advanced past them
    snapshot_after_parts:N   source/snapshot.py   raises after N parts of a copy were recorded
    decode_after_catalog     decode/job.py  the process dies after the catalog and DDL log commits, before silver
    merge_after_history      merge/history_job.py dies after a table's history commit, before its gold commit
    merge_after_first_table  merge/job.py   dies after the first table's gold commit, before the others and _runs
"""
from __future__ import annotations

import os

ENV = "SLOTLAKE_FAILPOINT"
EXTRACT_AFTER_WRITE = "extract_after_write"
EXTRACT_AFTER_FILES = "extract_after_files:"
SNAPSHOT_AFTER_PARTS = "snapshot_after_parts:"
DECODE_AFTER_CATALOG = "decode_after_catalog"
MERGE_AFTER_HISTORY = "merge_after_history"
MERGE_AFTER_FIRST_TABLE = "merge_after_first_table"


def active(name: str) -> bool:
    return os.environ.get(ENV) == name


def die_at(name: str) -> None:
    """Exit the process at once, like a kill -9 (no cleanup, no finally blocks), when `name` is set."""
    if active(name):
        os._exit(137)


def count(prefix: str) -> int | None:
    """N of a `<prefix>N` failpoint, when that one is set."""
    value = os.environ.get(ENV, "")
    return int(value[len(prefix):]) if value.startswith(prefix) else None
