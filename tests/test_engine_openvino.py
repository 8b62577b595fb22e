"""OpenVINO as the second real engine, tested for real on this CPU.

The samples' known answers (sample_models/openvino_cases.json) are re-verified
against the installed openvino and onnxruntime; then `check` and `bisect` run
end to end: the Reduce post-op fusion bug is named by its exact original nodes
and the proven marking passes when rechecked, a passing model exits 0, a bf16
run that fails for precision gets "not a fusion", and a fusion marking cannot
switch off (MVN) is judged in isolation."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

ov = pytest.importorskip("openvino")
ort = pytest.importorskip("onnxruntime")

from bisect_tui.cli import main  # noqa: E402
from bisect_tui.engines import EngineConfig, get_engine  # noqa: E402
from bisect_tui.engines.openvino.engine import fused_node_map  # noqa: E402

FP32 = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def ov_cases(samples) -> dict:
    doc = json.loads((samples / "openvino_cases.json").read_text())
    return {c["model"]: c for c in doc["cases"]}


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _feeds(path: Path) -> dict:
    m = onnx.load(str(path))
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in m.graph.input}


def _unfused(path: Path, feeds: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _all_interior(path: Path) -> list[str]:
    m = onnx.load(str(path))
    outs = {o.name for o in m.graph.output}
    return [o for n in m.graph.node for o in n.output if o not in outs]


def _err(built, feeds, ref) -> float:
    (y,) = [v for k, v in built.run(feeds).items() if k == built.output_names[0]]
    return float(np.abs(y.astype(np.float64) - ref).max())


# --------------------------------------------------------------------------- known answers


def test_reduce_postop_sample_known_answer(samples, ov_cases):
    """The per-channel eps fused into the ReduceMean breaks FP32 by >1000x the
    bound; every fusion blocked, or only the Reduce output marked, passes."""
    case = ov_cases["ov_rmsnorm.onnx"]
    path = samples / "ov_rmsnorm.onnx"
    feeds = _feeds(path)
    ref = _unfused(path, feeds)
    engine = get_engine("openvino")
    built = engine.build(path, EngineConfig())
    try:
        assert built.precision_used() == "fp32"
        assert _err(built, feeds, ref) > 1000 * FP32["atol"]
        culprits = [f.original_nodes for f in built.fused_nodes if f.op_type == case["culprit_op_type"]]
        assert culprits == case["expected_culprits"]
    finally:
        built.close()
    blocked = engine.build(path, EngineConfig(), _all_interior(path))
    assert _err(blocked, feeds, ref) < FP32["atol"]
    assert blocked.fusions_across(_all_interior(path)) == []  # marking IS the switch here
    fixed = engine.build(path, EngineConfig().with_options(mark=json.dumps(case["workaround_marks"])))
    assert _err(fixed, feeds, ref) < FP32["atol"]
    # onnxruntime fuses the same head correctly
    so = ort.SessionOptions()
    y = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert float(np.abs(y - ref).max()) < FP32["atol"]


def _cpu_has_bf16() -> bool:
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def test_passing_sample_and_its_bf16_precision_case(samples):
    path = samples / "ov_rmsnorm_ok.onnx"
    feeds = _feeds(path)
    ref = _unfused(path, feeds)
    engine = get_engine("openvino")
    ok = engine.build(path, EngineConfig())
    assert _err(ok, feeds, ref) < FP32["atol"]
    bf16 = engine.build(path, EngineConfig(precision="bf16"))
    if not _cpu_has_bf16():
        # the plugin runs f32 where the CPU has no BF16 (an AVX2-only host): the build
        # says so instead of passing for bf16
        assert bf16.precision_used() == "fp32"
        assert _err(bf16, feeds, ref) < FP32["atol"]
        return
    assert bf16.precision_used() == "bf16"
    assert _err(bf16, feeds, ref) > 10 * FP32["atol"]
    blocked = engine.build(path, EngineConfig(precision="bf16"), _all_interior(path))
    assert _err(blocked, feeds, ref) > 10 * FP32["atol"]  # still fails: precision, not a fusion


def test_unblockable_mvn_sample_known_answer(samples, ov_cases):
    """Marking every interior tensor leaves the MVN in place (and the error):
    the engine says so from its runtime graph."""
    case = ov_cases["ov_layernorm_offset.onnx"]
    path = samples / "ov_layernorm_offset.onnx"
    feeds = _feeds(path)
    ref = _unfused(path, feeds)
    engine = get_engine("openvino")
    plain = engine.build(path, EngineConfig())
    mvn = [f for f in plain.fused_nodes if f.op_type == "MVN"]
    assert [f.original_nodes for f in mvn] == case["expected_culprits"]
    # the runtime names list names only the last node: the rest is mapped by tensors and topology
    layer = next(lay for lay in plain.layers if lay["type"] == "MVN")
    assert len(layer["original"]) < len(case["expected_culprits"][0])
    marks = _all_interior(path)
    blocked = engine.build(path, EngineConfig(), marks)
    assert _err(blocked, feeds, ref) > 10 * FP32["atol"]
    assert [f.op_type for f in blocked.fusions_across(marks)] == ["MVN"]


def test_default_precision_is_read_back_not_assumed():
    """Whatever this CPU picks by default, the engine reports what it read back."""
    engine = get_engine("openvino")
    default = engine.default_precision()
    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    # the CPU plugin's own pick: bf16 where the CPU has it, else f16 where it has that, else f32
    assert default == ("bf16" if "BF16" in caps else "fp16" if "FP16" in caps else "fp32")


def test_fused_node_map_fills_missing_names_by_topology():
    """A layer that names only its last node but takes the pattern's input
    covers every node in between (runtime records as the plugin writes them)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="pre"),
             helper.make_node("ReduceMean", ["a"], ["m"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["a", "m"], ["d"], name="sub"),
             helper.make_node("Div", ["d", "m"], ["y"], name="div")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(g)
    layers = [{"name": "x", "type": "Input", "original": ["x"], "inputs": [], "precision": ""},
              {"name": "pre", "type": "Eltwise", "original": ["pre"], "inputs": ["x"], "precision": ""},
              {"name": "y", "type": "MVN", "original": ["y"], "inputs": ["pre"], "precision": ""},
              {"name": "y/sink", "type": "Output", "original": [], "inputs": ["y"], "precision": ""}]
    fused = fused_node_map(model, layers)
    assert [(f.name, f.original_nodes) for f in fused] == [("pre", ["pre"]), ("y", ["mean", "sub", "div"])]
    assert fused[1].inputs == ["a"] and fused[1].outputs == ["y"]


# --------------------------------------------------------------------------- the CLI for real


@pytest.mark.slow
def test_check_and_bisect_name_the_reduce_fusion_and_prove_the_marking(samples, ov_cases, tmp_path, capsys):
    case = ov_cases["ov_rmsnorm.onnx"]
    model = samples / "ov_rmsnorm.onnx"
    sess = tmp_path / "s"
    code, out, _ = run(["check", model, "--engine", "openvino", "--session", sess,
                        "--json", tmp_path / "check.json", "-q"], capsys)
    assert code == 1, out
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["engine"] == "openvino" and check["verdict"] == "fail"
    assert [n["op_type"] for n in check["fused_nodes"]] == ["FullyConnected", "Reduce", "Subgraph"]
    # a CPU that would pick bf16 on its own: the check says so next to what really ran
    default = get_engine("openvino").default_precision()
    if default == "fp32":
        assert "precision_used" not in check
    else:
        assert check["precision_used"] == {"asked": "fp32", "used": "fp32", "engine_default": default}
        assert "without an explicit precision this engine would run" in out

    code, out, _ = run(["bisect", model, "--engine", "openvino", "--session", sess,
                        "--json", tmp_path / "bisect.json", "--bundle", tmp_path / "b.zip", "-q"], capsys)
    assert code == 1, out
    b = json.loads((tmp_path / "bisect.json").read_text())["bisect"]
    assert b["verdict"] == "culprits"
    assert [c["original_nodes"] for c in b["culprits"]] == case["expected_culprits"]
    assert b["culprits"][0]["op_type"] == "Reduce"
    assert b["culprits"][0]["isolated"]["reproduces"] is True
    w = b["workaround"]
    assert w["kind"] == "mark_outputs" and w["marked_tensors"] == case["workaround_marks"]
    assert w["full_engine"]["passed"] is True
    assert "--ov-mark norm/reduce:0" in w["how"]
    assert "OpenVINO has no pass switches" in out

    # the workaround, rechecked from the user's side
    marks = [a for t in w["marked_tensors"] for a in ("--ov-mark", t)]
    code, out, _ = run(["check", model, "--engine", "openvino", *marks, "--session", tmp_path / "s2", "-q"],
                       capsys)
    assert code == 0, out

    # the bundle's repro needs only numpy and openvino and reads its names from repro.json
    with zipfile.ZipFile(tmp_path / "b.zip") as z:
        names = set(z.namelist())
        assert {"repro/repro.py", "repro/repro.json", "repro/subgraph.onnx"} <= names
        spec = json.loads(z.read("repro/repro.json"))
        assert spec["engine"] == "openvino" and spec["workaround_marks"] == case["workaround_marks"]
        script = z.read("repro/repro.py").decode()
        assert "norm/" not in script and "import onnxruntime" not in script
        z.extractall(tmp_path / "bundle")
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "bundle" / "repro", capture_output=True,
                       text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "repro.py", "--workaround"], cwd=tmp_path / "bundle" / "repro",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_passing_model_exits_0_and_bf16_is_not_a_fusion(samples, tmp_path, capsys):
    model = samples / "ov_rmsnorm_ok.onnx"
    code, out, _ = run(["bisect", model, "--engine", "openvino", "--session", tmp_path / "a", "-q"], capsys)
    assert code == 0, out
    code, out, _ = run(["bisect", model, "--engine", "openvino", "--precision", "bf16", "--preset", "fp32",
                        "--session", tmp_path / "b", "--json", tmp_path / "bf16.json", "-q"], capsys)
    if not _cpu_has_bf16():
        # no BF16 on this CPU: the engine ran f32 and passes, and the check says it
        # compared another precision than the one asked
        assert code == 0, out
        assert "asked bf16, the compiled engine runs fp32 (NOT what was asked" in out
        return
    assert code == 1, out
    b = json.loads((tmp_path / "bf16.json").read_text())["bisect"]
    assert b["verdict"] == "not_fusion" and b["culprits"] == []
    assert b["precision"]["kind"] == "precision_setting" and b["precision"]["passed"] is True
    assert "INFERENCE_PRECISION_HINT': 'f32'" in b["precision"]["setting"]
    assert "not caused by a fusion" in out


