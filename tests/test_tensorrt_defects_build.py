"""Issue 25, the build-side defects (items 1-3, 5, 7-12), one test each,
without TensorRT.

Where TensorRT itself would be needed (the builder, a network, an engine),
the test drives our code with Polygraphy's real objects where they work
without TensorRT (CreateConfig, Profile, EngineBytesFromNetwork, the logger,
TrtRunner) and with stand-ins for TensorRT's objects otherwise
(tests/fixtures.tensorrt_helpers.py); the stand-ins are named as such."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from bisect_tui.core.errors import ExitCode, UserError
from bisect_tui.api import EngineConfig
from fixtures.tensorrt_helpers import Layer, Network, Tensor, TrtEnums
from testlib import init, make_model, vi

def _node(op, ins, outs, name, **kw):
    return helper.make_node(op, ins, outs, name=name, **kw)


# ------------------------------------------------------------------ helpers for the build-side defects


def _qdq_model():
    nodes = [_node("QuantizeLinear", ["x", "s", "z"], ["q"], "Q_0"),
             _node("DequantizeLinear", ["q", "s", "z"], ["y"], "DQ_1")]
    return make_model(nodes, [vi("x", [1, 4])], [vi("y", [1, 4])],
                      [init("s", np.array(0.1, np.float32)), init("z", np.array(0, np.int8))])


def _feats(major):
    from bisect_tui.engines.tensorrt.features import features_from_names

    if major == 10:  # names as in include/NvInfer.h v10.16
        return features_from_names("10.16.0", {"FP16", "BF16", "INT8", "TF32", "OBEY_PRECISION_CONSTRAINTS"},
                                   {"mark_debug", "mark_unfused_tensors_as_debug_tensors"}, {"create_engine_inspector"})
    return features_from_names("11.1.0", {"TF32"}, {"mark_debug", "mark_unfused_tensors_as_debug_tensors"},
                               {"create_engine_inspector"})


def _key_for(marks):
    from bisect_tui.engines.tensorrt.cache import cache_key

    return cache_key("d" * 64, {"precision": "fp16"}, marks)


# ------------------------------------------------------------------ 1. INT8 with a Q/DQ model


def test_d01_int8_with_a_qdq_model_is_not_refused_by_the_option_check(tmp_path):
    """The CLI (engines/flags.config_from_args) and the app validate options
    without the model: INT8 without a cache can only be judged by the build."""
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    eng = TensorRTEngine()
    eng.validate(EngineConfig(precision="int8"))
    qdq, plain = tmp_path / "qdq.onnx", tmp_path / "plain.onnx"
    onnx.save(_qdq_model(), str(qdq))
    onnx.save(make_model([_node("Relu", ["x"], ["y"], "Relu_0")], [vi("x", [1, 4])], [vi("y", [1, 4])]), str(plain))
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:  # past the refusals, the build needs TensorRT
        with pytest.raises(UserError) as e:
            eng.build(qdq, EngineConfig(precision="int8"))
        assert e.value.code == ExitCode.ENVIRONMENT
    with pytest.raises(UserError) as e:  # no Q/DQ, no cache: refused before TensorRT is needed
        eng.build(plain, EngineConfig(precision="int8"))
    assert e.value.code == ExitCode.USAGE and "calibration cache" in str(e.value)


# ------------------------------------------------------------------ 2. INT8 calibration, static model


def test_d02_static_model_with_a_calibrator_gets_polygraphys_default_profile(tmp_path):
    """Polygraphy's CreateConfig keeps `profiles=[]` (util.default only
    replaces None) and reads `profiles[-1]` when a calibrator is set."""
    from polygraphy.backend.trt import CreateConfig, Profile

    from bisect_tui.engines.tensorrt.buildconfig import create_config_kwargs
    from bisect_tui.engines.tensorrt.options import TrtOptions

    assert CreateConfig(profiles=[]).profiles == []  # what the engine used to hand over
    cache = tmp_path / "calib.cache"
    cache.write_bytes(b"TRT-10000-EntropyCalibration2\n")
    calibrator = object()  # stand-in: Polygraphy's Calibrator needs TensorRT to exist
    kw = create_config_kwargs(TrtOptions("int8", calibration_cache=str(cache)), _feats(10), [], TrtEnums,
                              calibrator=calibrator)
    cfg = CreateConfig(**kw)
    assert kw["profiles"] is None and len(cfg.profiles) == 1 and isinstance(cfg.profiles[-1], Profile)
    assert cfg.int8 is True and cfg.calibrator is calibrator and cfg.precision_constraints == "obey"
    # a dynamic model keeps its one exact profile
    from bisect_tui.engines.tensorrt.profiles import ProfileSpec

    kw = create_config_kwargs(TrtOptions("fp16"), _feats(10), [ProfileSpec("x", (2, 4), (2, 4), (2, 4))], TrtEnums)
    assert [list(p["x"]) for p in CreateConfig(**kw).profiles] == [[[2, 4], [2, 4], [2, 4]]]


# ------------------------------------------------------------------ 3. scripts/gpu_check.sh


def test_d03_gpu_check_runs_every_step_for_tensorrt_10_and_11_and_writes_one_summary(tmp_path):
    """With a stand-in nvidia-smi and a python that fails, every step of both
    venvs still runs and lands in the summary (the script cannot run here)."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
    text = script.read_text()
    import re

    assert not re.search(r"^\s*set -[a-z]*e", text, re.M)  # no abort on the first failure
    assert "tensorrt>=10,<11" in text and "tensorrt>=11,<12" in text
    assert "download.pytorch.org/whl/cpu" in text  # the [test] extra's torch pin, satisfied by the CPU wheel
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-smi").write_text('#!/bin/sh\necho "stand-in GPU, 0, 0 MiB, 0.0"\n')
    (stub / "python").write_text("#!/bin/sh\nexit 3\n")
    for f in stub.iterdir():
        f.chmod(0o755)
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{stub}:/usr/bin:/bin", "PYTHON": str(stub / "python"), "OUT_DIR": str(out),
                            "VENV_ROOT": str(tmp_path / "venvs")})
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    summary = (out / "summary.txt").read_text().splitlines()
    steps = [line.split()[1:3] for line in summary if line.startswith(("PASS", "FAIL"))]
    names = ["venv", "pip-upgrade", "torch-cpu", "install", "versions", "samples", "inspector",
             "translation-tests", "gpu-tests", "bisect"]
    assert steps == [["trt10", n] for n in names] + [["trt11", n] for n in names]
    assert all(line.startswith("FAIL") for line in summary if line.startswith(("PASS", "FAIL")))
    assert (out / "10" / "venv.log").exists() and (out / "11" / "bisect.log").exists()


