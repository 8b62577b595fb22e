"""The UI thread stays free while a big model is dumped and bisected: keys are
answered during the work (engine work runs in thread workers)."""

from __future__ import annotations

import sys

import onnx
import pytest

from bisect_tui.tui.app import make_app
from tui_helpers import gelu_options, wait_for, wait_idle

from testlib import REPO


@pytest.fixture
def big_model(tmp_path):
    """~2,400 nodes: 200 blocks of MatMul+Add, Relu/erf-Gelu, decomposed LayerNorm."""
    sys.path.insert(0, str(REPO / "sample_models"))
    import build

    g, _ = build._stack("big", 3, 200, {120})
    path = tmp_path / "big.onnx"
    onnx.save(g.model("responsiveness"), path)
    return path


async def test_keys_answered_during_baseline_and_bisection(big_model, tmp_path, monkeypatch, hold_after):
    from bisect_tui.core.bisect.search import Bisector
    from bisect_tui.core.pipeline import Triage

    monkeypatch.chdir(tmp_path)
    checks_held = hold_after(Triage, "run_baseline")
    search_held = hold_after(Bisector, "run")
    opts = gelu_options(str(big_model), "sess")
    app = make_app(options=opts)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")  # every check, starting with the baseline of ~2,400 tensors
        await wait_for(pilot, lambda: app.busy, what="work to start")
        for _ in range(3):  # each key takes effect while the worker still runs
            before = app.lang
            await pilot.press("l")
            await wait_for(pilot, lambda: app.lang != before, timeout=2.0, what="the language key")
            assert app.busy
        checks_held.set()
        await wait_idle(pilot, timeout=240)
        await pilot.press("b")
        await wait_for(pilot, lambda: app.busy, what="the bisection to start")
        before = app.lang
        await pilot.press("l")
        await wait_for(pilot, lambda: app.lang != before, timeout=2.0, what="the language key")
        assert bool(app.busy)  # answered while the search was still running
        search_held.set()
        await wait_idle(pilot, timeout=240)
