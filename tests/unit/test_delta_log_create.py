"""`delta_log.create_empty`: the empty `_quarantine` and `_runs` tables both merges create without Spark. Spark reads
the tables it creates after every merge test that makes one (tests/integration/test_merge_job.py, the suite's
delta-rs/Spark reader check); here the table's log, schema and protocol, and that an existing table is left alone."""
from __future__ import annotations

import json

import deltalake
import pyarrow as pa
import pytest

from slotlake import contracts, delta_log

pytestmark = [pytest.mark.unit,
              pytest.mark.delta_readers(skip="empty tables; Spark reads the ones merges create in test_merge_job.py")]


def _actions(path, version: int) -> dict:
    lines = (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return {k: v for line in lines for k, v in json.loads(line).items()}


@pytest.mark.parametrize("columns", [contracts.QUARANTINE, contracts.RUNS], ids=["quarantine", "runs"])
def test_an_empty_table_of_the_contract_columns_with_spark_s_protocol(tmp_path, columns):
    path = tmp_path / "t"
    delta_log.create_empty(str(path), columns)
    table = deltalake.DeltaTable(str(path))
    assert table.version() == 0
    assert pa.schema(table.schema().to_arrow()).names == [n for n, _ in columns]
    assert table.to_pyarrow_table().num_rows == 0
    assert _actions(path, 0)["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert delta_log.table_properties(str(path)) == {}


def test_an_existing_table_is_left_as_it_is(tmp_path):
    path = tmp_path / "runs"
    schema = contracts.arrow_schema(contracts.RUNS)
    deltalake.write_deltalake(str(path), pa.Table.from_pylist([{"run_end_lsn": 7}], schema=schema))
    delta_log.create_empty(str(path), contracts.RUNS)
    delta_log.create_empty(str(path), contracts.QUARANTINE)  # another schema: still nothing written
    table = deltalake.DeltaTable(str(path))
    assert table.version() == 0
    assert table.to_pyarrow_table().column("run_end_lsn").to_pylist() == [7]
