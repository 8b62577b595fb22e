"""The stats of one tensor, for baseline dumps: range, moments, NaN/Inf/zeros.

Streams in chunks like the comparison; the standard deviation uses Chan's
pairwise merge of the chunks' moments, so it stays accurate when mean >> std.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bisect_tui.core.metrics import arrays

_NAN = float("nan")


def summarize(array: Any) -> dict:
    """Stats of one tensor for baseline dumps (min/max/mean/std over finite
    values; NaN when none is finite). Streams in chunks; std uses Chan's
    pairwise merge so it stays accurate when mean >> std."""
    arr = arrays.as_array(array, "array")
    flat = arr.reshape(-1)
    nan = inf = zeros = 0
    n = 0
    mean = m2 = 0.0
    lo, hi = math.inf, -math.inf
    for start in arrays.spans(flat.size):
        c = flat[start : start + arrays.CHUNK].astype(np.float64)
        fin = np.isfinite(c)
        c_nan = int(np.count_nonzero(np.isnan(c)))
        nan += c_nan
        inf += c.size - int(np.count_nonzero(fin)) - c_nan
        zeros += int(np.count_nonzero(c == 0.0))
        if not fin.all():
            c = c[fin]
        if c.size == 0:
            continue
        lo = min(lo, float(c.min()))
        hi = max(hi, float(c.max()))
        c_mean = float(c.mean())
        d = c - c_mean
        c_m2 = float(np.dot(d, d))
        tot = n + c.size
        delta = c_mean - mean
        mean += delta * c.size / tot
        m2 += c_m2 + delta * delta * n * c.size / tot
        n = tot
    numel = int(arr.size)
    return {
        "shape": [int(d) for d in arr.shape],
        "dtype": str(arr.dtype),
        "numel": numel,
        "min": lo if n else _NAN,
        "max": hi if n else _NAN,
        "mean": mean if n else _NAN,
        "std": math.sqrt(m2 / n) if n else _NAN,
        "abs_max": max(-lo, hi) if n else _NAN,
        "nan": nan,
        "inf": inf,
        "zeros": zeros,
        "zero_share": zeros / numel if numel else _NAN,
    }
