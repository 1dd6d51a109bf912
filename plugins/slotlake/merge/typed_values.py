"""PostgreSQL text -> typed Spark Column: the Spark half of `slotlake.decode.types` (docs there).

`typed_value` returns the typed value and a reason. The reason is non-null exactly when a non-null text cannot be
held exactly by the gold type (the value is then NULL and the caller quarantines the raw text). Nothing is ever
rounded.
"""
from __future__ import annotations

from typing import cast

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, DecimalType, StringType, StructField, StructType

from slotlake.decode.types import (
    ARRAY_ELEMENT,
    BOOL,
    BYTEA,
    DATE,
    DECIMAL,
    FLOAT4,
    FLOAT8,
    INTS,
    NUMERIC,
    TIMESTAMP,
    TIMESTAMPTZ,
    UNCONSTRAINED_NUMERIC,
    NumericTypmod,
    gold_type,
    numeric_as_text,
    numeric_decimal,
    parse_array_row,
)
from slotlake.spark import schemas


def spark_type(type_oid: int, typmod: int, unconstrained_numeric: str = DECIMAL) -> DataType:
    """The gold Spark type of a PostgreSQL column type (`decode.types.gold_type` as a DataType)."""
    return schemas.spark_type(gold_type(type_oid, typmod, unconstrained_numeric))


def _reason_when(text: Column, bad: Column, reason: str) -> Column:
    return F.when(text.isNotNull() & bad, F.lit(reason))


def _cast_checked(text: Column, dtype: DataType, valid: Column, what: str) -> tuple[Column, Column]:
    """Cast `text` when it matches the exact form `valid`; anything else (or a failed cast) gets a reason."""
    value = F.when(valid, text.try_cast(dtype))
    return value, _reason_when(text, value.isNull(), f"not a {what} Spark can hold exactly")


def _numeric_value(text: Column, typmod: int, unconstrained_numeric: str) -> tuple[Column, Column]:
    if numeric_as_text(typmod, unconstrained_numeric):
        # PostgreSQL's text is exact: every digit, the scale it printed, NaN, Infinity, -Infinity.
        return text, F.lit(None).cast("string")
    dtype = cast(DecimalType, schemas.spark_type(cast(str, numeric_decimal(typmod))))  # not text
    special = text.isin("NaN", "Infinity", "-Infinity")
    if dtype == schemas.spark_type(UNCONSTRAINED_NUMERIC) and NumericTypmod.of(typmod).precision is None:
        # Unconstrained numeric: anything with more than 20 integer digits or a non-zero digit past the 18th
        # fraction digit would be rounded or overflow by a cast; report it instead.
        m = r"^-?0*(\d{0,20})(\.(\d{0,18})0*)?$"
        fits = text.rlike(m)
    else:
        fits = text.rlike(r"^-?\d+(\.\d+)?$")
    value = F.when(fits & ~special, text.try_cast(dtype))
    reason = (F.when(text.isNull(), F.lit(None))
              .when(special, F.concat(F.lit("numeric "), text, F.lit(f" has no {dtype.simpleString()} value")))
              .when(value.isNull(), F.lit(f"numeric does not fit {dtype.simpleString()} without rounding")))
    return value, reason


