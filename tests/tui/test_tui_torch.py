"""The app's model picker takes a PyTorch factory as `--torch` does, and its
checklist runs the front end (export, golden data, cross-check) for real."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from bisect_tui.tui.app import make_app  # noqa: E402
from bisect_tui.tui.screens.checklist import ChecklistScreen  # noqa: E402
from bisect_tui.tui.screens.picker import PickerScreen  # noqa: E402
from test_tui_picker import status, type_path  # noqa: E402
from testlib import REPO  # noqa: E402
from tui_helpers import wait_for, wait_idle  # noqa: E402

SPEC = f"{REPO / 'sample_models' / 'torch_models.py'}:tiny_transformer"


@pytest.mark.slow
async def test_picker_opens_a_torch_factory_and_runs_the_front_end(workdir):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await type_path(pilot, f"{REPO / 'sample_models' / 'torch_models.py'}:no_such_factory")
        await wait_for(pilot, lambda: "has no callable 'no_such_factory'" in status(app), what="the error")
        assert isinstance(app.screen, PickerScreen)
        await type_path(pilot, SPEC)
        await wait_for(pilot, lambda: isinstance(app.screen, ChecklistScreen), timeout=60, what="the checklist")
        assert app.state.options.torch["spec"] == SPEC and app.state.options.model is None
        await pilot.press("a")
        await wait_idle(pilot, timeout=120)
        assert app.state.states["fused"] == "passed"
        session = app.triage.session.root
        cc = json.loads((session / "torch" / "crosscheck.json").read_text())
        assert cc["export_matches"] and cc["crosscheck"]["coverage"]["modules"] == 28
        assert json.loads((session / "arbiter.json").read_text())["available"]