@pytest.mark.slow
def test_unblockable_fusion_is_judged_in_isolation(samples, ov_cases, tmp_path, capsys):
    case = ov_cases["ov_layernorm_offset.onnx"]
    code, out, _ = run(["bisect", samples / "ov_layernorm_offset.onnx", "--engine", "openvino",
                        "--session", tmp_path / "s", "--json", tmp_path / "r.json", "-q"], capsys)
    assert code == 1, out
    b = json.loads((tmp_path / "r.json").read_text())["bisect"]
    assert b["all_blocked"]["passed"] is False and b["all_blocked"]["unblocked"]
    assert b["region_isolation"]["unblocked"] == b["all_blocked"]["unblocked"]
    assert [c["original_nodes"] for c in b["culprits"]] == case["expected_culprits"]
    assert b["workaround"]["kind"] is None
    assert "offers no switch" in b["workaround"]["how"]


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("argv, words", [
    (["--engine", "openvino", "--ov-config", "NUM_STREEMS=1"], "did you mean NUM_STREAMS"),
    (["--engine", "openvino", "--disable", "GeluFusion"], "--disable is an option of ONNX Runtime"),
    (["--engine", "openvino", "--keep-fp32", "act"], "no per-pass or per-node switch"),
    (["--engine", "openvino", "--ort-config", "session.x=1"], "is an option of ONNX Runtime"),
    (["--ov-mark", "t"], "is an option of OpenVINO (--engine openvino)"),
    (["--ort-config", "optimization.enable_gelu_aproximation=1"], "did you mean optimization.enable_gelu_approximation"),
    (["--engine", "openvino", "--level", "basic"], "--level is an option of ONNX Runtime"),
    (["--engine", "openvino", "--ov-device", "GPUX"], "not available here"),
    (["--engine", "openvin"], "unknown engine 'openvin'; available: ort, openvino, tensorrt; did you mean openvino"),
])
def test_engine_options_are_validated_up_front(samples, tmp_path, capsys, argv, words):
    code, out, err = run(["check", samples / "ov_rmsnorm_ok.onnx", *argv, "--session", tmp_path / "s", "-q"],
                         capsys)
    assert code == 2
    assert words in err and "Traceback" not in err


