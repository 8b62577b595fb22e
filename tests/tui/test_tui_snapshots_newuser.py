"""What a new user met at 80x24 (issue 22), on the real sample models and real
onnxruntime: the culprit pane shows the evidence, the keep-set and the engine's
error the CLI prints; the export key offers only what export writes; the steps
table shows more than two rows; help wraps beside its keys; a passing model
counts its fused nodes; a range check with FP16 findings is a warning; toasts
leave the settings form's buttons free. SVG snapshots (pytest-textual-snapshot)
for the not-a-fusion, keep-set and engine-error screens; regenerate with
`pytest tests/tui/test_tui_snapshots_newuser.py --snapshot-update`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bisect_tui.core.pipeline import TriageOptions
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.api import EngineConfig
from bisect_tui.tui.app import make_app
from bisect_tui.tui.widgets.culprit import CulpritPanel
from tui_helpers import BUDGET, gelu_options, screen_text, wait_for, wait_idle


def fp16_options(workdir: Path, samples: Path, model: str, tolerance: str) -> TriageOptions:
    shutil.copy(samples / model, workdir / model)
    return TriageOptions(model=Path(model), session_dir=Path("sess"), max_memory=BUDGET,
                         tolerance=parse_tolerance(tolerance), config=EngineConfig(precision="fp16"))


async def bisect_then_culprit_full_screen(pilot):
    await pilot.press("b")
    await wait_idle(pilot, 300)
    await pilot.press("tab", "f")  # the culprit pane, on the whole screen
    await wait_for(pilot, lambda: pilot.app.screen.has_class("-max-culprit"), what="the culprit pane full screen")
    await pilot.pause()  # its layout done before the snapshot


def panel_text(app) -> str:
    return str(app.screen.query_one(CulpritPanel).render())


def test_not_a_fusion_shows_its_evidence(snap_compare, workdir, samples):
    """FP16 at FP32's tolerance: no fusion to blame; the pane says where the error starts (the
    CLI's evidence line). Keeping every node in FP32 reproduces FP32 (the control, issue 21: the
    old conversion still rounded them and "none found" was the wrong answer), so a keep-set of
    five nodes passes even FP32's tolerance, and its repro goes into the bundle."""
    app = make_app(fp16_options(workdir, samples, "fp16_keepset.onnx", "fp32"))

    async def run(pilot):
        await bisect_then_culprit_full_screen(pilot)
        await pilot.press(*["down"] * 8)  # the pane scrolled to its evidence and the export line
        pane = app.screen.query_one(CulpritPanel)
        await wait_for(pilot, lambda: not pane.is_scrolling and any(
            getattr(a, "scroll_y", 0) > 0 for a in pane.ancestors_with_self), what="the pane scrolled")
        await pilot.pause()  # its last scroll painted before the snapshot
        text = panel_text(app)
        assert app.state.bisect.result.final_verdict == "not_fusion"
        assert "The evidence below shows where the error starts" in text
        # the FP16 probe sees the tensors inside the graph: the first one out of FP32's tolerance, not the output
        assert "Where the error starts\nevidence: the first tensor out of tolerance is blk0/bias:0" in text
        assert "keep-set: keep 5 of" in text and "control (every node kept in FP32" in text
        assert "e: export report + repro bundle" in text

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)


def test_keep_set_result_is_shown(snap_compare, workdir, samples):
    app = make_app(fp16_options(workdir, samples, "fp16_keepset.onnx", "fp16"))

    async def run(pilot):
        await bisect_then_culprit_full_screen(pilot)
        text = panel_text(app)
        p = app.state.bisect.result.precision
        assert p.passed and sorted(p.keep_fp32) == ["side/gain", "side/matmul"]
        assert "Keep-set: nodes to keep in FP32\nkeep-set: keep 2 of" in text
        assert "node_block_list=['side/matmul', 'side/gain']" in text
        assert "e: export report + repro bundle" in text  # ORT adds its keep-set repro

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)


