"""Helpers shared by the tests (tiny ONNX models, ORT-version-aware answers).

A plain module rather than conftest.py: tests/ and tests/tui/ both have a
conftest, and `from conftest import ...` would depend on import order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]


def make_model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def ort_version() -> tuple[int, int]:
    import onnxruntime

    major, minor = onnxruntime.__version__.split(".")[:2]
    return int(major), int(minor)


# Before ~1.20, ORT fused a MatMul's bias Add into the Gelu (BiasGelu, then
# FastGelu with a bias input); since MatMulAddFusion runs at level 1 the bias
# goes into a Gemm instead. The sample answers (cases.json) are recorded for
# the newer behaviour; on older releases the culprit also holds the bias Add.
OLD_ORT_FUSIONS = ort_version() < (1, 20)
old_ort_skip = pytest.mark.skipif(
    OLD_ORT_FUSIONS, reason="answer recorded for ORT >= 1.20 fusions (fp16 LayerNorm, Gemm bias)")


def culprit_matches(found: list[str], expected: list[str]) -> bool:
    """The tool's culprit equals the recorded pattern (plus, on ORT < 1.20, the
    bias Add that ORT folds into the fused Gelu)."""
    if found == expected:
        return True
    extra = [n for n in found if n not in expected]
    return (OLD_ORT_FUSIONS and [n for n in found if n in expected] == expected
            and len(extra) == 1 and extra[0].endswith("bias"))


def gelu_triage(model, root):
    """A checked triage of `model` with ORT's Gelu approximation on (the samples' failure)."""
    from bisect_tui.core.pipeline import Triage, TriageOptions
    from bisect_tui.api import EngineConfig

    t = Triage(TriageOptions(model=model, session_dir=root, config=EngineConfig(
        config_entries=(("optimization.enable_gelu_approximation", "1"),))), lambda p: None)
    t.run_all()
    return t


def search_shape(res: dict) -> dict:
    """What must not depend on the number of workers or the pool."""
    return {
        "verdict": res["verdict"],
        "culprits": [c["original_nodes"] for c in res["culprits"]],
        "passes": [c["attribution"]["confirmed"] for c in res["culprits"]],
        "workaround": res["workaround"]["disabled_optimizers"],
        "builds": res["engine_builds"],
        "steps": [(s["kind"], s["region"], s["passed"], s["builds"]) for s in res["steps"]],
    }


# --------------------------------------------------------------------------- the package's import graph


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (a folder under `root`) by dotted name; a
    package's __init__.py is the package module itself."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports, read with `ast` (so an
    import inside a function or under `if TYPE_CHECKING` is an edge too).
    `from pkg import name` is an edge to the submodule pkg.name when there is
    one, else to pkg; relative imports are resolved against the importer."""
    import ast

    modules = module_names(root, package)

    def known(name: str) -> str | None:
        while name and name not in modules:  # `import a.b.c` where c is a name in a.b: a.b
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                hit = known(target)
                if hit:
                    graph[name].add(hit)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of the graph: each strongly connected component of more than
    one module (Tarjan's algorithm, iterative), and each module importing
    itself; modules sorted within a cycle, cycles sorted by their first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)
