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

# The memory budget the app tests run with. The app runs inside the test process, which
# has grown to ~880 MB here by the time the app tests run (over 1 GB on CI): a 1 GB budget
# then left the search no room for one build ("--max-memory is below what one whole-graph
# build needs") and planned one tensor per group. Fixed, since the screens show it.
BUDGET = 4 << 30
GELU = (("optimization.enable_gelu_approximation", "1"),)
EXPECTED_NODES = ["mlp/gelu/div", "mlp/gelu/erf", "mlp/gelu/add_one", "mlp/gelu/mul_x", "mlp/gelu/mul_half"]
DEEP_NODES = [f"blk11/gelu/{n}" for n in ("div", "erf", "add_one", "mul_x", "mul_half")]


def gelu_options(model: str, session: str = "sess", gelu: bool = True) -> TriageOptions:
    """Options as the CLI would build them, with a fixed memory budget (shown on screen)."""
    return TriageOptions(
        model=Path(model),
        session_dir=Path(session),
        max_memory=BUDGET,
        tolerance=parse_tolerance("fp32"),
        config=EngineConfig(config_entries=GELU if gelu else ()),
    )


async def wait_idle(pilot, timeout: float = 60.0) -> None:
    """Wait until the app has no engine work left (its WorkDone message was handled):
    each running engine worker is awaited (its task ends when its thread does), then the
    app is let settle and its state read again, as a follow-up step may start another."""
    from textual.worker import WorkerCancelled, WorkerFailed

    app = pilot.app
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout

    def running() -> list:
        return [w for w in app.workers if w.group == "engine" and w.is_running]

    while True:
        busy = running()
        if busy:
            try:
                await asyncio.wait_for(app.workers.wait_for_complete(busy), max(end - loop.time(), 0.0))
            except (WorkerFailed, WorkerCancelled):
                pass  # the app reports its engine's failure itself: the tests read it on screen
            except asyncio.TimeoutError:
                raise AssertionError(f"app still busy after {timeout}s; status: {app.status_text}") from None
        await pilot.pause()  # the messages already posted are handled: a follow-up step would set busy
        if not app.is_running:
            raise AssertionError(f"the app stopped while work was expected (crashed?); return code {app.return_code}")
        if not app.busy and not running():
            return
        if loop.time() >= end:
            raise AssertionError(f"app still busy ({app.busy}) after {timeout}s; status: {app.status_text}")


async def wait_for(pilot, predicate, timeout: float = 30.0, what: str = "condition") -> None:
    """Check `predicate` each time the app has settled (Pilot.pause() without a delay: its
    messages handled, at most a second apart while threads keep the process busy) until it
    holds: the one place the app tests wait for a screen, so none sleeps a guessed time."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if not pilot.app.is_running:
            raise AssertionError(f"the app stopped before {what} (crashed?); return code {pilot.app.return_code}")
        if loop.time() >= end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause()


async def wait_exit(pilot, timeout: float = 30.0) -> None:
    """Wait until the app has handled its way out (its return code is set)."""
    await wait_for(pilot, lambda: pilot.app.return_code is not None, timeout, what="the app to exit")


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


_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-9A-Za-z]|[=>NOM78c])")


class Terminal:
    """A real command line in a pseudo-terminal of `cols` x `rows`, and what it
    has drawn so far as plain text (escape sequences become spaces, runs of
    whitespace one space), so a test waits for a text to appear instead of
    sleeping. Use it as a context manager: a child still running at the end is
    killed, never left behind."""

    def __init__(self, argv: list[str], cols: int = 80, rows: int = 24) -> None:
        import codecs
        import fcntl
        import os
        import pty
        import struct
        import termios

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.environ["TERM"] = "xterm-256color"
            os.execv(argv[0], argv)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.raw = b""
        self.text = ""
        self.closed = False
        self.status: int | None = None
        self._pending = b""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc) -> None:
        import os
        import signal

        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)

    def send(self, keys: bytes) -> None:
        import os

        os.write(self.fd, keys)

    def _read(self, wait: float) -> None:
        import os
        import select

        ready, _, _ = select.select([self.fd], [], [], wait)
        if not ready:
            return
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            chunk = b""
        if not chunk:
            self.closed = True
            return
        self.raw += chunk
        data = self._pending + chunk
        cut = data.rfind(b"\x1b")
        self._pending = b""
        if cut >= 0 and not _ESCAPE.match(data[cut:].decode("latin-1")):  # a sequence cut in two
            data, self._pending = data[:cut], data[cut:]
        piece = re.sub(r"\s+", " ", _ESCAPE.sub(" ", self._decoder.decode(data)))
        if self.text.endswith(" ") and piece.startswith(" "):
            piece = piece[1:]
        self.text += piece

    def _tail(self) -> str:
        return self.text[-1500:]

    def wait_for(self, needle: str, after: int = 0, timeout: float = 60.0) -> int:
        """Read until `needle` appears in the text drawn after offset `after`;
        the offset just past it (to wait for what comes next)."""
        import time

        end = time.monotonic() + timeout
        while True:
            at = self.text.find(needle, after)
            if at >= 0:
                return at + len(needle)
            left = end - time.monotonic()
            if self.closed or left <= 0:
                why = "the terminal closed" if self.closed else f"{timeout:g} s passed"
                raise AssertionError(f"{why} before {needle!r} was drawn; last text: {self._tail()}")
            self._read(min(left, 0.5))

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Read until the child closes the terminal, then its exit code."""
        import os
        import time

        end = time.monotonic() + timeout
        while not self.closed:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"still running after {timeout:g} s; last text: {self._tail()}")
            self._read(min(left, 0.5))
        _, status = os.waitpid(self.pid, 0)  # the terminal is closed: the child is exiting
        self.status = os.waitstatus_to_exitcode(status)
        return self.status
