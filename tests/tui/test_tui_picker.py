"""The model picker: recent sessions first, models under the cwd, typed paths,
and bad paths as a one-line error with the app still alive."""

from __future__ import annotations

from bisect_tui.core.pipeline import Triage
from bisect_tui.tui.app import make_app
from bisect_tui.tui.screens.checklist import ChecklistScreen
from bisect_tui.tui.screens.picker import PickerScreen
from bisect_tui.tui.widgets.common import StatusLine
from textual.widgets import Input, OptionList
from tui_helpers import gelu_options, screen_text, wait_for, wait_idle


def options_text(app) -> list[str]:
    ol = app.screen.query_one("#choices", OptionList)
    return [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]


async def type_path(pilot, text: str) -> None:
    inp = pilot.app.screen.query_one("#path", Input)
    inp.focus()
    inp.value = ""
    await pilot.pause()
    await pilot.press(*text, "enter")


def status(app) -> str:
    return str(app.screen.query_one(StatusLine).render())


async def test_recent_sessions_first_then_models(workdir):
    # a session made by the core (as `bisect-tui check` would) lands in the recent list
    Triage(gelu_options("transformer_block.onnx", session="old-session")).prepare()
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, PickerScreen)
        rows = options_text(app)
        assert rows[0] == "Recent sessions"
        assert "old-session" in rows[1] and "transformer_block.onnx" in rows[1]
        models = rows.index("Models under the working directory")
        assert models > 1
        # the same depth: in name order
        assert [r.strip() for r in rows[models + 1:]] == ["deep_stack.onnx", "transformer_block.onnx"]
        # enter on the highlighted recent session reopens it
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChecklistScreen), what="the checklist")
        await wait_idle(pilot)
        assert app.state.states["inputs"] == "passed"  # restored from the session
        assert app.state.options.config.config_entries  # its saved engine settings came back


async def test_open_typed_path(workdir):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await type_path(pilot, "transformer_block.onnx")
        await wait_for(pilot, lambda: isinstance(app.screen, ChecklistScreen), what="the checklist")
        assert app.state.options.model.name == "transformer_block.onnx"
        await pilot.press("r")
        await wait_idle(pilot)
        assert app.state.states["inputs"] == "passed"
        # m goes back to the picker; the new session is now a recent one
        await pilot.press("m")
        await pilot.pause()
        assert isinstance(app.screen, PickerScreen)
        assert options_text(app)[0] == "Recent sessions"


async def test_bad_paths_are_one_line_errors(workdir):
    (workdir / "notes.onnx").write_text("this is not a protobuf")
    (workdir / "somedir").mkdir()
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await type_path(pilot, "missing.onnx")
        await pilot.pause()
        assert "error: not found: missing.onnx" in status(app)
        assert "\n" not in status(app).strip()

        await type_path(pilot, "notes.onnx")
        await wait_for(pilot, lambda: "not an ONNX model" in status(app), what="the not-ONNX error")
        assert isinstance(app.screen, PickerScreen)

        await type_path(pilot, "somedir")
        await pilot.pause()
        assert "not a bisect-tui session" in status(app)

        await type_path(pilot, "")
        await pilot.pause()
        assert "type a path" in status(app)
        assert "Traceback" not in screen_text(app)
        # still alive: a good path still opens
        await type_path(pilot, "deep_stack.onnx")
        await wait_for(pilot, lambda: isinstance(app.screen, ChecklistScreen), what="the checklist")
