"""Spark schemas of the lake tables and gold, derived from `slotlake.contracts` (declared there once)."""
from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from slotlake.contracts import Columns, Field, Schema, TypeTree, type_tree

_SIMPLE: dict[str, DataType] = {
    "long": LongType(), "bigint": LongType(), "int": IntegerType(), "smallint": ShortType(), "tinyint": ByteType(),
    "float": FloatType(), "double": DoubleType(), "string": StringType(), "boolean": BooleanType(),
    "binary": BinaryType(), "date": DateType(), "timestamp": TimestampType(), "timestamp_ntz": TimestampNTZType(),
}


def spark_type(of: str | TypeTree) -> DataType:
    tree = type_tree(of) if isinstance(of, str) else of
    kind = tree[0]
    if kind == "array":
        return ArrayType(spark_type(tree[1]), containsNull=True)
    if kind == "map":
        return MapType(spark_type(tree[1]), spark_type(tree[2]))
    if kind == "struct":
        return StructType([StructField(n, spark_type(sub)) for n, sub in tree[1]])
    if kind == "decimal":
        return DecimalType(tree[1], tree[2])
    return _SIMPLE[kind]


def struct_type(columns: Columns) -> StructType:
    """The contract as a Spark StructType (every field nullable, as Spark's DDL strings make them)."""
    return StructType([StructField(n, spark_type(t)) for n, t in columns])


def struct_of(fields: Iterable[Field]) -> StructType:
    """A gold or history schema (`contracts.Field`s, as `merge.plan` plans them) as a Spark StructType."""
    return StructType([StructField(f.name, spark_type(f.type), f.nullable) for f in fields])


def fields_of(struct: StructType) -> Schema:
    """A Spark schema (a gold table's, as Delta has it) as `contracts.Field`s."""
    return tuple(Field(f.name, f.dataType.simpleString(), f.nullable) for f in struct.fields)
