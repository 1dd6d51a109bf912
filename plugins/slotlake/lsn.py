"""The `Lsn` value type: a PostgreSQL WAL position (pg_lsn), 64-bit, written `XXXXXXXX/XXXXXXXX`."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import overload

_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_MAX = (1 << 64) - 1


@dataclass(frozen=True, order=True, slots=True)
class Lsn:
    """A WAL position. Ordered, hashable, and convertible to and from pg_lsn text and int.

    `str(lsn)` is PostgreSQL's form (`16/B374D848`); `lsn.hex16` is a fixed-width form whose
    lexical order equals LSN order (used in file names).
    """

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or isinstance(self.value, bool):
            raise TypeError(f"Lsn value must be int, got {type(self.value).__name__}")
        if not 0 <= self.value <= _MAX:
            raise ValueError(f"Lsn out of range: {self.value}")

    @classmethod
    def parse(cls, text: str | int | Lsn) -> Lsn:
        """Parse `X/Y` (pg_lsn text), a fixed-width 16-digit hex form, or pass an int/Lsn through."""
        if isinstance(text, Lsn):
            return text
        if isinstance(text, int):
            return cls(text)
        s = text.strip()
        m = _TEXT.match(s)
        if m:
            return cls((int(m.group(1), 16) << 32) | int(m.group(2), 16))
        if re.fullmatch(r"[0-9A-Fa-f]{16}", s):
            return cls(int(s, 16))
        raise ValueError(f"not an LSN: {text!r} (expected the form 16/B374D848)")

    @classmethod
    def looks_like(cls, text: str) -> bool:
        return bool(_TEXT.match(text.strip()))

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def __int__(self) -> int:
        return self.value

    @property
    def hex16(self) -> str:
        return f"{self.value:016X}"

    def __add__(self, other: int) -> Lsn:
        if isinstance(other, Lsn):
            raise TypeError("adding two LSNs has no meaning; add a byte count")
        return Lsn(self.value + other)

    @overload
    def __sub__(self, other: Lsn) -> int: ...

    @overload
    def __sub__(self, other: int) -> Lsn: ...

    def __sub__(self, other: Lsn | int) -> int | Lsn:
        """`lsn - lsn` is a byte distance (int); `lsn - n` is an earlier Lsn."""
        if isinstance(other, Lsn):
            return self.value - other.value
        return Lsn(self.value - other)


ZERO = Lsn(0)
