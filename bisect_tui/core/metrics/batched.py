"""Many small reference/test pairs compared in one pass (the fused-graph probe).

The probe compares thousands of tensors of a few hundred elements; one call of
the streamed comparison costs ~40 numpy calls whatever the size. Here every
pair is widened into one float64 concatenation and each sum is a segment
reduction (``reduceat``) over it; the figures then follow from the sums as
`catalog.METRICS` declares them, exactly as for one pair.
"""

from __future__ import annotations

import numpy as np

from bisect_tui.core.memory import runs_within
from bisect_tui.core.metrics.catalog import FIGURE_KEYS, Sums, figure_rows

_FMAX = float(np.finfo(np.float64).max)

MANY_MAX_ELEMENTS = 1 << 16  # a tensor above this is compared alone (the batch would copy it)


def compare_many(
    pairs: list[tuple[np.ndarray, np.ndarray]],
    *,
    rel_floor: float | None = None,
    allclose: tuple[float, float] | None = None,
) -> list[dict | None]:
    """compare() (with histograms=False) for many small tensors in one pass.

    The fused-graph probe compares thousands of tensors of a few hundred
    elements; one call costs ~40 numpy calls whatever the size. Here every
    pair is widened into one float64 concatenation and each figure is a
    segment reduction (``reduceat``) over it: the same formulas, sums taken in
    another order (last-digit differences), and no worst elements or
    histograms. A pair it does not take (shapes that differ, not floating
    point, empty or large, a NaN/Inf on either side, magnitudes that
    compare() would rescale) gets None: compare it alone."""
    out: list[dict | None] = [None] * len(pairs)
    take = [i for i, (r, t) in enumerate(pairs)
            if r.shape == t.shape and r.dtype.kind == "f" and t.dtype.kind == "f"
            and 0 < r.size <= MANY_MAX_ELEMENTS]
    with np.errstate(over="ignore", invalid="ignore"):  # the pairs that overflow are left out below
        sizes = {i: pairs[i][0].size for i in take}
        for batch in runs_within(take, sizes.__getitem__, BATCH_ELEMENTS):
            _compare_many(pairs, batch, out, rel_floor, allclose)
    return out


# Elements of one pass. The probe of a 21,000-node model with [1, 72, 72] activations
# compared 7,000 pairs (72M elements) in one pass and peaked at 7.5 GB under --max-memory
# 2G; a pass holds ~8 float64 arrays of its size, whatever the graph, with the same figures
# (each pair is its own segment). Small passes are also faster: 256K elements (2 MB an
# array) stay in the cache and reuse the allocator's blocks, where 2M-element ones fault
# in fresh pages for every temporary (7,000 pairs of 256: 0.15 s at 2M, 0.12 s at 256K).
BATCH_ELEMENTS = 1 << 18


