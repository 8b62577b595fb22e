"""Helpers shared by the app tests (imported by conftest and the test modules)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bisect_tui.core.pipeline import TriageOptions
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.engines.base import EngineConfig

GELU = (("optimization.enable_gelu_approximation", "1"),)
EXPECTED_NODES = ["mlp/gelu/div", "mlp/gelu/erf", "mlp/gelu/add_one", "mlp/gelu/mul_x", "mlp/gelu/mul_half"]
DEEP_NODES = [f"blk11/gelu/{n}" for n in ("div", "erf", "add_one", "mul_x", "mul_half")]


def gelu_options(model: str, session: str = "sess", gelu: bool = True) -> TriageOptions:
    """Options as the CLI would build them, with a fixed memory budget (shown on screen)."""
    return TriageOptions(
        model=Path(model),
        session_dir=Path(session),
        max_memory=1 << 30,
        tolerance=parse_tolerance("fp32"),
        config=EngineConfig(config_entries=GELU if gelu else ()),
    )


async def wait_idle(pilot, timeout: float = 60.0) -> None:
    """Wait until the app has no engine work left (its WorkDone message was handled)."""
    app = pilot.app
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        await pilot.pause(0.05)
        if getattr(app, "_exception", None) is not None:
            raise AssertionError(f"the app crashed: {app._exception!r}")
        if not app.busy and not [w for w in app.workers if w.group == "engine" and w.is_running]:
            await pilot.pause(0.05)
            if not app.busy:
                return
    raise AssertionError(f"app still busy ({app.busy}) after {timeout}s; status: {app.status_text}")


async def wait_for(pilot, predicate, timeout: float = 30.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if getattr(pilot.app, "_exception", None) is not None:
            raise AssertionError(f"the app crashed: {pilot.app._exception!r}")
        if predicate():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def screen_text(app) -> str:
    """The current screen as plain text (what a user reads)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


def step_states(app) -> dict[str, str]:
    return dict(app.state.states)