def test_precision_the_engine_really_ran_is_reported(samples, tmp_path, capsys):
    """Asked fp16, a CPU without FP16 arithmetic runs something else (bf16 here):
    the check reads it back from the compiled model and says so."""
    model = samples / "ov_rmsnorm_ok.onnx"
    used = get_engine("openvino").build(model, EngineConfig(precision="fp16")).precision_used()
    code, out, _ = run(["check", model, "--engine", "openvino", "--precision", "fp16", "--session", tmp_path / "s",
                        "--json", tmp_path / "c.json", "-q"], capsys)
    check = json.loads((tmp_path / "c.json").read_text())
    # the exit code is the verdict's, and the verdict is the outputs' own judgement
    judged = "pass" if all(o["passed"] for o in check["outputs"].values()) else "fail"
    assert check["verdict"] == judged and code == {"pass": 0, "fail": 1}[judged]
    default = get_engine("openvino").default_precision()
    if used != "fp16":
        assert check["precision_used"] == {"asked": "fp16", "used": used, "engine_default": default}
        assert f"asked fp16, the compiled engine runs {used} (NOT what was asked" in out
    elif default in (None, "fp16"):
        assert "precision_used" not in check
    else:
        assert check["precision_used"] == {"asked": "fp16", "used": "fp16", "engine_default": default}


