"""Engine builds that take minutes report their phases through the triage's
progress, and a cancel stops them (TensorRT's builder asks after each step)."""

from pathlib import Path

import numpy as np

from bisect_tui.core.cancel import CancelToken
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.engines.tensorrt.progress import BuildProgress


def test_triage_wires_build_progress_and_cancel_into_the_tensorrt_engine():
    seen = []
    cancel = CancelToken()
    triage = Triage(TriageOptions(model=Path("m.onnx"), engine="tensorrt"), seen.append, cancel)
    engine = triage.engine  # constructing it imports no TensorRT
    assert engine.progress is not None
    # the same chain TensorRT's IProgressMonitor drives during a build
    monitor = BuildProgress(engine.progress)
    monitor.phase_start("Building engine", None, 3)
    assert monitor.step_complete("Building engine", 0) is True
    assert [p.stage for p in seen] == ["build", "build"]
    assert seen[-1].message == "building the TensorRT engine: Building engine 1/3"
    cancel.cancel()
    assert monitor.step_complete("Building engine", 1) is False  # the builder stops


def test_engines_without_build_phases_take_the_callback_and_never_call_it(tiny_model, tmp_path):
    # the contract declares the hook on every engine (api.EngineBase); an engine whose
    # builds have no phases to report (ORT's session creation) builds without a word
    seen = []
    triage = Triage(TriageOptions(model=tiny_model, engine="ort"), seen.append)
    engine = triage.engine
    assert engine.progress == triage._build_progress
    from bisect_tui.api import EngineConfig

    built = engine.build(tiny_model, EngineConfig(), workdir=tmp_path)
    assert set(built.run({"x": np.ones((2, 8), np.float32)})) >= {"y"}
    built.close()
    assert not [p for p in seen if p.stage == "build"]
