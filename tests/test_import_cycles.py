"""No import cycles anywhere in lipcast: any module that imports another must not be reachable back from it.

The layer and independence rules are import-linter contracts (``[tool.importlinter]`` in pyproject.toml,
``lint-imports`` in ``make test``); this asks grimp, the graph library import-linter is built on, for the
cycles themselves, between single modules, lazy and ``TYPE_CHECKING`` imports included.
"""

from __future__ import annotations

import grimp

ROOT = "lipcast"


def find_cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """One cycle per import that closes one, shortest first (each as importer, ..., importer)."""
    cycles: set[tuple[str, ...]] = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycle = (importer, *back)
                start = cycle.index(min(cycle[:-1]))  # the same cycle found from each of its modules
                cycles.add((*cycle[start:-1], *cycle[:start], cycle[start]))
    return sorted(cycles, key=len)


def test_no_module_imports_itself_through_others() -> None:
    cycles = find_cycles(grimp.build_graph(ROOT))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    assert find_cycles(graph) == []
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert find_cycles(graph) == [("pkg.a", "pkg.b", "pkg.c", "pkg.a")]
