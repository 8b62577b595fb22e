"""Cancel in the app at a known step: the programmed fake engine (tests/fake_engine.py)
holds the search inside a chosen build, so the cancel always lands mid-search (the
deep_stack cancel test can pass when the search finished first); a new app then
resumes from the session and reuses the recorded steps."""

from __future__ import annotations

from pathlib import Path


from bisect_tui.core.pipeline import TriageOptions
from bisect_tui.core.resume import options_from_session
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.tui.app import make_app
from fake_engine import FakeEngine, save_two_linear
from tui_helpers import BUDGET, wait_for, wait_idle


async def test_cancel_held_at_a_chosen_step_then_resume(workdir):
    fused = save_two_linear(workdir / "two_linear.onnx")
    sess = workdir / "sess"
    opts = TriageOptions(model=Path("two_linear.onnx"), session_dir=Path("sess"), max_memory=BUDGET,
                         tolerance=parse_tolerance("fp32"))
    engine = FakeEngine(fused, {"Gemm_2": 0.5}, hold_at=3)  # build 1: the check; 2-3: the search
    app = make_app(opts, engine=engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot)
        assert app.state.states["fused"] == "failed"
        app.simulate_key("b")
        await wait_for(pilot, engine.reached.is_set, what="the search inside its held build")
        app.simulate_key("x")
        # the held build is let go only once the cancel reached the search's token
        await wait_for(pilot, lambda: app.triage is not None and app.triage.cancel.cancelled,
                       what="the cancel reaching the running search")
        engine.release.set()
        await wait_idle(pilot)
        assert app.state.bisect.status == "cancelled"  # always: the search was held mid-build
        n_before = len((sess / "bisect" / "steps.jsonl").read_text().splitlines())
        assert n_before >= 1

    again = FakeEngine(fused, {"Gemm_2": 0.5})
    app2 = make_app(options_from_session(sess), resume=True, engine=again)
    async with app2.run_test(size=(80, 24)) as pilot:
        await wait_idle(pilot)
        await pilot.pause()
        assert app2.state.bisect.status == "interrupted"
        await pilot.press("r")
        await wait_idle(pilot)
        result = app2.state.bisect.result
        assert [c.original_nodes for c in result.culprits] == [["l2/matmul", "l2/bias"]]
        assert result.search["reused_steps"] >= n_before
