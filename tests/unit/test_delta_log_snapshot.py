"""`delta_log.snapshot`: a Delta table's live files replayed from its log without Spark (what merge/dv_merge.py
plans on). Real checkpoints (delta-rs's, of a table Spark wrote with deletion vectors) are read in
tests/integration/test_in_process_deletion_vectors.py; here the replay rules on hand-written JSON commits."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlake import delta_log

# hand-written logs (no data files): not tables for the suite's reader check
pytestmark = [pytest.mark.unit, pytest.mark.delta_readers(skip="hand-written Delta logs without data files")]

DV1 = {"storageType": "u", "pathOrInlineDv": "a5v9S<+l4!U4RE5]Goa&", "offset": 1, "sizeInBytes": 34, "cardinality": 2}
DV2 = {"storageType": "u", "pathOrInlineDv": "Q@1?dfpCmSO){Rp*k+q+", "offset": 1, "sizeInBytes": 36, "cardinality": 3}


def _commit(log: Path, version: int, *actions: dict) -> None:
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _add(path: str, dv: dict | None = None) -> dict:
    add = {"path": path, "partitionValues": {}, "size": 10, "modificationTime": 0, "dataChange": True,
           "stats": json.dumps({"numRecords": 5})}
    if dv:
        add["deletionVector"] = dv
    return {"add": add}


def _remove(path: str, dv: dict | None = None) -> dict:
    remove = {"path": path, "deletionTimestamp": 0, "dataChange": True}
    if dv:
        remove["deletionVector"] = dv
    return {"remove": remove}


PROTOCOL = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                         "writerFeatures": ["deletionVectors"]}}
META = {"metaData": {"id": "x", "format": {"provider": "parquet", "options": {}}, "schemaString": "{}",
                     "partitionColumns": [], "configuration": {"delta.enableDeletionVectors": "true"}}}


def test_a_file_given_a_new_vector_is_removed_and_added_in_one_commit(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    _commit(log, 0, {"commitInfo": {}}, PROTOCOL, META, _add("a.parquet"), _add("b.parquet"))
    # Spark writes the new add before the remove of the same path (with its old vector): removes apply first
    _commit(log, 1, {"commitInfo": {}}, _add("a.parquet", DV1), _remove("a.parquet"), _add("c.parquet"))
    _commit(log, 2, {"commitInfo": {}}, _add("a.parquet", DV2), _remove("a.parquet", DV1), _remove("b.parquet"))
    snap = delta_log.snapshot(str(tmp_path / "t"))
    assert snap is not None and snap.version == 2
    assert sorted(snap.files) == ["a.parquet", "c.parquet"]
    assert snap.files["a.parquet"]["deletionVector"] == DV2
    assert snap.protocol["readerFeatures"] == ["deletionVectors"]
    assert snap.metadata["configuration"] == {"delta.enableDeletionVectors": "true"}
    # as of an earlier version (a replay's base): the commits after it are not read
    at1 = delta_log.snapshot(str(tmp_path / "t"), 1)
    assert at1 is not None and at1.version == 1 and sorted(at1.files) == ["a.parquet", "b.parquet", "c.parquet"]
    assert at1.files["a.parquet"]["deletionVector"] == DV1
    assert delta_log.snapshot(str(tmp_path / "t"), 3) is None  # no such version


def test_what_it_cannot_replay_is_none(tmp_path):
    assert delta_log.snapshot(str(tmp_path / "none")) is None  # no table
    log = tmp_path / "t" / "_delta_log"
    _commit(log, 0, PROTOCOL, META, _add("a.parquet"))
    _commit(log, 2, _add("b.parquet"))
    assert delta_log.snapshot(str(tmp_path / "t")) is None  # version 1 is gone and there is no checkpoint
    _commit(log, 1, _add("c.parquet"))
    assert sorted(delta_log.snapshot(str(tmp_path / "t")).files) == ["a.parquet", "b.parquet", "c.parquet"]
    (log / f"{2:020d}.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json").write_text("{}")
    assert delta_log.snapshot(str(tmp_path / "t")) is None  # a v2 checkpoint: Spark reads it
    assert delta_log.table_properties(str(tmp_path / "t")) is None