def test_engine_error_is_shown(snap_compare, workdir, samples):
    """The FP16 engine does not build: the pane shows the engine's own message and the keep-set
    that makes it build, with more than two steps visible in the table above."""
    app = make_app(fp16_options(workdir, samples, "hann_fp16.onnx", "fp16"))

    async def run(pilot):
        await pilot.press("b")
        await wait_idle(pilot, 300)
        def steps_on_screen() -> int:
            screen = screen_text(app)
            return sum(f"┃ {n} " in screen for n in range(1, 10))

        await wait_for(pilot, lambda: "keep-set: keep 1 of" in panel_text(app) and steps_on_screen() >= 3,
                       what="the keep-set and the search's steps on screen")
        text = panel_text(app)
        assert "engine build_error: [ONNXRuntimeError]" in text and "Type Error" in text
        assert "keep-set: keep 1 of" in text
        screen = screen_text(app)
        steps = [n for n in range(1, 10) if f"┃ {n} " in screen]
        assert len(steps) >= 3, screen  # every step of this search is on screen at 80x24

    assert snap_compare(app, terminal_size=(80, 24), run_before=run)


async def test_range_check_with_fp16_findings_is_a_warning(workdir, samples):
    app = make_app(fp16_options(workdir, samples, "fp16_keepset.onnx", "fp16"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot, 300)
        await pilot.press("up", "up")  # from the comparison to the range check
        await wait_for(pilot, lambda: "Range check: ⚠ warning" in screen_text(app), what="the range check's pane")
        screen = screen_text(app)
        assert "Range check: ⚠ warning" in screen  # the pane says what its row says
        assert "⚠ warning Range check" in screen and "fp16 underflow: 1 tensor(s)" in screen
        assert app.state.states["range_check"] == "passed"  # the step passed; only its row warns
        assert "✔ passed  Baseline" in screen


async def test_passing_model_counts_its_fused_nodes(workdir):
    app = make_app(gelu_options("transformer_block.onnx", gelu=False))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b")
        await wait_idle(pilot, 300)
        await wait_for(pilot, lambda: "the full engine passes" in panel_text(app), what="the passing verdict's pane")
        n = len(app.state.fused.fused_nodes)
        assert n == 7
        text = panel_text(app)
        assert f"the full engine passes with all {n} of its fused nodes" in text and "over 0" not in text
        assert "e: export report   c:" in text  # a passing model gets no bundle


async def test_help_wraps_beside_its_keys(workdir):
    app = make_app(gelu_options("transformer_block.onnx"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "settings: inputs" in screen_text(app), what="the help screen")
        lines = screen_text(app).splitlines()
        assert any("tab / shift+tab  move focus (the focused pane has a heavy border)" in ln for ln in lines)
        at = next(i for i, ln in enumerate(lines) if "  o " in ln and "settings: inputs" in ln)
        start = lines[at].index("settings: inputs")
        cont = lines[at + 1]
        # the wrapped rest of the description starts under its first word, the key column stays empty
        assert cont[:start].strip("│ ") == "" and cont[start] != " " and cont[start - 1] == " "


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
async def test_notifications_leave_the_settings_buttons_free(workdir, size):
    app = make_app(gelu_options("transformer_block.onnx"))
    async with app.run_test(size=size, notifications=True) as pilot:
        await pilot.press("o")
        await wait_for(pilot, lambda: bool(app.screen.query("#apply")), what="the settings form")
        app.screen.query_one("#apply").focus()
        for _ in range(3):
            app.notify("the settings can change when nothing runs: press x to cancel first " * 3, timeout=30)
        await wait_for(pilot, lambda: len(app.screen.query("Toast")) == 3
                       and all(t.region.area for t in app.screen.query("Toast")), what="three laid-out toasts")
        toasts = list(app.screen.query("Toast"))
        assert len(toasts) == 3
        for button in ("#apply", "#cancel"):
            region = app.screen.query_one(button).region
            assert all(not region.overlaps(t.region) for t in toasts), (button, region, [t.region for t in toasts])


async def test_after_the_search_the_comparison_no_longer_says_to_bisect(workdir, samples):
    """Every "next" names a step still ahead: back on the checklist after `b`, the
    comparison pane gives the search's verdict instead of "press b to bisect"."""
    app = make_app(fp16_options(workdir, samples, "fp16_keepset.onnx", "fp16"))

    def pane() -> str:  # the comparison pane's words, unwrapped
        return " ".join(str(app.screen.query_one("#cmp-text").render()).split())

    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot, 300)
        assert "break tolerance; press b to bisect" in pane()
        await pilot.press("b")
        await wait_idle(pilot, 300)
        await pilot.press("h")
        await wait_for(pilot, lambda: "bisected: the error is not caused by a fusion" in pane(),
                       what="the comparison pane's verdict")
        assert app.state.bisect.result.final_verdict == "not_fusion"
        assert "press b to bisect" not in pane()
        assert "break tolerance; bisected: the error is not caused by a fusion" in pane()
