"""The import graph of the slotlake package has no cycles between modules (function-level imports included), so
every module can be read, imported and tested after the ones it uses, and none between the stage packages either
(function-level imports included). The layer order itself (front ends > spark_apps > pipeline > pending > recover >
merge > decode > catalog > source > bronze, spark > foundations), the pure modules and source without Spark are
import-linter contracts in pyproject.toml, run by scripts/lint.sh."""
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


def test_no_import_cycles_between_the_packages_of_the_stages(monkeypatch):
    """`slotlake.<x>` and `slotlake.<y>` (packages or top modules) never import each other, however indirectly."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    graph = grimp.build_graph("slotlake", cache_dir=None)
    edges: dict[str, dict[str, str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = module.split(".")[1:2], imported.split(".")[1:2]
            if a and b and a != b and imported.startswith("slotlake."):
                edges.setdefault(a[0], {}).setdefault(b[0], f"{module} -> {imported}")

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), {}):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted(f"{a} -> {b} ({why}), and {b} reaches {a}" for a, out in edges.items() for b, why in out.items()
                    if reaches(b, a))
    assert not cycles, "package-level import cycles:\n" + "\n".join(cycles)
