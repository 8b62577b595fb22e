"""The report's pictures drawn in characters: the error along the graph and
each output's value and error histograms. A report pasted into an issue has no
images (its plot links point at files beside it), so the text must carry the
same evidence; the app draws the same chart (widgets/errorprofile.py styles
these rows)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from bisect_tui.core.escape import term
from bisect_tui.core.plots import RATIO_FLOOR, ErrorProfile
from bisect_tui.core.triage.records import OutputVerdict

EIGHTHS = " ▁▂▃▄▅▆▇█"
LABEL_W = 7  # "x1e+03 " on the left of each row
TOL_CHAR = "┄"


def _log(r: float) -> float:
    if r is None or not math.isfinite(r):
        return 30.0
    return math.log10(max(r, RATIO_FLOOR))


@dataclass(frozen=True)
class ProfileChart:
    """The chart as rows of characters; `over[b]` says whether column b is above
    the tolerance (the app paints those red)."""

    labels: tuple[str, ...]
    bars: tuple[str, ...]
    over: tuple[bool, ...]
    marks: str
    legend: tuple[str, ...]

    def lines(self) -> list[str]:
        rows = [f"{label:<{LABEL_W - 1}} {bar}".rstrip() for label, bar in zip(self.labels, self.bars)]
        return [*rows, (" " * LABEL_W + self.marks).rstrip(), *self.legend]


def profile_chart(prof: ErrorProfile, width: int, height: int = 6) -> ProfileChart:
    """`height` rows of bars (one column per bucket of tensors, the worst of the
    bucket), a marker row (C: the culprit's tensors, ▲: the first crossing) and a legend."""
    n = len(prof.ratios)
    # the chart always spans the width: many tensors share a column, few tensors get several
    cols = max(width - LABEL_W, 1)
    buckets = [(b * n // cols, max((b + 1) * n // cols, b * n // cols + 1)) for b in range(cols)]
    vals = [max(_log(r) for r in prof.ratios[lo:hi]) for lo, hi in buckets]
    y_min = math.log10(RATIO_FLOOR)
    y_max = max(1.0, math.ceil(max(vals)))
    step = (y_max - y_min) / height
    tol_row = min(max(int((y_max - 0.0) / step), 0), height - 1)  # the row holding log10(1) = 0
    labels, bars = [], []
    for row in range(height):
        hi_y = y_max - row * step
        lo_y = hi_y - step
        labels.append("x1 tol" if row == tol_row else f"x1e{int(round(y_max)):+d}" if row == 0
                      else f"x1e{int(y_min):+d}" if row == height - 1 else "")
        line = ""
        for v in vals:
            if v >= hi_y:
                line += "█"
            elif v > lo_y:
                line += EIGHTHS[max(1, min(8, int((v - lo_y) / step * 8)))]
            else:
                line += TOL_CHAR if row == tol_row else " "
        bars.append(line)

    def first_col_of(i: int) -> int:  # a tensor spread over several columns is marked once
        return next(b for b, (lo, hi) in enumerate(buckets) if lo <= i < hi)

    first_col = first_col_of(prof.first_crossing) if prof.first_crossing is not None else None
    culprit_cols = {first_col_of(i) for i in prof.culprits}
    marks = "".join("C" if b in culprit_cols else ("▲" if b == first_col else " ") for b in range(cols))
    over_n = sum(1 for r in prof.ratios if r > 1)
    legend = [f"{n} tensors in topological order, {over_n} above the tolerance (bars above {TOL_CHAR})."]
    if prof.first_crossing is not None:
        i = prof.first_crossing
        legend.append(f"▲ first crossing: #{i} {term(prof.tensors[i])} ({term(prof.op_types[i])}, "
                      f"x{prof.ratios[i]:.3g} of the tolerance)")
    if prof.culprits:
        legend.append(f"C made by the culprit: {', '.join(term(prof.tensors[i]) for i in prof.culprits[:3])}")
    return ProfileChart(tuple(labels), tuple(bars), tuple(v > 0 for v in vals), marks.rstrip(), tuple(legend))


def spark(counts: list, width: int = 40) -> str:
    """Counts as one row of eighth-blocks, resampled to `width` columns (the
    largest bucket is a full block, an empty one a space)."""
    if not counts:
        return ""
    n = len(counts)
    cols = min(width, n)
    sums = [sum(counts[b * n // cols:max((b + 1) * n // cols, b * n // cols + 1)]) for b in range(cols)]
    top = max(sums) or 1
    return "".join(EIGHTHS[0 if c == 0 else max(1, round(c / top * 8))] for c in sums)


def _span(hist: dict) -> str:
    from bisect_tui.core.report.words import fmt

    edges = hist.get("edges") or []
    return f"[{fmt(edges[0])} .. {fmt(edges[-1])}]" if edges else ""


def histogram_lines(name: str, o: OutputVerdict, width: int = 40) -> list[str]:
    """One output's values, baseline over fused, and its error's distribution
    (log10 |fused - baseline|); empty when the comparison kept no histogram."""
    m = o.metrics or {}
    ref, test, err = m.get("ref_hist") or {}, m.get("test_hist") or {}, m.get("error_hist") or {}
    if not ref.get("counts"):
        return []
    width = min(width, len(ref["counts"]))
    out = [f"{term(name)} ({'PASS' if o.passed else 'FAIL'})",
           f"  baseline values  |{spark(ref['counts'], width):<{width}}| {_span(ref)}"]
    if test.get("counts"):
        same = test.get("counts") == ref.get("counts") and test.get("edges") == ref.get("edges")
        out.append(f"  fused values     |{spark(test['counts'], width):<{width}}| {_span(test)}"
                   + ("  (same histogram)" if same else ""))
    if err.get("counts"):
        out.append(f"  log10 |error|    |{spark(err['counts'], width):<{width}}| {_span(err)}")
    return out


def profile_lines(prof: Optional[ErrorProfile], width: int = 72, height: int = 6) -> list[str]:
    return profile_chart(prof, width, height).lines() if prof is not None and prof.ratios else []
