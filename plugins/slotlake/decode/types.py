"""PostgreSQL type (OID, typmod) -> Spark type, and PostgreSQL text -> typed Spark Column.

Silver keeps every value as the text PostgreSQL produced (DateStyle=ISO, TimeZone=UTC, IntervalStyle=iso_8601,
extra_float_digits=3, bytea_output=hex). Gold types them here. Two rules:

* The Spark type depends on the column's type only (OID and typmod, and for an unconstrained `numeric` the
  configured `numeric.unconstrained` of the column), never on the data seen so far, so a table's gold schema is
  stable from its first row.
* No silent loss: `typed_value` returns the typed value and a reason. The reason is non-null exactly when a
  non-null text cannot be held exactly by the Spark type (the value is then NULL and the caller quarantines the
  raw text). Nothing is ever rounded.

Types Spark cannot hold exactly (time, timetz, interval, uuid, json, network types, money, enums, custom types...)
stay strings: PostgreSQL's text form is lossless.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, FLOAT4, FLOAT8, MONEY, MACADDR, INET, CIDR = 114, 142, 700, 701, 790, 829, 869, 650
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266
NUMERIC, UUID, JSONB, MACADDR8 = 1700, 2950, 3802, 774

# Array type OID -> element type OID (pg_type.typelem) for the built-in types we know.
ARRAY_ELEMENT: dict[int, int] = {
    1000: BOOL, 1001: BYTEA, 1002: CHAR, 1003: NAME, 1005: INT2, 1007: INT4, 1009: TEXT, 1014: BPCHAR,
    1015: VARCHAR, 1016: INT8, 1021: FLOAT4, 1022: FLOAT8, 1028: OID, 1182: DATE, 1183: TIME, 1115: TIMESTAMP,
    1185: TIMESTAMPTZ, 1187: INTERVAL, 1270: TIMETZ, 1231: NUMERIC, 2951: UUID, 199: JSON, 3807: JSONB, 143: XML,
    791: MONEY, 1040: MACADDR, 775: MACADDR8, 1041: INET, 651: CIDR,
}

_INTS: dict[int, DataType] = {INT2: ShortType(), INT4: IntegerType(), INT8: LongType(), OID: LongType()}
_UNCONSTRAINED_NUMERIC = DecimalType(38, 18)
# numeric.unconstrained (config): how a numeric without precision lands in gold.
DECIMAL, STRING = "decimal", "string"
_MAX_SPARK_PRECISION = 38
_VARHDRSZ = 4


@dataclass(frozen=True)
class NumericTypmod:
    """precision/scale of numeric(p,s); both None for an unconstrained numeric (typmod -1)."""

    precision: int | None
    scale: int | None

    @classmethod
    def of(cls, typmod: int) -> NumericTypmod:
        if typmod < _VARHDRSZ:
            return cls(None, None)
        t = typmod - _VARHDRSZ
        # PostgreSQL 15+ allows scale in [-1000, 1000]: an 11-bit two's complement field.
        scale = ((t & 0x7FF) ^ 1024) - 1024
        return cls((t >> 16) & 0xFFFF, scale)


def _numeric_decimal(typmod: int) -> DecimalType | None:
    """The DecimalType that holds every value of numeric(typmod) exactly, or None when Spark has none."""
    nt = NumericTypmod.of(typmod)
    if nt.precision is None or nt.scale is None:
        return _UNCONSTRAINED_NUMERIC
    p, s = nt.precision, nt.scale
    if s < 0:  # numeric(5,-2): integers of up to p - s digits
        p, s = p - s, 0
    elif s > p:  # numeric(3,5): 0.00xyz, needs s digits
        p = s
    return DecimalType(p, s) if p <= _MAX_SPARK_PRECISION else None


def _numeric_as_text(typmod: int, unconstrained_numeric: str) -> bool:
    """True when a numeric(typmod) column is kept as PostgreSQL's text: precision over 38, or unconstrained with
    `numeric.unconstrained: string`."""
    if unconstrained_numeric not in (DECIMAL, STRING):
        raise ValueError(f"unconstrained_numeric must be {DECIMAL!r} or {STRING!r}, got {unconstrained_numeric!r}")
    if NumericTypmod.of(typmod).precision is None:
        return unconstrained_numeric == STRING
    return _numeric_decimal(typmod) is None


def spark_type(type_oid: int, typmod: int, unconstrained_numeric: str = DECIMAL) -> DataType:
    """The gold Spark type of a PostgreSQL column type. Depends on (type_oid, typmod) only, and for a `numeric`
    without precision (also as array element) on the column's `numeric.unconstrained` (decimal | string)."""
    if type_oid in ARRAY_ELEMENT:
        return ArrayType(spark_type(ARRAY_ELEMENT[type_oid], typmod, unconstrained_numeric), containsNull=True)
    if type_oid == BOOL:
        return BooleanType()
    if type_oid in _INTS:
        return _INTS[type_oid]
    if type_oid == FLOAT4:
        return FloatType()
    if type_oid == FLOAT8:
        return DoubleType()
    if type_oid == NUMERIC:
        if _numeric_as_text(typmod, unconstrained_numeric):
            return StringType()
        return cast(DecimalType, _numeric_decimal(typmod))  # not None: not kept as text
    if type_oid == BYTEA:
        return BinaryType()
    if type_oid == DATE:
        return DateType()
    if type_oid == TIMESTAMP:
        return TimestampNTZType()
    if type_oid == TIMESTAMPTZ:
        return TimestampType()
    # text-like types, time/timetz/interval, uuid, json(b), xml, network types, money, enums, custom types.
    return StringType()


