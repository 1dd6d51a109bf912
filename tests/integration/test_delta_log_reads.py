"""The merge and decode read table metadata of a local lake from the Delta log itself (no Spark job): the version,
the watermark, the schema at a version, the properties, the newest commit's metrics. Each must say exactly what
Spark's Delta reader says for the same table, including commits slotlake did not make (OPTIMIZE, free-text
userMetadata), a schema change and a table property set later."""
from __future__ import annotations

import json

import pytest

from slotlake import delta_log
from slotlake.lsn import Lsn
from slotlake.merge import job as merge_job
from slotlake.merge import watermarks

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _spark_state(spark, path: str) -> watermarks.DeltaState:
    """`delta_state` answered by Spark alone (the path the code takes for lakes on object stores)."""
    from delta.tables import DeltaTable

    from slotlake.merge.plan import newest_watermark

    rows = [(r["version"], r["userMetadata"]) for r in DeltaTable.forPath(spark, path).history().collect()]
    newest = newest_watermark(rows)
    return watermarks.DeltaState(max(v for v, _ in rows), newest[1] if newest else None,
                                newest[0] if newest else None)


def test_log_reads_equal_spark(spark, tmp_path):
    from delta.tables import DeltaTable
    from pyspark.sql.types import StructType

    path = str(tmp_path / "t")
    assert watermarks._local_delta_state(path) == watermarks.DeltaState(None, None)

    def write(df, mode: str, meta: str | None, **opts) -> None:
        w = df.write.format("delta").mode(mode)
        if meta is not None:
            w = w.option("userMetadata", meta)
        for k, v in opts.items():
            w = w.option(k, v)
        w.save(path)

    write(spark.createDataFrame([(1, "a")], "id int, v string"), "append", None)
    assert watermarks._local_delta_state(path) == _spark_state(spark, path) == watermarks.DeltaState(0, None, None)
    write(spark.createDataFrame([(2, "b")], "id int, v string"), "append",
          json.dumps({"slotlake": {"end_lsn": "0/16B3748", "stage": "merge"}}))
    write(spark.createDataFrame([(3, "c", 1.5)], "id int, v string, x double"), "append", "someone's note",
          mergeSchema="true")
    spark.sql(f"OPTIMIZE delta.`{path}`")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('slotlake.test' = 'yes')")
    local = watermarks._local_delta_state(path)
    assert local == _spark_state(spark, path)
    assert local.watermark == Lsn.parse("0/16B3748") and local.marked_version == 1 and local.version == 4

    for version in range(5):
        want = spark.read.format("delta").option("versionAsOf", version).load(path).schema
        got = StructType.fromJson(delta_log.schema_at(path, version))
        assert [(f.name, f.dataType) for f in got.fields] == [(f.name, f.dataType) for f in want.fields], version

    props = DeltaTable.forPath(spark, path).detail().select("properties").collect()[0][0]
    assert delta_log.table_properties(path) == dict(props) and props["slotlake.test"] == "yes"

    # The newest commit's metrics as `_last_commit` reports them (the merge's row counts come from there).
    write(spark.createDataFrame([(4, "d", 2.5), (5, "e", None)], "id int, v string, x double"), "append", None)
    row = DeltaTable.forPath(spark, path).history(1).collect()[0]
    version, metrics = merge_job._last_commit(spark, path)
    assert version == row["version"] == 5
    assert metrics["numOutputRows"] == row["operationMetrics"]["numOutputRows"] == "2"

    # Gold's size as the merge weighs a batch against it (`_gold_bytes`): what DESCRIBE DETAIL says, read with
    # delta-rs; also after a DELETE removed files and an OPTIMIZE replaced them.
    def spark_bytes() -> int:
        return int(DeltaTable.forPath(spark, path).detail().select("sizeInBytes").first()[0])

    assert watermarks.table_bytes(path) == spark_bytes() > 0
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id >= 4")
    spark.sql(f"OPTIMIZE delta.`{path}`")
    assert watermarks.table_bytes(path) == merge_job._gold_bytes(spark, path) == spark_bytes() > 0
    assert watermarks.table_bytes(str(tmp_path / "none")) is None  # no table: the caller asks Spark
