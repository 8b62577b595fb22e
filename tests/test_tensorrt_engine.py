"""The TensorRT engine's glue, tested without TensorRT or a GPU: its
refusals and advice, the repro bundle, the GPU-box script, the optional
extra, session files, build progress, and the network edits on stand-ins for
TensorRT's objects (tests/fixtures/tensorrt_helpers.py). Nothing here claims
a TensorRT result: the GPU tests are in test_tensorrt_gpu.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from bisect_tui.core.errors import ExitCode, UserError
from bisect_tui.api import EngineConfig
from bisect_tui.engines.tensorrt.precision import NetworkLayer
from bisect_tui.engines.tensorrt.profiles import build_profiles
from fixtures.tensorrt_helpers import InputStub, Layer, Network, Tensor, chain_model


# ------------------------------------------------------------------ engine words, repro


def test_engine_refuses_what_tensorrt_cannot_do_and_says_how_to_apply_fixes():
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    eng = TensorRTEngine()
    with pytest.raises(UserError, match="no per-pass switch"):
        eng.validate(EngineConfig(disabled_passes=("ConvBNFusion",)))
    with pytest.raises(UserError, match="one optimization level"):
        eng.validate(EngineConfig(level="basic"))
    eng.validate(EngineConfig(precision="fp16"))
    assert eng.describe(EngineConfig(precision="fp16", keep_fp32=("Softmax_5",))) == [
        ("engine", "TensorRT via Polygraphy, FP16"), ("kept in FP32", "Softmax_5")]
    text = eng.workaround_text({"kind": "keep_fp32", "layer_precisions": {"Softmax_5": "fp32", "Softmax_5_1": "fp32"}})
    assert "--trt-npps keep_fp32.py -o model.engine" in text and "Softmax_5, Softmax_5_1" in text
    assert "--precision-constraints obey" in text
    assert "TensorRT 11" in eng.workaround_text({"kind": "keep_fp32"})
    assert "--precision fp32" in eng.workaround_text({"kind": "precision", "precision": "fp32"})
    assert eng.workaround_text({"kind": None}) == "no TensorRT setting was proven to fix it"
    assert eng.default_precision() == "fp32"
    assert "ModifyNetworkOutputs" in eng.workaround_text({"kind": "mark_outputs", "marked_tensors": ["t"]})
    assert eng.name == "tensorrt" and eng.known_passes() == set()


def test_repro_script_is_constant_and_reads_names_from_json(tmp_path):
    import subprocess
    import sys
    from types import SimpleNamespace

    from bisect_tui.engines.tensorrt.engine import TensorRTEngine
    from bisect_tui.engines.tensorrt.repro import SCRIPT

    evil = 'out"; import os; os.system("echo pwned") #'
    spec = SimpleNamespace(model_file="model.onnx", inputs_file="inputs.npz", config=EngineConfig(precision="fp16").to_dict(),
                           outputs=[evil], tolerance={"atol": 1e-3, "rtol": 1e-3},
                           reference={"file": "reference.npz", "name": "onnxruntime fp32"},
                           workaround={"kind": "keep_fp32", "keep_fp32": ["Softmax_5"]}, extra={"inputs": ["x"]})
    files = TensorRTEngine().write_repro(tmp_path, spec)
    assert [f.name for f in files] == ["repro_tensorrt.py", "repro_tensorrt.json", "keep_fp32.py"]
    assert files[0].read_text() == SCRIPT and evil not in SCRIPT
    data = json.loads(files[1].read_text())
    assert data["outputs"] == [evil] and data["input_names"] == ["x"]
    assert data["create_config"] == {"tf32": False, "fp16": True, "bf16": False, "int8": False,
                                     "precision_constraints": "obey"}
    compile(SCRIPT, "repro_tensorrt.py", "exec")
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        r = subprocess.run([sys.executable, str(files[0])], capture_output=True, text=True, timeout=120)
        assert r.returncode == 5 and "needs tensorrt and polygraphy" in r.stderr


def test_int8_refusal_comes_before_tensorrt_is_needed(tmp_path):
    from bisect_tui.engines.tensorrt.engine import TensorRTEngine

    src = tmp_path / "m.onnx"
    onnx.save(chain_model(), str(src))
    with pytest.raises(UserError) as e:
        TensorRTEngine().build(src, EngineConfig(precision="int8"))
    assert e.value.code == ExitCode.USAGE and "calibration cache" in str(e.value)


# ------------------------------------------------------------------ the GPU-box script, the extra


def test_gpu_check_script_parses_and_stops_cleanly_without_a_gpu(tmp_path):
    import shutil
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: the script would really run")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "OUT_DIR": str(tmp_path / "out"), "VENV": str(tmp_path / "venv")})
    assert r.returncode == 5 and "needs an NVIDIA GPU" in r.stderr
    assert not (tmp_path / "venv").exists()  # nothing installed on a machine that cannot run it


def test_tensorrt_extra_is_optional():
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert not any("tensorrt" in d for d in meta["dependencies"])
    assert not any("tensorrt" in d for d in meta["optional-dependencies"]["test"])
    assert meta["optional-dependencies"]["tensorrt"] == ["tensorrt>=10,<12"]


def test_declarations_import_no_engine_library():
    import subprocess
    import sys

    code = ("import sys, bisect_tui.engines.tensorrt as t; "
            "print(t.LABEL, sorted(m for m in ('tensorrt', 'polygraphy.backend.trt', 'onnxruntime', 'onnx') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "TensorRT []"


def test_engines_are_cached_in_the_session_even_for_marked_builds(tmp_path):
    """The search builds marked engines without a workdir: the cache is found
    from the model's place in the session."""
    from bisect_tui.engines.tensorrt.engine import session_cache_dir

    sess = tmp_path / "sess"
    (sess / "bisect" / "iso_3").mkdir(parents=True)
    (sess / "session.json").write_text("{}")
    assert session_cache_dir(sess / "model.onnx") == (sess / "engines" / "trt_engines").resolve()
    assert session_cache_dir(sess / "bisect" / "iso_3" / "subgraph.onnx") == (sess / "engines" / "trt_engines").resolve()
    loose = tmp_path / "loose"
    loose.mkdir()
    assert session_cache_dir(loose / "m.onnx") is None
    assert session_cache_dir(loose / "m.onnx", tmp_path / "wd") == tmp_path / "wd" / "trt_engines"
    # a symlinked session.json is not trusted
    other = tmp_path / "other"
    other.mkdir()
    os.symlink(sess / "session.json", other / "session.json")
    assert session_cache_dir(other / "m.onnx") is None


