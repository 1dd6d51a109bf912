"""slotlake's processes allocate Arrow buffers from jemalloc (`slotlake.ARROW_POOL`), not pyarrow's default
mimalloc, unless the user's `ARROW_DEFAULT_MEMORY_POOL` names a pool: whether pyarrow is imported before or after
slotlake, and in the processes they start. Each case in a fresh interpreter (the pool is chosen once per process)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"

# the pool pyarrow allocates from here, and the one a child process (a Spark Python worker, a CLI child) gets
PROBE = """
import subprocess, sys
{imports}
a = pa.array(range(1000))  # allocates through the default pool
child = subprocess.run([sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(pa.default_memory_pool().backend_name, child, pa.total_allocated_bytes() > 0)
"""


def _pools(imports: str, pool: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGINS), env.get("PYTHONPATH", "")])
    if pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = pool
    out = subprocess.run([sys.executable, "-c", PROBE.format(imports=imports)], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


@pytest.mark.parametrize("imports", ["import slotlake\nimport pyarrow as pa", "import pyarrow as pa\nimport slotlake"])
def test_slotlake_allocates_from_jemalloc_in_its_process_and_its_children(imports):
    import slotlake

    assert _pools(imports, None) == [slotlake.ARROW_POOL, slotlake.ARROW_POOL, "True"] == ["jemalloc", "jemalloc",
                                                                                          "True"]


@pytest.mark.parametrize("imports", ["import slotlake\nimport pyarrow as pa", "import pyarrow as pa\nimport slotlake"])
def test_the_users_arrow_pool_stands(imports):
    assert _pools(imports, "system") == ["system", "system", "True"]


def test_without_slotlake_pyarrow_keeps_its_own_default():
    """The probe tells the pools apart: pyarrow alone does not pick jemalloc here (its default is mimalloc)."""
    assert _pools("import pyarrow as pa", None)[0] == "mimalloc"
