"""The float64 truth proves itself against the FP32 baseline before the arbiter's verdict counts.

Real graphs, real onnx.reference and ONNX Runtime: a Paddle-style BatchNormalization (opset 12,
one output) that onnx.reference wrongly runs in training mode (its momentum is never None); a sum that
cancels in FP32 (two float64 kernels agree, FP32 does not); the same where no double kernel
exists (the truth is then unreliable and gets no verdict)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bisect_tui.api import EngineConfig
from bisect_tui.core.arbiter import arbitrate
from bisect_tui.core.inputs import InputSet
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.core.reference import Float64Reference, float64_outputs
from bisect_tui.core.report import arbiter_markdown, check_text
from bisect_tui.core.threads import cores
from bisect_tui.core.triage.records import ArbiterResult, Summary
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.engines.ort.unfused import OrtUnfused, make_session


def _paddle_bn_model(channels: int = 4) -> onnx.ModelProto:
    """Conv -> BatchNormalization(opset 12, momentum=0.9 as Paddle writes it, Y only) -> Relu -> BN -> Sigmoid."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.5
    inits = [numpy_helper.from_array(w, "conv_w")]
    for k in (1, 2):
        inits += [numpy_helper.from_array(rng.uniform(0.5, 2, channels).astype(np.float32), f"bn{k}_scale"),
                  numpy_helper.from_array(rng.uniform(-1, 1, channels).astype(np.float32), f"bn{k}_bias"),
                  # stored statistics far from the batch's own: training mode would show at once
                  numpy_helper.from_array(rng.uniform(-3, 3, channels).astype(np.float32), f"bn{k}_mean"),
                  numpy_helper.from_array(rng.uniform(0.2, 4, channels).astype(np.float32), f"bn{k}_var")]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv_out", "bn1_scale", "bn1_bias", "bn1_mean", "bn1_var"],
                         ["bn1_out"], name="batch_norm_first", epsilon=1e-5, momentum=0.9),
        helper.make_node("Relu", ["bn1_out"], ["relu_out"], name="relu"),
        helper.make_node("BatchNormalization", ["relu_out", "bn2_scale", "bn2_bias", "bn2_mean", "bn2_var"],
                         ["bn2_out"], name="batch_norm_second", epsilon=1e-5, momentum=0.9),
        helper.make_node("Sigmoid", ["bn2_out"], ["y"], name="sigmoid"),
    ]
    g = helper.make_graph(nodes, "paddle_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 12)])
    m.ir_version = 7
    return m


def _fp32_values(model: onnx.ModelProto, feeds: dict) -> dict:
    """Every node output of the FP32 unfused baseline (ORT_DISABLE_ALL), one run."""
    from bisect_tui.core.graph import mark_outputs

    names = [o for n in model.graph.node for o in n.output if o]
    sess = make_session(mark_outputs(model, names))
    outs = [o.name for o in sess.get_outputs()]
    return dict(zip(outs, sess.run(outs, feeds)))


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)


def test_the_evaluator_is_wrong_on_paddle_batchnorm_and_the_check_falls_back():
    m = _paddle_bn_model()
    x = _x()
    fp32 = _fp32_values(m, {"x": x})
    # the defect itself: onnx.reference normalises with batch statistics (momentum stated)
    plain = Float64Reference(m, known_fixes=False).run({"x": x}, ["bn1_out"])["bn1_out"]
    off = np.abs(plain - fp32["bn1_out"]).max()
    assert off > 0.1 * np.abs(fp32["bn1_out"]).max()
    # left to the check (the known deviation not applied): it finds the node by comparison
    ref = Float64Reference(m, OrtUnfused(), lambda t, k: fp32.get(t), known_fixes=False)
    found = ref.run({"x": x}, ["y"])["y"]
    rc = ref.check
    assert rc["checked"] and rc["reliable"] and rc["unreliable_at"] is None
    (p,) = rc["parted"]  # the first BatchNormalization in graph order, found once
    assert p["node"] == "batch_norm_first" and p["op_type"] == "BatchNormalization" and p["tensor"] == "bn1_out"
    assert p["outcome"] == "fallback" and "BatchNormalization" in p["fallback"] and p["same_type_nodes"] == 1
    assert p["kernel_local"]["rel"] > 0.1  # the evaluator's own kernel, on FP32's inputs
    assert p["max_abs"] == pytest.approx(off, rel=1e-6)
    assert p["tried"][0]["local"]["rel"] < 1e-6  # the spec's formula agrees with FP32's kernel
    assert rc["fallbacks"] == [{"with": p["fallback"], "nodes": 2}]
    assert rc["tensors_compared"] == 5
    # after the fallback the truth matches ORT FP32 within rounding, at the output too
    np.testing.assert_allclose(found, fp32["y"], rtol=0, atol=1e-6)
    # the default: the known deviation runs the spec's formula from the start, its evidence kept
    inputs = InputSet({"x": x[None]})
    got = float64_outputs(m, inputs, ["y"], OrtUnfused(), lambda t, k: fp32.get(t))
    rc = got.reference_check
    (k,) = rc["parted"]
    assert k["outcome"] == "known" and k["node"] == "batch_norm_first" and "momentum is never None" in k["why"]
    assert k["max_abs"] == pytest.approx(off, rel=1e-6) and k["tried"][0]["local"]["rel"] < 1e-6
    assert rc["reliable"] and rc["fallbacks"] == [{"with": p["fallback"], "nodes": 2}]
    np.testing.assert_array_equal(got[0]["y"][0], found)
    assert "with fallbacks: numpy formula" in got[1]
    # without FP32 values (the search's subgraph truths) the known deviation is fixed all the same
    alone = Float64Reference(m).run({"x": x}, ["y"])["y"]
    np.testing.assert_array_equal(alone, found)