# ------------------------------------------------------------------ 5. GPU in the cache key, foreign plans


def test_d05_cache_key_holds_the_gpu_and_a_plan_that_does_not_load_is_rebuilt(tmp_path):
    """The GPUs of trt-engine-explorer's examples (A100 80GB PCIe, sm_80, from
    its profile metadata; RTX 3090, sm_86) must not share plans. A cached plan
    that fails to deserialize is dropped and rebuilt, not read as a marking
    failure."""
    from bisect_tui.engines.tensorrt.buildflow import build_engine
    from bisect_tui.engines.tensorrt.cache import EngineCache, cache_key, engine_versions
    from bisect_tui.engines.tensorrt.gpu import current_gpu, gpu_identity

    a100 = engine_versions("10.16.0", "0.53.6", gpu_identity("NVIDIA A100 80GB PCIe", 8, 0))
    rtx = engine_versions("10.16.0", "0.53.6", gpu_identity("NVIDIA GeForce RTX 3090", 8, 6))
    assert a100["gpu"] == "NVIDIA A100 80GB PCIe (sm_80)"
    opts = {"precision": "fp16"}
    assert cache_key("d" * 64, opts, versions=a100) != cache_key("d" * 64, opts, versions=rtx)
    assert cache_key("d" * 64, opts, versions=a100) == cache_key("d" * 64, opts, versions=dict(a100))
    assert isinstance(current_gpu(), str) and current_gpu()  # "unknown" without a CUDA device
    cache = EngineCache(tmp_path / "engines")
    cache.put(_key_for(["t"]), b"plan built on another GPU", {"marked": 1})
    builds = []

    def build_bytes(marks, box):
        builds.append(list(marks))
        return b"fresh plan"

    def deserialize(data):  # stand-in for EngineFromBytes on this GPU
        if data != b"fresh plan":
            raise RuntimeError("Serialization assertion: plan was built for a different device")
        return ("engine", data)

    out = build_engine(cache, _key_for, ["t"], build_bytes, deserialize, lambda: False, {"model": "m.onnx"})
    assert out.engine == ("engine", b"fresh plan") and not out.cache_hit
    assert builds == [["t"]] and out.marking_error == "" and out.dropped_marks == []
    assert cache.get(_key_for(["t"])) == b"fresh plan"


