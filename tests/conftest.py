"""Shared fixtures: sample models built once per test run, tiny models built
with onnx.helper, and an isolated state dir so tests never touch $HOME."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def samples(tmp_path_factory) -> Path:
    """sample_models/*.onnx built fresh by the repo's own script."""
    out = tmp_path_factory.mktemp("samples")
    subprocess.run([sys.executable, str(REPO / "sample_models" / "build.py"), "--out", str(out), "-q"],
                   check=True)
    return out


@pytest.fixture(scope="session")
def cases(samples) -> dict:
    data = json.loads((samples / "cases.json").read_text())
    return {Path(c["model"]).stem: c for c in data["cases"]}


def make_model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


@pytest.fixture
def tiny_model(tmp_path) -> Path:
    """x[2,8] -> MatMul -> Relu -> Mul(b,b) -> y ; weights scaled to overflow fp16 at y."""
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) * 300
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Mul", ["b", "b"], ["y"], name="square"),
    ]
    m = make_model(nodes, [vi("x", [2, 8])], [vi("y", [2, 8])], [init("w", w)])
    p = tmp_path / "tiny.onnx"
    onnx.save(m, p)
    return p


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
