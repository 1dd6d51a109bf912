"""Which Delta table features the pinned `deltalake` (delta-rs) reads: each table is made with Spark + Delta (the
jars in .jars), then read with `deltalake.DeltaTable(path).to_pyarrow_table()` and compared with Spark's read.

    PYTHONPATH=plugins .venv/bin/python scripts/delta_rs_features.py [WORKDIR]

Prints one line per feature: ok (same rows and schema), WRONG (read, but different rows or schema) or REFUSED.
Results with Delta 4.4.0 and deltalake 1.6.6 are in the README ("Schema changes").
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "tests")]

from delta_readers import assert_delta_readers_agree, protocol  # noqa: E402
from slotlake.spark.session import get_spark  # noqa: E402

COLS = "(id int, a int, f float, n decimal(10,2), s string)"
ROWS = "(1, 10, 1.5, 1.25, 'x'), (2, 20, 2.5, 2.50, 'y'), (3, 30, 3.5, 3.75, 'z')"


def main(work: Path) -> None:
    spark = get_spark("delta-rs-features", "local[1]", {"spark.sql.shuffle.partitions": "1"})

    def table(path: Path, props: str = "") -> str:
        ref = f"delta.`{path}`"
        spark.sql(f"CREATE TABLE {ref} {COLS} USING delta {props}")
        spark.sql(f"INSERT INTO {ref} VALUES {ROWS}")
        return ref

    def plain(p: Path) -> None:
        table(p)

    def type_widening(p: Path) -> None:
        ref = table(p, "TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        spark.sql(f"ALTER TABLE {ref} ALTER COLUMN a TYPE bigint")

    def column_mapping_rename(p: Path) -> None:
        ref = table(p)
        spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')")
        spark.sql(f"ALTER TABLE {ref} RENAME COLUMN a TO a2")
        spark.sql(f"ALTER TABLE {ref} ADD COLUMNS (c string)")
        spark.sql(f"INSERT INTO {ref} VALUES (4, 40, 4.5, 4.0, 'w', 'c4')")

    def column_mapping_only(p: Path) -> None:
        table(p, "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')")

    def deletion_vectors(p: Path) -> None:
        ref = table(p, "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        spark.sql(f"DELETE FROM {ref} WHERE id = 2")

    def timestamp_ntz(p: Path) -> None:
        spark.sql(f"CREATE TABLE delta.`{p}` (id int, t timestamp_ntz) USING delta")
        spark.sql(f"INSERT INTO delta.`{p}` VALUES (1, timestamp_ntz'2020-01-01 10:00:00')")

    def checkpoint(policy: str):
        def make(p: Path) -> None:
            ref = table(p, f"TBLPROPERTIES ('delta.checkpointPolicy' = '{policy}', 'delta.checkpointInterval' = '2')")
            for i in range(3):
                spark.sql(f"INSERT INTO {ref} VALUES ({10 + i}, 1, 1.0, 1.0, 'q')")
        return make

    def in_commit_timestamps(p: Path) -> None:
        table(p, "TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true')")

    def row_tracking(p: Path) -> None:
        table(p, "TBLPROPERTIES ('delta.enableRowTracking' = 'true')")

    cases = {"plain": plain, "typeWidening": type_widening, "columnMapping (no rename)": column_mapping_only,
             "columnMapping + rename/add": column_mapping_rename, "deletionVectors": deletion_vectors,
             "timestampNtz": timestamp_ntz, "classic checkpoint": checkpoint("classic"),
             "v2Checkpoint": checkpoint("v2"), "inCommitTimestamp": in_commit_timestamps,
             "rowTracking": row_tracking}
    for n, (name, make) in enumerate(cases.items()):
        path = work / f"t{n}"
        make(path)
        try:
            assert_delta_readers_agree(spark, path)
            verdict = "ok"
        except AssertionError as e:
            verdict = ("REFUSED: " if "cannot read" in str(e) else "WRONG: ") + " ".join(str(e).split())[:160]
        print(f"{name:28} {verdict}  protocol={protocol(path)}")


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="delta-rs-features-"))
    try:
        main(where)
    finally:
        if len(sys.argv) <= 1:
            shutil.rmtree(where, ignore_errors=True)
