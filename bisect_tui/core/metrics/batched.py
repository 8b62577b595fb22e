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
from bisect_tui.core.metrics.catalog import Sums, figures
from bisect_tui.core.metrics.histograms import hist_dict

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
        for batch in runs_within(take, lambda i: pairs[i][0].size, BATCH_ELEMENTS):
            _compare_many(pairs, batch, out, rel_floor, allclose)
    return out


# Elements of one pass: it makes ~20 float64 temporaries of its size. The probe of a
# 21,000-node model with [1, 72, 72] activations compared 7,000 pairs (72M elements) in
# one pass and peaked at 7.5 GB under --max-memory 2G; per 2M elements a pass holds
# ~330 MB whatever the graph, with the same figures (each pair is its own segment).
BATCH_ELEMENTS = 1 << 21


def _compare_many(pairs, take, out, rel_floor, allclose):
    sizes = np.array([pairs[i][0].size for i in take], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    r = np.concatenate([np.asarray(pairs[i][0], dtype=np.float64).reshape(-1) for i in take])
    t = np.concatenate([np.asarray(pairs[i][1], dtype=np.float64).reshape(-1) for i in take])
    finite = np.logical_and.reduceat(np.isfinite(r) & np.isfinite(t), starts)
    r_abs = np.abs(r)
    t_abs = np.abs(t)
    amax = np.maximum(np.maximum.reduceat(r_abs, starts), np.maximum.reduceat(t_abs, starts))
    # compare() rescales sums of squares outside (1e-150, 1e150): leave those to it
    plain = finite & ((amax == 0.0) | ((amax > 1e-150) & (amax < 1e150)))
    err = np.abs(t - r)
    max_abs = np.maximum.reduceat(err, starts)
    sum_err = np.add.reduceat(err, starts)
    r_absmax = np.maximum.reduceat(r_abs, starts)
    if rel_floor is None:
        floors = np.maximum(1e-6, 1e-3 * r_absmax)
    else:
        floors = np.full(len(take), float(rel_floor))
    floors = np.where(np.isfinite(floors), floors, _FMAX)
    rel = err / np.maximum(r_abs, np.repeat(floors, sizes))
    max_rel = np.maximum.reduceat(rel, starts)
    sum_rel = np.add.reduceat(rel, starts)
    within1 = np.add.reduceat((rel <= 1e-3).astype(np.int64), starts)
    within5 = np.add.reduceat((rel <= 5e-3).astype(np.int64), starts)
    sum_r2 = np.add.reduceat(r * r, starts)
    sum_t2 = np.add.reduceat(t * t, starts)
    sum_rt = np.add.reduceat(r * t, starts)
    sum_e2 = np.add.reduceat(err * err, starts)
    if allclose is not None:
        atol, rtol = allclose
        thr = r_abs * rtol
        thr += atol
        ac_fail = np.add.reduceat((err > thr).astype(np.int64), starts)
        ac_excess = np.maximum.reduceat(err - thr, starts)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = err / thr
        q[np.isnan(q)] = 0.0
        ac_ratio = np.maximum(np.maximum.reduceat(q, starts), 0.0)
    for j, i in enumerate(take):
        if not plain[j]:
            continue
        n = int(sizes[j])
        ref, tst = pairs[i]
        m = {"shape": [int(d) for d in ref.shape], "ref_dtype": str(ref.dtype), "test_dtype": str(tst.dtype),
             "numel": n, "n_compared": n}
        m.update(figures(Sums(
            n=n, err_max=float(max_abs[j]), sum_err=float(sum_err[j]), max_rel=float(max_rel[j]),
            sum_rel=float(sum_rel[j]), within1=int(within1[j]), within5=int(within5[j]),
            sum_r2=float(sum_r2[j]), sum_t2=float(sum_t2[j]), sum_rt=float(sum_rt[j]), sum_e2=float(sum_e2[j]),
            scale=1.0, rel_floor=float(floors[j]))))
        m.update({
            "nan_ref": 0, "inf_ref": 0, "nan_test": 0, "inf_test": 0, "nan_mismatch": 0, "inf_mismatch": 0,
            "worst": [], "error_hist": hist_dict(None, 0.0, 0.0, 1), "ref_hist": hist_dict(None, 0.0, 0.0, 1),
            "test_hist": hist_dict(None, 0.0, 0.0, 1),
        })
        if allclose is not None:
            m.update(allclose_atol=float(allclose[0]), allclose_rtol=float(allclose[1]),
                     allclose_fail_count=int(ac_fail[j]), allclose_fail_share=int(ac_fail[j]) / n,
                     allclose_worst_excess=float(ac_excess[j]), allclose_max_ratio=float(ac_ratio[j]))
        out[i] = m
