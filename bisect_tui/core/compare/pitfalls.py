"""Detectors for the classic ways a golden-vs-engine comparison lies.

Each looks at the two aligned arrays (only once the values already fail, except
the ranking one) and returns a `Finding` in plain words with the fix:

- softmax applied on one side only: one side's rows are non-negative and sum
  to 1, the other's are not, and softmax of the raw side matches;
- batch order: the test's rows are the golden rows in another order (dynamic
  batching, requests sorted by length); the permutation is printed;
- ranking: logits judged by value when only their ranking matters.

They sample (at most `ROWS` rows, `BATCH_CELLS` distance cells) so a large
logits tensor stays cheap; what was sampled is said in the text.
"""

from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np

from bisect_tui.core.compare.records import Conversion, Finding
from bisect_tui.core.escape import term
from bisect_tui.core.tolerance import Tolerance, Verdict, judge_arrays

ROWS = 4096
MAX_BATCH = 512
BATCH_CELLS = 50_000_000


def _rows(x: np.ndarray, axis: int, limit: Optional[int] = ROWS) -> np.ndarray:
    r = np.moveaxis(np.asarray(x), axis, -1)
    r = r.reshape(-1, r.shape[-1])
    return np.asarray(r[:limit] if limit else r, dtype=np.float64)


def _sum_tol(dtype: np.dtype) -> float:
    return 2e-2 if dtype.itemsize <= 2 else 2e-3


def probabilities(x: np.ndarray, axis: int) -> tuple[bool, float, float]:
    """Whether the rows along `axis` look like softmax output, and the row-sum range."""
    if x.ndim == 0 or x.shape[axis] < 2 or x.size == 0:
        return False, math.nan, math.nan
    r = _rows(x, axis)
    if not np.isfinite(r).all():
        return False, math.nan, math.nan
    s = r.sum(axis=1)
    lo, hi = float(s.min()), float(s.max())
    ok = bool(r.min() >= -1e-6 and abs(lo - 1) <= _sum_tol(x.dtype) and abs(hi - 1) <= _sum_tol(x.dtype))
    return ok, lo, hi