# ------------------------------------------------------------------ 7. pin plans across cache hits, processes


def test_d07_pin_plan_survives_a_cache_hit_and_another_process(tmp_path):
    from bisect_tui.engines.tensorrt.cache import EngineCache
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine
    from bisect_tui.engines.tensorrt.precision import NetworkLayer, plan_keep_fp32

    plan = plan_keep_fp32([NetworkLayer("Softmax_5", ("out",), ("FLOAT",), "[ONNX Layer: Softmax_5]", "SOFTMAX")],
                          ["Softmax_5"], {"Softmax_5": ["out"]}, strongly_typed=False)
    # a pool worker built with this keep-set: its record, as the engine has always written it
    other = EngineCache(tmp_path / "other" / "engines" / "trt_engines")
    other.put(_key_for(["w"]), b"plan", {"model": "m.onnx", "marked": 0, "keep_fp32": ["Softmax_5"],
                                         "precision_plan": plan.to_dict()})
    # the main process: a fresh engine that built nothing with this keep-set
    fresh = TensorRTEngine(cache_dir=other.root)
    text = fresh.workaround_text({"kind": "keep_fp32", "keep_fp32": ["Softmax_5"]})
    assert "Softmax_5" in text and "TensorRT 11" not in text
    from bisect_tui.engines.tensorrt.buildflow import build_engine

    cache = EngineCache(tmp_path / "session" / "engines" / "trt_engines")
    record = {"model": "m.onnx", "keep_fp32": ["Softmax_5"]}

    def build_bytes(marks, box):
        box["plan"] = plan
        return b"plan"

    first = build_engine(cache, _key_for, [], build_bytes, lambda d: "engine", lambda: False, record)
    assert not first.cache_hit and first.plan.pins == {"Softmax_5": "fp32"}

    def no_build(marks, box):
        raise AssertionError("a cache hit must not build")

    second = build_engine(cache, _key_for, [], no_build, lambda d: "engine", lambda: False, record)
    assert second.cache_hit and second.plan.pins == plan.pins and second.plan.unmatched == []
    # the main process: a fresh engine that built nothing with this keep-set (a pool worker did)
    eng = TensorRTEngine(cache_dir=cache.root)
    text = eng.workaround_text({"kind": "keep_fp32", "keep_fp32": ["Softmax_5"]})
    assert "Softmax_5" in text and "--trt-npps keep_fp32.py" in text and "TensorRT 11" not in text
    assert ("TensorRT layers pinned to FP32", "Softmax_5") in eng.describe(
        EngineConfig(precision="fp16", keep_fp32=("Softmax_5",)))


# ------------------------------------------------------------------ 8. build errors, cancel, activation


