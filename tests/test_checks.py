"""Determinism and range checks on real ORT runs of purpose-built models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from bisect_tui.core.checks import parse_ranges
from bisect_tui.core.errors import UserError
from bisect_tui.core.pipeline import Triage, TriageOptions

from testlib import init, make_model, vi


def _run(path, tmp_path, **kw):
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / "s", **kw))
    t.prepare()
    t.run_baseline()
    return t


def test_nondeterministic_baseline_names_first_tensor(tiny_model, tmp_path):
    """ORT CPU kernels (even unseeded RandomNormal, seeded per process) repeat
    bit for bit, so the first run is made to differ the way a racy kernel
    would: its dump of `b` and `y` is changed by one ulp. The second run is
    real and must catch it, in topological order."""
    from bisect_tui.core import atomic

    t = _run(tiny_model, tmp_path)
    manifest = t.baseline.manifest
    for e in manifest["tensors"]:
        if e["tensor"] in ("b", "y"):
            f = t.session.baseline_dir / e["file"]
            arr = np.load(f)
            arr.flat[0] = np.nextafter(arr.flat[0], np.float32(np.inf))
            np.save(f, arr)
            import hashlib

            e["sha256"] = hashlib.sha256(arr.tobytes()).hexdigest()
    atomic.write_json(t.session.manifest_path, manifest)
    det = t.run_determinism()
    assert det["deterministic"] is False
    assert det["first"]["tensor"] == "b" and det["first"]["node"] == "relu"
    assert [d["tensor"] for d in det["differing"]] == ["b", "y"]
    assert "differs between two identical runs" in det["advice"]


def test_deterministic_model_passes(tiny_model, tmp_path):
    t = _run(tiny_model, tmp_path)
    det = t.run_determinism()
    assert det["deterministic"] is True and det["tensors_compared"] == 3
    assert t.session.read_json("determinism.json")["deterministic"] is True


def test_nan_origin_is_first_op_with_finite_inputs(tmp_path):
    nodes = [
        helper.make_node("Sub", ["x", "ten"], ["shifted"], name="shift"),  # makes negatives
        helper.make_node("Sqrt", ["shifted"], ["root"], name="sqrt"),  # NaN starts here
        helper.make_node("Mul", ["root", "ten"], ["y"], name="scale"),  # inherits it
    ]
    p = tmp_path / "nan.onnx"
    onnx.save(make_model(nodes, [vi("x", [8])], [vi("y", [8])], [init("ten", np.float32(10))]), p)
    t = _run(p, tmp_path)
    rc = t.run_range_check()
    assert [r["tensor"] for r in rc["nan_inf"]] == ["root", "y"]
    assert rc["nan_inf_origin"]["node"] == "sqrt"
    assert rc["nan_inf_origin"]["nan"] == 8
    assert rc["ok"] is False


def test_fp16_headroom_and_user_ranges(tiny_model, tmp_path):
    t = _run(tiny_model, tmp_path)
    t.opts.ranges = parse_ranges(["a=-100:100"])
    rc = t.run_range_check()
    over = {r["tensor"]: r for r in rc["fp16"]["overflow"]}
    y = np.load(t.session.baseline_dir / "layer_0002_Mul_y.npy")
    assert set(over) == {"y"}
    assert over["y"]["count"] == int((np.abs(y) > 65504).sum())
    assert over["y"]["headroom"] < 1
    assert rc["nan_inf"] == [] and rc["bf16"]["overflow"] == []
    assert [v["tensor"] for v in rc["user_ranges"]] == ["a"]


def test_engine_built_beside_the_dump_gives_the_same_check(samples, tmp_path, monkeypatch):
    """The engine under test is built in a thread while the baseline dumps
    (Capabilities.concurrent_builds): the same verdict and numbers as a build
    after the dump."""
    import threading

    from bisect_tui.core.pipeline import Triage, TriageOptions
    from bisect_tui.api import EngineConfig
    from bisect_tui.engines.ort.engine import OrtEngine

    where = []
    real = OrtEngine.build
    monkeypatch.setattr(OrtEngine, "build",
                        lambda self, *a, **k: where.append(threading.current_thread().name) or real(self, *a, **k))
    cfg = EngineConfig(config_entries=(("optimization.enable_gelu_approximation", "1"),))

    def check(name):
        t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / name, config=cfg))
        t.run_all()
        return t

    early = check("early")
    assert where[0].startswith("fused-build") and early.fused["passed"] is False
    monkeypatch.setattr(Triage, "_start_fused_build_early", lambda self: None)
    where.clear()
    after = check("after")
    assert where[0] == threading.main_thread().name
    assert early.fused["outputs"] == after.fused["outputs"]
    assert early.fused["fused_nodes"] == after.fused["fused_nodes"]
    # the sensitivity check's 1-ulp run: in the dump's own last session (both runs
    # above), in a thread beside what follows, or in the check itself: the same figures
    from bisect_tui.core import checks

    real_runs = checks.perturbed_runs
    how = []

    def no_session(reference, model, inputs, session=None, outputs=None):
        how.append("dump's session" if session is not None else threading.current_thread().name)
        return None if session is not None else real_runs(reference, model, inputs)

    monkeypatch.setattr(checks, "perturbed_runs", no_session)
    thread = check("thread")
    monkeypatch.setattr(Triage, "_start_sensitivity_early", lambda self: None)
    late = check("late")
    assert how[0] == "dump's session" and how[1].startswith("sensitivity")
    assert how[2] == "dump's session" and how[3] == threading.main_thread().name
    assert early.fused["sensitivity"]["outputs"] == after.fused["sensitivity"]["outputs"] \
        == thread.fused["sensitivity"]["outputs"] == late.fused["sensitivity"]["outputs"]


def test_the_second_run_makes_only_references_of_this_tool():
    """The child process makes its reference again from the spec the parent
    passes; anything but a class of this tool is refused, never imported."""
    import sys

    from bisect_tui.core.second_run import load_reference
    from bisect_tui.engines.ort.unfused import OrtUnfused

    assert type(load_reference(OrtUnfused.spec)) is OrtUnfused
    for bad in ("os:system", "bisect_tui.engines.ort.unfused:Ort Unfused", "bisect_tuix.evil:X", "shutil"):
        with pytest.raises(UserError, match="not a reference of this tool"):
            load_reference(bad)
    assert "bisect_tuix" not in sys.modules


def test_second_run_is_planned_for_a_fresh_process_not_this_one(tiny_model, tmp_path, monkeypatch):
    """An app that has grown to its whole --max-memory (the test suite's own process
    passed 1 GB on CI) still plans the second run in one group: that run is a fresh
    process. The baseline, dumped here, is what this process's size constrains."""
    from bisect_tui.core import memory
    from bisect_tui.core.checks import determinism_plan

    t = _run(tiny_model, tmp_path, max_memory=512 << 20)
    tensors = [e["tensor"] for e in t.baseline.manifest["tensors"]]
    assert determinism_plan(t.info, t.shapes, tensors, 512 << 20) == [tensors]
    monkeypatch.setattr(memory, "process_floor", lambda: 600 << 20)  # this process: over the budget
    assert memory.activation_budget(512 << 20, 0, {}) == 1  # here: one tensor per group
    assert determinism_plan(t.info, t.shapes, tensors, 512 << 20) == [tensors]
    det = t.run_determinism()
    assert det["deterministic"] is True and det["tensors_compared"] == len(tensors)
