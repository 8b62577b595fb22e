"""The error along the graph as text: each tensor's error / tolerance in
topological order, log scale, a tolerance line, the first crossing and the
culprit's tensors marked, so the jump is seen at a glance (the PNG in the report
draws the same data with matplotlib)."""

from __future__ import annotations

import math
from typing import Optional

from rich.text import Text
from textual.widgets import Static

from bisect_tui.core.escape import term
from bisect_tui.core.plots import RATIO_FLOOR, ErrorProfile

EIGHTHS = " ▁▂▃▄▅▆▇█"
LABEL_W = 7  # "x1e+03 " on the left of each row


def _log(r: float) -> float:
    if r is None or not math.isfinite(r):
        return 30.0
    return math.log10(max(r, RATIO_FLOOR))


def profile_text(prof: Optional[ErrorProfile], width: int, height: int = 6) -> Text:
    """`height` rows of bars (one column per bucket of tensors), a marker row and a legend."""
    t = Text()
    if prof is None or not prof.ratios:
        t.append("no per-tensor errors yet: they come with the comparison (the fused-graph probe)\n")
        return t
    n = len(prof.ratios)
    # the chart always spans the width: many tensors share a column, few tensors get several
    cols = max(width - LABEL_W, 1)
    buckets = [(b * n // cols, max((b + 1) * n // cols, b * n // cols + 1)) for b in range(cols)]
    vals = [max(_log(r) for r in prof.ratios[lo:hi]) for lo, hi in buckets]
    y_min = math.log10(RATIO_FLOOR)
    y_max = max(1.0, math.ceil(max(vals)))
    step = (y_max - y_min) / height
    tol_row = min(max(int((y_max - 0.0) / step), 0), height - 1)  # the row holding log10(1) = 0
    for row in range(height):
        hi_y = y_max - row * step
        lo_y = hi_y - step
        if row == tol_row:
            label = "x1 tol"
        elif row == 0:
            label = f"x1e{int(round(y_max)):+d}"
        elif row == height - 1:
            label = f"x1e{int(y_min):+d}"
        else:
            label = ""
        t.append(f"{label:<{LABEL_W - 1}} ", style="dim")
        for v in vals:
            if v >= hi_y:
                ch = "█"
            elif v > lo_y:
                ch = EIGHTHS[max(1, min(8, int((v - lo_y) / step * 8)))]
            else:
                ch = "┄" if row == tol_row else " "
            over = v > 0
            t.append(ch, style=("bold red" if over and ch not in " ┄" else ("dim" if ch == "┄" else "")))
        t.append("\n")
    def first_col_of(i: int) -> int:  # a tensor spread over several columns is marked once
        return next(b for b, (lo, hi) in enumerate(buckets) if lo <= i < hi)

    first_col = first_col_of(prof.first_crossing) if prof.first_crossing is not None else None
    culprit_cols = {first_col_of(i) for i in prof.culprits}
    marks = "".join("C" if b in culprit_cols else ("▲" if b == first_col else " ") for b in range(cols))
    t.append(" " * LABEL_W + marks.rstrip() + "\n", style="bold")
    over = sum(1 for r in prof.ratios if r > 1)
    t.append(f"{n} tensors in topological order, {over} above the tolerance (bars above ┄).", style="")
    if prof.first_crossing is not None:
        i = prof.first_crossing
        t.append(f"\n▲ first crossing: #{i} {term(prof.tensors[i])} ({term(prof.op_types[i])}, "
                 f"x{prof.ratios[i]:.3g} of the tolerance)")
    if prof.culprits:
        t.append(f"\nC made by the culprit: {', '.join(term(prof.tensors[i]) for i in prof.culprits[:3])}")
    return t


class ErrorProfileChart(Static):
    """Redraws at its own width, so a wider terminal shows more detail."""

    DEFAULT_CSS = """
    ErrorProfileChart { height: auto; margin-top: 1; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.profile: Optional[ErrorProfile] = None
        self.rows = 6

    def show(self, profile: Optional[ErrorProfile], rows: int = 6) -> None:
        self.profile = profile
        self.rows = rows
        self._draw()

    def _draw(self) -> None:
        width = self.content_size.width or (self.app.size.width - 40 if self.is_mounted else 40)
        self.update(profile_text(self.profile, max(width, 20), self.rows))

    def on_resize(self) -> None:
        self._draw()