def test_d08_build_failure_says_tensorrts_reason_and_a_cancel_is_a_cancel(tmp_path):
    """Polygraphy's TensorRT logger sends the builder's errors to
    G_LOGGER.error, then EngineBytesFromNetwork raises "Invalid Engine..."
    (backend/trt/util.py, loader.py); the steps below do exactly those calls."""
    from polygraphy.logger import G_LOGGER

    from bisect_tui.core.errors import Cancelled, EngineBuildError, EngineRunError
    from bisect_tui.engines.tensorrt.buildflow import build_engine
    from bisect_tui.engines.tensorrt.built import activate_runner
    from bisect_tui.engines.tensorrt.cache import EngineCache
    from bisect_tui.engines.tensorrt.progress import BuildProgress

    reason = "10: Could not find any implementation for node {ForeignNode[/m/MatMul.../m/Softmax]}."
    calls = []

    def fails_when_marked(marks, box):
        calls.append(list(marks))
        if marks or box.get("always"):
            G_LOGGER.error(reason)
            G_LOGGER.critical("Invalid Engine. Please ensure the engine was built correctly")
        return b"plan"

    cache = EngineCache(tmp_path / "engines")
    out = build_engine(cache, _key_for, ["t"], fails_when_marked, lambda d: "engine", lambda: False, {})
    assert calls == [["t"], []] and out.dropped_marks == ["t"] and reason in out.marking_error

    def always_fails(marks, box):
        box["always"] = True
        return fails_when_marked(marks, box)

    with pytest.raises(EngineBuildError) as e:
        build_engine(EngineCache(tmp_path / "e2"), _key_for, [], always_fails, lambda d: "engine", lambda: False, {})
    assert reason in str(e.value) and "Invalid Engine" not in str(e.value) and reason in e.value.engine_message
    # the user cancelled: TensorRT's progress monitor got False, the build failed; no unmarked rebuild
    monitor = BuildProgress(lambda text: False)
    monitor.phase_start("Building engine", None, 3)
    assert monitor.step_complete("Building engine", 0) is False and monitor.cancelled
    calls.clear()
    with pytest.raises(Cancelled):
        build_engine(EngineCache(tmp_path / "e3"), _key_for, ["t"], fails_when_marked, lambda d: "engine",
                     lambda: monitor.cancelled, {})
    assert calls == [["t"]]
    # TrtRunner.activate() failing (here: a stand-in engine object) is a run error, not a traceback
    from polygraphy.backend.trt import TrtRunner

    with pytest.raises(EngineRunError, match="could not prepare the engine"):
        activate_runner(TrtRunner(object()))


# ------------------------------------------------------------------ 9. a tensor TensorRT lacks


def test_d09_a_constant_folded_into_weights_costs_only_its_own_mark(tmp_path):
    """`c` is an ONNX Constant output: the parser turns it into weights, the
    network has no such tensor. The other marks stay; `c` is reported."""
    from bisect_tui.engines.tensorrt.network import mark_exact

    def network():
        return Network([Tensor("x")], [Layer("Add_1", [Tensor("a")]), Layer("Relu_2", [Tensor("r")])])

    net = network()
    assert mark_exact(net, ["c", "a"]) == ["c"] and net.marked == ["a"]
    from bisect_tui.engines.tensorrt.buildflow import build_engine
    from bisect_tui.engines.tensorrt.cache import EngineCache

    def build_bytes(marks, box):
        box["missing"] = mark_exact(network(), marks)
        return b"plan"

    cache = EngineCache(tmp_path / "engines")
    out = build_engine(cache, _key_for, ["c", "a"], build_bytes, lambda d: "engine", lambda: False, {})
    assert out.missing_marks == ["c"] and out.marking_error == "" and out.dropped_marks == []
    hit = build_engine(cache, _key_for, ["c", "a"], build_bytes, lambda d: "engine", lambda: False, {})
    assert hit.cache_hit and hit.missing_marks == ["c"]


# ------------------------------------------------------------------ 10. the repro's profile, calibrator, version


def _spec(config, workaround=None):
    from types import SimpleNamespace

    return SimpleNamespace(model_file="model.onnx", inputs_file="inputs.npz", config=config.to_dict(), outputs=["y"],
                           tolerance={"atol": 1e-3, "rtol": 1e-3}, reference={"file": "reference.npz"},
                           workaround=workaround or {}, extra={"inputs": ["x[0]"]})


