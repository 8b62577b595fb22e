"""Regenerate docs/screenshot.svg and print the screen texts used in docs/walkthrough.md.

    .venv/bin/python tests/tui/make_walkthrough_shots.py

Runs the real app (real onnxruntime) on sample_models/transformer_block.onnx with
the Gelu approximation, in a temporary working directory, exactly like the tests.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from tui_helpers import gelu_options, screen_text, wait_idle  # noqa: E402

from bisect_tui.tui.app import make_app  # noqa: E402


async def main() -> None:
    samples = REPO / "sample_models"
    if not (samples / "transformer_block.onnx").exists():
        subprocess.run([sys.executable, str(samples / "build.py")], check=True)
    work = Path(tempfile.mkdtemp(prefix="bisect-tui-doc-"))
    shutil.copy(samples / "transformer_block.onnx", work)
    os.chdir(work)
    os.environ["XDG_STATE_HOME"] = str(work / "state")

    def show(title: str, app) -> None:
        print(f"----- {title} -----")
        print("\n".join(line.rstrip() for line in screen_text(app).splitlines()))

    app = make_app(gelu_options("transformer_block.onnx"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        show("checklist, nothing run yet (80x24)", app)
        await pilot.press("a")
        await wait_idle(pilot)
        show("checklist after `a` (80x24)", app)
        await pilot.press("up", "up")
        await pilot.pause()
        show("range check (80x24)", app)
    app = make_app(gelu_options("transformer_block.onnx"))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("b")
        await wait_idle(pilot)
        await pilot.pause()
        show("bisection with the culprit (120x40)", app)
        svg = app.export_screenshot(title="bisect-tui: bisection")
        out = REPO / "docs" / "screenshot.svg"
        out.write_text(svg, encoding="utf-8")
        print(f"wrote {out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