def _dtype_name(dtype: np.dtype) -> str:
    """str(dtype), remembered: numpy builds the name anew on every call (4 us,
    two per pair: a tenth of the probe's comparison of 7,000 pairs)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


_DTYPE_NAMES: dict = {}
# the keys of a pair's figures, in compare()'s order (allclose_* only with an elementwise test)
_KEYS = ("shape", "ref_dtype", "test_dtype", "numel", "n_compared") + FIGURE_KEYS + (
    "nan_ref", "inf_ref", "nan_test", "inf_test", "nan_mismatch", "inf_mismatch", "worst", "error_hist",
    "ref_hist", "test_hist", "allclose_atol", "allclose_rtol", "allclose_fail_count", "allclose_fail_share",
    "allclose_worst_excess", "allclose_max_ratio")


def _compare_many(pairs, take, out, rel_floor, allclose):
    """One pass over the pairs `take`: the same element-wise formulas and segment
    reductions as compare(), each a whole-array operation, and the figures of
    each pair read back from the per-segment results as Python numbers.

    Temporaries are reused (``out=``): a fresh array of the batch's size per
    operation costs page faults, not arithmetic, and the values (and therefore
    every sum) are the same. A segment is finite exactly when the largest
    magnitude on both sides is (NaN propagates through ``maximum``)."""
    refs = [pairs[i][0] for i in take]
    tests = [pairs[i][1] for i in take]
    sizes_l = [a.size for a in refs]
    sizes = np.array(sizes_l, dtype=np.int64)
    starts = np.zeros(len(take), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    # widened and flattened in C order, as np.asarray(a, np.float64).reshape(-1) each
    r = np.concatenate(refs, axis=None, dtype=np.float64)
    t = np.concatenate(tests, axis=None, dtype=np.float64)
    r_abs = np.abs(r)
    buf = np.abs(t)
    r_absmax = np.maximum.reduceat(r_abs, starts)
    amax = np.maximum(r_absmax, np.maximum.reduceat(buf, starts))
    # compare() rescales sums of squares outside (1e-150, 1e150): leave those to it
    plain = np.isfinite(amax) & ((amax == 0.0) | ((amax > 1e-150) & (amax < 1e150)))
    err = np.subtract(t, r)
    np.abs(err, out=err)
    max_abs = np.maximum.reduceat(err, starts)
    sum_err = np.add.reduceat(err, starts)
    if rel_floor is None:
        floors = np.maximum(1e-6, 1e-3 * r_absmax)
    else:
        floors = np.full(len(take), float(rel_floor))
    floors = np.where(np.isfinite(floors), floors, _FMAX)
    rel = np.repeat(floors, sizes)
    np.maximum(r_abs, rel, out=rel)
    np.divide(err, rel, out=rel)
    max_rel = np.maximum.reduceat(rel, starts)
    sum_rel = np.add.reduceat(rel, starts)
    mask = np.less_equal(rel, 1e-3)
    within1 = np.add.reduceat(mask, starts, dtype=np.int64)
    np.less_equal(rel, 5e-3, out=mask)
    within5 = np.add.reduceat(mask, starts, dtype=np.int64)
    sum_r2 = np.add.reduceat(np.multiply(r, r, out=buf), starts)
    sum_t2 = np.add.reduceat(np.multiply(t, t, out=buf), starts)
    sum_rt = np.add.reduceat(np.multiply(r, t, out=buf), starts)
    sum_e2 = np.add.reduceat(np.multiply(err, err, out=buf), starts)
    if allclose is not None:
        atol, rtol = allclose
        thr = np.multiply(r_abs, rtol, out=r_abs)  # r_abs is not read again
        thr += atol
        np.greater(err, thr, out=mask)
        ac_fail = np.add.reduceat(mask, starts, dtype=np.int64).tolist()
        ac_excess = np.maximum.reduceat(np.subtract(err, thr, out=buf), starts).tolist()
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.divide(err, thr, out=rel)
        q[np.isnan(q)] = 0.0
        ac_ratio = np.maximum(np.maximum.reduceat(q, starts), 0.0).tolist()
        atol_f, rtol_f = float(atol), float(rtol)
    keep = np.flatnonzero(plain)
    if not len(keep):
        return
    sums = Sums(sizes[keep], max_abs[keep], sum_err[keep], max_rel[keep], sum_rel[keep], within1[keep],
                within5[keep], sum_r2[keep], sum_t2[keep], sum_rt[keep], sum_e2[keep], 1.0, floors[keep])
    for j, fig in zip(keep.tolist(), figure_rows(sums)):
        i = take[j]
        ref, tst = pairs[i]
        n = sizes_l[j]
        shape = list(ref.shape) if type(ref) is np.ndarray else [int(d) for d in ref.shape]
        row = (shape, _dtype_name(ref.dtype), _dtype_name(tst.dtype), n, n) + fig + (
            0, 0, 0, 0, 0, 0, [], {"edges": [], "counts": []}, {"edges": [], "counts": []},
            {"edges": [], "counts": []})
        if allclose is not None:
            fails = ac_fail[j]
            row += (atol_f, rtol_f, fails, fails / n, ac_excess[j], ac_ratio[j])
        out[i] = dict(zip(_KEYS, row))
