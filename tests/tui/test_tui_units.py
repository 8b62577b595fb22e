"""Small pieces of the app: progress coalescing, formatting, form parsing, quitting."""

from __future__ import annotations

import pytest
from textual.app import App

from bisect_tui.core.errors import UserError
from bisect_tui.tui.app import make_app
from bisect_tui.tui.format import clip_hist, mini_spark, state_label
from bisect_tui.tui.messages import BisectStep, EngineProgress, StepFinished
from bisect_tui.tui.screens.settings import parse_entries, parse_names
from bisect_tui.tui.widgets.common import wrap_cjk
from tui_helpers import gelu_options, wait_exit, wait_for


def test_progress_is_coalesced_per_stage_only():
    a = EngineProgress("baseline", "1/3", 1, 3)
    b = EngineProgress("baseline", "2/3", 2, 3)
    assert b.can_replace(a)
    assert not EngineProgress("fused", "x").can_replace(a)
    # results and bisection steps are never dropped
    assert not BisectStep({"n": 1}).can_replace(BisectStep({"n": 0}))
    assert not b.can_replace(StepFinished("baseline", "passed", {}))


async def test_a_flood_of_progress_collapses():
    """Progress posted faster than it is handled reaches the handler once per run of
    one stage, with the latest text; another stage in between is kept, in order.
    The messages are posted with no await between them, so all 501 are queued before
    the app handles the first: what reaches the handler does not depend on timing."""
    seen: list[str] = []

    class Probe(App):
        def on_engine_progress(self, m: EngineProgress) -> None:
            seen.append(m.text)

    app = Probe()
    async with app.run_test() as pilot:
        await pilot.pause()
        for i in range(250):
            app.post_message(EngineProgress("baseline", str(i), i, 500))
        app.post_message(EngineProgress("fused", "f"))
        for i in range(250, 500):
            app.post_message(EngineProgress("baseline", str(i), i, 500))
        await wait_for(pilot, lambda: seen[-1:] == ["499"], what="the last progress message")
    assert seen == ["249", "f", "499"]


def test_states_are_words_and_symbols():
    assert state_label("passed") == "✔ passed"
    assert state_label("failed") == "✘ failed"
    assert state_label("running") == "… running"
    assert state_label("pending") == "· pending"
    assert state_label("skipped") == "– skipped"


def test_sparkline_helpers():
    assert mini_spark([0, 0, 0]) == "   "
    assert mini_spark([1, 8]) == "▁█"
    assert len(mini_spark(list(range(100)), 12)) == 12
    # exponents -32..32 folded into -26..16: the ends collect what lies outside
    counts = [0] * 65
    counts[0] = 5  # 2^-32: rounds to zero in fp16
    counts[64] = 7  # 2^32: overflows fp16
    counts[32] = 1  # 2^0
    folded = clip_hist(counts, -26, 16, -32)
    assert folded[0] == 5 and folded[-1] == 7 and folded[26] == 1 and sum(folded) == 13


def test_wrap_cjk_breaks_between_characters():
    text = "为什么重要：基线就是标准答案，关闭所有融合（ORT_DISABLE_ALL）再跑一遍。"
    lines = wrap_cjk(text, 20).splitlines()
    from rich.cells import cell_len

    assert all(cell_len(line) <= 20 for line in lines)
    assert "".join(lines) == text.replace(" ", "")
    assert any("ORT_DISABLE_ALL" in line for line in lines)  # Latin words stay whole


def test_settings_parsing():
    assert parse_entries("b=2, a=1") == (("a", "1"), ("b", "2"))
    assert parse_entries("") == ()
    with pytest.raises(UserError):
        parse_entries("novalue")
    assert parse_names("GeluApproximation, GeluFusionL2 GeluApproximation") == (
        "GeluApproximation", "GeluFusionL2")


async def test_quit_while_working_returns_130(workdir, hold_after):
    """q while the checks run cancels them and exits 130. The baseline is held after its
    real work (CI once finished all of deep_stack's checks inside one settle of the app,
    so the test never saw it busy)."""
    from bisect_tui.core.pipeline import Triage

    held = hold_after(Triage, "run_baseline")
    app = make_app(gelu_options("deep_stack.onnx"))
    async with app.run_test(size=(80, 24)) as pilot:
        app.simulate_key("a")
        await wait_for(pilot, lambda: app.busy, what="work to start")
        app.simulate_key("q")
        await wait_exit(pilot)
        held.set()  # before the app's shutdown, which waits for its worker thread
    assert app.return_code == 130


async def test_quit_returns_0(workdir):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
    assert app.return_code == 0


async def test_core_user_error_is_one_line_not_a_traceback(workdir):
    """A UserError from the core (here: the session holds another model) marks the
    step failed, shows one line in the status bar and keeps the app usable."""
    from bisect_tui.core.pipeline import Triage
    from bisect_tui.tui.widgets.common import StatusLine
    from tui_helpers import screen_text, wait_idle

    Triage(gelu_options("transformer_block.onnx")).prepare()
    app = make_app(gelu_options("deep_stack.onnx"))  # same session dir "sess"
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        await wait_idle(pilot)
        assert app.state.states["inputs"] == "failed"
        status = str(app.screen.query_one(StatusLine).render())
        assert status.startswith("error: session sess holds a triage of another model")
        assert app.status_error
        assert "Traceback" not in screen_text(app)
        await pilot.press("question_mark")  # still alive and responsive
        await wait_for(pilot, lambda: "run the next step" in screen_text(app), what="the help")