def test_d10_repro_builds_with_the_searchs_profile_and_calibration_cache(tmp_path):
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine
    from bisect_tui.engines.tensorrt.repro import SCRIPT

    cache = tmp_path / "calib.cache"
    cache.write_bytes(b"TRT-10000-EntropyCalibration2\nx: 3c010a14\n")
    cfg = EngineConfig(precision="int8", options=(("calibration_cache", str(cache)), ("profile", "x[0]=1x4:2x4:8x4")))
    files = TensorRTEngine().write_repro(tmp_path / "r", _spec(cfg))
    data = json.loads((tmp_path / "r" / "repro_tensorrt.json").read_text())
    assert data["profile_ranges"] == {"x[0]": [[1, 4], [2, 4], [8, 4]]}
    assert data["calibration_cache"] == "calibration.cache"
    assert (tmp_path / "r" / "calibration.cache").read_bytes() == cache.read_bytes()
    assert (tmp_path / "r" / "calibration.cache") in files
    # the script builds one profile (user ranges, else the saved inputs' shapes), a calibrator,
    # and tells TensorRT 11 apart by its major version as features.py does
    assert "kwargs[\"profiles\"] = [profile]" in SCRIPT and "Calibrator(data_loader=[]" in SCRIPT
    assert "int(str(trt.__version__).split(\".\")[0]) >= 11" in SCRIPT


# ------------------------------------------------------------------ 11. the proof's output types in the advice


def test_d11_the_suggested_command_reproduces_precision_and_output_types(tmp_path, monkeypatch):
    """keep_fp32.py (the bundle's Polygraphy --trt-npps script) run on a
    stand-in network with a stand-in tensorrt module: precision and output
    types FP32 on the proof's layers, precision only on a Cast."""
    import importlib.util
    import sys
    import types

    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    eng = TensorRTEngine()
    text = eng.workaround_text({"kind": "keep_fp32", "layer_precisions": {"Softmax_5": "fp32"}})
    assert "--trt-npps keep_fp32.py" in text and "output types" in text and "Softmax_5" in text
    workaround = {"kind": "keep_fp32", "keep_fp32": ["Softmax_5", "Cast_3"],
                  "layer_precisions": {"Softmax_5": "fp32", "Cast_3": "fp32"}, "output_types": {"Softmax_5": [0]}}
    eng.write_repro(tmp_path / "r", _spec(EngineConfig(precision="fp16"), workaround))
    fake = types.SimpleNamespace(float32="float32", float16="float16", bfloat16="bfloat16")
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    spec = importlib.util.spec_from_file_location("keep_fp32_bundle", tmp_path / "r" / "keep_fp32.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    soft = Layer("Softmax_5", [Tensor("out", "float32")], layer_type="SOFTMAX")
    cast = Layer("Cast_3", [Tensor("c", "float16")], layer_type="CAST")
    meta = Layer("(Unnamed Layer* 7) [ElementWise]", [Tensor("e", "float32"), Tensor("i", "int32")],
                 "[ONNX Layer: Softmax_5]")
    other = Layer("Relu_1", [Tensor("r", "float32")])
    module.postprocess(network=Network([], [soft, cast, meta, other]))
    assert (soft.precision, soft.out_types) == ("float32", {0: "float32"})
    assert (cast.precision, cast.out_types) == ("float32", {})
    assert (meta.precision, meta.out_types) == ("float32", {0: "float32"})
    assert (other.precision, other.out_types) == (None, {})


# ------------------------------------------------------------------ 12. one timing cache per session and GPU


def test_d12_builds_share_the_sessions_timing_cache(tmp_path):
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork

    from bisect_tui.engines.tensorrt.buildconfig import create_config_kwargs
    from bisect_tui.engines.tensorrt.cache import engine_versions, timing_cache_path
    from bisect_tui.engines.tensorrt.options import TrtOptions

    root = tmp_path / "session" / "engines" / "trt_engines"
    a100 = engine_versions("10.16.0", "0.53.6", "NVIDIA A100 80GB PCIe (sm_80)")
    path = timing_cache_path(root, a100)
    assert path.parent == root and path == timing_cache_path(root, dict(a100))
    assert path != timing_cache_path(root, {**a100, "gpu": "NVIDIA GeForce RTX 3090 (sm_86)"})
    assert path != timing_cache_path(root, {**a100, "tensorrt": "11.1.0"})
    kw = create_config_kwargs(TrtOptions("fp16"), _feats(10), [], TrtEnums, timing_cache=path)
    assert CreateConfig(**kw).timing_cache_path == str(path)
    assert EngineBytesFromNetwork(lambda: None, save_timing_cache=str(path)).timing_cache_path == str(path)
