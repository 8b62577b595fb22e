"""The whole wizard on transformer_block.onnx with the Gelu approximation:
checks, comparison FAIL, bisection naming FastGelu, export, screenshot."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import DataTable

from bisect_tui.tui.app import make_app
from bisect_tui.tui.screens.bisection import BisectionScreen
from bisect_tui.tui.screens.checklist import ChecklistScreen
from bisect_tui.tui.screens.settings import SettingsScreen
from bisect_tui.tui.widgets.common import StatusLine, StepList, WhyPanel
from bisect_tui.tui.widgets.culprit import CulpritPanel
from tui_helpers import EXPECTED_NODES, gelu_options, screen_text, wait_for, wait_idle


def prompt(app, step: str) -> str:
    return str(app.screen.query_one(StepList).get_option(step).prompt)


async def test_full_wizard_80x24(gelu, workdir):
    app = make_app(gelu)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, ChecklistScreen)
        assert "· pending" in prompt(app, "inputs")

        await pilot.press("a")  # run every check
        await wait_idle(pilot)
        st = app.state.states
        assert [st[s] for s in ("inputs", "baseline", "determinism", "range_check", "settings")] == ["passed"] * 5
        assert st["fused"] == "failed"
        assert "✔ passed" in prompt(app, "baseline")
        assert "✘ failed" in prompt(app, "fused")
        # the checklist followed the work down to the comparison: its table says FAIL and why
        table = app.screen.query_one("#cmp-table", DataTable)
        row = [str(c) for c in table.get_row_at(0)]
        assert row[0] == "mlp/residual:0" and "FAIL" in row[1] and row[2] == "atol/rtol"
        text = screen_text(app)
        assert "✘ FAIL" in text and "press b to find the fused op" in text

        await pilot.press("b")
        await wait_idle(pilot)
        assert isinstance(app.screen, BisectionScreen)
        result = app.state.bisect.result
        assert result.final_verdict == "culprits"
        (culprit,) = result.culprits
        assert culprit.op_type == "FastGelu"
        assert culprit.original_nodes == EXPECTED_NODES
        assert "GeluApproximation" in culprit.optimizers
        panel = str(app.screen.query_one(CulpritPanel).render())
        assert "Culprit 1: FastGelu" in panel
        assert "mlp/gelu/div" in panel and "mlp/gelu/mul_half" in panel
        assert "float64 truth" in panel and "Workaround: disable GeluApproximation" in panel
        steps = app.screen.query_one("#bis-steps", DataTable)
        assert steps.row_count == len(result.steps) >= 4
        assert "✔ found the culprit" in screen_text(app)  # a search that found it is not "failed"

        await pilot.press("e")
        await wait_idle(pilot)
        sess = workdir / "sess"
        for name in ("report.md", "report.json", "bundle.zip"):
            assert (sess / name).is_file(), name
        assert "exported sess/report.md" in app.status_text
        report = json.loads((sess / "report.json").read_text())
        assert report["bisect"]["culprits"][0]["op_type"] == "FastGelu"
        assert "FastGelu" in (sess / "report.md").read_text()

        await pilot.press("c")  # export again and copy the Markdown (OSC 52)
        await wait_idle(pilot)
        assert app.clipboard.startswith("# bisect-tui bisect: culprit(s) found: FastGelu") and "FastGelu" in app.clipboard
        assert "copied to the clipboard" in app.status_text

        await pilot.press("s")
        await pilot.pause()
        assert Path(app.last_screenshot).is_file()
        assert Path(app.last_screenshot).parent.resolve() == sess.resolve()

        await pilot.press("h")  # back to the checklist: the bisection row has its verdict
        await pilot.pause()
        assert isinstance(app.screen, ChecklistScreen)
        assert "✔ found" in prompt(app, "bisect")
        await pilot.press("q")
    assert app.return_code == 0


async def test_step_by_step_wide_120x40(gelu, workdir):
    app = make_app(gelu)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        # at 120 columns the why panel sits under the detail: the tables get the width
        assert not app.screen.has_class("-wide")
        assert not app.screen.query_one("#why-side", WhyPanel).display
        assert app.screen.query_one("#why-inline", WhyPanel).display

        expected = ["inputs", "baseline", "determinism", "range_check"]
        for i, step in enumerate(expected):
            await pilot.press("r")
            await wait_idle(pilot)
            assert app.state.states[step] == "passed", (step, app.status_text)
            later = expected[i + 1:] + ["fused"]
            assert all(app.state.states[s] == "pending" for s in later)
        assert app.state.manifest and len(app.state.manifest["tensors"]) == 32
        text = screen_text(app)
        assert "FP16 headroom" in text or "fp16 headroom" in text
        assert "log2 scale" in text  # the magnitude sparkline of the tightest tensor

        await pilot.press("r")  # engine settings: confirmed as they are
        await pilot.pause()
        assert app.state.states["settings"] == "passed"
        await pilot.press("r")
        await wait_idle(pilot)
        assert app.state.states["fused"] == "failed"
        text = screen_text(app)
        assert "baseline (FP32 unfused) values" in text and "fused engine values" in text
        assert "|fused - baseline| (log10)" in text
        table = app.screen.query_one("#cmp-table", DataTable)
        # at 120x40 the table fits its pane (the least useful column waits in full screen, f)
        assert "←→ scroll" not in table.border_subtitle
        assert "x tol" in text and "cosine" in text and "max rel" in text

        await pilot.press("l")  # the why panel in Chinese, and back
        await pilot.pause()
        assert "为什么重要" in str(app.screen.query_one("#why-inline", WhyPanel).render())
        await pilot.press("l")
        await pilot.pause()
        assert "Why this matters" in str(app.screen.query_one("#why-inline", WhyPanel).render())

        await pilot.press("b")
        await wait_idle(pilot)
        assert app.state.bisect.result.culprits[0].original_nodes == EXPECTED_NODES
        text = screen_text(app)
        assert "culprit: FastGelu" in text and "mlp/gelu/mul_half" in text


async def test_settings_form_breaks_and_validates(workdir):
    app = make_app(gelu_options("transformer_block.onnx", gelu=False))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot)
        assert app.state.states["fused"] == "passed"  # default fusion stays within fp32 tolerance

        await pilot.press("o")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        await pilot.press("tab", "tab")  # level -> precision -> config entries
        await pilot.press(*"optimization.enable_gelu_approximation=1")
        await pilot.press("tab", *"GeluApprox", "enter")
        await wait_for_text(pilot, "does not know this optimizer")
        assert isinstance(app.screen, SettingsScreen)  # the form stays, with a one-line reason
        assert "did you mean GeluApproximation" in screen_text(app)
        await pilot.press(*["backspace"] * len("GeluApprox"), "enter")
        await pilot.pause()
        assert isinstance(app.screen, ChecklistScreen)
        assert app.state.options.config.config_entries == (("optimization.enable_gelu_approximation", "1"),)
        assert app.state.states["fused"] == "pending" and app.state.options_dirty

        await pilot.press("r")
        await wait_idle(pilot)
        assert app.state.states["fused"] == "failed"
        # the session records the new settings, so `resume` reopens them
        meta = json.loads((workdir / "sess" / "session.json").read_text())
        assert meta["options"]["config"]["config_entries"] == {"optimization.enable_gelu_approximation": "1"}
        status = app.screen.query_one(StatusLine)
        assert "tolerance broken" in str(status.render())


async def wait_for_text(pilot, needle: str, timeout: float = 10.0) -> None:
    try:
        await wait_for(pilot, lambda: needle in screen_text(pilot.app), timeout, f"{needle!r} on screen")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{screen_text(pilot.app)}") from None


async def test_help_and_keys_without_escape(gelu, workdir):
    """Everything is reachable by plain keys; escape is never the only way out."""
    app = make_app(gelu)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "run the next step" in screen_text(app), what="the help")
        await pilot.press("q")  # closes the help, does not quit
        await pilot.pause()
        assert isinstance(app.screen, ChecklistScreen)
        await pilot.press("e")  # nothing to export yet: one line, no crash
        await pilot.pause()
        assert isinstance(app.screen, ChecklistScreen)
        keys = set(app.screen.active_bindings)
        assert {"r", "a", "b", "o", "q", "question_mark", "l", "s", "m"} <= keys
        for key in ("ctrl+s", "ctrl+b", "ctrl+q"):
            assert key not in keys or key == "ctrl+q"  # ctrl+q is Textual's own extra, never the only way


async def test_why_panel_beside_the_detail_from_140_columns(gelu):
    app = make_app(gelu)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        assert app.screen.has_class("-wide")
        assert app.screen.query_one("#why-side", WhyPanel).display
        assert not app.screen.query_one("#why-inline", WhyPanel).display
