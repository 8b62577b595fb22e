"""Numerical comparison of a fused-engine tensor against its FP32 baseline.

Pure numpy, no engine. `catalog` declares every reported figure once;
`streamed` compares one pair in chunks, `batched` many small pairs at once,
`summary` gives one tensor's stats; `arrays` and `histograms` hold what they
share. The names callers use are importable from here.
"""

from __future__ import annotations

from bisect_tui.core.metrics.arrays import align
from bisect_tui.core.metrics.batched import MANY_MAX_ELEMENTS, compare_many
from bisect_tui.core.metrics.histograms import ERR_CLAMP, hist_counts
from bisect_tui.core.metrics.streamed import WORST_K, compare
from bisect_tui.core.metrics.summary import summarize

__all__ = ["ERR_CLAMP", "MANY_MAX_ELEMENTS", "WORST_K", "align", "compare", "compare_many", "hist_counts",
           "summarize"]
