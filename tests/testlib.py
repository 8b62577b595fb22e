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
