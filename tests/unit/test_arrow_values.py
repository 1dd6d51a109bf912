"""PostgreSQL text -> Arrow values for the in-process merge (slotlake.merge.arrow_values): exact or None."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa

from slotlake.decode.types import BOOL, BYTEA, DATE, FLOAT8, INT2, INT4, INT8, NUMERIC, TEXT, TIMESTAMP, TIMESTAMPTZ
from slotlake.merge.arrow_values import supported, typed_array

UTC = dt.UTC


def typed(texts, oid, typmod=-1):
    out = typed_array(pa.array(texts, pa.string()), oid, typmod, "decimal")
    return None if out is None else out.to_pylist()


def test_integers_and_booleans_are_exact_and_an_overflow_declines():
    assert typed(["-32768", "32767", None], INT2) == [-32768, 32767, None]
    assert typed(["-2147483648", "7"], INT4) == [-2147483648, 7]
    assert typed(["9223372036854775807"], INT8) == [9223372036854775807]
    assert typed(["32768"], INT2) is None
    assert typed(["t", "f", None], BOOL) == [True, False, None]
    assert typed(["t", "yes"], BOOL) is None


def test_text_stays_as_printed():
    assert typed(["a  ", "", None, "ü"], TEXT) == ["a  ", "", None, "ü"]


def test_dates_and_time_stamps_of_plain_iso_text():
    assert typed(["2024-02-29", None, "1900-01-01", "9999-12-31"], DATE) == [
        dt.date(2024, 2, 29), None, dt.date(1900, 1, 1), dt.date(9999, 12, 31)]
    assert typed(["2024-01-01 12:00:00", "2024-01-01 12:00:00.000001", "1999-12-31 23:59:59.5"], TIMESTAMP) == [
        dt.datetime(2024, 1, 1, 12), dt.datetime(2024, 1, 1, 12, 0, 0, 1),
        dt.datetime(1999, 12, 31, 23, 59, 59, 500000)]
    assert typed(["2024-01-01 12:00:00.123456+00", None], TIMESTAMPTZ) == [
        dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC), None]


def test_what_only_spark_types_declines():
    for texts, oid in [(["infinity"], TIMESTAMP), (["-infinity"], TIMESTAMPTZ), (["2024-01-01 BC"], DATE),
                       (["0044-03-15 12:00:00 BC"], TIMESTAMP), (["12345-01-01"], DATE), (["1582-10-10"], DATE),
                       (["2024-01-01 12:00:00+05:30"], TIMESTAMPTZ), (["2024-01-01 12:00:00"], TIMESTAMPTZ)]:
        assert typed(texts, oid) is None, (texts, oid)
    for oid in (FLOAT8, BYTEA, 1007):  # float8, bytea, int4[]
        assert not supported(oid, -1, "decimal")
        assert typed(["1"], oid) is None


def numeric(p: int, s: int) -> int:
    return (p << 16 | s) + 4  # PostgreSQL's typmod of numeric(p,s)


def test_numerics_into_decimals_exactly_or_not_at_all():
    """A numeric's text becomes gold's decimal when it holds every digit; a value Spark's merge would quarantine
    (NaN, an infinity, more digits than the decimal holds, a fraction it would round) declines the batch."""
    from decimal import Decimal

    assert typed(["123.45", "-0.01", "99999999.99", None], NUMERIC, numeric(10, 2)) == [
        Decimal("123.45"), Decimal("-0.01"), Decimal("99999999.99"), None]
    big = "12345678901234567890.123456789012345678"  # unconstrained: decimal(38,18)
    assert typed([big, "1.5", "-0.000000000000000001"], NUMERIC) == [
        Decimal(big), Decimal("1.5"), Decimal("-0.000000000000000001")]
    assert typed(["1.0000000000000000000000"], NUMERIC) == [Decimal(1)]  # zeros past the 18th digit: exact
    for texts, typmod in [(["NaN"], numeric(10, 2)), (["Infinity"], -1), (["-Infinity"], -1),
                          (["0.0000000000000000001"], -1), (["123456789012345678901"], -1), (["1e5"], -1),
                          (["123.456"], numeric(10, 2))]:
        assert typed(texts, NUMERIC, typmod) is None, texts
    # kept as PostgreSQL's text (over 38 digits, or unconstrained with `numeric.unconstrained: string`): as printed
    assert typed(["1.50", "NaN"], NUMERIC, numeric(39, 2)) == ["1.50", "NaN"]
    assert typed_array(pa.array(["NaN", "0.1"]), NUMERIC, -1, "string").to_pylist() == ["NaN", "0.1"]


def test_rows_equal_to_gold_rows_match_with_nulls_equal_and_nothing_else():
    """The FULL append's check (`in_process._equal_rows`): a batch row matches a gold row when every column is equal
    or NULL on both sides, as the MERGE's `<=>`; "" and 0 (the fill values) do not match NULL."""
    from slotlake.merge.in_process import _equal_rows

    ts = pa.timestamp("us", "UTC")
    dec = pa.decimal128(6, 3)
    batch = pa.table({"a": pa.array([1, None, 0, 2], pa.int32()), "b": pa.array(["x", None, "", None]),
                      "t": pa.array([5, 6, 0, None], ts), "d": pa.array([1, None, 0, 3], pa.date32()),
                      "ok": pa.array([True, None, False, None]),
                      "v": pa.array([Decimal("1.5"), None, Decimal(0), None], dec)})
    gold = pa.table({"a": pa.array([1, None, None, 2], pa.int32()), "b": pa.array(["x", None, None, "y"]),
                     "t": pa.array([5, 6, None, None], ts), "d": pa.array([1, None, None, 3], pa.date32()),
                     "ok": pa.array([True, None, None, None]),
                     "v": pa.array([Decimal("1.500"), None, None, None], dec)})
    assert sorted(_equal_rows(batch, gold).column("v0").to_pylist()) == [0, 1]  # rows 0 and 1 (a NULL -> 0)
    assert _equal_rows(batch.slice(2), gold).num_rows == 0  # (0, "", epoch, epoch, false, 0) is not all NULL
    assert _equal_rows(batch, gold.slice(0, 0)).num_rows == 0
