"""The bisection package's imports point one way.

Read from the source (an import inside a function counts, since it runs
sooner or later): no two modules of core/bisect import each other through any
chain, and the search's own parts (store, scheduler, trials, strategy, the
pools) load an engine only through the factory they are handed, never by
importing an engine package or the registry.
"""

from __future__ import annotations

import ast

from testlib import REPO

PACKAGE = REPO / "bisect_tui" / "core" / "bisect"
PREFIX = "bisect_tui.core.bisect."
SEARCH_PARTS = ["store", "scheduler", "trials", "strategy", "suspects", "verdicts", "records", "search", "pool",
                "ray_pool", "early", "run", "findings", "precision", "judge", "command"]


def _imports(name: str) -> set[str]:
    """Every module `name` imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    mods = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    return {m: {i[len(PREFIX):] for i in _imports(m) if i.startswith(PREFIX) and i[len(PREFIX):] in mods} - {m}
            for m in mods}


def test_no_import_cycle_inside_the_bisection_package():
    graph = _graph()
    assert {"early", "search", "pool", "ray_pool"} <= set(graph)  # the graph was really read

    def reaches(a: str, b: str, seen: set) -> bool:
        return any(n == b or (n not in seen and not seen.add(n) and reaches(n, b, seen)) for n in graph[a])

    cycles = [(a, b) for a in graph for b in graph[a] if reaches(b, a, set())]
    assert cycles == []


def test_the_search_parts_import_no_engine_package():
    for name in SEARCH_PARTS:
        engines = {i for i in _imports(name) if i.startswith("bisect_tui.engines")}
        assert engines <= {"bisect_tui.api", "bisect_tui.api.EngineConfig",
                           "bisect_tui.api.FusedNode", "bisect_tui.api.LEVELS"}, (name, engines)
