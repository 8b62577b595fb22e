"""No import cycles between the modules of bisect_tui: a cycle means two
modules hold one idea between them (or one idea is in the wrong place), and it
breaks as soon as either side imports the other at module level."""

from __future__ import annotations

from testlib import REPO, import_cycles, import_graph


def cycle_report(cycles: list[list[str]], graph: dict[str, set[str]]) -> str:
    """One paragraph per cycle: its modules, then each import edge inside it."""
    lines = [f"{len(cycles)} import cycle(s):"]
    for cycle in cycles:
        members = set(cycle)
        lines.append("  " + " <-> ".join(cycle))
        for module in cycle:
            for target in sorted(graph[module] & members):
                lines.append(f"      {module} imports {target}")
    return "\n".join(lines)


def test_bisect_tui_has_no_import_cycles():
    graph = import_graph(REPO, "bisect_tui")
    assert "bisect_tui.core.pipeline" in graph and graph["bisect_tui.cli"]  # it really read the package
    cycles = import_cycles(graph)
    assert not cycles, cycle_report(cycles, graph)


def write_package(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_walker_finds_every_kind_of_cycle(tmp_path):
    """The same functions on a small package: a cycle through an import inside
    a function, one through a relative `from . import submodule`, one through a
    package __init__, a self-import, and modules that only import one way."""
    write_package(tmp_path, {
        "pkg/__init__.py": "from pkg.c import thing\n",
        "pkg/a.py": "import os\nfrom pkg import b\n",
        "pkg/b.py": "def late():\n    import pkg.a\n",
        "pkg/c.py": "from pkg import d\nthing = 1\n",
        "pkg/d.py": "from pkg import thing\n",  # `thing` is no submodule: an edge to pkg itself
        "pkg/sub/__init__.py": "",
        "pkg/sub/e.py": "from . import f\nfrom .. import a\n",
        "pkg/sub/f.py": "from .e import x\n",
        "pkg/sub/g.py": "import pkg.sub.g\nfrom ..sub import e\n",
        "pkg/sub/h.py": "from pkg.sub import e, f\n",  # imports into a cycle, is in none
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.e"] == {"pkg.sub.f", "pkg.a"}
    assert graph["pkg.sub.h"] == {"pkg.sub.e", "pkg.sub.f"}
    assert graph["pkg.a"] == {"pkg.b"}
    assert import_cycles(graph) == [
        ["pkg", "pkg.c", "pkg.d"],
        ["pkg.a", "pkg.b"],
        ["pkg.sub.e", "pkg.sub.f"],
        ["pkg.sub.g"],
    ]
    report = cycle_report(import_cycles(graph), graph)
    assert "pkg.a <-> pkg.b" in report and "pkg.b imports pkg.a" in report
    assert "pkg.sub.g imports pkg.sub.g" in report


def test_no_cycle_no_report(tmp_path):
    write_package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import json\n"})
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert import_cycles(graph) == []
