"""SVG snapshots of the main screens at 80x24 and 120x40 (pytest-textual-snapshot).

Deterministic by construction: the cwd is a fresh tmp dir holding copies of the
models, the session directory is the relative name `sess`, the memory budget
is fixed, and the app shows no clock, timestamp or duration. Regenerate with
`pytest tests/tui --snapshot-update` after an intended change of the screens.
"""

from __future__ import annotations

import pytest

from bisect_tui.core.pipeline import Triage
from bisect_tui.tui.app import make_app
from tui_helpers import gelu_options, wait_idle

SIZES = [(80, 24), (120, 40)]


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
def test_picker(snap_compare, workdir, size):
    Triage(gelu_options("transformer_block.onnx", session="sess")).prepare()  # one recent session
    assert snap_compare(make_app(), terminal_size=size)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
def test_checklist_after_run(snap_compare, gelu, size):
    async def run_all(pilot):
        await pilot.press("a")
        await wait_idle(pilot)

    assert snap_compare(make_app(gelu), terminal_size=size, run_before=run_all)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
def test_bisection_with_culprit(snap_compare, gelu, size):
    async def bisect(pilot):
        await pilot.press("b")  # runs the missing checks, then the search
        await wait_idle(pilot)

    assert snap_compare(make_app(gelu), terminal_size=size, run_before=bisect)
