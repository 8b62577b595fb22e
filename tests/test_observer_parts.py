"""The fused-graph probe's observer run in parts (engines/ort/observer.py), its
control (the graph outputs it reads must be the engine's own, bit for bit), a part
built from the proto in hand without reading its file back, and the closes a
process about to exit leaves undone (issue 24, thirteenth pass). Real ORT builds
on a 300-node two-culprit stack, with the part size lowered so it is cut."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from bisect_tui.api import BuildContext, EngineConfig
from bisect_tui.core import background
from bisect_tui.core.bisect import parts
from bisect_tui.core.bisect.probe import run_probe
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.engines.ort.engine import OrtEngine
from bisect_tui.engines.ort.observer import OrtObserver


@pytest.fixture
def stack(ln_stack_300):
    return ln_stack_300


@pytest.fixture
def small_parts(monkeypatch):
    monkeypatch.setattr(parts, "PART_NODES", 60)


def _optimized(path, workdir):
    built = OrtEngine().build(path, EngineConfig(), (), workdir)
    try:
        outs = built.run({"x": np.random.default_rng(0).standard_normal([1, 16, 16]).astype(np.float32)})
        return built.optimized_model_path, outs
    finally:
        built.close()


def test_an_observer_in_parts_reads_what_one_session_reads_bit_for_bit(stack, tmp_path, small_parts):
    _, path = stack
    opt, engine_outs = _optimized(path, tmp_path / "e")
    feeds = {"x": np.random.default_rng(0).standard_normal([1, 16, 16]).astype(np.float32)}
    whole, cut = OrtObserver(opt), OrtObserver(opt, in_parts=True)
    assert not whole.in_parts and cut.in_parts and cut.part_count >= 3
    tensors = whole.tensors
    # the probe asks in groups: a group that ends early runs only the parts it needs
    for group in (tensors, tensors[: len(tensors) // 3]):
        want, got = whole.observe(feeds, group), cut.observe(feeds, group)
        assert list(got) == list(want) and len(got) == len(group)
        for k in want:
            assert want[k].dtype == got[k].dtype and np.array_equal(want[k], got[k]), k
    (out,) = engine_outs
    assert np.array_equal(cut.observe(feeds, [out])[out], engine_outs[out])  # what the probe checks it on
    cut.whole()
    assert not cut.in_parts and cut.part_count == 1
    assert list(cut.observe(feeds, tensors)) == list(tensors)


def _checked(stack, tmp_path, name):
    _, path = stack
    t = Triage(TriageOptions(model=path, session_dir=tmp_path / name), lambda p: None)
    t.run_all()
    return t


def test_the_probe_checks_its_parts_on_the_engines_outputs(stack, tmp_path, monkeypatch):
    whole = _checked(stack, tmp_path, "whole")  # 300 nodes: under two parts' worth, one session
    monkeypatch.setattr(parts, "PART_NODES", 60)
    cut = _checked(stack, tmp_path, "cut")
    sw, sc = whole.check.shared_tensors, cut.check.shared_tensors
    assert sw["observer"] == {"parts": 1} and sc["observer"]["parts"] >= 3
    assert sc["observer"]["control"].startswith("graph outputs ") and "bit-identical" in sc["observer"]["control"]
    for k in ("tensors_compared", "failing", "first_failing_tensor", "worst_tensors", "profile"):
        assert sc[k] == sw[k], k


def test_a_control_that_differs_sends_the_probe_back_to_one_session(stack, tmp_path, small_parts):
    t = _checked(stack, tmp_path, "differs")
    optimized = t.check.optimized_model
    want = {k: t.check.shared_tensors[k] for k in ("failing", "first_failing_tensor")}
    outs = t.info.outputs
    feeds = t.inputs.feeds(0)
    built = t.engine.build(t.session.model_path, t.opts.config, (), tmp_path / "again")
    try:
        right = [built.run(feeds)]
    finally:
        built.close()
    t.probe_errors.clear()
    ok = run_probe(t, optimized, [], expected=right)
    assert ok["observer"]["parts"] >= 3 and "control_differed" not in ok["observer"]
    wrong = [{o: right[0][o] + np.float32(1e-3) for o in outs}]  # one ulp would do; the control is exact
    t.probe_errors.clear()
    back = run_probe(t, optimized, [], expected=wrong)
    assert back["observer"]["parts"] == 1 and back["observer"]["control_differed"] in outs
    assert "control" not in back["observer"]
    assert {"failing": back["failing_count"], "first_failing_tensor": back["first_failing_tensor"]} == want
    t.probe_errors.clear()
    bare = run_probe(t, optimized, [])  # nothing to check it on: one session from the start
    assert bare["observer"] == {"parts": 1} and bare["failing_count"] == want["failing"]


def test_a_part_handed_in_is_built_from_memory_not_from_its_file(stack, tmp_path):
    model, _ = stack
    path = tmp_path / "part.onnx"
    path.write_bytes(b"not an onnx file")  # what a build reading the file back would fail on
    feeds = {"x": np.random.default_rng(2).standard_normal([1, 16, 16]).astype(np.float32)}
    engine = OrtEngine()
    built = engine.build(path, EngineConfig(), [model.graph.node[3].output[0]], None,
                         context=BuildContext(map_wanted=False, model=model))
    try:
        got = built.run(feeds)
    finally:
        built.close()
    good = tmp_path / "good.onnx"
    onnx.save(model, str(good))
    ref = engine.build(good, EngineConfig(), [model.graph.node[3].output[0]], None,
                       context=BuildContext(map_wanted=False))
    try:
        want = ref.run(feeds)
    finally:
        ref.close()
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
    # a build whose optimized graph is saved names it by the file: the file is read, not the proto
    with pytest.raises(Exception, match="ONNX|onnx|protobuf|model"):
        engine.build(path, EngineConfig(), (), tmp_path / "w", context=BuildContext(model=model))


def test_the_last_closes_are_left_to_a_process_about_to_exit(monkeypatch):
    closed: list[str] = []
    background.run_later()
    background.close_later(lambda: closed.append("a"))
    background.run_later(last=True)  # in-process (tests, the app): run as before
    assert closed == ["a"]
    monkeypatch.setattr(background, "_EXIT_SOON", [])
    monkeypatch.setattr(background, "_LEFT", [])
    background.exit_soon()

    class Engine:
        def close(self):
            closed.append("b")

    e = Engine()
    background.close_later(e.close)
    background.run_later()  # a wait of the search still closes
    assert closed == ["a", "b"]
    background.close_later(e.close)
    background.run_later(last=True)
    assert closed == ["a", "b"] and background._LEFT == [e.close]  # kept alive: no teardown before the exit
    background.run_later()
    assert closed == ["a", "b"]


def test_a_wait_on_a_build_in_parts_leaves_the_closes_for_later(tmp_path):
    from concurrent.futures import Future

    from bisect_tui.core.bisect.scheduler import BuildScheduler, Plan

    class Running(Future):
        """A build still running when the scheduler looks, whose result is in by the time it waits."""

        def done(self):
            return False

    closed: list[int] = []
    background.run_later()
    sched = BuildScheduler(None, engine_dir=lambda c: tmp_path / "e", concurrent=True,
                           beside=lambda builds=2: True, cuts=lambda plan: ("cut",))
    cfg = EngineConfig()
    marked = Plan(kind="remaining fusions", region="whole graph", ids=(), config=cfg, marks=("t",), key="m")
    whole = Plan(kind="full engine", region="whole graph", ids=(), config=cfg, marks=(), key="w")
    for plan, want in ((marked, []), (whole, [1, 1])):
        f = Running()
        f.set_result(["done"])
        sched._prefetched[plan.key] = f
        background.close_later(lambda: closed.append(1))
        assert sched.build([plan])[0][1] == "done"
        # a teardown would stall the parts' Python: the close waits for a wait on a whole build
        assert closed == want, plan.kind