def test_build_progress_lines_and_cancel():
    from bisect_tui.engines.tensorrt.progress import BuildProgress

    lines, answers = [], iter([None, None, None, False])
    bp = BuildProgress(lambda text: (lines.append(text), next(answers, None))[1])
    bp.phase_start("Building engine", None, 3)
    bp.phase_start("Tactic selection", "Building engine", 10)
    assert bp.step_complete("Tactic selection", 4) is True
    assert lines[-1] == "building the TensorRT engine: Building engine 0/3 > Tactic selection 5/10"
    assert bp.step_complete("Tactic selection", 5) is False  # the user cancelled: TensorRT stops the build
    bp.phase_finish("Tactic selection")
    bp.phase_finish("Building engine")
    assert lines[-1] == "building the TensorRT engine: done"


def test_marking_matches_names_exactly_and_pins_set_fp32():
    """Polygraphy's ModifyNetworkOutputs would read `a[0]*` as a pattern and
    mark `a0x`; names are data, so marking is by exact name."""
    from bisect_tui.engines.tensorrt.engine import apply_pins, mark_exact, network_layers

    net = Network([Tensor("x")], [Layer("L0", [Tensor("a0x")]), Layer("L1", [Tensor("a[0]*")]),
                                    Layer("L2", [Tensor("shape", "DataType.INT64")], "[ONNX Layer: N2]")])
    assert mark_exact(net, ["a[0]*"]) == [] and net.marked == ["a[0]*"]
    # a name the network lacks is reported; the others are still marked (issue 25, item 9)
    assert mark_exact(net, ["a[0]?", "a0x"]) == ["a[0]?"] and net.marked == ["a[0]*", "a0x"]
    layers = network_layers(net)
    assert layers[2] == NetworkLayer("L2", ("shape",), ("INT64",), "[ONNX Layer: N2]", "ELEMENTWISE")
    from bisect_tui.engines.tensorrt.precision import PrecisionPlan

    assert apply_pins(net, PrecisionPlan("layer_precisions", {"L1": "fp32"}, output_types={"L1": [0]}),
                      "FP32-TYPE") == 1
    assert net._layers[1].precision == "FP32-TYPE" and net._layers[1].out_types == {0: "FP32-TYPE"}
    assert net._layers[0].precision is None


def test_profile_shapes_come_from_the_session_inputs_headers_only(tmp_path):
    """A dynamic model in a session: the engine builds for the saved inputs'
    shapes (input.npz stores (samples, *shape)), read without loading data."""
    from bisect_tui.engines.tensorrt.engine import session_input_shapes

    sess = tmp_path / "s"
    (sess / "bisect").mkdir(parents=True)
    (sess / "session.json").write_text("{}")
    np.savez(sess / "input.npz", x=np.zeros((3, 2, 5), np.float32), ids=np.zeros((3, 7), np.int64))
    assert session_input_shapes(sess / "model.onnx") == {"x": [2, 5], "ids": [7]}
    assert session_input_shapes(sess / "bisect" / "sub.onnx") == {"x": [2, 5], "ids": [7]}
    specs = build_profiles([InputStub("x", ["batch", 5])], session_input_shapes(sess / "model.onnx"))
    assert specs[0].opt == (2, 5)
    (sess / "input.npz").write_bytes(b"not a zip")
    assert session_input_shapes(sess / "model.onnx") == {}
    assert session_input_shapes(tmp_path / "elsewhere.onnx") == {}


def test_cli_tensorrt_refusals_are_one_line(tmp_path):
    """Through the real CLI, without TensorRT: INT8 without a cache is bad input
    (exit 2); a build needs TensorRT (exit 5, how to install it)."""
    import subprocess
    import sys

    src = tmp_path / "m.onnx"
    onnx.save(chain_model(), str(src))
    base = [sys.executable, "-m", "bisect_tui", "check", str(src), "--engine", "tensorrt", "-q"]
    r = subprocess.run(base + ["--precision", "int8", "--session", str(tmp_path / "s1")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "INT8 needs a calibration cache" in r.stderr
    r = subprocess.run(base + ["--disable", "ConvBNFusion", "--session", str(tmp_path / "s2")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        r = subprocess.run(base + ["--precision", "fp16", "--session", str(tmp_path / "s3")],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 5 and "pip install -e '.[tensorrt]'" in r.stderr and "Traceback" not in r.stderr