def _softmax(r: np.ndarray) -> np.ndarray:
    e = np.exp(r - r.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def softmax_one_side(g: np.ndarray, t: np.ndarray, axis: int) -> Optional[Finding]:
    if g.ndim == 0 or not -g.ndim <= axis < g.ndim:
        return None
    gp, glo, ghi = probabilities(g, axis)
    tp, tlo, thi = probabilities(t, axis)
    if gp == tp:
        return None
    prob, raw, lo, hi = ("golden", "test", tlo, thi) if gp else ("test", "golden", glo, ghi)
    p_rows, r_rows = (_rows(g, axis), _rows(t, axis)) if gp else (_rows(t, axis), _rows(g, axis))
    err = float(np.max(np.abs(_softmax(r_rows) - p_rows))) if np.isfinite(r_rows).all() else math.nan
    n = p_rows.shape[0]
    sums = f"sum to {lo:.4g}..{hi:.4g}" if math.isfinite(lo) else "hold NaN/Inf"
    matches = (f"softmax({raw}) matches {prob} to max |err| {err:.2g}" if err <= 1e-2
               else f"even softmax({raw}) differs from {prob} by up to {err:.2g}")
    return Finding(
        "softmax",
        f"softmax on one side only: {prob} rows along axis {axis} are probabilities (>= 0, sum to 1; "
        f"{n} row(s) checked) but {raw} rows {sums}; {matches}",
        f"pass --softmax {axis} to turn the raw side into probabilities before comparing, or dump both "
        "sides at the same point (both before or both after the softmax)",
        axis=axis,
    )


def apply_softmax(x: np.ndarray, side: str, axis: int) -> tuple[np.ndarray, Conversion]:
    """--softmax: probabilities along `axis`; a side that already holds them is left as is
    (a second softmax would flatten it)."""
    ok, _, _ = probabilities(x, axis)
    if ok:
        return x, Conversion(side, str(x.dtype), str(x.dtype),
                             f"already probabilities along axis {axis} (rows sum to 1): left as is for --softmax")
    a = np.asarray(x, dtype=np.float64)
    a = a - np.max(a, axis=axis, keepdims=True)
    np.exp(a, out=a)
    a /= np.sum(a, axis=axis, keepdims=True)
    return a, Conversion(side, str(x.dtype), "float64", f"softmax along axis {axis} applied (--softmax)", False)


def batch_axis(shape: tuple[int, ...]) -> Optional[int]:
    """The first axis of size >= 2 with something per row (a batch, beam or sample axis)."""
    for i, d in enumerate(shape):
        if d >= 2:
            rest = int(np.prod(shape[i + 1:])) if i + 1 < len(shape) else 1
            return i if rest >= 2 else None
    return None


def batch_order(g: np.ndarray, t: np.ndarray, tol: Tolerance, topk: Optional[int]) -> Optional[Finding]:
    axis = batch_axis(tuple(g.shape))
    if axis is None:
        return None
    n = g.shape[axis]
    if n > MAX_BATCH:
        return None
    gr = np.moveaxis(np.asarray(g), axis, 0).reshape(n, -1)
    tr = np.moveaxis(np.asarray(t), axis, 0).reshape(n, -1)
    cols = max(16, min(gr.shape[1], BATCH_CELLS // (n * n)))
    gs = np.asarray(gr[:, :cols], dtype=np.float64)
    ts = np.asarray(tr[:, :cols], dtype=np.float64)
    if not (np.isfinite(gs).all() and np.isfinite(ts).all()):
        return None
    dist = np.empty((n, n))
    for i in range(n):
        dist[i] = np.abs(gs - ts[i]).mean(axis=1)
    perm = dist.argmin(axis=1)
    if sorted(perm.tolist()) != list(range(n)) or (perm == np.arange(n)).all():
        return None
    moved = [i for i in range(n) if perm[i] != i]
    if not all(dist[i, perm[i]] < 0.1 * dist[i, i] for i in moved):
        return None
    fixed = np.empty_like(np.asarray(tr))
    fixed[perm] = tr  # test row i goes back to golden position perm[i]
    fixed = np.moveaxis(fixed.reshape(np.moveaxis(np.asarray(t), axis, 0).shape), 0, axis)
    _, verdict = judge_arrays(g, fixed, tol, topk=topk, hist_bins=1)
    after = "is within tolerance" if verdict.passed else f"still fails ({verdict.summary()})"
    perm_t = tuple(int(p) for p in perm)
    sample = "" if cols == gr.shape[1] else f" (rows matched on their first {cols} values)"
    return Finding(
        "batch_order",
        f"batch order: along axis {axis} the test rows are the golden rows in another order{sample}: "
        f"permutation {list(perm_t)} (test row i is golden row permutation[i]; {len(moved)} of {n} rows "
        f"moved); put back in "
        f"order, the tensor {after}",
        "make the engine return rows in input order (dynamic batching or sorting requests by length "
        "reorders them), or reorder the test dump with this permutation before comparing",
        permutation=perm_t,
        axis=axis,
    )


LOGITS_HINT = re.compile(r"logit|prob|score|class|cls|token|lm_head|pred|topk", re.I)
"""Names that say "this is a ranking": only for those (or with --topk) does agreeing
ranking mean the engine may be fine; for a hidden state it means nothing."""


BOX_HINT = re.compile(r"box|bbox|reg|loc(?!al)|coord|anchor|xywh|xyxy|delta|offset|landmark|kpt|keypoint", re.I)
"""Names of regression tensors (box coordinates, landmarks): their values, not a ranking, are the result."""
BOX_AXIS = 4  # a last axis this small holds coordinates (x, y, w, h), not classes


def ranking_applies(name: str, shape, asked: bool = False) -> bool:
    """Whether a top-1/top-k ranking along the last axis means anything for this
    tensor: class scores or logits yes; box regression (YOLO's x, y, w, h, a last
    axis of 4 or fewer, a box-like name) no; an unnamed tensor of rank 3 or more
    (a detection head [1, 84, 8400], a feature map) no. `asked` (--topk, min_topk
    in a tolerance) settles it: the user knows the tensor is a ranking."""
    shape = list(shape or [])
    if asked:
        return True
    if not shape or shape[-1] <= BOX_AXIS or BOX_HINT.search(name):
        return False
    return bool(LOGITS_HINT.search(name)) or len(shape) <= 2


def ranking(name: str, metrics: dict, verdict: Verdict, asked: bool = False) -> Optional[Finding]:
    """`asked`: the user gave --topk (or min_topk), so the ranking matters whatever the name."""
    if not (asked or (LOGITS_HINT.search(name) and ranking_applies(name, metrics.get("shape")))):
        return None
    top1, topk, k = metrics.get("top1_agreement"), metrics.get("topk_agreement"), metrics.get("topk")
    if top1 is None or topk is None or not (math.isfinite(top1) and math.isfinite(topk)):
        return None
    shape = metrics.get("shape") or [0]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    q = term(name)
    value_fail = [c for c in verdict.failed if c.name != "min_topk" and c.name != "nan_inf"]
    if value_fail and top1 == 1.0 and topk >= 0.995:
        return Finding(
            "ranking",
            f"values break tolerance ({verdict.summary()}) but the ranking agrees: the same argmax on "
            f"{rows} of {rows} row(s) and top-{k} overlap {topk:.1%}; if only the ranking matters "
            "(classification, greedy decoding) the engine is fine",
            f"judge the ranking instead of the values: --tol '{q}:atol=none,rtol=none,min_cosine=none,"
            "min_topk=0.995' (top-k within 0.5%, the article's rule)",
        )
    if verdict.passed and top1 < 1.0:
        differ = round((1 - top1) * rows)
        return Finding(
            "ranking",
            f"values are within tolerance but the argmax differs on {differ} of {rows} row(s) (near ties "
            f"flipped by rounding; top-{k} overlap {topk:.1%})",
            f"if users see the ranking, judge it too: --tol '{q}:min_topk=1'",
        )
    return None
