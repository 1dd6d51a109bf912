"""The no-Spark decision of a sync (`slotlake.pending`): what is due given the lake's watermarks, and reading
table properties from a Delta log (JSON commits and a checkpoint) without Spark."""
from __future__ import annotations

import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slotlake import delta_log
from slotlake.lsn import Lsn
from slotlake.pending import LakeWatermarks, PendingWork, pending_work

pytestmark = pytest.mark.unit

L = Lsn
IDLE = LakeWatermarks(bronze_end=L(500), silver_end=L(500), silver_exists=True, catalog_end=L(500),
                      bootstrap_lsns=(L(100),), merged_end=L(500), unloaded_copies=())


@pytest.mark.parametrize("w,decode,merge", [
    (IDLE, None, None),
    (replace(IDLE, bronze_end=L(600)), "bronze holds changes up to 0/258, silver is at 0/1F4", None),
    (replace(IDLE, merged_end=L(400)), None, "silver is at 0/1F4, the last complete merge run at 0/190"),
    (replace(IDLE, merged_end=None), None, "silver is at 0/1F4, the last complete merge run at None"),
    (replace(IDLE, unloaded_copies=("public.a",)), None, "the initial copy of public.a is not loaded into gold yet"),
    (replace(IDLE, silver_end=None), "silver has no decode commit (its watermark is unknown)", None),
    # a new source: no bronze, no silver; the bootstrap read is in _catalog (or not yet)
    (replace(IDLE, bronze_end=None, silver_end=None, silver_exists=False, catalog_end=L(100), merged_end=None),
     None, None),
    (replace(IDLE, bronze_end=None, silver_end=None, silver_exists=False, catalog_end=None, merged_end=None),
     "the bootstrap catalog read at 0/64 is not in _catalog yet", None),
    # a resync's bootstrap read past silver's end, not in _catalog
    (replace(IDLE, bootstrap_lsns=(L(100), L(700))), "the bootstrap catalog read at 0/2BC is not in _catalog yet",
     None),
    (replace(IDLE, bootstrap_lsns=(L(100), L(700)), catalog_end=L(700)), None, None),
], ids=["idle", "bronze-ahead", "merge-died-halfway", "never-merged", "copy-not-loaded", "silver-unmarked",
        "new-source-idle", "new-source-catalog", "resync-bootstrap", "resync-bootstrap-done"])
def test_pending_work(w, decode, merge):
    p = pending_work(w)
    assert (p.decode, p.merge) == (decode, merge)
    assert p.idle == (decode is None and merge is None)
    assert PendingWork.from_dict(p.as_dict()) == p  # it travels through XCom


def test_describe_says_what_runs_and_why():
    assert pending_work(IDLE).describe() == ("decode and merge skipped: nothing new (bronze, silver, catalog and "
                                             "gold all at 0/1F4)")
    assert pending_work(replace(IDLE, merged_end=L(1))).describe().startswith("merge due: silver is at")
    assert pending_work(replace(IDLE, bronze_end=L(900))).describe().startswith("decode and merge due: bronze")


def _commit(log_dir, version: int, *actions: dict) -> None:
    (log_dir / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def _meta(conf: dict) -> dict:
    return {"metaData": {"id": "x", "format": {"provider": "parquet"}, "schemaString": "{}",
                         "partitionColumns": [], "configuration": conf}}


@pytest.mark.delta_readers(skip="hand-written _delta_log fragments (only the metaData actions), not a readable table")
def test_table_properties_from_json_commits_and_a_checkpoint(tmp_path):
    table = tmp_path / "gold"
    log_dir = table / "_delta_log"
    log_dir.mkdir(parents=True)
    assert delta_log.table_properties(str(tmp_path / "missing")) is None
    _commit(log_dir, 0, {"commitInfo": {"operation": "CREATE TABLE"}}, _meta({"a": "1"}))
    _commit(log_dir, 1, {"commitInfo": {"operation": "WRITE"}}, {"add": {"path": "p"}})
    assert delta_log.table_properties(str(table)) == {"a": "1"}
    _commit(log_dir, 2, {"commitInfo": {"operation": "SET TBLPROPERTIES"}}, _meta({"a": "2", "b": "x"}))
    assert delta_log.table_properties(str(table)) == {"a": "2", "b": "x"}
    # a checkpoint at version 3 (its configuration is a Parquet map), and the JSON before it cleaned up
    cp = pa.table({"metaData": pa.array([None, {"configuration": [("c", "3")]}],
                                        pa.struct([("configuration", pa.map_(pa.string(), pa.string()))]))})
    pq.write_table(cp, log_dir / f"{3:020d}.checkpoint.parquet")
    _commit(log_dir, 3, {"commitInfo": {"operation": "WRITE"}})
    for v in (0, 1, 2):
        (log_dir / f"{v:020d}.json").unlink()
    _commit(log_dir, 4, {"commitInfo": {"operation": "MERGE"}}, {"add": {"path": "q"}})
    assert delta_log.table_properties(str(table)) == {"c": "3"}
    _commit(log_dir, 5, {"commitInfo": {"operation": "SET TBLPROPERTIES"}}, _meta({"d": "5"}))
    assert delta_log.table_properties(str(table)) == {"d": "5"}
