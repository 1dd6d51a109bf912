"""The Lsn value type: parse, format, compare, arithmetic, bad input."""
from __future__ import annotations

import pytest

from slotlake.lsn import ZERO, Lsn

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text, value",
    [("0/0", 0), ("16/B374D848", 0x16_B374D848), ("16/b374d848", 0x16_B374D848), (" 0/1 ", 1),
     ("FFFFFFFF/FFFFFFFF", (1 << 64) - 1), ("00000016B374D848", 0x16_B374D848)],
    ids=["zero", "upper", "lower", "spaces", "max", "hex16"],
)
def test_parse(text, value):
    assert Lsn.parse(text) == Lsn(value)


@pytest.mark.parametrize("value, text, hex16", [(0, "0/0", "0000000000000000"),
                                                (0x16_B374D848, "16/B374D848", "00000016B374D848"),
                                                (0x1_0000000A, "1/A", "000000010000000A")],
                         ids=["zero", "typical", "short-low-part"])
def test_format_round_trips(value, text, hex16):
    lsn = Lsn(value)
    assert str(lsn) == text and lsn.hex16 == hex16 and repr(lsn) == f"Lsn('{text}')"
    assert Lsn.parse(str(lsn)) == lsn == Lsn.parse(lsn.hex16) and int(lsn) == value


def test_order_follows_value_not_text():
    # As text "9/0" > "10/0"; as LSNs it is smaller, and hex16 keeps lexical order = LSN order.
    a, b = Lsn.parse("9/0"), Lsn.parse("10/0")
    assert a < b and max(a, b) == b and sorted([b, a]) == [a, b]
    assert a.hex16 < b.hex16
    assert ZERO < Lsn(1) and Lsn(5) == Lsn.parse(5) and hash(Lsn(5)) == hash(Lsn.parse("0/5"))


def test_arithmetic():
    a = Lsn.parse("0/FFFFFFFF")
    assert a + 1 == Lsn.parse("1/0")
    assert Lsn.parse("1/0") - a == 1
    assert Lsn.parse("1/0") - 1 == a
    with pytest.raises(TypeError):
        a + a  # noqa: B018 - two positions cannot be added


@pytest.mark.parametrize("bad", ["", "16", "16/", "/1", "G/0", "123456789/0", "1/2/3", "0x16/1", "-1/0"],
                         ids=["empty", "no-slash", "no-low", "no-high", "not-hex", "high-too-long", "two-slashes",
                              "0x-prefix", "negative"])
def test_bad_text_is_rejected(bad):
    with pytest.raises(ValueError, match="not an LSN"):
        Lsn.parse(bad)


@pytest.mark.parametrize("value, exc", [(-1, ValueError), (1 << 64, ValueError), (True, TypeError), ("1", TypeError)],
                         ids=["negative", "too-big", "bool", "str"])
def test_bad_values_are_rejected(value, exc):
    with pytest.raises(exc):
        Lsn(value)


def test_subtracting_past_zero_fails():
    with pytest.raises(ValueError):
        Lsn(1) - 2
