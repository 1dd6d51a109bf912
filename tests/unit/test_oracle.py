"""The oracle's canonical text form must tell values apart exactly (it is what every end-to-end test trusts)."""
from __future__ import annotations

import decimal

import pytest

from oracle import canonical

pytestmark = pytest.mark.unit


def test_numeric_keeps_every_digit():
    big = decimal.Decimal("123456789012345678901234567890.123")
    assert canonical(big, "numeric") == "123456789012345678901234567890.123"
    assert canonical(big, "numeric") != canonical(big + decimal.Decimal("0.001"), "numeric")


def test_numeric_scale_does_not_matter():
    assert canonical(decimal.Decimal("1.500"), "numeric") == canonical(decimal.Decimal("1.5"), "numeric") == "1.5"
    assert canonical(decimal.Decimal("1E+3"), "numeric") == "1000"
    assert canonical(decimal.Decimal("0.000"), "numeric") == "0"


def test_numeric_kept_as_text_compares_character_for_character():
    # numeric.unconstrained: string keeps PostgreSQL's text; the oracle then compares texts, not values
    assert canonical("1.50", "numeric") == "1.50" != canonical("1.5", "numeric")
    assert canonical("NaN", "numeric") == "NaN" and canonical("-Infinity", "numeric") == "-Infinity"
    assert canonical(["1.0", None, "NaN"], "_numeric") != canonical(["1.00", None, "NaN"], "_numeric")
