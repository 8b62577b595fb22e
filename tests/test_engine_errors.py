"""Engine failures searched, and pass bisection as the fallback, on real ORT 1.32 bugs.

Each model is built here with onnx.helper, the bug inside a deeper graph with
ordinary nodes before and after, and each answer is rechecked with plain
onnxruntime, independently of bisect_tui:
- DivMulFusion moves the Mul's input onto the Div without its edge, and
  CastElimination then removes the same-type Cast producing it: the session
  refuses to build ("Node input 'mid' is not a graph input ...").
- SimplifiedLayerNormFusion fuses a Mul whose scale broadcasts [3,1] to [3,2];
  the fused kernel rejects that scale when it runs.
- GeluApproximation rewrites Gelu to FastGelu in place (one op for one, no
  interior tensor): marking cannot block it and no fused node covers two
  original nodes; only the pass bisection finds it.
- OpenVINO refuses an ONNX Det at its front end: bisect says the engine cannot
  build the model (exit 6) instead of blaming a kernel.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(0)


def _init(name, shape, scale=0.5):
    return nh.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def div_mul_model() -> onnx.ModelProto:
    nodes = [
        h.make_node("MatMul", ["x", "W1"], ["h1"], name="fc1"),
        h.make_node("Add", ["h1", "b1"], ["h2"], name="fc1_bias"),
        h.make_node("Relu", ["h2"], ["a"], name="act1"),
        h.make_node("Cast", ["a"], ["mid"], to=T.FLOAT, name="cast_same"),
        h.make_node("Abs", ["y"], ["ya"], name="y_abs"),
        h.make_node("Add", ["ya", "one"], ["yy"], name="y_shift"),
        h.make_node("Div", ["one", "yy"], ["inv"], name="recip"),
        h.make_node("Mul", ["inv", "mid"], ["m"], name="scale"),
        h.make_node("Tanh", ["m"], ["t"], name="post_tanh"),
        h.make_node("MatMul", ["t", "W2"], ["out"], name="fc2"),
    ]
    inits = [_init("W1", [8, 8]), _init("b1", [8]), _init("W2", [8, 4]),
             nh.from_array(np.array(1.0, np.float32), "one")]
    g = h.make_graph(nodes, "div_mul", [h.make_tensor_value_info("x", T.FLOAT, [2, 8]),
                                        h.make_tensor_value_info("y", T.FLOAT, [2, 8])],
                     [h.make_tensor_value_info("out", T.FLOAT, [2, 4])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def simplified_ln_model() -> onnx.ModelProto:
    nodes = [
        h.make_node("MatMul", ["x", "W1"], ["h1"], name="fc1"),
        h.make_node("Relu", ["h1"], ["r1"], name="act1"),
        h.make_node("MatMul", ["r1", "Wp"], ["p"], name="proj"),
        h.make_node("Pow", ["p", "two"], ["sq"], name="rms_pow"),
        h.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, name="rms_mean"),
        h.make_node("Add", ["ms", "eps"], ["mse"], name="rms_add"),
        h.make_node("Sqrt", ["mse"], ["rms"], name="rms_sqrt"),
        h.make_node("Div", ["p", "rms"], ["nm"], name="rms_div"),
        h.make_node("Mul", ["nm", "gamma"], ["sc"], name="rms_scale"),
        h.make_node("Relu", ["sc"], ["r2"], name="act2"),
        h.make_node("MatMul", ["r2", "W3"], ["out"], name="fc3"),
    ]
    inits = [_init("W1", [4, 4]), _init("Wp", [4, 1]), _init("W3", [2, 3]),
             nh.from_array(np.array(2.0, np.float32), "two"), nh.from_array(np.array(1e-5, np.float32), "eps"),
             nh.from_array(np.array([0.5, 2.0], np.float32), "gamma"),
             nh.from_array(np.array([-1], np.int64), "axes")]
    g = h.make_graph(nodes, "rms", [h.make_tensor_value_info("x", T.FLOAT, [3, 4])],
                     [h.make_tensor_value_info("out", T.FLOAT, [3, 3])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 18)])


def gelu_model() -> onnx.ModelProto:
    nodes = [
        h.make_node("Abs", ["x"], ["xa"], name="pre_abs"),
        h.make_node("MatMul", ["xa", "W"], ["hh"], name="fc"),
        h.make_node("Gelu", ["hh"], ["g"], name="act", domain="com.microsoft"),
        h.make_node("Sub", ["g", "x"], ["d"], name="res"),
        h.make_node("Tanh", ["d"], ["out"], name="post_tanh"),
    ]
    g = h.make_graph(nodes, "gelu", [h.make_tensor_value_info("x", T.FLOAT, [4, 16])],
                     [h.make_tensor_value_info("out", T.FLOAT, [4, 16])], [_init("W", [16, 16], 1.0)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])


GELU_APPROX = ["--ort-config", "optimization.enable_gelu_approximation=1"]


def _plain(model: onnx.ModelProto, level: str, disabled=(), config=None):
    """Outputs of plain ORT at `level`, or the exception it raised (build or run)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.log_severity_level = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    feeds = {i.name: np.random.default_rng(1).standard_normal(
        [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
    try:
        s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=list(disabled))
    except Exception as exc:  # noqa: BLE001
        return ("build", str(exc))
    try:
        return s.run(None, feeds)[0]
    except Exception as exc:  # noqa: BLE001
        return ("run", str(exc))


def _bisect(tmp_path: Path, model: onnx.ModelProto, *extra: str) -> tuple[int, dict, str, str]:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    js, md = tmp_path / "out.json", tmp_path / "report.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bisect_tui.cli", "bisect", str(path), "--session", str(tmp_path / "s"),
         "--json", str(js), "--report", str(md), "--bundle", str(tmp_path / "bundle.zip"), "-q", *extra],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode in (0, 1, 6), proc.stderr[-2000:] + proc.stdout[-2000:]
    return proc.returncode, json.loads(js.read_text()), proc.stdout, md.read_text()


def test_plain_ort_reproduces_the_three_bugs_and_their_workarounds():
    dm, sln, ge = div_mul_model(), simplified_ln_model(), gelu_model()
    onnx.checker.check_model(dm, full_check=True)
    onnx.checker.check_model(sln, full_check=True)
    ref = _plain(dm, "ORT_DISABLE_ALL")
    err = _plain(dm, "ORT_ENABLE_ALL")
    assert err[0] == "build" and "'mid' is not a graph input" in err[1]
    for off in (["DivMulFusion"], ["CastElimination"]):
        assert np.allclose(_plain(dm, "ORT_ENABLE_ALL", off), ref, atol=1e-5)
    err = _plain(sln, "ORT_ENABLE_ALL")
    assert err[0] == "run" and "SimplifiedLayerNormFusion" in err[1]
    assert np.allclose(_plain(sln, "ORT_ENABLE_ALL", ["SimplifiedLayerNormFusion"]), _plain(sln, "ORT_DISABLE_ALL"))
    cfg = {"optimization.enable_gelu_approximation": "1"}
    assert np.abs(_plain(ge, "ORT_ENABLE_ALL", config=cfg) - _plain(ge, "ORT_DISABLE_ALL")).max() > 1e-4
    assert np.array_equal(_plain(ge, "ORT_ENABLE_ALL", ["GeluApproximation"], cfg), _plain(ge, "ORT_DISABLE_ALL"))


def test_build_error_divmul_is_bisected_to_its_nodes_and_passes(tmp_path):
    rc, js, out, md = _bisect(tmp_path, div_mul_model())
    b = js["bisect"]
    assert rc == 1 and b["verdict"] == "culprits"
    (c,) = b["culprits"]
    assert c["kind"] == "build_error" and "'mid'" in c["engine_error"]["message"]
    # the smallest failing region of marks, and the tensor the message names mapped to its producer and consumer
    assert b["error_region"]["original_nodes"] == ["cast_same", "recip"]
    assert c["engine_error"]["names"] == ["mid"]
    assert c["original_nodes"] == ["cast_same", "recip", "scale"]
    # the failure needs both passes: disabling either makes the engine build and pass
    assert set(c["optimizers"]) == {"DivMulFusion", "CastElimination"}
    ps = b["pass_bisection"]
    assert ps["candidates"] > 50 and ps["builds"] <= 2 * (int(np.ceil(np.log2(ps["candidates"]))) + 3)
    w = b["workaround"]
    assert w["kind"] == "disable_optimizers" and w["full_engine"]["passed"]
    assert w["disabled_optimizers"][0] in ("DivMulFusion", "CastElimination")
    # independently: the workaround builds, runs and matches the unoptimized engine
    m = div_mul_model()
    assert np.allclose(_plain(m, "ORT_ENABLE_ALL", w["disabled_optimizers"]), _plain(m, "ORT_DISABLE_ALL"), atol=1e-4)
    assert "DivMulFusion" in md and "cast_same" in md and "does not build" in out
    _unzip_and_check_repro(tmp_path, "DivMulFusion")  # the repro fails to build as configured
    assert "0 fused nodes" not in out


def test_run_error_simplified_layernorm_is_its_fused_node(tmp_path):
    rc, js, out, md = _bisect(tmp_path, simplified_ln_model())
    b = js["bisect"]
    assert rc == 1 and b["verdict"] == "culprits"
    (c,) = b["culprits"]
    assert c["kind"] == "run_error"
    assert c["fused_node"] == "rms_scale/SimplifiedLayerNormFusion/"
    assert c["original_nodes"] == ["rms_pow", "rms_mean", "rms_add", "rms_sqrt", "rms_div", "rms_scale"]
    assert c["optimizers"] == ["SimplifiedLayerNormFusion"]
    assert b["engine_error"]["original_nodes"] == c["original_nodes"]  # the message's node name, mapped
    assert c["isolated"].get("run_error")  # the fused region alone fails the same way
    w = b["workaround"]
    assert w["disabled_optimizers"] == ["SimplifiedLayerNormFusion"] and w["full_engine"]["passed"]
    assert "SimplifiedLayerNormFusion" in md and "rms_scale" in md
    _unzip_and_check_repro(tmp_path, "SimplifiedLayerNormFusion")  # the fused region alone fails running


def test_in_place_rewrite_is_found_by_pass_bisection(tmp_path):
    rc, js, out, md = _bisect(tmp_path, gelu_model(), *GELU_APPROX)
    b = js["bisect"]
    assert rc == 1 and b["verdict"] == "culprits"
    (c,) = b["culprits"]
    assert c["kind"] == "pass" and c["fused_node"] is None
    assert c["optimizers"] == ["GeluApproximation"]
    assert c["original_nodes"] == ["act"]  # the optimized graphs with and without the pass, compared
    assert b["pass_bisection"]["original_nodes_from"].startswith("optimized graphs")
    assert b["pass_bisection"]["builds"] <= int(np.ceil(np.log2(b["pass_bisection"]["candidates"]))) + 3
    assert b["workaround"]["disabled_optimizers"] == ["GeluApproximation"]
    assert "GeluApproximation" in md
    # the bundle's repro runs the whole model with plain onnxruntime: 1 as configured, 0 with the pass off
    _unzip_and_check_repro(tmp_path, "GeluApproximation")


def _unzip_and_check_repro(tmp_path: Path, disable: str) -> None:
    import zipfile

    with zipfile.ZipFile(tmp_path / "bundle.zip") as z:
        z.extractall(tmp_path / "bundle")
    script = tmp_path / "bundle" / "repro" / "repro.py"
    bug = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    fixed = subprocess.run([sys.executable, str(script), "--disable", disable], capture_output=True, text=True,
                           timeout=120)
    assert bug.returncode == 1, bug.stdout + bug.stderr
    assert fixed.returncode == 0 and "within tolerance" in fixed.stdout, fixed.stdout + fixed.stderr


def test_an_engine_that_never_builds_is_not_blamed_on_a_kernel(tmp_path):
    pytest.importorskip("openvino")
    nodes = [h.make_node("Relu", ["x0"], ["x"], name="pre"), h.make_node("Det", ["x"], ["y"], name="det"),
             h.make_node("Abs", ["y"], ["out"], name="post")]
    g = h.make_graph(nodes, "det", [h.make_tensor_value_info("x0", T.FLOAT, [3, 3])],
                     [h.make_tensor_value_info("out", T.FLOAT, [])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    rc, js, out, md = _bisect(tmp_path, model, "--engine", "openvino")
    b = js["bisect"]
    assert rc == 6 and b["verdict"] == "engine_error" and not b["culprits"]
    assert "cannot build this model" in b["explanation"] and "OpConversionFailure" in b["explanation"]
    # marking changes nothing here: parts of the graph built alone name the node the engine cannot take
    iso = b["engine_error"]["isolated"]
    assert iso["node"] == "det" and iso["op_type"] == "Det" and iso["alone"] is True
    assert "node 'det' (Det)" in b["explanation"]
    assert "differs without fusion" not in out and "differs without fusion" not in md
    assert "cannot build or run this model" in md
    # a step whose engine failed shows that, not the 1e300 placeholder of its ratio
    assert "FAIL build error" in out and "| build error |" in md
    assert "e+300" not in out and "e+300" not in md


def test_named_in_error_maps_nodes_tensors_and_fused_names():
    from bisect_tui.core.bisect.engine_errors import named_in_error
    from bisect_tui.core.bisect.units import Unit
    from bisect_tui.core.graph import GraphIndex

    index = GraphIndex.build(div_mul_model())
    got = named_in_error("Node input 'mid' is not a graph input", index)
    assert got == {"names": ["mid"], "original_nodes": ["cast_same", "scale"]}
    u = Unit(index=0, fused_node="scale/DivMulFusion/", op_type="Div", original_nodes=["recip", "scale"],
             optimizers=[], outputs=["m"])
    assert named_in_error("Name:'scale/DivMulFusion/' failed", index, [u])["original_nodes"] == ["recip", "scale"]
    assert named_in_error("while running 'post_tanh'", index)["original_nodes"] == ["post_tanh"]
    assert named_in_error("nothing quoted here", index) == {"names": [], "original_nodes": []}


def test_ort_pass_plan_comes_from_the_library():
    from bisect_tui.api import EngineConfig
    from bisect_tui.engines.ort.passlog import pass_plan

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.onnx"
        onnx.save(div_mul_model(), str(path))
        plan = pass_plan(path, EngineConfig(level="all"))
    # the transformers ORT's VERBOSE log shows, the failing rule container among those that ran
    assert "Level1_RuleBasedTransformer" in plan["ran"]
    assert {"SimplifiedLayerNormFusion", "ConstantFolding", "NchwcTransformer"} <= set(plan["passes"])
    rules = plan["groups"]["Level1_RuleBasedTransformer"]
    assert {"DivMulFusion", "CastElimination", "EliminateDropout"} <= set(rules)
    assert not set(rules) & set(plan["passes"])
