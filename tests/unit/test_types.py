"""PostgreSQL type -> gold type (pure: Spark SQL type text), the same as a Spark DataType, and the array-literal
parser."""
from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from slotlake.contracts import type_tree
from slotlake.decode.types import ArrayLiteralError, NumericTypmod, gold_type, parse_array_literal
from slotlake.merge.typed_values import always_exact, spark_type

pytestmark = pytest.mark.unit


def numeric(p: int, s: int) -> int:
    return ((p << 16) | (s & 0x7FF)) + 4


@pytest.mark.parametrize("oid,typmod,want", [
    (16, -1, BooleanType()), (21, -1, ShortType()), (23, -1, IntegerType()), (20, -1, LongType()),
    (26, -1, LongType()), (700, -1, FloatType()), (701, -1, DoubleType()),
    (1700, -1, DecimalType(38, 18)), (1700, numeric(10, 2), DecimalType(10, 2)),
    (1700, numeric(38, 0), DecimalType(38, 0)), (1700, numeric(39, 2), StringType()),
    (1700, numeric(5, -2), DecimalType(7, 0)), (1700, numeric(3, 5), DecimalType(5, 5)),
    (25, -1, StringType()), (1043, 54, StringType()), (1042, 14, StringType()), (19, -1, StringType()),
    (18, -1, StringType()), (17, -1, BinaryType()), (1082, -1, DateType()), (1083, -1, StringType()),
    (1266, -1, StringType()), (1114, -1, TimestampNTZType()), (1184, 3, TimestampType()),
    (1186, -1, StringType()), (2950, -1, StringType()), (114, -1, StringType()), (3802, -1, StringType()),
    (142, -1, StringType()), (869, -1, StringType()), (650, -1, StringType()), (829, -1, StringType()),
    (774, -1, StringType()), (790, -1, StringType()), (424242, -1, StringType()),
    (1007, -1, ArrayType(IntegerType())), (1009, -1, ArrayType(StringType())),
    (1231, numeric(6, 1), ArrayType(DecimalType(6, 1))),
    (1185, -1, ArrayType(TimestampType())), (1001, -1, ArrayType(BinaryType())), (3807, -1, ArrayType(StringType())),
], ids=lambda v: str(v))
def test_spark_type(oid, typmod, want):
    assert spark_type(oid, typmod) == want
    # the pure type text is what Spark prints for the type (gold's schema as Delta has it compares with it)
    assert gold_type(oid, typmod) == want.simpleString()
    assert type_tree(gold_type(oid, typmod))  # and the contracts parser reads it


@pytest.mark.parametrize("oid,typmod,mode,want", [
    (1700, -1, "decimal", DecimalType(38, 18)), (1700, -1, "string", StringType()),
    (1700, numeric(10, 2), "string", DecimalType(10, 2)), (1700, numeric(39, 2), "decimal", StringType()),
    (1231, -1, "string", ArrayType(StringType())), (1231, -1, "decimal", ArrayType(DecimalType(38, 18))),
    (1231, numeric(6, 1), "string", ArrayType(DecimalType(6, 1))), (23, -1, "string", IntegerType()),
], ids=["unconstrained-decimal", "unconstrained-string", "constrained-ignores-mode", "over-38-is-text",
        "array-string", "array-decimal", "constrained-array-ignores-mode", "not-numeric"])
def test_spark_type_of_unconstrained_numeric(oid, typmod, mode, want):
    """numeric.unconstrained changes only a numeric without precision (also as array element)."""
    assert spark_type(oid, typmod, mode) == want
    assert gold_type(oid, typmod, mode) == want.simpleString()


def test_spark_type_rejects_an_unknown_numeric_mode():
    with pytest.raises(ValueError, match="unconstrained_numeric must be 'decimal' or 'string'"):
        spark_type(1700, -1, "text")
    with pytest.raises(ValueError, match="unconstrained_numeric must be 'decimal' or 'string'"):
        gold_type(1700, -1, "text")


@pytest.mark.parametrize("typmod,precision,scale", [
    (-1, None, None), (numeric(10, 2), 10, 2), (numeric(1000, 0), 1000, 0), (numeric(5, -2), 5, -2),
    (numeric(3, 5), 3, 5),
], ids=["unconstrained", "10_2", "1000_0", "negative_scale", "scale_over_precision"])
def test_numeric_typmod(typmod, precision, scale):
    assert NumericTypmod.of(typmod) == NumericTypmod(precision, scale)


@pytest.mark.parametrize("text,want", [
    ("{}", []),
    ("{1,2,3}", ["1", "2", "3"]),
    ("{1,NULL,3}", ["1", None, "3"]),
    ("{null,NuLl}", [None, None]),
    ('{"NULL"}', ["NULL"]),
    ('{"a,b","c}d"}', ["a,b", "c}d"]),
    ('{"say \\"hi\\"","back\\\\slash"}', ['say "hi"', "back\\slash"]),
    ('{"\\\\x0102"}', ["\\x0102"]),
    ("{ a , b }", ["a", "b"]),
    ('{""}', [""]),
    ('{" x "}', [" x "]),
    ("{a\\,b}", ["a,b"]),
    ("[1:2]={7,8}", ["7", "8"]),
    ('{"{not nested}"}', ["{not nested}"]),
    ("{2024-01-01 10:00:00+00,infinity}", ["2024-01-01 10:00:00+00", "infinity"]),
], ids=["empty", "ints", "null", "null_any_case", "quoted_null_is_text", "quoted_delims", "escapes",
        "bytea_hex", "spaces_trimmed", "empty_string", "quoted_spaces_kept", "escaped_comma", "default_bounds",
        "braces_in_quotes", "timestamps"])
def test_parse_array_literal(text, want):
    assert parse_array_literal(text) == want


@pytest.mark.parametrize("text", [
    "{{1,2},{3,4}}", "[0:1]={1,2}", "[1:2][1:1]={{1},{2}}", "1,2", '{"open}', "{a,,b}", '{"a"b}', "{a\"b}",
], ids=["two_dims", "bounds_from_0", "two_dim_bounds", "no_braces", "unterminated", "empty_element",
        "junk_after_quote", "quote_inside"])
def test_parse_array_literal_rejects(text):
    with pytest.raises(ArrayLiteralError):
        parse_array_literal(text)


def test_the_types_whose_every_value_gold_holds_exactly():
    """The merge skips its count of bad values when every column is of such a type: integers, booleans and the
    types gold keeps as text; never a type whose text can fail (floats' forms, numeric ranges, dates, arrays)."""
    int2, int4, int8, oid, boolean, text, varchar, bpchar, uuid, jsonb = 21, 23, 20, 26, 16, 25, 1043, 1042, 2950, 3802
    for t in (int2, int4, int8, oid, boolean, text, varchar, bpchar, uuid, jsonb):
        assert always_exact(t, -1), t
    float4, float8, num, bytea, date, ts, tstz = 700, 701, 1700, 17, 1082, 1114, 1184
    int4_array, text_array = 1007, 1009
    for t in (float4, float8, bytea, date, ts, tstz, int4_array, text_array):
        assert not always_exact(t, -1), t
    assert not always_exact(num, numeric(10, 2)) and not always_exact(num, -1)
    assert always_exact(num, -1, "string")  # numeric.unconstrained: string keeps the text
    assert always_exact(num, numeric(60, 2))  # over 38 digits: text