def _scalar_value(text: Column, type_oid: int, typmod: int, unconstrained_numeric: str) -> tuple[Column, Column]:
    dtype = spark_type(type_oid, typmod, unconstrained_numeric)
    none = F.lit(None).cast("string")
    if type_oid == BOOL:
        value = F.when(text == "t", F.lit(True)).when(text == "f", F.lit(False))
        return value, _reason_when(text, value.isNull(), "not a boolean ('t' or 'f')")
    if type_oid in INTS:
        # PostgreSQL prints an integer as -?digits, which always fits the gold integer of the same width: the
        # cast is exact and needs no pattern (a regular expression per value cost the merge ~20%; bench/README.md).
        return _cast_checked(text, dtype, F.lit(True), dtype.simpleString())
    if type_oid in (FLOAT4, FLOAT8):
        # PostgreSQL's output (digits, an exponent, NaN, Infinity, -Infinity; extra_float_digits=3) is read
        # exactly by Spark's cast.
        return _cast_checked(text, dtype, F.lit(True), dtype.simpleString())
    if type_oid == NUMERIC:
        return _numeric_value(text, typmod, unconstrained_numeric)
    if type_oid == BYTEA:
        # bytea_output=hex: '\\x' and two hex digits per byte; unhex gives NULL for anything but hex digits.
        value = F.when(text.startswith("\\x"), F.unhex(F.substring(text, 3, 1 << 30)))
        return value, _reason_when(text, value.isNull(), "bytea is not in hex output format (\\x...)")
    # Dates and time stamps: PostgreSQL's ISO output (the extract's DateStyle) is 'YYYY-MM-DD[ HH:MM:SS[.f]
    # [+HH[:MM[:SS]]]]', with ' BC' after BC values, 5 or more year digits past 9999, or 'infinity'/'-infinity'.
    # Spark's cast reads the plain forms exactly (every offset form included) and gives NULL for a ' BC' time stamp
    # and for the infinities; what it would misread is excluded by position and length, not by a regular
    # expression per value (which cost the merge ~20%): a 5-digit year (which Spark reads) has no '-' at the fifth
    # character, and a date's cast ignores what follows the date (' BC'), so a date must be 10 characters.
    four_digit_year = F.substring(text, 5, 1) == "-"
    if type_oid == DATE:
        valid = four_digit_year & (F.length(text) == 10)
        return _cast_checked(text, dtype, valid, "date (0001-01-01..9999-12-31)")
    if type_oid == TIMESTAMP:
        return _cast_checked(text, dtype, four_digit_year, "timestamp (0001..9999, no infinity/BC)")
    if type_oid == TIMESTAMPTZ:
        value = F.when(four_digit_year, text.try_cast(dtype))
        return value, _reason_when(text, value.isNull(),
                                   "not a timestamptz Spark can hold (0001..9999, no infinity/BC)")
    if isinstance(dtype, StringType):
        return text, none
    raise AssertionError(f"no conversion for type {type_oid}")  # spark_type and this function disagree


def always_exact(type_oid: int, typmod: int, unconstrained_numeric: str = DECIMAL) -> bool:
    """Whether `typed_value` gives a null reason for every text PostgreSQL prints for the type: integers (their
    output always fits the gold integer of the same width), booleans ('t'/'f'), and the types gold keeps as text.
    A batch whose columns are all such needs no count of bad values."""
    if type_oid in ARRAY_ELEMENT:
        return False
    if type_oid in INTS or type_oid == BOOL:
        return True
    if type_oid == NUMERIC:
        return numeric_as_text(typmod, unconstrained_numeric)
    if type_oid in (FLOAT4, FLOAT8, BYTEA, DATE, TIMESTAMP, TIMESTAMPTZ):
        return False
    return isinstance(spark_type(type_oid, typmod, unconstrained_numeric), StringType)


_PARSED = StructType([StructField("items", ArrayType(StringType())), StructField("error", StringType())])


_parse_array_udf = None


def _array_udf():
    # Created lazily: a UDF needs an active SparkContext.
    global _parse_array_udf
    if _parse_array_udf is None:
        # A plain lambda: Spark would otherwise try to infer a pandas UDF from the type hints.
        _parse_array_udf = F.udf(lambda text: parse_array_row(text), _PARSED)
    return _parse_array_udf


def _array_value(text: Column, element_oid: int, typmod: int, unconstrained_numeric: str) -> tuple[Column, Column]:
    parsed = _array_udf()(text)
    items = parsed.getField("items")
    typed = F.transform(items, lambda x: _scalar_value(x, element_oid, typmod, unconstrained_numeric)[0])
    reasons = F.filter(F.transform(items, lambda x: _scalar_value(x, element_oid, typmod, unconstrained_numeric)[1]),
                       lambda r: r.isNotNull())
    element_reason = F.when(F.size(reasons) > 0, F.concat(F.lit("array element: "), reasons.getItem(0)))
    reason = F.when(text.isNull(), F.lit(None)).otherwise(
        F.coalesce(F.concat(F.lit("array: "), parsed.getField("error")), element_reason))
    value = F.when(reason.isNull(), typed)
    return value, reason


def typed_value(text: Column, type_oid: int, typmod: int,
                unconstrained_numeric: str = DECIMAL) -> tuple[Column, Column]:
    """(value, reason): `text` (PostgreSQL text, null = SQL NULL) as `spark_type(type_oid, typmod,
    unconstrained_numeric)`.

    `reason` is null when the value is held exactly (or the text is null); otherwise it says why not and the
    value is null. Never rounds.
    """
    if type_oid in ARRAY_ELEMENT:
        return _array_value(text, ARRAY_ELEMENT[type_oid], typmod, unconstrained_numeric)
    return _scalar_value(text, type_oid, typmod, unconstrained_numeric)
