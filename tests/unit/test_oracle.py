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
