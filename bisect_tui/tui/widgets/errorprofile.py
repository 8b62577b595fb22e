"""The error along the graph as text: each tensor's error / tolerance in
topological order, log scale, a tolerance line, the first crossing and the
culprit's tensors marked, so the jump is seen at a glance (the PNG in the report
draws the same data with matplotlib)."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.widgets import Static

from bisect_tui.core.plots import ErrorProfile
from bisect_tui.core.report.textplots import LABEL_W, TOL_CHAR, profile_chart


def profile_text(prof: Optional[ErrorProfile], width: int, height: int = 6) -> Text:
    """`height` rows of bars (one column per bucket of tensors), a marker row and a legend."""
    t = Text()
    if prof is None or not prof.ratios:
        t.append("no per-tensor errors yet: they come with the comparison (the fused-graph probe)\n")
        return t
    chart = profile_chart(prof, width, height)
    for label, bar in zip(chart.labels, chart.bars):
        t.append(f"{label:<{LABEL_W - 1}} ", style="dim")
        for ch, over in zip(bar, chart.over):
            t.append(ch, style=("bold red" if over and ch not in " " + TOL_CHAR else ("dim" if ch == TOL_CHAR else "")))
        t.append("\n")
    t.append(" " * LABEL_W + chart.marks + "\n", style="bold")
    t.append("\n".join(chart.legend), style="")
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
