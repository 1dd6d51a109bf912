"""Every Delta table slotlake writes must read the same through delta-rs (`deltalake`) as through Spark.

`assert_delta_readers_agree(spark, path)` reads the table with `deltalake.DeltaTable(path).to_pyarrow_table()` and
with Spark (`toArrow()`), and compares the column names and types (Arrow types mapped to one name per logical
type: string/large_string/string_view are all `string`, a timestamp with any zone is `timestamp[us, tz]`) and the
rows as multisets (duplicates count). A table delta-rs refuses (a reader feature it lacks, such as `typeWidening`
or `deletionVectors`) fails with the table's protocol in the message.

`delta_tables(root)` finds the tables under a folder (every directory holding a `_delta_log` with a commit);
tests/conftest.py runs the check on every table under each test's `tmp_path` (marker `delta_readers`), and a
lake a module shares gets it at its fixture's end (`assert_all_readers_agree`). The oracle (tests/oracle.py)
reads gold with delta-rs; this check is where Spark reads the same tables.
An s3a:// lake: delta-rs opens each table with `slotlake.storage.delta_rs_table_args` (the configured endpoint),
Spark through s3a. A Spark session gets the S3 jars only when it starts, so `check_bucket(config, prefix)` runs
the check in a new process (`python tests/delta_readers.py --config F s3a://bucket/prefix`) with a Spark session
made for that lake.
"""
from __future__ import annotations

import collections
import datetime as dt
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

_DATA_SUFFIXES = (".parquet", ".json", ".crc", ".checkpoint")


def delta_tables_s3(root: str) -> list[str]:
    """Delta tables under an s3a:// folder (a prefix holding `_delta_log/` with a commit or checkpoint)."""
    from slotlake import storage

    files = storage.files_for(root)
    names = files.list_names(root)
    if "_delta_log" in names:
        log = storage.join(root, "_delta_log")
        return [root] if any(n.endswith((".json", ".parquet")) for n in files.list_names(log)) else []
    out: list[str] = []
    for name in names:
        if not name.endswith(_DATA_SUFFIXES):
            out += delta_tables_s3(storage.join(root, name))
    return sorted(out)


def _rs_table(path: Path | str):
    import deltalake

    from slotlake import storage

    uri, options = storage.delta_rs_table_args(str(path))
    return deltalake.DeltaTable(uri, storage_options=options)


def delta_tables(root: Path) -> list[Path]:
    """Delta tables under `root` (a folder holding `_delta_log/` with at least one commit or checkpoint)."""
    out = []
    for here, dirs, _ in os.walk(root):
        if "_delta_log" in dirs:
            log = Path(here) / "_delta_log"
            if any(n.endswith(".json") or n.endswith(".parquet") for n in os.listdir(log)):
                out.append(Path(here))
            dirs.remove("_delta_log")
    return sorted(out)


def protocol(path: Path | str) -> dict[str, Any]:
    """The newest protocol action in the table's JSON commits (for messages; checkpoints are not read)."""
    from slotlake import storage

    found: dict[str, Any] = {}
    log = storage.join(str(path), "_delta_log")
    files = storage.files_for(log)
    for name in sorted(n for n in files.list_names(log) if n.endswith(".json") and n[:20].isdigit()):
        for line in files.read_bytes(storage.join(log, name)).decode().splitlines():
            if line.startswith('{"protocol"'):
                found = json.loads(line)["protocol"]
    return found


def reader_features(path: Path | str) -> set[str]:
    return set(protocol(path).get("readerFeatures") or ())


def _type_name(t: pa.DataType) -> str:
    """One name per logical type, whatever Arrow layout a reader chose."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.unit}{', tz' if t.tz else ''}]"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) \
            or pa.types.is_large_list_view(t):
        return f"list<{_type_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{_type_name(t.key_type)}, {_type_name(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{t.field(i).name}: {_type_name(t.field(i).type)}"
                                     for i in range(t.num_fields)) + ">"
    if pa.types.is_dictionary(t):
        return _type_name(t.value_type)
    return str(t)


def _value(v: Any) -> Any:
    """A hashable form, equal exactly when the values are (timestamps compared as instants, NaN equal to NaN)."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC)
    if isinstance(v, (list, tuple)):
        return tuple(_value(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _value(x)) for k, x in v.items()))
    return v


def _rows(table: pa.Table) -> collections.Counter:
    names = table.column_names
    return collections.Counter(tuple(_value(r[c]) for c in names) for r in table.to_pylist())


def schema_of(table: pa.Table) -> list[tuple[str, str]]:
    return [(f.name, _type_name(f.type)) for f in table.schema]


def column_mapping(path: Path | str) -> str | None:
    """The table's `delta.columnMapping.mode` (name, id) or None."""
    return _column_mapping(_rs_table(path))


def _column_mapping(table) -> str | None:
    mode = table.metadata().configuration.get("delta.columnMapping.mode")
    return mode if mode in ("name", "id") else None


def deletion_vectors(path: Path | str) -> bool:
    """Whether the table has the `deletionVectors` reader feature (config `deletion_vectors`)."""
    return _deletion_vectors(_rs_table(path))


def _deletion_vectors(table) -> bool:
    return "deletionVectors" in (table.protocol().reader_features or [])


