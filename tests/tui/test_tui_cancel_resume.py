"""Cancel the bisection from the keyboard, then resume it: in the same app with r,
and in a new app opened on the session directory (what `bisect-tui resume DIR` does)."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import DataTable

from bisect_tui.core.resume import options_from_session
from bisect_tui.tui.app import make_app
from bisect_tui.tui.screens.bisection import BisectionScreen
from bisect_tui.tui.screens.checklist import ChecklistScreen
from tui_helpers import DEEP_NODES, gelu_options, screen_text, wait_for, wait_idle


def recorded(sess: Path) -> int:
    p = sess / "bisect" / "steps.jsonl"
    return len(p.read_text().splitlines()) if p.exists() else 0


async def test_cancel_then_resume(workdir):
    sess = workdir / "sess"
    app = make_app(gelu_options("deep_stack.onnx"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot)
        assert app.state.states["fused"] == "failed"

        # b then x as a user types them: simulate_key does not wait for the CPU to go idle
        app.simulate_key("b")
        await wait_for(pilot, lambda: app.state.bisect.steps, what="the first bisection step")
        app.simulate_key("x")
        await wait_idle(pilot)
        status = app.state.bisect.status
        assert status in ("cancelled", "finished"), status
        assert isinstance(app.screen, BisectionScreen)
        n_before = recorded(sess)
        assert n_before >= 1
        if status == "cancelled":
            assert "– cancelled" in screen_text(app)
            assert "r resumes" in app.status_text
            meta = json.loads((sess / "session.json").read_text())
            assert meta["steps"]["bisect"]["state"] == "cancelled"  # what `resume` sees

    if status == "cancelled":
        # a new app on the session directory: reopens on the interrupted bisection
        app2 = make_app(options_from_session(sess), resume=True)
        async with app2.run_test(size=(80, 24)) as pilot:
            await wait_idle(pilot)
            await pilot.pause()
            assert isinstance(app2.screen, BisectionScreen)
            assert app2.state.bisect.status == "interrupted"
            assert app2.state.bisect.recorded == n_before
            # the checklist behind it was restored from the session, not rerun from scratch
            assert app2.state.states["baseline"] == "passed" and app2.state.baseline_reused
            assert app2.state.states["fused"] == "failed"
            await pilot.press("r")
            await wait_idle(pilot)
            result = app2.state.bisect.result
            assert result.final_verdict == "culprits"
            assert result.culprits[0].original_nodes == DEEP_NODES
            assert result.search["reused_steps"] > 0
            table = app2.screen.query_one("#bis-steps", DataTable)
            assert any("↺" in str(table.get_row_at(i)[-1]) for i in range(table.row_count))

    # reopening a finished session shows its culprit at once, nothing rerun
    app3 = make_app(options_from_session(sess), resume=True)
    async with app3.run_test(size=(80, 24)) as pilot:
        await wait_idle(pilot)
        await pilot.pause()
        assert isinstance(app3.screen, BisectionScreen)
        assert app3.state.bisect.status == "finished"
        assert app3.state.bisect.result.culprits[0].original_nodes == DEEP_NODES
        assert "session reopened" in app3.status_text
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app3.screen, ChecklistScreen)
        assert app3.state.states["bisect"] == "found"  # the search succeeded: it named the culprit
        assert "✔ found" in screen_text(app3)


async def test_cancel_a_check_keeps_the_app_usable(workdir, hold_after):
    """x during the checks: the step goes back to pending (not failed) and r finishes it.
    The baseline is held after its real work, so x certainly comes while the checks run."""
    from bisect_tui.core.pipeline import Triage

    held = hold_after(Triage, "run_baseline")
    app = make_app(gelu_options("deep_stack.onnx"))
    async with app.run_test(size=(80, 24)) as pilot:
        app.simulate_key("a")
        await wait_for(pilot, lambda: app.busy, what="the checks to start")
        app.simulate_key("x")
        await wait_for(pilot, lambda: app.triage.cancel.cancelled, what="the cancel to reach the checks")
        held.set()
        await wait_idle(pilot)
        assert "failed" not in app.state.states.values()
        await pilot.press("a")
        await wait_idle(pilot)
        assert app.state.states["fused"] == "failed"
