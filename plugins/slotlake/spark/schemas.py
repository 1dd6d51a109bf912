"""Spark schemas of the lake tables, derived from `slotlake.contracts` (declared there once)."""
from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from slotlake.contracts import Columns, TypeTree, type_tree

_SIMPLE: dict[str, DataType] = {
    "long": LongType(), "int": IntegerType(), "string": StringType(), "boolean": BooleanType(),
    "binary": BinaryType(), "timestamp": TimestampType(),
}


def spark_type(of: str | TypeTree) -> DataType:
    tree = type_tree(of) if isinstance(of, str) else of
    kind = tree[0]
    if kind == "array":
        return ArrayType(spark_type(tree[1]))
    if kind == "map":
        return MapType(spark_type(tree[1]), spark_type(tree[2]))
    if kind == "struct":
        return StructType([StructField(n, spark_type(sub)) for n, sub in tree[1]])
    return _SIMPLE[kind]


def struct_type(columns: Columns) -> StructType:
    """The contract as a Spark StructType (every field nullable, as Spark's DDL strings make them)."""
    return StructType([StructField(n, spark_type(t)) for n, t in columns])