def test_report_command_line_carries_the_engine_options(samples):
    """The command line a report shows is built from the engine's declaration."""
    from bisect_tui.core.commandline import command_argv
    from bisect_tui.core.pipeline import TriageOptions

    cfg = EngineConfig(precision="bf16").with_options(mark=json.dumps(["norm/reduce:0"]))
    opts = TriageOptions(model=samples / "ov_rmsnorm.onnx", engine="openvino", config=cfg)
    argv = command_argv(opts, "check")
    assert argv[:4] == ["check", "ov_rmsnorm.onnx", "--engine", "openvino"]
    assert argv[4:] == ["--precision", "bf16", "--ov-mark", "norm/reduce:0", "--preset", "fp32"]
    ort_opts = TriageOptions(model=samples / "cnn.onnx", config=EngineConfig(
        level="basic", config_entries=(("optimization.enable_gelu_approximation", "1"),),
        disabled_passes=("GeluApproximation",)).with_options(
        providers=json.dumps(["CUDAExecutionProvider", "CPUExecutionProvider"])))
    assert command_argv(ort_opts, "bisect")[2:] == [
        "--level", "basic", "--ort-config", "optimization.enable_gelu_approximation=1",
        "--disable", "GeluApproximation", "--ort-provider", "CUDAExecutionProvider"]
