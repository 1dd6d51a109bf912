"""PostgreSQL text -> Arrow arrays of gold's types, for the merge without Spark (`merge/in_process.py`).

The same rule as `slotlake.merge.typed_values` (Spark's half): the gold type depends on the column's type only
(`decode.types.gold_type`), and nothing is ever rounded. Here only the types whose every text PostgreSQL prints
(the extract's DateStyle=ISO, TimeZone=UTC) is read exactly by Arrow's plain parse: booleans, integers, the types
gold keeps as text, numerics into gold decimals (Arrow's cast refuses any value that would be rounded or overflow,
as Spark's merge quarantines it), dates and time stamps of the years 1900-9999. `typed_array` returns None for
anything else (a float, bytea, an array, a numeric NaN or infinity, a BC or infinite time stamp, a value Arrow
cannot parse or hold exactly): the caller then leaves the batch to Spark's merge, which types and quarantines as
`typed_values` says.
"""
from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from slotlake.decode.types import ARRAY_ELEMENT, BOOL, DATE, INTS, NUMERIC, TIMESTAMP, TIMESTAMPTZ, gold_type

ARROW_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(), "string": pa.string(),
    "date": pa.date32(), "timestamp_ntz": pa.timestamp("us"), "timestamp": pa.timestamp("us", tz="UTC"),
}
"""Gold's Spark type text -> the Arrow type these values take, for the types `typed_array` reads."""

DELTA_TYPES: dict[str, str] = {
    "boolean": "boolean", "smallint": "short", "int": "integer", "bigint": "long", "string": "string",
    "date": "date", "timestamp_ntz": "timestamp_ntz", "timestamp": "timestamp",
}
"""Gold's Spark type text -> the Delta log's primitive type name (what delta-rs's schema says); see `delta_type`."""

_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")
_NUMERIC_TEXT = r"^-?[0-9]+(\.[0-9]+)?$"  # what PostgreSQL prints for a finite numeric (no exponent)


def arrow_type(gold: str) -> pa.DataType | None:
    """The Arrow type of gold's Spark type text, for the types `typed_array` reads (None: another type)."""
    m = _DECIMAL.match(gold)
    return pa.decimal128(int(m[1]), int(m[2])) if m else ARROW_TYPES.get(gold)


def delta_type(gold: str) -> str | None:
    """The Delta log's type name of gold's Spark type text, for the types `typed_array` reads (None: another)."""
    return gold if _DECIMAL.match(gold) else DELTA_TYPES.get(gold)

# Years 1900-9999 only: before the Gregorian switch Spark's and Arrow's calendars may differ, and PostgreSQL's
# ' BC', 5-digit years and infinities are not plain ISO text.
_YEAR = r"(19|[2-9][0-9])[0-9]{2}"
_DATE = rf"^{_YEAR}-[0-9]{{2}}-[0-9]{{2}}"
_TIME = r" [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
_PATTERNS = {DATE: _DATE + "$", TIMESTAMP: _DATE + _TIME + "$", TIMESTAMPTZ: _DATE + _TIME + r"\+00$"}


def supported(type_oid: int, typmod: int, unconstrained_numeric: str) -> bool:
    """Whether `typed_array` may read the column's values (it may still decline a value)."""
    if type_oid in ARRAY_ELEMENT:
        return False
    return arrow_type(gold_type(type_oid, typmod, unconstrained_numeric)) is not None


def _all_match(texts: pa.Array, pattern: str) -> bool:
    ok = pc.match_substring_regex(texts, pattern)
    return bool(pc.all(pc.or_kleene(ok, pc.is_null(texts))).as_py() is not False)


def typed_array(texts: Any, type_oid: int, typmod: int, unconstrained_numeric: str) -> pa.Array | None:
    """`texts` (PostgreSQL's text of one column, null = SQL NULL) as the column's gold type, or None when a value
    (or the type) is not one this module reads exactly."""
    if not supported(type_oid, typmod, unconstrained_numeric):
        return None
    texts = pa.array(texts, pa.string()) if not isinstance(texts, pa.Array | pa.ChunkedArray) else texts
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    gold = gold_type(type_oid, typmod, unconstrained_numeric)
    target = arrow_type(gold)
    if gold == "string":
        return texts.cast(pa.string())
    if type_oid == NUMERIC:  # into a decimal: finite values only, each held exactly or the whole batch declines
        if not _all_match(texts, _NUMERIC_TEXT):
            return None
        try:
            return pc.cast(texts, target)  # refuses a value needing rounding or more digits than the precision
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    if type_oid == BOOL:
        if not pc.all(pc.or_kleene(pc.is_in(texts, pa.array(["t", "f"])), pc.is_null(texts))).as_py():
            return None
        return pc.equal(texts, "t")
    if type_oid in INTS:
        try:
            return pc.cast(texts, target)  # PostgreSQL prints -?digits; one that does not fit fails the cast
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    pattern = _PATTERNS.get(type_oid)
    if pattern is None or not _all_match(texts, pattern):
        return None
    try:
        if type_oid == DATE:
            return pc.cast(texts, pa.date32())
        if type_oid == TIMESTAMPTZ:  # '...+00' (TimeZone=UTC): the wall time is UTC
            naive = pc.cast(pc.utf8_slice_codeunits(texts, 0, -3), pa.timestamp("us"))
            return naive.cast(target)
        return pc.cast(texts, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
