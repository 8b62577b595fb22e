"""The one options module: the picker's input flags go through the same
declarations and checks as `check`; the step order is declared once; the CLI,
compare_cli, the app and the picker import each other in one direction; the
core's triage modules import no engine package; Triage uses the engine it is
given."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from bisect_tui.api import EngineBase
from bisect_tui.core.errors import UserError
from bisect_tui.core.pipeline import CHECK_STEPS, Triage, TriageOptions, plan_steps
from bisect_tui.options import options_for_input_flags

from testlib import REPO

PKG = REPO / "bisect_tui"


def test_picker_flags_are_the_check_flags(samples):
    opts = options_for_input_flags(samples / "cnn.onnx", "--shape x=1x3x8x8 --seed 3 --input-value 'sr=16000'")
    assert opts.shapes == {"x": [1, 3, 8, 8]} and opts.seed == 3 and opts.input_values == {"sr": 16000}
    assert opts.model == samples / "cnn.onnx"
    with pytest.raises(UserError, match="--level is not an input option here"):
        options_for_input_flags(samples / "cnn.onnx", "--level basic")
    with pytest.raises(UserError, match="--samples must be between 1 and"):
        options_for_input_flags(samples / "cnn.onnx", "--samples 0")
    with pytest.raises(UserError, match=r"^input options: argument --seed: invalid int value: 'abc'$"):
        options_for_input_flags(samples / "cnn.onnx", "--seed abc")
    with pytest.raises(UserError, match="input options: No closing quotation"):
        options_for_input_flags(samples / "cnn.onnx", "--shape 'x=1")


def test_plan_takes_what_a_step_needs_in_checklist_order():
    assert CHECK_STEPS == ("inputs", "baseline", "determinism", "range_check", "fused")
    assert plan_steps(["fused"], {}) == ["inputs", "baseline", "fused"]
    assert plan_steps(["fused", "determinism"], {"inputs": True}) == ["baseline", "determinism", "fused"]
    assert plan_steps(["range_check"], {"inputs": True, "baseline": True}) == ["range_check"]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_cli_app_and_picker_import_in_one_direction():
    edges = {name: _imports(PKG / path) for name, path in {
        "cli": "cli.py", "commands": "commands.py", "compare_cli": "compare_cli.py", "options": "options.py",
        "app": "tui/app.py", "workers": "tui/workers.py", "handlers": "tui/handlers.py",
        "picker": "tui/screens/picker.py"}.items()}
    for name in ("compare_cli", "options", "app", "workers", "handlers", "picker", "commands"):
        assert "bisect_tui.cli" not in edges[name], name
    for name in ("options", "app", "workers", "handlers", "picker"):
        assert "bisect_tui.compare_cli" not in edges[name] and "bisect_tui.commands" not in edges[name], name
    assert not any(m.startswith("bisect_tui.tui") for m in edges["options"])
    assert "bisect_tui.options" in edges["picker"] and "bisect_tui.options" in edges["compare_cli"]


def test_the_triage_modules_import_no_engine():
    files = [*sorted((PKG / "core" / "triage").glob("*.py")), PKG / "core" / "pipeline.py",
             PKG / "core" / "commandline.py"]
    assert len(files) > 8
    for f in files:
        bad = {m for m in _imports(f) if m.startswith("bisect_tui.engines") and not m.startswith("bisect_tui.api")}
        assert not bad, (f.name, bad)
        text = f.read_text(encoding="utf-8")
        for word in ("ONNX Runtime", "ORT_", "disabled_optimizers", "onnxruntime"):
            assert word not in text, (f.name, word)


class CountingEngine(EngineBase):
    """Stands for an engine the caller chose; only its loading is looked at here."""

    made = 0

    def __init__(self) -> None:
        CountingEngine.made += 1


def make_counting_engine() -> CountingEngine:
    return CountingEngine()


def test_triage_uses_the_engine_it_is_given(samples):
    opts = TriageOptions(model=samples / "cnn.onnx", engine="no-such-engine")
    before = CountingEngine.made
    t = Triage(opts, engine_factory=make_counting_engine)
    assert isinstance(t.engine, CountingEngine) and t.engine is t.engine  # made once, kept
    assert CountingEngine.made == before + 1
    given = CountingEngine()
    assert Triage(opts, engine=given).engine is given
    # without one, the installed catalog (the registry, in these tests) is asked, by name
    with pytest.raises(UserError, match="unknown engine 'no-such-engine'"):
        Triage(opts).engine
    factory = Triage(TriageOptions(model=samples / "cnn.onnx")).engine_factory
    assert type(pickle.loads(pickle.dumps(factory))()).__name__ == type(factory()).__name__
