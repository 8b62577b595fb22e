"""Helpers shared by the app tests (imported by conftest and the test modules)."""

from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

from rich.cells import get_character_cell_size

from bisect_tui.core.pipeline import TriageOptions
from bisect_tui.core.tolerance import parse_tolerance
from bisect_tui.api import EngineConfig

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
        if not app.is_running:
            raise AssertionError(f"the app stopped while work was expected (crashed?); return code {app.return_code}")
        if not app.busy and not [w for w in app.workers if w.group == "engine" and w.is_running]:
            await pilot.pause(0.05)
            if not app.busy:
                return
    raise AssertionError(f"app still busy ({app.busy}) after {timeout}s; status: {app.status_text}")


async def wait_for(pilot, predicate, timeout: float = 30.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if predicate():
            return
        if not pilot.app.is_running:
            raise AssertionError(f"the app stopped before {what} (crashed?); return code {pilot.app.return_code}")
        await pilot.pause(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# the screen's runs of text carry class "<id>-r<N>"; the window title is "<id>-title"
_SVG_TEXT = re.compile(r'<text class="[^"]*-r\d+"[^>]*\bx="([0-9.]+)"[^>]*\by="([0-9.]+)"[^>]*>(.*?)</text>', re.S)


def screen_text(app) -> str:
    """The current screen as plain text (what a user reads), read back from the
    public SVG screenshot: Rich's export_svg puts each run of text at
    x = column * char_width and y = row * line_height + char_height, so the
    character grid is recovered exactly."""
    svg = app.export_screenshot()
    width, height = app.size
    char_height = 20  # rich.console.Console.export_svg defaults
    char_width = char_height * 0.61
    line_height = char_height * 1.22
    grid = [[" "] * width for _ in range(height)]
    for x, y, text in _SVG_TEXT.findall(svg):
        row = round((float(y) - char_height) / line_height)
        col = round(float(x) / char_width)
        if not 0 <= row < height:
            continue
        for ch in html.unescape(text).replace("\xa0", " "):
            cells = get_character_cell_size(ch)
            if 0 <= col < width:
                grid[row][col] = ch
                for extra in range(1, cells):  # a wide (CJK) character covers two cells
                    if col + extra < width:
                        grid[row][col + extra] = ""
            col += cells
    return "\n".join("".join(line) for line in grid)


def step_states(app) -> dict[str, str]:
    return dict(app.state.states)


def spawn_in_pty(argv: list[str], cols: int = 80, rows: int = 24) -> tuple[int, int]:
    """The real command line in a pseudo-terminal of `cols` x `rows`: (pid, fd)."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child
        os.environ["TERM"] = "xterm-256color"
        os.execv(argv[0], argv)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return pid, fd


def pty_read(fd: int, wait: float = 0.2):
    """What the terminal shows next: bytes (b"" when nothing came within `wait`
    seconds), or None once the child has closed it."""
    import os
    import select

    ready, _, _ = select.select([fd], [], [], wait)
    if not ready:
        return b""
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        return None
    return chunk or None
