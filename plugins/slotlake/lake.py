"""Where things live under `<lake>/<source>/` (DESIGN.md "Lake layout")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LakePaths:
    """Paths of one source's lake. `root` is `<lake>/<source>` (a local path or a URI)."""

    root: str

    @classmethod
    def of(cls, lake: str, source: str) -> LakePaths:
        return cls(f"{lake.rstrip('/')}/{source}")

    @property
    def bronze(self) -> str:
        return f"{self.root}/bronze"

    @property
    def catalog(self) -> str:
        return f"{self.root}/_catalog"

    @property
    def changes(self) -> str:
        return f"{self.root}/silver/changes"

    @property
    def quarantine(self) -> str:
        return f"{self.root}/_quarantine"

    @property
    def runs(self) -> str:
        """Delta table: one row per (run, gold table) with the end LSN and the table's Delta version."""
        return f"{self.root}/_runs"

    def gold(self, schema: str, table: str) -> str:
        return f"{self.root}/gold/{schema}/{table}"
