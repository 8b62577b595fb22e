"""The compare view (`bisect-tui compare ... --tui`) on real dumps, at 80x24 and 120x40."""

from __future__ import annotations

import numpy as np
import pytest

from bisect_tui.core.compare import compare_dumps
from bisect_tui.tui.screens.compare import BOTH, GOLDEN_ONLY, TEST_ONLY, CompareApp, OverlayHistogram, overlay_rows
from tui_helpers import Terminal, screen_text


@pytest.fixture
def result(tmp_path):
    rng = np.random.default_rng(0)
    g = {"logits": rng.standard_normal((4, 30)).astype(np.float32),
         "hidden": rng.standard_normal((4, 16)).astype(np.float32)}
    np.savez(tmp_path / "golden.npz", **g)
    (tmp_path / "dumps").mkdir()
    np.save(tmp_path / "dumps" / "logits.npy", g["logits"].astype(np.float16).view(np.uint16))
    np.save(tmp_path / "dumps" / "hidden.npy", g["hidden"][[1, 0, 2, 3]])  # two requests swapped
    return compare_dumps(tmp_path / "golden.npz", tmp_path / "dumps")


def test_overlay_rows_shade_each_side():
    rows = overlay_rows([4, 0, 2], [4, 2, 0], height=2)
    assert rows == [BOTH + "  ", BOTH + TEST_ONLY + GOLDEN_ONLY]
    assert overlay_rows([1, 2], [2, 1], height=1, width=9) == [BOTH * 4 + BOTH * 4]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_compare_view_shows_tensors_histograms_and_findings(result, size):
    assert [t.pair.test.name for t in result.tensors] == ["hidden", "logits"]
    app = CompareApp(result)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "FAIL: 1 of 2 tensor(s) break tolerance (exit 1)" in text
        assert "✘ FAIL" in text and "✔ PASS" in text and "hidden" in text and "logits" in text
        hist = app.screen.query_one(OverlayHistogram)
        drawn = str(hist.render())
        assert "golden only" in drawn and BOTH in drawn
        rows = [r for r in drawn.splitlines() if set(r) <= {BOTH, GOLDEN_ONLY, TEST_ONLY, " "} and r.strip()]
        assert rows and max(len(r) for r in rows) <= hist.content_size.width  # fits the screen
        findings = str(app.screen.query_one("#cmp-findings").render())
        assert "permutation [1, 0, 2, 3] (test row i is golden row permutation[i]" in findings
        await pilot.press("down")  # to logits: raw fp16 words, aligned, within fp16 tolerance
        await pilot.pause()
        assert "✔ PASS: logits" in str(app.screen.query_one("#cmp-summary").render())
        assert "uint16 -> float16" in str(app.screen.query_one("#cmp-details").render())
        if size == (120, 40):
            assert "uint16 -> float16" in screen_text(app)
        await pilot.press("q")
    assert app.return_code == 1


@pytest.mark.slow
def test_compare_tui_flag_opens_the_view_in_a_real_terminal(tmp_path):
    """`bisect-tui compare ... --tui` end to end in a pseudo-terminal: the view draws,
    q quits, and the process exits with the verdict's code."""
    import os
    import shutil
    import sys

    pytest.importorskip("pty")
    exe = shutil.which("bisect-tui", path=os.path.dirname(sys.executable))
    assert exe, "bisect-tui is not installed next to this python"
    g = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    np.save(tmp_path / "golden.npy", g)
    np.save(tmp_path / "test.npy", g[[1, 0, 2, 3]])
    with Terminal([exe, "compare", str(tmp_path / "golden.npy"), str(tmp_path / "test.npy"), "--tui"]) as term:
        term.wait_for("golden only")
        term.send(b"q")
        assert term.wait_exit() == 1  # the swapped rows break tolerance
    assert "FAIL: 1 of 1 tensor(s) break tolerance (exit 1)" in term.text