def _check(path, session, determinism: bool) -> Triage:
    t = Triage(TriageOptions(model=path, session_dir=session, max_memory=4 << 30, tolerance=parse_tolerance("fp32"),
                             config=EngineConfig(), check_determinism=determinism))
    t.run_all()
    return t


def _same_check(rc: dict) -> dict:
    return {k: v for k, v in rc.items() if k not in ("seconds",)}


def test_the_arbiter_on_a_paddle_batchnorm_model_end_to_end(tmp_path):
    """Both places the truth is computed (the determinism check's second process, against its
    own FP32 run; this process, against the dump) check it alike."""
    path = tmp_path / "bn.onnx"
    onnx.save(_paddle_bn_model(), str(path))
    t = _check(path, tmp_path / "child", True)
    here = _check(path, tmp_path / "here", False)
    assert t.determinism.get("overlapped") == (cores() >= 2)  # the child computed it where it could
    if t.determinism.get("overlapped"):
        assert _same_check(t.arbiter["reference_check"]) == _same_check(here.arbiter["reference_check"])
    assert t.arbiter["outputs"] == here.arbiter["outputs"]
    s = t.summary()
    arb = s["arbiter"]
    rc = arb["reference_check"]
    assert rc["reliable"] and rc["verified"] and rc["parted"][0]["node"] == "batch_norm_first"
    o = arb["outputs"]["y"]
    assert o["verdict"] in ("not_worse", "worse") and o["baseline"]["max_abs"] < 1e-6
    assert rc["outputs"]["y"]["within"]
    text = check_text(s)
    assert "the evaluator parts from FP32 at bn1_out (BatchNormalization, node batch_norm_first)" in text
    assert "and at 1 more BatchNormalization nodes" in text


def test_a_right_evaluator_keeps_the_old_verdicts(samples, tmp_path):
    tight = parse_tolerance("fp32", atol=1e-9, rtol=0.0)
    t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / "s",
                             max_memory=4 << 30, tolerance=tight, config=EngineConfig()))
    t.run_all()
    s = t.summary()
    rc = s["arbiter"]["reference_check"]
    assert rc["checked"] and rc["reliable"] and rc["parted"] == [] and rc["fallbacks"] == []
    assert rc["tensors_compared"] > 20 and rc["worst"]["ratio"] < 1
    o = s["arbiter"]["outputs"]["mlp/residual:0"]
    assert o["not_worse"] and o["too_tight"] and o["verdict"] == "not_worse"
    assert s["arbiter"]["truth_source"] == "onnx.reference.ReferenceEvaluator (float64)"
    assert "loosen" in check_text(s)


