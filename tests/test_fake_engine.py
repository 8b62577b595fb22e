"""The engine is injected into Triage and the app: a programmed fake engine
(tests/fake_engine.py) drives the real search, and holding it at a chosen
build lets a cancel land at a known step and a resume reuse what was done."""

from __future__ import annotations

import threading

import pytest

from bisect_tui.core.bisect.run import run_bisection
from bisect_tui.core.errors import Cancelled
from bisect_tui.core.pipeline import Triage, TriageOptions

from fake_engine import FakeEngine, save_two_linear


@pytest.fixture
def two_linear(tmp_path):
    path = tmp_path / "two_linear.onnx"
    return path, save_two_linear(path)


def test_injected_engine_finds_the_programmed_culprit(two_linear, tmp_path):
    path, fused = two_linear
    engine = FakeEngine(fused, {"Gemm_2": 0.5})
    triage = Triage(TriageOptions(model=path, session_dir=tmp_path / "s"), engine=engine)
    summary = triage.run_all()
    assert summary["verdict"] == "fail" and summary["versions"]["fake"] == "1"
    result = run_bisection(triage)
    assert result["verdict"] == "culprits"
    assert [c["original_nodes"] for c in result["culprits"]] == [["l2/matmul", "l2/bias"]]
    assert result["workaround"]["kind"] == "mark_outputs" and result["workaround"]["marked_tensors"] == ["m2"]
    assert result["workaround"]["full_engine"]["passed"] is True


def test_cancel_held_at_a_chosen_build_then_resume_reuses_the_steps(two_linear, tmp_path):
    path, fused = two_linear
    opts = TriageOptions(model=path, session_dir=tmp_path / "s")
    first = Triage(opts, engine=FakeEngine(fused, {"Gemm_2": 0.5}))
    first.run_all()  # build 1: the check's full engine
    engine = FakeEngine(fused, {"Gemm_2": 0.5}, hold_at=3)
    first._engine = engine
    outcome: dict = {}

    def search():
        try:
            outcome["result"] = run_bisection(first)
        except Cancelled:
            outcome["cancelled"] = True

    worker = threading.Thread(target=search)
    worker.start()
    assert engine.reached.wait(timeout=60)  # the search is inside its third build of this run
    first.cancel.cancel()
    engine.release.set()
    worker.join(timeout=60)
    assert outcome == {"cancelled": True}
    assert first.session.step_state("bisect") == "cancelled"
    done = len(first.session.path("bisect/steps.jsonl").read_text().splitlines())
    assert done >= 2  # the steps before the held one were recorded

    again = FakeEngine(fused, {"Gemm_2": 0.5})
    second = Triage(opts, engine=again)
    second.run_all()
    result = run_bisection(second)
    assert [c["original_nodes"] for c in result["culprits"]] == [["l2/matmul", "l2/bias"]]
    assert result["reused_steps"] >= done
