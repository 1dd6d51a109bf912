"""slotlake.contracts: the lake tables' schemas and the commit metadata record, declared once; and the failpoints."""
from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest

from slotlake import contracts, failpoints
from slotlake.contracts import CommitMeta
from slotlake.decode.decoded import decoded_schema, row_of
from slotlake.decode.frames import SilverChange
from slotlake.lsn import Lsn

pytestmark = pytest.mark.unit


def test_arrow_types_follow_spark_types():
    assert contracts.arrow_type("long") == pa.int64()
    assert contracts.arrow_type("int") == pa.int32()
    assert contracts.arrow_type("timestamp") == pa.timestamp("us", tz="UTC")
    assert contracts.arrow_type("array<string>") == pa.list_(pa.string())
    assert contracts.arrow_type("map<string,string>") == pa.map_(pa.string(), pa.string())
    assert contracts.arrow_type("struct<a:int, b:array<boolean>>") == pa.struct(
        [pa.field("a", pa.int32()), pa.field("b", pa.list_(pa.bool_()))])
    assert contracts.arrow_type("decimal(10,2)") == pa.decimal128(10, 2)
    assert contracts.arrow_type("map<string,decimal(38,18)>") == pa.map_(pa.string(), pa.decimal128(38, 18))
    assert contracts.arrow_type("timestamp_ntz") == pa.timestamp("us")
    with pytest.raises(ValueError, match="add it to slotlake.contracts"):
        contracts.arrow_type("void")


def test_every_lake_table_contract_converts_to_arrow_and_ddl():
    for cols in (contracts.BRONZE, contracts.SILVER, contracts.DECODED, contracts.CATALOG, contracts.DDL_LOG,
                 contracts.QUARANTINE, contracts.RUNS):
        schema = contracts.arrow_schema(cols)
        assert schema.names == contracts.names(cols)
        assert len(set(schema.names)) == len(schema.names)
        assert contracts.ddl(cols).split(", ")[0] == f"{cols[0][0]} {cols[0][1]}"


def test_decoded_rows_are_silver_plus_kind_and_content():
    schema = decoded_schema()
    assert schema.names == ["kind", *contracts.names(contracts.SILVER), "content"]
    assert schema.field("commit_ts").type == pa.timestamp("us", tz="UTC")
    assert schema.field("unchanged").type == pa.list_(pa.int32())
    # The decoder's record carries silver's columns in silver's order (commit_end_lsn is filled in later).
    fields = [f.name.replace("commit_ts_us", "commit_ts") for f in dataclasses.fields(SilverChange)]
    assert fields == [n for n in contracts.names(contracts.SILVER) if n != "commit_end_lsn"]
    change = SilverChange(commit_lsn=1, commit_ts_us=2, xid=3, seq=4, lsn=5, rel_oid=6, schema_name="s",
                          table_name="t", op="I", replica_identity="d", columns=("a",), key_columns=("a",),
                          type_oids=(23,), typmods=(-1,), old_kind=None, old=None, new=("1",), unchanged=(),
                          truncate_options=None, bronze_file="f")
    pa.RecordBatch.from_pylist([dict(zip(schema.names, row_of(change)))], schema=schema)  # fits the schema


def test_commit_meta_round_trip_and_wire_format():
    meta = CommitMeta("merge", Lsn.parse("16/B374D848"))
    assert meta.json() == '{"slotlake":{"end_lsn":"16/B374D848","stage":"merge"}}'
    assert CommitMeta.parse(meta.json()) == meta
    extra = CommitMeta("history", Lsn(5), {"history_from": "0/5"})
    assert json.loads(extra.json()) == {"slotlake": {"end_lsn": "0/5", "stage": "history", "history_from": "0/5"}}
    assert CommitMeta.parse(extra.json()).get("history_from") == "0/5"
    no_end = CommitMeta("recover", None, {"source": "shop"})
    assert json.loads(no_end.json()) == {"slotlake": {"stage": "recover", "source": "shop"}}
    assert CommitMeta.parse(no_end.json()) == no_end


@pytest.mark.parametrize("text", [None, "", "free text", "[1]", '{"other": {}}', '{"slotlake": 3}'])
def test_commit_meta_ignores_what_is_not_ours(text):
    assert CommitMeta.parse(text) is None


def test_commit_meta_with_a_bad_end_lsn_has_no_watermark():
    meta = CommitMeta.parse('{"slotlake": {"end_lsn": "bogus", "stage": "merge"}}')
    assert meta is not None and meta.stage == "merge" and meta.end_lsn is None


def test_failpoints(monkeypatch):
    monkeypatch.delenv(failpoints.ENV, raising=False)
    assert not failpoints.active(failpoints.EXTRACT_AFTER_WRITE)
    assert failpoints.count(failpoints.SNAPSHOT_AFTER_PARTS) is None
    failpoints.die_at(failpoints.MERGE_AFTER_HISTORY)  # unset: returns
    monkeypatch.setenv(failpoints.ENV, "snapshot_after_parts:3")
    assert failpoints.count(failpoints.SNAPSHOT_AFTER_PARTS) == 3
    assert not failpoints.active(failpoints.EXTRACT_AFTER_WRITE)
    monkeypatch.setenv(failpoints.ENV, failpoints.EXTRACT_AFTER_WRITE)
    assert failpoints.active(failpoints.EXTRACT_AFTER_WRITE)


def test_a_die_at_failpoint_ends_the_process_like_a_kill(tmp_path):
    import os
    import subprocess
    import sys

    code = ("from slotlake import failpoints\nimport pathlib, sys\n"
            "try:\n    failpoints.die_at(failpoints.MERGE_AFTER_FIRST_TABLE)\n"
            "finally:\n    pathlib.Path(sys.argv[1]).write_text('cleanup ran')\n")
    env = {**os.environ, failpoints.ENV: failpoints.MERGE_AFTER_FIRST_TABLE}
    marker = tmp_path / "marker"
    out = subprocess.run([sys.executable, "-c", code, str(marker)], env=env, capture_output=True, text=True)
    assert out.returncode == 137, out.stderr
    assert not marker.exists()  # no finally block ran: as a kill -9
    env[failpoints.ENV] = failpoints.MERGE_AFTER_HISTORY
    assert subprocess.run([sys.executable, "-c", code, str(marker)], env=env).returncode == 0
    assert marker.read_text() == "cleanup ran"
