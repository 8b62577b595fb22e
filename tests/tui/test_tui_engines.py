"""The settings form is drawn from the engine's declaration: OpenVINO's own
rows appear (device, properties, mark tensors), ORT's do not, a value typed
there reaches the session's config, and a wrong one is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from textual.widgets import Input, Label

from bisect_tui.core.pipeline import TriageOptions
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.tui.app import make_app
from bisect_tui.tui.screens.checklist import ChecklistScreen
from bisect_tui.tui.screens.settings import SettingsScreen
from tui_helpers import BUDGET, screen_text, wait_for

pytest.importorskip("openvino")


async def test_openvino_settings_rows_come_from_its_declaration(workdir, samples):
    shutil.copy(samples / "ov_rmsnorm.onnx", workdir / "ov_rmsnorm.onnx")
    opts = TriageOptions(model=Path("ov_rmsnorm.onnx"), session_dir=Path("sess"), engine="openvino",
                         max_memory=BUDGET, tolerance=parse_tolerance("fp32"))
    app = make_app(opts)
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.pause()
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings form")
        labels = [str(w.render()) for w in app.screen.query(Label)]
        assert {"device", "precision", "properties", "mark tensors"} <= set(labels)
        assert "disable optim." not in labels and "level" not in labels
        app.screen.query_one("#opt-config", Input).value = "NUM_STREEMS=1"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "did you mean NUM_STREAMS" in screen_text(app), what="the refusal")
        assert isinstance(app.screen, SettingsScreen)  # refused by OpenVINO's own validation
        app.screen.query_one("#opt-config", Input).value = ""
        app.screen.query_one("#opt-mark", Input).value = "norm/reduce:0"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChecklistScreen), what="back to the checklist")
        cfg = app.state.options.config
        assert json.loads(cfg.option("mark")) == ["norm/reduce:0"] and cfg.level == "all"


async def test_openvino_bisection_in_the_app(workdir, samples):
    """The app runs the same checks and search with OpenVINO: the Reduce fusion
    is named with its original nodes and the proven marking as the workaround."""
    from bisect_tui.tui.screens.bisection import BisectionScreen
    from bisect_tui.tui.widgets.culprit import CulpritPanel
    from tui_helpers import wait_idle

    shutil.copy(samples / "ov_rmsnorm.onnx", workdir / "ov_rmsnorm.onnx")
    opts = TriageOptions(model=Path("ov_rmsnorm.onnx"), session_dir=Path("sess"), engine="openvino",
                         max_memory=BUDGET, tolerance=parse_tolerance("fp32"))
    app = make_app(opts)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot)
        assert app.state.states["fused"] == "failed"
        await pilot.press("b")
        await wait_idle(pilot)
        assert isinstance(app.screen, BisectionScreen)
        result = app.state.bisect.result
        assert [c.original_nodes for c in result.culprits] == [["norm/reduce", "norm/add_eps", "norm/sqrt"]]
        panel = str(app.screen.query_one(CulpritPanel).render())
        assert "Reduce" in panel and "norm/add_eps" in panel and "--ov-mark norm/reduce:0" in panel
