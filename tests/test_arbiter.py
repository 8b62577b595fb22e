"""The float64 arbiter on real ONNX models: is the fused result really worse
than FP32, or is the tolerance tighter than FP32's own error?"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bisect_tui.core.arbiter import arbitrate, factor_for
from bisect_tui.core.errors import UserError
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.core.reference import Float64Reference
from bisect_tui.engines.ort.unfused import OrtUnfused
from bisect_tui.core.report import arbiter_markdown, check_markdown, check_text
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.core.triage.records import ArbiterResult
from bisect_tui.api import EngineConfig

GELU = (("optimization.enable_gelu_approximation", "1"),)


def run(samples: Path, tmp: Path, tol, config=()) -> Triage:
    t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp, max_memory=4 << 30,
                             tolerance=tol, config=EngineConfig(config_entries=config)))
    t.run_all()
    return t


def test_gelu_approximation_is_really_worse_than_fp32(samples, tmp_path):
    t = run(samples, tmp_path / "s", parse_tolerance("fp32"), GELU)
    s = t.summary()
    assert s["verdict"] == "fail"
    arb = s["arbiter"]
    assert arb["available"] and arb["truth_source"] == "onnx.reference.ReferenceEvaluator (float64)"
    (name, o), = arb["outputs"].items()
    assert name == "mlp/residual:0"
    # FP32 is ~1e-6 from the truth; the tanh approximation of Gelu ~5e-4
    assert o["baseline"]["rmse"] < 1e-5 and o["fused"]["rmse"] > 1e-4
    assert o["ratio"] > 100 and o["verdict"] == "worse" and not o["too_tight"]
    text = check_text(s)
    assert "[WORSE] mlp/residual:0" in text and "run `bisect-tui bisect`" in text


def test_too_tight_atol_fails_but_fused_is_not_worse(samples, tmp_path):
    tight = parse_tolerance("fp32", atol=1e-9, rtol=0.0)
    t = run(samples, tmp_path / "s", tight)
    s = t.summary()
    assert s["verdict"] == "fail" and s["exit_code"] == 1  # the tolerance still decides the exit code
    o = s["arbiter"]["outputs"]["mlp/residual:0"]
    assert o["tolerance_passed"] is False and o["not_worse"] and o["too_tight"]
    assert o["ratio"] <= 2.0
    text = check_text(s)
    assert "[not worse] mlp/residual:0" in text and "loosen" in text
    assert "run `bisect-tui bisect`" not in text
    md = check_markdown(s)
    assert "### Float64 arbiter" in md and "FAIL (too tight)" in md and "`mlp/residual:0`" in md
    # the same numbers again from the session: the arbiter's result is reused by key
    t2 = run(samples, tmp_path / "s", tight)
    assert t2.arbiter == t.arbiter


def test_float64_falls_back_to_ort_double_and_says_so():
    nodes = [helper.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", name="fmm")]
    w = onnx.numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 7, "w")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    ref = Float64Reference(m, OrtUnfused())
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    y = ref.run({"x": x}, ["y"])["y"]
    assert y.dtype == np.float64
    assert ref.ran_with == "onnxruntime in double (ORT_DISABLE_ALL)"
    assert "FusedMatMul" in ref.fallback_reason
    np.testing.assert_allclose(y, x.astype(np.float64) @ (np.arange(16).reshape(4, 4) / 7), rtol=1e-7)
    # an op neither can run in double: one plain error, never a crash
    bad = helper.make_model(helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", name="g")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    bad.ir_version = 8
    with pytest.raises(UserError, match="no float64 truth"):
        Float64Reference(bad, OrtUnfused()).run({"x": np.ones(2, np.float32)}, ["y"])


def test_rule_factor_and_floor():
    assert factor_for("fp32") == 2.0 and factor_for("fp16") == 2.0 and factor_for("bf16") == 3.0
    rng = np.random.default_rng(0)
    truth = rng.standard_normal((1, 100))
    base = (truth + rng.standard_normal((1, 100)) * 1e-7).astype(np.float32)
    fused_same = (truth + rng.standard_normal((1, 100)) * 1.5e-7).astype(np.float32)
    fused_bad = (truth + rng.standard_normal((1, 100)) * 1e-4).astype(np.float32)
    a = arbitrate({"y": truth}, {"y": base}, {"y": fused_same}, "fp32", "test", {"y": False})
    assert a.outputs[0].not_worse and a.outputs[0].too_tight
    b = arbitrate({"y": truth}, {"y": base}, {"y": fused_bad}, "fp32", "test", {"y": False})
    assert not b.outputs[0].not_worse and b.outputs[0].ratio > 100
    # a baseline that hits the truth exactly does not make 1 ulp "infinitely worse"
    exact = np.full((1, 8), 0.5)
    c = arbitrate({"y": exact}, {"y": exact.astype(np.float32)},
                  {"y": np.nextafter(exact.astype(np.float32), np.float32(1))}, "fp32", "test")
    assert np.isfinite(c.outputs[0].ratio) and c.outputs[0].ratio <= 2.0


def test_markdown_escapes_output_names():
    d = arbitrate({"a|b`*": np.ones((1, 2))}, {"a|b`*": np.ones((1, 2), np.float32)},
                  {"a|b`*": np.ones((1, 2), np.float32)}, "fp32", "src <x>", {"a|b`*": True}).to_dict()
    md = "\n".join(arbiter_markdown(ArbiterResult.from_json(d)))
    # a code span one backtick longer than the name's, the pipe escaped for the table cell
    assert "| ``a\\|b`*`` |" in md
    assert "src &lt;x&gt;" in md and "<x>" not in md


def _arbiter_numbers(arb: dict) -> dict:
    return {k: v for k, v in arb.items() if k not in ("seconds",)}


def test_the_second_process_computes_the_same_truth(samples, tmp_path, monkeypatch):
    """The determinism check's second process computes the float64 truth after its
    digests (checks.SecondRun.truth): the arbiter's answer is the one computed
    here, to the last digit; when that process dies first, it is computed here."""
    from bisect_tui.core import checks

    asked = []
    real_truth = checks.SecondRun.truth
    monkeypatch.setattr(checks.SecondRun, "truth", lambda self: asked.append(self) or real_truth(self))
    t = run(samples, tmp_path / "child", parse_tolerance("fp32"), GELU)
    assert t.determinism["overlapped"] and len(asked) == 1 and asked[0].truth_outputs == list(t.info.outputs)
    assert not Path(asked[0].truth_path).exists()  # read, then removed
    here = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / "here",
                                max_memory=4 << 30, tolerance=parse_tolerance("fp32"),
                                config=EngineConfig(config_entries=GELU), check_determinism=False))
    here.run_all()
    assert _arbiter_numbers(t.arbiter)["outputs"] == _arbiter_numbers(here.arbiter)["outputs"]
    assert t.arbiter["truth_source"] == here.arbiter["truth_source"]

    fallbacks = []

    def failing(sabotage):
        def truth(self):
            sabotage(self)
            got = real_truth(self)
            fallbacks.append(got)
            return got
        return truth

    def died_first(self):  # the process gone before its truth line: nothing more to read
        self.proc.kill()
        self.proc.wait()
        self._next_message = lambda: None

    def file_gone(self):  # the line came, its file did not survive
        msg = self._next_message()
        while "truth" not in msg:
            msg = self._next_message()
        Path(self.truth_path).unlink()
        self._next_message = lambda: msg

    monkeypatch.setattr(checks.SecondRun, "truth", failing(died_first))
    dead = run(samples, tmp_path / "dead", parse_tolerance("fp32"), GELU)
    assert fallbacks == [None]
    assert dead.arbiter["available"] and dead.arbiter["outputs"] == here.arbiter["outputs"]
    monkeypatch.setattr(checks.SecondRun, "truth", failing(file_gone))
    gone = run(samples, tmp_path / "gone", parse_tolerance("fp32"), GELU)
    assert fallbacks == [None, None] and gone.arbiter["outputs"] == here.arbiter["outputs"]


def _weighted(path: Path) -> Path:
    """A 1 MB MatMul weight: the float64 run would hold about 4 MB of it."""
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
                           helper.make_node("Relu", ["y"], ["z"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 512])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("budget, runs", [(3 << 20, False), (5 << 20, True)])
def test_the_float64_run_keeps_to_the_memory_budget(tmp_path, budget, runs):
    # a 2.4 GB model peaked at 9.5 GB with the float64 run: over the budget it is skipped, saying how much to give
    t = Triage(TriageOptions(model=_weighted(tmp_path / "w.onnx"), session_dir=tmp_path / "s", max_memory=budget,
                             tolerance=parse_tolerance("fp32")))
    t.run_all()
    arb = t.summary()["arbiter"]
    assert arb["available"] is runs
    if not runs:
        assert arb["skipped"] and "4 MB), more than the memory budget of 3 MB; give --max-memory 5M" in arb["reason"]
        assert "float64 arbiter: not run (skipped: the float64 run holds" in check_text(t.summary())
