"""Adding an engine touches only its own package: a fifth engine (a numpy
interpreter, tests/numpy_engine/) registered through the registry's plugin
variable runs `check` and `bisect` end to end through the real CLI, with real
exit codes and the real culprit, and needs nothing of bisect_tui but the contract."""

from __future__ import annotations

import ast
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bisect_tui.cli import main
from bisect_tui.engines.registry import PLUGINS_VARIABLE, engine_names

from fake_engine import save_two_linear

PACKAGE = Path(__file__).parent / "numpy_engine"
CULPRIT = ["l1/matmul", "l1/bias", "l1/relu"]  # the float16 MatMul+Add+Relu kernel


@pytest.fixture
def numpy_engine(monkeypatch):
    monkeypatch.setenv(PLUGINS_VARIABLE, "numpy=numpy_engine")


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "two_linear.onnx"
    save_two_linear(path)
    return path


def test_its_package_needs_only_the_contract():
    """Every import of bisect_tui in the engine's package is of bisect_tui.api."""
    seen = set()
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                seen.add(node.module)
            elif isinstance(node, ast.Import):
                seen.update(a.name for a in node.names)
    ours = {m for m in seen if m.split(".")[0] == "bisect_tui"}
    assert ours == {"bisect_tui.api"}, ours
    assert "numpy_engine" in seen  # the walk read the package's own imports too


def test_unregistered_it_is_refused_and_registered_it_is_listed(model, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(PLUGINS_VARIABLE, raising=False)
    assert "numpy" not in engine_names()
    code = main(["check", str(model), "--engine", "numpy", "--session", str(tmp_path / "s"), "-q"])
    assert code == 2 and "unknown engine 'numpy'" in capsys.readouterr().err
    monkeypatch.setenv(PLUGINS_VARIABLE, "numpy=numpy_engine")
    assert engine_names() == ["ort", "openvino", "tensorrt", "numpy"]


def test_check_and_bisect_end_to_end(numpy_engine, model, tmp_path, capsys):
    sess = tmp_path / "s"
    code = main(["check", str(model), "--engine", "numpy", "--session", str(sess),
                 "--json", str(tmp_path / "check.json"), "-q"])
    out = capsys.readouterr().out
    assert code == 1, out  # the float16 kernel breaks the FP32 tolerance
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["engine"] == "numpy" and check["verdict"] == "fail"
    assert [n["op_type"] for n in check["fused_nodes"] if n["is_fused"]] == ["FusedMatMulAddRelu", "FusedMatMulAdd"]
    (metrics,) = [o["metrics"] for o in check["outputs"].values()]
    assert 1e-4 < metrics["max_abs"] < 1.0  # float16 rounding, not garbage

    code = main(["bisect", str(model), "--engine", "numpy", "--session", str(sess),
                 "--json", str(tmp_path / "bisect.json"), "--bundle", str(tmp_path / "b.zip"), "-q"])
    out = capsys.readouterr().out
    assert code == 1, out
    b = json.loads((tmp_path / "bisect.json").read_text())["bisect"]
    assert b["verdict"] == "culprits"
    assert [c["original_nodes"] for c in b["culprits"]] == [CULPRIT]
    assert b["culprits"][0]["fused_node"] == "FusedMatMulAddRelu"
    w = b["workaround"]
    assert w["kind"] == "mark_outputs" and w["full_engine"]["passed"] is True
    assert set(w["marked_tensors"]) <= {"m1", "a1"}  # a tensor inside the culprit blocks it
    with zipfile.ZipFile(tmp_path / "b.zip") as z:
        spec = json.loads(z.read("repro/repro.json"))  # the contract's default repro: the data
        assert "repro/subgraph.onnx" in z.namelist()
    assert spec["config"]["precision"] == "fp32" and spec["outputs"]


def test_marking_inside_the_pattern_really_unfuses_it(model):
    """The contract the search relies on, checked on the engine itself: with a
    tensor of the pattern marked, the float16 kernel is gone and the output exact."""
    from numpy_engine import load

    from bisect_tui.api import EngineConfig

    engine = load()
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    exact = engine.build(model, EngineConfig(), ["a1"]).run({"x": x})["y"]
    fused = engine.build(model, EngineConfig()).run({"x": x})["y"]
    assert np.abs(fused - exact).max() > 1e-4
    import onnx
    from onnx.reference import ReferenceEvaluator

    (ref,) = ReferenceEvaluator(onnx.load(str(model))).run(None, {"x": x})
    assert np.abs(exact - ref).max() < 1e-5
