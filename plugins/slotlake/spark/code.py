"""The slotlake code version (a hash of the package's sources, the Spark server's check) and the zip of the package
that a cluster's executors get (`--py-files`, or `addPyFile` for an in-process session)."""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../slotlake
CHECKOUT = PACKAGE_DIR.parents[1]  # the repository when running from a checkout (plugins/slotlake)


def jars_dir() -> Path:
    """Where the Delta jars (and `s3/`, `cds/`) are: `$SLOTLAKE_JARS_DIR`, else `.jars/` of the checkout."""
    return Path(os.environ.get("SLOTLAKE_JARS_DIR", CHECKOUT / ".jars"))


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def code_digest() -> str:
    """A hash of the slotlake sources: names one code version (the --py-files zip, the Spark server's code)."""
    digest = hashlib.sha256()
    for p in package_files():
        digest.update(str(p.relative_to(PACKAGE_DIR)).encode())
        digest.update(p.read_bytes())
    return digest.hexdigest()[:16]


def code_zip() -> str:
    """Build (or reuse) the zip of the slotlake package that --py-files ships to a cluster; returns its path.

    Named by a hash of the sources, so it is built once per code version and a concurrent run never sees a
    half-written file (written to a temp name, then renamed).
    """
    files = package_files()
    out_dir = Path(os.environ.get("SLOTLAKE_WORK_DIR", tempfile.gettempdir())) / "slotlake-pyfiles"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"slotlake-{code_digest()}.zip"
    if not target.exists():
        tmp = out_dir / f".{target.name}.{os.getpid()}.tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for p in files:
                zf.write(p, str(Path("slotlake") / p.relative_to(PACKAGE_DIR)))
        os.replace(tmp, target)
        log.info("built %s (%d modules) for --py-files", target, len(files))
    return str(target)
