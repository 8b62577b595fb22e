"""The engine-neutral core in fact: core/ and tui/ import no engine and name none.

Every module of bisect_tui/core and bisect_tui/tui is read with `ast`, so an
import inside a function counts as much as one at the top. Rules:

* core imports nothing of `bisect_tui.engines` (not even the registry: the
  caller hands it an engine or a resolver); tui may reach the engines only
  through the registry and the flags built from the declarations
  (`bisect_tui.engines.registry`, `bisect_tui.engines.flags`), never an engine
  package nor the `bisect_tui.engines` package itself;
* neither imports an engine's library (onnxruntime, openvino, tensorrt, polygraphy);
* neither names engine vocabulary in code or strings: identifiers, attribute
  names, keyword names and every string constant count, docstrings included
  (they are what a reader takes for the module's subject). Comments are not
  read: a comment may say which engine made a design necessary, the code may not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "bisect_tui"
PACKAGES = ("core", "tui")
LIBRARIES = ("onnxruntime", "openvino", "tensorrt", "polygraphy")
TUI_MAY_IMPORT = ("bisect_tui.engines.registry", "bisect_tui.engines.flags")
# engine vocabulary: library names in any case; ORT's own identifiers as they are spelt
VOCABULARY = re.compile(
    r"SessionOptions|InferenceSession|disabled_optimizers|graph_optimization_level|\bORT_"
    r"|(?i:onnxruntime|openvino|tensorrt|polygraphy|ONNX Runtime)")


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement, relative ones resolved."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")[: len(module.split(".")) - node.level + (1 if module.endswith("__init__") else 0)]
                base = ".".join(pkg + ([base] if base else []))
            out.append((node.lineno, base))
            # `from bisect_tui.engines import ort` imports the submodule too
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names
                    if base == "bisect_tui.engines" and a.name != "*"]
    return out


def _import_problems(path: Path, tree: ast.AST) -> list[str]:
    module = _module_name(path)
    package = module.split(".")[1]
    problems = []
    for line, name in _imports(tree, module):
        top = name.split(".")[0]
        if top in LIBRARIES:
            problems.append(f"{line}: imports {name}")
        elif name == "bisect_tui.engines" or name.startswith("bisect_tui.engines."):
            allowed = package == "tui" and any(name == a or name.startswith(a + ".") for a in TUI_MAY_IMPORT)
            if not allowed:
                problems.append(f"{line}: imports {name}")
    return problems


def _words(tree: ast.AST):
    """(line, text) of every identifier and string constant in the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.keyword) and node.arg:
            yield getattr(node, "lineno", 0), node.arg
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, ast.alias):
            yield getattr(node, "lineno", 0), node.asname or node.name


def _vocabulary_problems(tree: ast.AST) -> list[str]:
    seen = []
    for line, text in _words(tree):
        for m in VOCABULARY.finditer(text):
            seen.append(f"{line}: names {m.group(0)!r}")
    return list(dict.fromkeys(seen))


def violations() -> dict[str, list[str]]:
    out = {}
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found = _import_problems(path, tree) + _vocabulary_problems(tree)
        if found:
            out[str(path.relative_to(ROOT.parent))] = found
    return out


def test_the_rules_see_what_they_are_meant_to_see(tmp_path):
    """The checker itself: an import inside a function, a docstring and an
    attribute are caught; a comment and a neutral word are not."""
    src = ('"""Runs the model in ONNX Runtime."""\n'
           "def f():\n    from bisect_tui.engines.ort import load\n    import onnxruntime as rt\n"
           "    so = rt.SessionOptions()  # a comment about OpenVINO is allowed\n"
           "    return so, 'sorted', SORT_KEY\n")
    tree = ast.parse(src)
    problems = _import_problems(ROOT / "core" / "x.py", tree) + _vocabulary_problems(tree)
    assert problems == ["3: imports bisect_tui.engines.ort", "4: imports onnxruntime",
                        "1: names 'ONNX Runtime'", "5: names 'SessionOptions'"]
    tui = ast.parse("from bisect_tui.engines.registry import get_engine\nfrom bisect_tui.engines import ort\n")
    assert _import_problems(ROOT / "tui" / "x.py", tui) == ["2: imports bisect_tui.engines",
                                                             "2: imports bisect_tui.engines.ort"]
    core = ast.parse("from bisect_tui.engines.registry import get_engine\n")
    assert _import_problems(ROOT / "core" / "x.py", core) == ["1: imports bisect_tui.engines.registry"]


def test_core_and_tui_import_no_engine_and_name_none():
    found = violations()
    assert _modules() and len(_modules()) > 50  # the walk really read the packages
    report = "\n".join(f"{path}:{p}" for path, problems in sorted(found.items()) for p in problems)
    assert not found, f"{len(found)} module(s) of core/ or tui/ speak an engine's language:\n{report}"


def test_the_contract_is_a_leaf():
    """bisect_tui.api imports nothing of bisect_tui outside itself, and importing
    it loads no third-party library (numpy is named in annotations only)."""
    import subprocess
    import sys

    for path in sorted((ROOT / "api").glob("*.py")):
        for line, name in _imports(ast.parse(path.read_text(encoding="utf-8")), _module_name(path)):
            if name.split(".")[0] == "bisect_tui":
                assert name == "bisect_tui.api" or name.startswith("bisect_tui.api."), f"{path}:{line} {name}"
    # every name of the contract (they are loaded on first use)
    code = "import sys; from bisect_tui.api import *; print('\\n'.join(sys.modules))"
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.split())
    assert "bisect_tui.api.engine" in mods  # the import really happened
    ours = {m for m in mods if m.startswith("bisect_tui.")}
    assert ours <= {"bisect_tui.api"} | {m for m in ours if m.startswith("bisect_tui.api.")}, ours
    assert not mods & {"numpy", "onnx", "onnxruntime", "openvino", "textual"}
