"""The slotlake code version: a hash of the package's sources (the --py-files zip's name, the Spark server's check)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from slotlake.spark.session import PACKAGE_DIR


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def code_digest() -> str:
    """A hash of the slotlake sources: names one code version (the --py-files zip, the Spark server's code)."""
    digest = hashlib.sha256()
    for p in package_files():
        digest.update(str(p.relative_to(PACKAGE_DIR)).encode())
        digest.update(p.read_bytes())
    return digest.hexdigest()[:16]
