"""Engine builds that take minutes report their phases through the triage's
progress, and a cancel stops them (TensorRT's builder asks after each step)."""

from pathlib import Path

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


def test_engines_without_build_progress_are_left_alone():
    triage = Triage(TriageOptions(model=Path("m.onnx"), engine="ort"))
    assert not hasattr(triage.engine, "progress")
