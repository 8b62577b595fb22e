"""Histogram ranges numpy can always split, and histograms with fixed edges.

The comparison bins the error and both sides' values; a UI overlays the
histograms of several tensors (one per bisection step), which only works when
the edges are chosen by the caller, not by the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bisect_tui.core.metrics import arrays

ERR_CLAMP = 1e-12
"""Zero errors are drawn at log10(1e-12) so the error histogram has a floor."""


def edges(lo: float, hi: float, bins: int) -> tuple[float, float]:
    """A histogram range numpy can split into ``bins`` distinct edges.

    An empty range is widened by 0.5 like numpy does; a range only a few ulps
    wide (all values ~equal, e.g. 1.0 +/- 1e-16) is widened to a few ulps per
    bin, where numpy would raise "Too many bins for data range".
    """
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    min_span = 4.0 * bins * float(np.spacing(max(abs(lo), abs(hi))))
    if hi - lo < min_span:
        mid = lo / 2 + hi / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    return lo, hi


def hist_dict(counts: np.ndarray | None, lo: float, hi: float, bins: int) -> dict:
    if counts is None:
        return {"edges": [], "counts": []}
    bounds = np.linspace(lo, hi, bins + 1)
    return {"edges": [float(e) for e in bounds], "counts": [int(c) for c in counts]}


def hist_counts(array: Any, bins: int, lo: float, hi: float) -> list[int]:
    """Counts of the finite values of ``array`` in ``bins`` equal bins over
    [lo, hi] (values outside are dropped). Fixed edges let a UI overlay the
    histograms of several tensors, e.g. one per bisection step."""
    arr = arrays.as_array(array, "array").reshape(-1)
    lo, hi = edges(float(lo), float(hi), bins)
    counts = np.zeros(bins, dtype=np.int64)
    for start in arrays.spans(arr.size):
        c = arr[start : start + arrays.CHUNK].astype(np.float64)
        counts += np.histogram(c[np.isfinite(c)], bins=bins, range=(lo, hi))[0]
    return [int(x) for x in counts]
