"""The import graph of the slotlake package has no cycles between modules (function-level imports included), so
every module can be read, imported and tested after the ones it uses. The package-level rules (pure decoder,
core without front ends, source without Spark, no cycles inside a package) are import-linter contracts in
pyproject.toml, run by scripts/lint.sh."""
from __future__ import annotations

from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.unit

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def test_no_import_cycles_between_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    graph = grimp.build_graph("slotlake", cache_dir=None)
    cycles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("slotlake") and graph.chain_exists(importer=imported, imported=module):
                chain = graph.find_shortest_chain(importer=imported, imported=module)
                cycles.add(f"{module} -> {' -> '.join(chain or ())}")
    assert not cycles, "import cycles (move the shared part into a module both can import):\n" + "\n".join(
        sorted(cycles))


def test_the_cycle_check_sees_function_level_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyc import a\n    return a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyc", cache_dir=None)
    assert graph.chain_exists(importer="cyc.b", imported="cyc.a")
    assert graph.chain_exists(importer="cyc.a", imported="cyc.b")
