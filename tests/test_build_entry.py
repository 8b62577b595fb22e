"""Where the checklist and the search hand the cores to the engine (issue 24): the early
build reaching ONNX Runtime before the next GIL-holding step, closes put off to the
search's waits, and parts built without writing an optimized graph. Real ORT builds."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bisect_tui.api import BuildContext, EngineConfig
from bisect_tui.core import background
from bisect_tui.core.pipeline import Triage, TriageOptions
from bisect_tui.core.triage.overlap import Overlap
from bisect_tui.engines.ort import session as ort_session
from bisect_tui.engines.ort.engine import OrtEngine

GELU = EngineConfig(config_entries=(("optimization.enable_gelu_approximation", "1"),))


def test_the_checklist_waits_for_the_early_build_to_reach_the_engine(samples, tmp_path, monkeypatch):
    """The second run's plan (shape inference of the whole graph, one call holding the
    GIL) starts only once the engine under test is inside its library. The build is
    held before it gets there until the plan starts, or 1 s has shown that it does not:
    without the wait the plan starts at once, releases the build, and comes first."""
    order: list[str] = []
    planned = threading.Event()
    real_check = ort_session._uses_external_data_file
    monkeypatch.setattr(background, "ENTRY_WAIT_S", 30.0)  # longer than the hold: the order is certain

    def slow_check(path):
        if threading.current_thread().name.startswith("fused-build"):
            planned.wait(1.0)
        return real_check(path)

    monkeypatch.setattr(ort_session, "_uses_external_data_file", slow_check)
    real_context = Triage.build_context

    def context(self, callbacks=True, entered=None):
        def mark():
            order.append("entered")
            entered()
        return real_context(self, callbacks, mark if entered is not None else None)

    monkeypatch.setattr(Triage, "build_context", context)
    real_plan = Overlap._start_second_run_early

    def plan(self):
        order.append("second run planned")
        planned.set()
        return real_plan(self)

    monkeypatch.setattr(Overlap, "_start_second_run_early", plan)
    t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / "s", config=GELU),
               lambda p: None)
    t0 = time.perf_counter()
    t.run_baseline()
    assert order[:2] == ["entered", "second run planned"]
    t.run_all()
    assert t.fused is not None and t.fused["passed"] is False  # the engine it built is judged as before
    assert time.perf_counter() - t0 < 30


def test_ort_says_once_when_it_takes_over(samples, tmp_path):
    calls: list[bool] = []
    model = samples / "transformer_block.onnx"

    def entered():
        calls.append(os.path.exists(tmp_path / "w"))

    built = OrtEngine().build(model, GELU, (), tmp_path / "w", context=BuildContext(entered=entered))
    try:
        assert calls == [True]  # once, after our own preparation (the workdir is made)
    finally:
        built.close()
    # refused before the library is reached: never said
    calls.clear()
    with pytest.raises(Exception):
        OrtEngine().build(model, EngineConfig(level="no-such-level"), (), tmp_path / "w2",
                          context=BuildContext(entered=entered))
    assert calls == []


def test_closes_wait_for_the_searchs_next_wait(samples, tmp_path):
    closed: list[str] = []
    background.close_later(lambda: closed.append("a"))
    background.close_later(lambda: closed.append("b"))
    assert closed == []
    background.run_later()
    assert closed == ["a", "b"]
    background.run_later()
    assert closed == ["a", "b"]  # each once


def test_the_checks_engine_is_closed_by_the_search_not_before(samples, tmp_path, monkeypatch):
    closed: list[str] = []
    closed_once = threading.Event()
    real_close = ort_session.OrtBuilt.close

    def close(self):
        if self._session is not None and len(self.output_names) == 1:  # unmarked: the graph's one output
            closed.append(threading.current_thread().name)
            closed_once.set()
        return real_close(self)

    monkeypatch.setattr(ort_session.OrtBuilt, "close", close)
    background.run_later()
    t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / "ahead",
                             config=GELU), lambda p: None)
    t.search_ahead = True
    t.run_all()  # the map was read inside run_fused: nothing of the check is still running
    assert closed == []  # the engine under test is still open: its teardown waits for the search
    background.run_later()
    assert closed == ["MainThread"]
    # without a search ahead (the check command, the app) it is closed at once
    closed.clear()
    closed_once.clear()
    t = Triage(TriageOptions(model=samples / "transformer_block.onnx", session_dir=tmp_path / "plain",
                             config=GELU), lambda p: None)
    t.run_all()
    assert closed_once.wait(30)  # closed when its map thread is done, with nothing put off
    assert len(closed) == 1


def test_a_build_nobody_maps_writes_no_optimized_graph(samples, tmp_path, monkeypatch):
    made: list[str] = []
    real_dir = ort_session.tempfile.TemporaryDirectory

    def tracked(*a, **k):
        d = real_dir(*a, **k)
        made.append(d.name)
        return d

    monkeypatch.setattr(ort_session.tempfile, "TemporaryDirectory", tracked)
    model = samples / "transformer_block.onnx"
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)}
    import onnx

    names = [o for n in onnx.load(str(model)).graph.node for o in n.output][:5]
    mapped = OrtEngine().build(model, GELU, names, None)
    try:
        assert mapped.optimized_model_path is not None and mapped.optimized_model_path.exists()
        want = mapped.run(feeds)
    finally:
        mapped.close()
    assert len(made) == 1
    bare = OrtEngine().build(model, GELU, names, None, context=BuildContext(map_wanted=False))
    try:
        assert bare.optimized_model_path is None
        assert len(made) == 1  # no temp folder either
        got = bare.run(feeds)
        with pytest.raises(RuntimeError):
            bare.fused_nodes
    finally:
        bare.close()
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])  # the same program


def test_marked_size_bounds_what_is_passed_as_bytes(tmp_path):
    from bisect_tui.core.onnx_files import model_size_estimate

    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], np.ones(64 * 64, np.float32).tolist())  # typed field
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    m = helper.make_model(g)
    p = Path(tmp_path) / "m.onnx"
    onnx.save(m, str(p))
    size = ort_session._marked_size(p, ["y"])
    marked = ort_session.mark_outputs(m, ["y"], {})
    assert size >= len(marked.SerializeToString()) >= p.stat().st_size  # what ORT is given, at most
    assert size < model_size_estimate(m) + len(m.SerializeToString())  # not looser than the walk it replaced, much
    assert ort_session._marked_size(tmp_path / "gone.onnx", ["y"]) == 0


def test_a_whole_graph_build_hands_its_result_over_before_its_teardown(samples, tmp_path, monkeypatch):
    from bisect_tui.core.bisect.pool import BuildJob, build_and_run
    from bisect_tui.core.bisect.scheduler import BuildScheduler, Plan

    closed: list[int] = []
    real_close = ort_session.OrtBuilt.close
    monkeypatch.setattr(ort_session.OrtBuilt, "close", lambda self: (closed.append(1), real_close(self))[1])
    background.run_later()
    model = samples / "transformer_block.onnx"
    feeds = [{"x": np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)}]
    later = BuildJob(config=GELU, marks=(), workdir=str(tmp_path / "a"), close_later=True)
    res = build_and_run(OrtEngine(), str(model), feeds, later)
    assert res.outputs and res.fused_objs and closed == []  # the map and outputs are in, the engine still open
    background.run_later()
    assert closed == [1]
    # in a worker process, and without the flag, it is closed before the result
    build_and_run(OrtEngine(), str(model), feeds, later, worker="w123")
    assert closed == [1, 1]
    build_and_run(OrtEngine(), str(model), feeds, BuildJob(config=GELU, marks=(), workdir=str(tmp_path / "b")))
    assert closed == [1, 1, 1]

    # the scheduler asks for it only for unmarked builds where a third engine fits the budget
    def scheduler(fits: bool) -> BuildScheduler:
        return BuildScheduler(None, engine_dir=lambda c: tmp_path / "e", concurrent=True,
                              beside=lambda builds=2: fits or builds < 3)

    plan = Plan(kind="full engine", region="whole graph", ids=(), config=GELU, marks=(), key="k")
    assert scheduler(True).job(plan).close_later
    assert not scheduler(False).job(plan).close_later
    marked = Plan(kind="remaining fusions", region="whole graph", ids=(), config=GELU, marks=("t",), key="m")
    assert not scheduler(True).job(marked).close_later
