"""Small read-only formatting helpers for the app (no engine logic here)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from bisect_tui.core.escape import term
from bisect_tui.core.report import fmt  # the same number format as the reports

STATE_SYMBOL = {
    "pending": "·",
    "running": "…",
    "passed": "✔",
    "failed": "✘",
    "skipped": "–",
    "found": "✔",  # the bisection found its culprit: the search succeeded
    "unclear": "?",  # the search ended without a single culprit to blame
}
BLOCKS = " ▁▂▃▄▅▆▇█"


def state_label(state: str) -> str:
    """Symbol and word, so the state never depends on colour."""
    return f"{STATE_SYMBOL.get(state, '?')} {state}"


def show_path(p: Any) -> str:
    """A path relative to the working directory when it is inside it, else absolute."""
    if p is None:
        return "-"
    path = Path(p)
    try:
        cwd = Path.cwd().resolve()
        rel = path.resolve().relative_to(cwd)
        return str(rel) if str(rel) != "." else "."
    except (ValueError, OSError):
        return str(path)


def mb(n: float) -> str:
    return f"{n / (1 << 20):.1f} MB"


def ratio(x: Optional[float]) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x >= 1e100:
        return "x inf"
    return f"x{x:.3g}"


def verdict_word(passed: bool) -> str:
    return "✔ PASS" if passed else "✘ FAIL"


def mini_spark(counts: Sequence[float], width: int = 16) -> str:
    """A text sparkline (block characters) of `counts` squeezed into `width` cells."""
    if not counts:
        return ""
    n = len(counts)
    width = max(1, min(width, n))
    buckets = []
    for b in range(width):
        lo, hi = (b * n) // width, ((b + 1) * n) // width
        buckets.append(sum(counts[lo:max(hi, lo + 1)]))
    top = max(buckets) or 1
    return "".join(BLOCKS[0] if v == 0 else BLOCKS[max(1, math.ceil(v / top * 8))] for v in buckets)


def clip_hist(counts: Sequence[int], lo: int, hi: int, start: int) -> list[int]:
    """Histogram over exponents [lo, hi]; bins outside are added to the end bins.

    `counts[i]` is the count for exponent `start + i`."""
    out = [0] * (hi - lo + 1)
    for i, c in enumerate(counts):
        e = min(max(start + i, lo), hi)
        out[e - lo] += c
    return out


def shown(text: Any) -> str:
    """Model-supplied names for the screen: control characters shown as \\x1b
    etc., never sent to the terminal (newlines kept)."""
    return term(text, keep_newlines=True)


def short(text: str, n: int) -> str:
    text = term(text)
    return text if len(text) <= n else text[: max(n - 1, 1)] + "…"


def relpath_or_name(p: Any) -> str:
    """For the header: a model path relative to the cwd, else its file name."""
    if p is None:
        return ""
    shown = show_path(p)
    return shown if not os.path.isabs(shown) else Path(shown).name


__all__ = [
    "fmt", "state_label", "show_path", "mb", "ratio", "verdict_word", "mini_spark",
    "clip_hist", "short", "shown", "relpath_or_name", "STATE_SYMBOL",
]
