"""What a new user hit in the app, at 80x24 and 120x40: a model with dynamic
inputs, the footer, focus, full pass names, a found culprit shown as found,
full-screen tables, the error along the graph, the command palette,
`tui --json/--report`, export with plots."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Sparkline

from bisect_tui.core.pipeline import TriageOptions
from bisect_tui.tui.app import make_app
from bisect_tui.tui.screens.bisection import BisectionScreen
from bisect_tui.tui.screens.checklist import ChecklistScreen
from bisect_tui.tui.screens.fullscreen import FullScreenTable
from bisect_tui.tui.screens.settings import SettingsScreen
from bisect_tui.tui.widgets.common import StepList, WhyPanel
from bisect_tui.tui.widgets.errorprofile import ErrorProfileChart
from newuser_models import vad_like
from tui_helpers import BUDGET, Terminal, screen_text, wait_for, wait_idle

SIZES = [(80, 24), (120, 40)]
IDS = ["80x24", "120x40"]


def footer_line(app) -> str:
    return screen_text(app).splitlines()[-1]


def prompt(app, step: str) -> str:
    return str(app.screen.query_one(StepList).get_option(step).prompt)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_a_model_with_dynamic_inputs_runs_from_the_settings_form(workdir, size):
    model = vad_like(workdir / "vad.onnx")
    app = make_app(TriageOptions(model=Path("vad.onnx"), max_memory=BUDGET))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press("r")
        await wait_idle(pilot)
        st = app.state
        assert st.states["inputs"] == "failed" and st.suggestion is not None
        text = screen_text(app)
        assert "'sr'" in text and "press o" in app.status_text
        assert "q Quit" in footer_line(app) and "? Help" in footer_line(app)

        await pilot.press("o")  # the form holds the suggestion that ran in the probe
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), what="settings form")
        form = app.screen
        assert form.query_one("#shapes", Input).value == "input=1x512, state=2x1x4"
        assert form.query_one("#values", Input).value == "sr=16000"
        assert form.focused is form.query_one("#shapes", Input)
        values = form.query_one("#values", Input)
        values.value += ", flag=true"  # the bool input the user decides
        values.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChecklistScreen), what="back to the checklist")

        await pilot.press("a")
        await wait_idle(pilot, 120)
        st = app.state
        assert st.states["inputs"] == "passed" and st.states["fused"] == "passed", app.status_text
        arrays = {a["name"]: a for a in st.inputs["arrays"]}
        assert arrays["sr"]["values"] == [16000] and arrays["flag"]["values"] == [True]
        assert arrays["input"]["shape"] == [1, 512]
        # its own session directory, keyed by these inputs
        assert st.session_root.name.startswith("vad-") and len(st.session_root.name.split("-")) == 3
        assert model.exists()


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_picker_fills_in_the_suggestion(workdir, size):
    vad_like(workdir / "vad.onnx")
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        path = app.screen.query_one("#path", Input)
        path.focus()
        path.value = "vad.onnx"
        await pilot.press("enter")
        flags = app.screen.query_one("#flags", Input)
        await wait_for(pilot, lambda: "--shape" in flags.value, what="the suggested flags")
        assert flags.value == "--shape input=1x512 --shape state=2x1x4 --input-value sr=16000"
        assert app.screen.focused is flags
        flags.value += " --input-value flag=true"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChecklistScreen), what="the checklist")
        o = app.state.options
        assert o.shapes == {"input": [1, 512], "state": [2, 1, 4]}
        assert o.input_values == {"sr": 16000, "flag": True}
        # a typo is one line in the picker, never an exit
        await pilot.press("m")
        await wait_for(pilot, lambda: app.screen.query("#flags"), what="picker again")
        app.screen.query_one("#path", Input).value = "vad.onnx"
        flags = app.screen.query_one("#flags", Input)
        flags.value = "--shape input=1x512 --level all"
        flags.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: "not an input option here" in screen_text(app), what="the error")


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_evidence_readable_footer_focus_and_found(gelu, size):
    app = make_app(gelu)
    async with app.run_test(size=size) as pilot:
        # the footer is painted on a later refresh than the first settle: polled, not sampled once
        await wait_for(pilot, lambda: "q Quit" in footer_line(app) and "? Help" in footer_line(app),
                       what="the checklist's footer")
        assert "┏━ Checklist" in screen_text(app)  # focus is a heavy border, not only a colour
        await pilot.press("b")
        await wait_idle(pilot, 120)
        assert isinstance(app.screen, BisectionScreen)
        # the pushed screen's footer is painted on a later refresh: polled, not sampled once
        await wait_for(pilot, lambda: "q Quit" in footer_line(app) and "? Help" in footer_line(app),
                       what="the bisection screen's footer")
        assert "state: ✔ found the culprit" in screen_text(app)
        table = app.screen.query_one("#bis-steps", DataTable)
        kinds = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
        # full pass names: which `disable ...` passes is the evidence
        assert kinds == [s.kind for s in app.state.bisect.result.steps]
        assert any(k.startswith("disable Gelu") for k in kinds)
        await pilot.press("f")  # the steps with every column on the whole screen
        await pilot.pause()
        assert isinstance(app.screen, FullScreenTable)
        full = app.screen.query_one("#fs-table", DataTable)
        assert [str(c.label) for c in full.columns.values()][3] == "marked"  # every column, scrollable
        assert full.row_count == len(app.state.bisect.result.steps)
        await pilot.press("escape")
        await pilot.pause()
        app.screen.query_one("#bis-side").focus()
        await pilot.press("f")  # the culprit pane on the whole screen
        await pilot.pause()
        assert app.screen.has_class("-max-culprit") and not app.screen.query_one("#bis-steps").display
        await pilot.press("f")
        await pilot.press("h")
        await pilot.pause()
        assert "✔ found" in prompt(app, "bisect")  # not "✘ failed": the search succeeded
        view = str(app.screen.query_one("#bsum-text").render())
        assert "culprit(s) found" in view and "culprits (" not in view


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_full_screen_table_error_along_the_graph_and_wide_sparklines(gelu, size):
    app = make_app(gelu)
    async with app.run_test(size=size) as pilot:
        await pilot.press("a")
        await wait_idle(pilot)
        screen = app.screen
        screen.select("fused")
        await pilot.pause()
        table = screen.query_one("#cmp-table", DataTable)
        assert "f full screen" in table.border_subtitle
        if size[0] == 80:
            assert "←→ scroll" in table.border_subtitle  # nine columns do not fit the pane
        chart = str(screen.query_one("#cmp-profile", ErrorProfileChart).render())
        assert "▲ first crossing: #10 mlp/gelu/mul_half:0" in chart and "x1 tol" in chart
        shown = [s for s in screen.query_one("#view-fused").query(Sparkline) if s.display and s.data]
        assert shown and all(s.size.width >= 40 for s in shown), [s.size for s in shown]
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, FullScreenTable)
        full = screen_text(app)
        for col in ("output", "verdict", "max abs", "mean abs", "max rel", "cosine"):
            assert col in full, col
        assert "▲ first crossing" in full
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ChecklistScreen)
        assert app.screen.query_one("#why-inline", WhyPanel).display
        await pilot.press("w")  # the why panel out of the way
        await pilot.pause()
        assert not app.screen.query_one("#why-inline", WhyPanel).display
        assert "w shows it again" in app.status_text
        await pilot.press("p")
        await wait_for(pilot, lambda: "saved" in app.status_text, what="the PNG")
        png = Path("sess") / "plots" / "mlp_residual_0.png"
        assert png.read_bytes()[:4] == b"\x89PNG"


async def test_command_palette_offers_every_action(gelu):
    app = make_app(gelu)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        titles = " ".join(t for t, _, _ in app.palette_commands())
        keys = {b.key for scr in (ChecklistScreen, BisectionScreen) for b in scr.BINDINGS} | \
            {b.key for b in app.BINDINGS}
        for key in keys - {"escape", "h"}:
            shown = "?" if key == "question_mark" else key
            if key == "q":
                continue  # Textual's own Quit command is listed
            assert f"({shown})" in titles, key
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"full-screen")
        await wait_for(pilot, lambda: "Full-screen table (f)" in screen_text(app), what="the palette's match")


async def test_tui_json_report_and_export_with_plots(gelu, workdir):
    app = make_app(gelu)
    app.output_json = workdir / "out.json"
    app.output_report = workdir / "out" / "report.md"
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b")
        await wait_idle(pilot, 120)
        await pilot.press("e")
        await wait_idle(pilot)
        sess = workdir / "sess"
        assert (sess / "plots" / "error-along-graph.png").is_file()  # export draws like the CLI
        names = zipfile.ZipFile(sess / "bundle.zip").namelist()
        assert "plots/error-along-graph.png" in names
        assert app.output_report.read_text().startswith("# bisect-tui bisect: culprit(s) found: FastGelu")
        assert (workdir / "out" / "report-plots" / "error-along-graph.png").is_file()
        assert json.loads(app.output_json.read_text())["bisect"]["verdict"] == "culprits"
        await pilot.press("q")


async def test_tui_report_is_written_on_quit(gelu, workdir):
    app = make_app(gelu)
    app.output_json = workdir / "check.json"
    app.output_report = workdir / "check.md"
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a")
        await wait_idle(pilot)
        await pilot.press("q")
    r = json.loads((workdir / "check.json").read_text())
    assert r["verdict"] == "fail" and "bisect" not in r
    assert (workdir / "check.md").read_text().startswith("# bisect-tui check: FAIL")


async def test_w_gives_the_why_panels_width_to_the_tables(gelu):
    app = make_app(gelu)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        before = app.screen.query_one("#detail").size.width
        await pilot.press("w")
        await pilot.pause()
        assert not app.screen.query_one("#why-side", WhyPanel).display
        assert app.screen.query_one("#detail").size.width >= before + 30


def test_tui_command_honours_json_and_report_in_a_real_terminal(workdir):
    """`bisect-tui tui MODEL --json F --report F.md` in a pseudo-terminal: a runs the
    checks, q quits, and both files are written (they used to be silently ignored)."""
    import os
    import shutil
    import sys

    pytest.importorskip("pty")
    exe = shutil.which("bisect-tui", path=os.path.dirname(sys.executable))
    assert exe, "bisect-tui is not installed next to this python"
    argv = [exe, "tui", "transformer_block.onnx", "--ort-config", "optimization.enable_gelu_approximation=1",
            "--session", "s", "--json", "out.json", "--report", "out.md"]
    with Terminal(argv) as term:
        at = term.wait_for("Checklist")
        term.send(b"a")
        at = term.wait_for("x Cancel", after=at)  # the footer while the checks run
        at = term.wait_for("op at fault", after=at, timeout=180)
        term.wait_for("b Bisect", after=at)  # the footer once the app is idle again: q now quits, not cancels
        assert (workdir / "s" / "check.json").is_file()
        term.send(b"q")
        assert term.wait_exit() == 0
    r = json.loads((workdir / "out.json").read_text())
    assert r["verdict"] == "fail" and r["failing_outputs"] == ["mlp/residual:0"]
    assert (workdir / "out.md").read_text().startswith("# bisect-tui check: FAIL")
    assert (workdir / "out-plots" / "error-along-graph.png").is_file()
