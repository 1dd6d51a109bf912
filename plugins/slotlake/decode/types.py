"""PostgreSQL type (OID, typmod) -> gold's Spark type (as Spark SQL type text), and PostgreSQL array literals.

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

Pure: types are Spark SQL type text (`decimal(10,2)`, `array<int>`: what `DataType.simpleString()` prints); the
Spark half (`slotlake.merge.typed_values`) turns them into DataTypes and text into typed Columns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

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

INTS: dict[int, str] = {INT2: "smallint", INT4: "int", INT8: "bigint", OID: "bigint"}
UNCONSTRAINED_NUMERIC = "decimal(38,18)"
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


def numeric_decimal(typmod: int) -> str | None:
    """The decimal type that holds every value of numeric(typmod) exactly, or None when Spark has none."""
    nt = NumericTypmod.of(typmod)
    if nt.precision is None or nt.scale is None:
        return UNCONSTRAINED_NUMERIC
    p, s = nt.precision, nt.scale
    if s < 0:  # numeric(5,-2): integers of up to p - s digits
        p, s = p - s, 0
    elif s > p:  # numeric(3,5): 0.00xyz, needs s digits
        p = s
    return f"decimal({p},{s})" if p <= _MAX_SPARK_PRECISION else None


def numeric_as_text(typmod: int, unconstrained_numeric: str) -> bool:
    """True when a numeric(typmod) column is kept as PostgreSQL's text: precision over 38, or unconstrained with
    `numeric.unconstrained: string`."""
    if unconstrained_numeric not in (DECIMAL, STRING):
        raise ValueError(f"unconstrained_numeric must be {DECIMAL!r} or {STRING!r}, got {unconstrained_numeric!r}")
    if NumericTypmod.of(typmod).precision is None:
        return unconstrained_numeric == STRING
    return numeric_decimal(typmod) is None


def gold_type(type_oid: int, typmod: int, unconstrained_numeric: str = DECIMAL) -> str:
    """The gold Spark type of a PostgreSQL column type, as Spark SQL type text. Depends on (type_oid, typmod) only,
    and for a `numeric` without precision (also as array element) on the column's `numeric.unconstrained`
    (decimal | string)."""
    if type_oid in ARRAY_ELEMENT:
        return f"array<{gold_type(ARRAY_ELEMENT[type_oid], typmod, unconstrained_numeric)}>"
    if type_oid == BOOL:
        return "boolean"
    if type_oid in INTS:
        return INTS[type_oid]
    if type_oid == FLOAT4:
        return "float"
    if type_oid == FLOAT8:
        return "double"
    if type_oid == NUMERIC:
        if numeric_as_text(typmod, unconstrained_numeric):
            return "string"
        return cast(str, numeric_decimal(typmod))  # not None: not kept as text
    if type_oid == BYTEA:
        return "binary"
    if type_oid == DATE:
        return "date"
    if type_oid == TIMESTAMP:
        return "timestamp_ntz"
    if type_oid == TIMESTAMPTZ:
        return "timestamp"
    # text-like types, time/timetz/interval, uuid, json(b), xml, network types, money, enums, custom types.
    return "string"


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


def parse_array_row(text: str | None) -> tuple[list[str | None] | None, str | None]:
    if text is None:
        return None, None
    try:
        return parse_array_literal(text), None
    except ArrayLiteralError as e:
        return None, str(e)