def _reason_when(text: Column, bad: Column, reason: str) -> Column:
    return F.when(text.isNotNull() & bad, F.lit(reason))


def _cast_checked(text: Column, dtype: DataType, valid: Column, what: str) -> tuple[Column, Column]:
    """Cast `text` when it matches the exact form `valid`; anything else (or a failed cast) gets a reason."""
    value = F.when(valid, text.try_cast(dtype))
    return value, _reason_when(text, value.isNull(), f"not a {what} Spark can hold exactly")


def _numeric_value(text: Column, typmod: int, unconstrained_numeric: str) -> tuple[Column, Column]:
    if _numeric_as_text(typmod, unconstrained_numeric):
        # PostgreSQL's text is exact: every digit, the scale it printed, NaN, Infinity, -Infinity.
        return text, F.lit(None).cast("string")
    dtype = cast(DecimalType, _numeric_decimal(typmod))  # not None: not kept as text
    special = text.isin("NaN", "Infinity", "-Infinity")
    if dtype == _UNCONSTRAINED_NUMERIC and NumericTypmod.of(typmod).precision is None:
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
    if type_oid in _INTS:
        return _cast_checked(text, dtype, text.rlike(r"^-?\d+$"), dtype.simpleString())
    if type_oid in (FLOAT4, FLOAT8):
        valid = text.rlike(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$") | text.isin("NaN", "Infinity", "-Infinity")
        return _cast_checked(text, dtype, valid, dtype.simpleString())
    if type_oid == NUMERIC:
        return _numeric_value(text, typmod, unconstrained_numeric)
    if type_oid == BYTEA:
        valid = text.rlike(r"^\\x([0-9a-fA-F]{2})*$")
        value = F.when(valid, F.unhex(F.substring(text, 3, 1 << 30)))
        return value, _reason_when(text, value.isNull(), "bytea is not in hex output format (\\x...)")
    if type_oid == DATE:
        # 'infinity', '-infinity', BC dates and years past 9999 have no Spark date.
        return _cast_checked(text, dtype, text.rlike(r"^\d{4}-\d{2}-\d{2}$"), "date (0001-01-01..9999-12-31)")
    if type_oid == TIMESTAMP:
        valid = text.rlike(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?$")
        return _cast_checked(text, dtype, valid, "timestamp (0001..9999, no infinity/BC)")
    if type_oid == TIMESTAMPTZ:
        # With TimeZone=UTC the offset is '+00'; other offsets (e.g. '+05:30') are still exact instants.
        m = r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?)([-+]\d{2})(:\d{2})?(:\d{2})?$"
        normal = F.concat(F.regexp_extract(text, m, 1), F.regexp_extract(text, m, 3),
                          F.coalesce(F.nullif(F.regexp_extract(text, m, 4), F.lit("")), F.lit(":00")),
                          F.regexp_extract(text, m, 5))
        value = F.when(text.rlike(m), normal.try_cast(dtype))
        return value, _reason_when(text, value.isNull(),
                                   "not a timestamptz Spark can hold (0001..9999, no infinity/BC)")
    if isinstance(dtype, StringType):
        return text, none
    raise AssertionError(f"no conversion for type {type_oid}")  # spark_type and this function disagree


# ---- arrays -------------------------------------------------------------------------------------------------

class ArrayLiteralError(ValueError):
    """A PostgreSQL array literal that is malformed or has no one-dimensional Spark equivalent."""


def parse_array_literal(text: str) -> list[str | None]:
    """Parse a one-dimensional PostgreSQL array literal (`{1,NULL,"a,b","q\\"x"}`) into element texts.

    Unquoted NULL (any case) is SQL NULL; quoted "NULL" is the string. Backslash escapes any character.
    Unquoted elements have surrounding whitespace removed. Raises ArrayLiteralError for multi-dimensional arrays,
    explicit bounds other than the default (`[0:1]={...}`), or malformed text.
    """
    s = text
    if s.startswith("["):
        eq = s.find("=")
        dims = s[:eq]
        if eq < 0 or not all(d.startswith("1:") for d in dims[1:-1].split("][")):
            raise ArrayLiteralError(f"array with non-default bounds {dims!r}")
        if dims.count("[") > 1:
            raise ArrayLiteralError("multi-dimensional array")
        s = s[eq + 1:]
    s = s.strip()
    if len(s) < 2 or s[0] != "{" or s[-1] != "}":
        raise ArrayLiteralError(f"not an array literal: {text[:60]!r}")
    body = s[1:-1]
    items: list[str | None] = []
    if body.strip() == "":
        return items
    i, n = 0, len(body)
    while True:
        while i < n and body[i].isspace():
            i += 1
        if i < n and body[i] == "{":
            raise ArrayLiteralError("multi-dimensional array")
        buf: list[str] = []
        quoted_any = False
        if i < n and body[i] == '"':
            quoted_any = True
            i += 1
            while True:
                if i >= n:
                    raise ArrayLiteralError("unterminated quoted element")
                c = body[i]
                if c == "\\":
                    if i + 1 >= n:
                        raise ArrayLiteralError("dangling backslash")
                    buf.append(body[i + 1])
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    buf.append(c)
                    i += 1
            while i < n and body[i].isspace():
                i += 1
        else:
            while i < n and body[i] not in ",}":
                c = body[i]
                if c in '{"':
                    raise ArrayLiteralError(f"unexpected {c!r} in unquoted element")
                if c == "\\":
                    if i + 1 >= n:
                        raise ArrayLiteralError("dangling backslash")
                    quoted_any = True  # an escaped character makes "NULL" a string
                    buf.append(body[i + 1])
                    i += 2
                else:
                    buf.append(c)
                    i += 1
        raw = "".join(buf)
        if not quoted_any:
            raw = raw.strip()
            if raw == "":
                raise ArrayLiteralError("empty unquoted element")
            items.append(None if raw.upper() == "NULL" else raw)
        else:
            items.append(raw)
        if i >= n:
            return items
        if body[i] != ",":
            raise ArrayLiteralError(f"expected ',' at {i}")
        i += 1


_PARSED = StructType([StructField("items", ArrayType(StringType())), StructField("error", StringType())])


def _parse_array_row(text: str | None) -> tuple[list[str | None] | None, str | None]:
    if text is None:
        return None, None
    try:
        return parse_array_literal(text), None
    except ArrayLiteralError as e:
        return None, str(e)


_parse_array_udf = None


def _array_udf():
    # Created lazily: a UDF needs an active SparkContext.
    global _parse_array_udf
    if _parse_array_udf is None:
        # A plain lambda: Spark would otherwise try to infer a pandas UDF from the type hints.
        _parse_array_udf = F.udf(lambda text: _parse_array_row(text), _PARSED)
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