def _cancel_model(op: str) -> onnx.ModelProto:
    """x -> op (a sum over 3 values that cancels in FP32) -> y."""
    if op == "ReduceSum":
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="cancel", keepdims=0)
        inits = [numpy_helper.from_array(np.array([3], np.int64), "axes")]
        out = [1, 1, 1]
    else:
        node = helper.make_node("GlobalAveragePool", ["x"], ["y"], name="cancel")
        inits = []
        out = [1, 1, 1, 1]
    g = helper.make_graph([node], "cancel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    return m


def test_fp32_own_cancellation_is_not_blamed_on_the_truth():
    m = _cancel_model("ReduceSum")
    x = np.array([1e8, 1, -1e8], np.float32).reshape(1, 1, 1, 3)
    fp32 = _fp32_values(m, {"x": x})
    assert fp32["y"].ravel()[0] == 0.0  # 1e8 + 1 rounds to 1e8 in FP32
    got = float64_outputs(m, InputSet({"x": x[None]}), ["y"], OrtUnfused(), lambda t, k: fp32.get(t))
    rc = got.reference_check
    assert got[0]["y"].ravel()[0] == 1.0
    (p,) = rc["parted"]
    assert p["outcome"] == "fp32_own" and p["node"] == "cancel" and rc["reliable"]
    assert any(t["independent"] and t["agrees_with_kernel"] for t in p["tried"])


def test_no_fallback_agrees_marks_the_truth_unreliable_and_gives_no_verdict():
    m = _cancel_model("GlobalAveragePool")  # ORT has no double GlobalAveragePool kernel
    x = np.array([1e8, 1, -1e8], np.float32).reshape(1, 1, 1, 3)
    fp32 = _fp32_values(m, {"x": x})
    got = float64_outputs(m, InputSet({"x": x[None]}), ["y"], OrtUnfused(), lambda t, k: fp32.get(t))
    rc = got.reference_check
    assert not rc["reliable"]
    assert rc["unreliable_at"] == {"node": "cancel", "op_type": "GlobalAveragePool", "tensor": "y"}
    assert rc["parted"][0]["outcome"] == "unreliable" and "error" in rc["parted"][0]["tried"][0]
    base = fp32["y"][None]
    arb = arbitrate(got[0], {"y": base}, {"y": base}, "fp32", got[1], {"y": False}, reference_check=rc).to_dict()
    o = arb["outputs"]["y"]
    assert o["verdict"] == "unverified" and not o["not_worse"] and not o["too_tight"] and not arb["all_not_worse"]
    assert "reference unreliable at op y (GlobalAveragePool, node cancel)" in o["summary"]
    summary = Summary.from_json({"verdict": "fail", "exit_code": 1, "model": {}, "session": "", "inputs": {},
                                 "tolerance": {}, "baseline": {}, "engine": "ort", "failing_outputs": ["y"],
                                 "arbiter": arb})
    from bisect_tui.core.report.advice import next_step

    assert "loosen" not in (next_step(summary) or "")
    md = "\n".join(arbiter_markdown(summary.arbiter))
    assert "no verdict (truth unverified)" in md and "reference unreliable at op y" in md
    from bisect_tui.core.report.sections import arbiter_lines

    text = "\n".join(arbiter_lines(summary.arbiter))
    assert "[no verdict] y:" in text and "no not-worse verdict on an unverified truth" in text
    assert "loosen" not in text


def test_an_output_beyond_fp32_rounding_of_the_sensitivity_run_is_unverified():
    rng = np.random.default_rng(1)
    truth = rng.standard_normal((1, 50))
    base = (truth + 1e-7 * rng.standard_normal((1, 50))).astype(np.float32)
    sens = {"outputs": {"y": {"max_abs": 2e-7}}}
    ok = arbitrate({"y": truth}, {"y": base}, {"y": base}, "fp32", "t", sensitivity=sens)
    assert ok.outputs[0].unverified is None and ok.reference_check["outputs"]["y"]["within"]
    wrong_truth = truth + 0.3  # a truth far from FP32: the baseline looks 1e6x its rounding off
    bad = arbitrate({"y": wrong_truth}, {"y": base}, {"y": base + np.float32(0.01)}, "fp16", "t", sensitivity=sens)
    o = bad.outputs[0]
    assert o.unverified and not o.not_worse and "1-ulp" in o.unverified
    assert bad.reference_check["outputs"]["y"]["x_rounding"] > 1e5


def test_the_printed_ratio_names_the_floor():
    truth = np.full((1, 8), 0.5)
    exact = truth.astype(np.float32)
    fused = np.nextafter(exact, np.float32(1))
    a = arbitrate({"y": truth}, {"y": exact}, {"y": fused}, "fp32", "t").outputs[0]
    assert a.floored and a.baseline.rmse == 0.0
    assert a.ratio == pytest.approx(a.fused.rmse / a.floor)
    assert "the FP32 floor" in a.verdict_text() and f"{a.floor:.3g}" in a.verdict_text()
    from bisect_tui.core.report.sections import arbiter_lines

    arb = ArbiterResult.from_json(arbitrate({"y": truth}, {"y": exact}, {"y": fused}, "fp32", "t").to_dict())
    line = next(x for x in arbiter_lines(arb)
                if x.strip().startswith("["))
    assert "x the FP32 floor" in line and "which the baseline is below" in line
    # no floor: the ratio is fused/baseline as printed
    rng = np.random.default_rng(0)
    t2 = rng.standard_normal((1, 100))
    b2 = (t2 + 1e-6 * rng.standard_normal((1, 100))).astype(np.float32)
    f2 = (t2 + 3e-6 * rng.standard_normal((1, 100))).astype(np.float32)
    c = arbitrate({"y": t2}, {"y": b2}, {"y": f2}, "fp32", "t").outputs[0]
    assert not c.floored and c.ratio == pytest.approx(c.fused.rmse / c.baseline.rmse)
    assert "the baseline's" in c.verdict_text()


def test_numpy_warnings_of_the_float64_run_are_kept_not_printed():
    g = helper.make_graph([helper.make_node("Exp", ["x"], ["y"], name="exp")], "e",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    ref = Float64Reference(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one escaping would fail here
        y = ref.run({"x": np.array([1.0, 800.0], np.float32)}, ["y"])["y"]
    assert np.isinf(y[1]) and any("overflow" in w for w in ref.warning_lines())


def test_a_truth_from_ort_in_double_says_it_was_not_checked():
    nodes = [helper.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", name="fmm")]
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 7, "w")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    got = float64_outputs(m, InputSet({"x": x[None]}), ["y"], OrtUnfused(), lambda t, k: None)
    rc = got.reference_check
    assert got[1] == "onnxruntime in double (ORT_DISABLE_ALL)"
    assert rc["checked"] is False and "onnxruntime in double" in rc["why"]
    from bisect_tui.core.report.sections import reference_check_line

    assert reference_check_line(rc).startswith("truth not checked tensor by tensor")