def read_delta_rs(path: Path | str) -> pa.Table:
    """The table as delta-rs reads it. A column-mapped table (gold with column names Delta stores only under column
    mapping, or `schema_changes.rename: column_mapping`) is read through delta-rs's query engine (`QueryBuilder`),
    which applies the mapping: deltalake 1.6's `to_pyarrow_table()` reads its columns as NULL (README,
    Troubleshooting). So is a table with deletion vectors (config `deletion_vectors`), which `to_pyarrow_table()`
    refuses and the query engine (and Polars) read with the deleted rows left out."""
    import deltalake

    try:
        table = _rs_table(path)  # its log read once
        if _column_mapping(table) or _deletion_vectors(table):
            result = deltalake.QueryBuilder().register("t", table).execute("SELECT * FROM t")
            return _without_views(pa.table(result.read_all()))
        return table.to_pyarrow_table()
    except Exception as e:
        raise AssertionError(
            f"delta-rs (deltalake {deltalake.__version__}) cannot read the Delta table {path}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (protocol {protocol(path)}); slotlake "
            "must not give a table a reader feature delta-rs lacks unless the user opted in") from None


def _plain(t: pa.DataType) -> pa.DataType:
    """`t` with Arrow's view types (which delta-rs's query engine returns) as the plain ones `to_pyarrow_table()`
    gives: pyarrow's compute kernels (filter, take, sort) do not all take views."""
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_large_list_view(t):
        return pa.large_list(_plain(t.value_type))
    if pa.types.is_list(t) or pa.types.is_list_view(t):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), _plain(t.item_type))
    return t


def _without_views(table: pa.Table) -> pa.Table:
    schema = pa.schema([pa.field(f.name, _plain(f.type), f.nullable, f.metadata) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


def read_spark(spark: Any, path: Path | str) -> pa.Table:
    return spark.read.format("delta").load(str(path)).toArrow()


def assert_delta_readers_agree(spark: Any, path: Path | str) -> int:
    """Assert delta-rs and Spark read the same columns, types and rows from the Delta table at `path`;
    returns the row count."""
    path = path if str(path).startswith("s3a://") else Path(path)
    rs = read_delta_rs(path)
    sp = read_spark(spark, path)
    assert schema_of(rs) == schema_of(sp), (
        f"{path}: delta-rs and Spark read different schemas\n  delta-rs: {schema_of(rs)}\n  Spark:    {schema_of(sp)}")
    got, want = _rows(rs), _rows(sp)
    if got != want:
        raise AssertionError(
            f"{path}: delta-rs and Spark read different rows ({rs.num_rows} vs {sp.num_rows}); columns "
            f"{rs.column_names}\n  only delta-rs: {list((got - want).elements())[:5]}\n"
            f"  only Spark: {list((want - got).elements())[:5]}")
    return rs.num_rows


def assert_delta_rs_refuses(path: Path | str, features: Iterable[str]) -> None:
    """Assert delta-rs refuses the table for one of `features` (a reader feature the user opted in to)."""
    import deltalake

    path = Path(path)
    try:
        deltalake.DeltaTable(str(path)).to_pyarrow_table()
    except Exception as e:
        assert any(f in str(e) for f in features), f"{path}: delta-rs failed for another reason: {e}"
        return
    raise AssertionError(f"{path}: delta-rs read a table with reader features {reader_features(path)}; "
                         "if it supports them now, drop the opt-in marker")


def assert_all_readers_agree(spark: Any, tables: Iterable[Path], opt_in: Iterable[str] = ()) -> None:
    """`assert_delta_readers_agree` for each of `tables` (`delta_tables(root)`); a table with a reader feature in
    `opt_in` must instead be refused by delta-rs for it, and read by Spark.

    A few tables at a time: each Spark read is a handful of tiny jobs (Delta's log replay, the scan), mostly
    scheduling latency, so concurrent ones overlap (measured on an 11-table lake: 5.6-5.9 s one by one, 2.9-3.6 s
    four at a time). The first failure is reported, after every check finished."""
    from concurrent.futures import ThreadPoolExecutor

    opted = set(opt_in)

    def check(path: Path) -> None:
        features = reader_features(path) & opted
        if features:
            assert_delta_rs_refuses(path, features)
            spark.read.format("delta").load(str(path)).count()
        else:
            assert_delta_readers_agree(spark, path)

    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="delta-readers") as pool:
        for future in [pool.submit(check, path) for path in tables]:
            future.result()


def check_bucket(config: str, root: str) -> tuple[int, str]:
    """Run the delta-rs/Spark check on every Delta table under the s3a:// folder `root` in a new process with a
    Spark session for the lake of `config` (its `storage:`); returns (number of tables, the process's report)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, __file__, "--config", config, root], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"delta readers disagree under {root}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    last = out.stdout.strip().splitlines()[-1]
    return int(last.split()[0]), out.stdout


def _main() -> None:
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="delta-rs vs Spark on every Delta table under an s3a:// folder")
    parser.add_argument("--config", required=True)
    parser.add_argument("root")
    args = parser.parse_args()
    root_dir = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root_dir / "plugins"))
    from slotlake.config import load_config
    from slotlake.spark.session import get_spark

    cfg = load_config(args.config)  # configures slotlake.storage for the lake's endpoint
    tables = delta_tables_s3(args.root)
    assert tables, f"no Delta table under {args.root}"
    spark = get_spark("slotlake-delta-readers-s3", "local[1]", {
        "spark.sql.shuffle.partitions": "1", "spark.databricks.delta.snapshotPartitions": "1"}, storage=cfg.storage)
    for t in tables:
        print(f"{t}: {assert_delta_readers_agree(spark, t)} rows agree", flush=True)
    print(f"{len(tables)} tables agree")


if __name__ == "__main__":
    _main()
