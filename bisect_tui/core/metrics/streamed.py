"""One reference/test pair compared in two streamed passes, in float64.

Everything is computed in float64 so that the comparison itself adds no error:
an fp16 or bfloat16 result is judged by what it holds, not by how badly a
float32 accumulator would sum it. At most a handful of chunk-sized float64
temporaries exist at once, never a full-size copy. The first pass finds ranges
and the scale (needed to place the histogram edges and the relative-error
floor), the second accumulates the rest; the figures then follow from the sums
as `catalog.METRICS` declares them.

Every returned value is a plain Python ``int``/``float``/``list``/``str`` so
that the dict can go straight to ``json.dumps``. NaN and +/-inf are kept as
Python floats; ``json.dumps`` writes them as ``NaN``/``Infinity`` (valid for
Python's and JavaScript's lenient parsers, not for strict JSON ones).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bisect_tui.core.metrics import arrays
from bisect_tui.core.metrics.catalog import Sums, figures
from bisect_tui.core.metrics.histograms import ERR_CLAMP, edges, hist_dict

WORST_K = 5

_FMAX = float(np.finfo(np.float64).max)
_NAN = float("nan")


def _pow2_exp(amax: float) -> int:
    """Exponent e such that values * 2**-e are near 1, when squaring amax would
    overflow or underflow float64 (sums of squares feed cosine/SNR/RMSE).
    Scaling by a power of two is exact; 0 (no scaling) in every ordinary case."""
    if not math.isfinite(amax) or amax == 0.0 or 1e-150 < amax < 1e150:
        return 0
    return min(1023, max(-1000, math.frexp(amax)[1] - 1))


@np.errstate(over="ignore")
def compare(
    reference: Any,
    test: Any,
    *,
    rel_floor: float | None = None,
    topk: int | None = None,
    class_axis: int = -1,
    hist_bins: int = 20,
    allclose: tuple[float, float] | None = None,
    histograms: bool = True,
) -> dict:
    """Compare ``test`` against ``reference`` and return JSON-able metrics.

    Relative error is ``|t - r| / max(|r|, floor)``. Without a floor, elements
    whose reference is ~0 (ReLU outputs, padding, residual sums that cancel)
    produce relative errors of 1e6 and more that say nothing about the kernel:
    a known weakness of other comparison tools, where max_rel is dominated by near-zero
    references. The default floor is ``max(1e-6, 1e-3 * max|r|)``: errors on
    elements 1000x smaller than the tensor's scale are judged against that
    scale instead. Pass ``rel_floor`` (> 0) to choose it; the one used is
    reported as ``rel_floor``.

    Metrics other than the NaN/Inf counts are over positions where both sides
    are finite (``n_compared``); when there is none they are NaN. ``snr_db`` is
    +inf for an exact match (JSON: ``Infinity``). ``topk`` adds ``topk``,
    ``top1_agreement`` and ``topk_agreement`` (both None when there is no class
    axis of size >= 2).

    ``allclose=(atol, rtol)`` also does the elementwise test in the same pass
    (tolerance.judge_arrays, so arrays are read only twice) and adds the
    ``allclose_*`` fields. ``histograms=False`` leaves the three histograms
    empty: the fused-graph probe judges thousands of tensors nobody plots, and
    binning was most of its cost; every other figure is the same.
    Float64 overflow (|t - r| beyond 1.8e308) is not an error here: it yields
    inf metrics, which fail any tolerance.
    """
    if hist_bins < 1:
        raise ValueError(f"hist_bins must be >= 1, got {hist_bins}")
    if rel_floor is not None and not (rel_floor > 0 and math.isfinite(rel_floor)):
        raise ValueError(f"rel_floor must be a finite number > 0, got {rel_floor}")
    if topk is not None and topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    ref, tst = arrays.align(reference, test)
    numel = int(ref.size)

    # ---- pass 1: counts, ranges, first moments, worst elements
    nan_ref = inf_ref = nan_test = inf_test = nan_mismatch = inf_mismatch = 0
    n = 0
    sum_err = 0.0
    err_min, err_max = math.inf, -math.inf
    r_min, r_max, t_min, t_max = math.inf, -math.inf, math.inf, -math.inf
    worst_err = np.empty(0)
    worst_idx = np.empty(0, dtype=np.int64)
    for start, rc, tc in arrays.chunks(ref, tst):
        nr = np.isnan(rc)
        nt = np.isnan(tc)
        ir = np.isinf(rc)
        it = np.isinf(tc)
        c_nr, c_nt, c_ir, c_it = (int(np.count_nonzero(a)) for a in (nr, nt, ir, it))
        nan_ref += c_nr
        nan_test += c_nt
        inf_ref += c_ir
        inf_test += c_it
        if c_nr or c_nt:
            nan_mismatch += int(np.count_nonzero(nr ^ nt))
        if c_ir or c_it:
            # Exactly one side is inf, or both are but with opposite signs.
            inf_mismatch += int(np.count_nonzero((ir ^ it) | (ir & it & (rc != tc))))
        del nr, nt, ir, it
        rc, tc, idx = arrays.finite_pair(rc, tc)
        if rc.size == 0:
            continue
        n += rc.size
        r_min = min(r_min, float(rc.min()))
        r_max = max(r_max, float(rc.max()))
        t_min = min(t_min, float(tc.min()))
        t_max = max(t_max, float(tc.max()))
        err = np.subtract(tc, rc)
        np.abs(err, out=err)
        sum_err += float(err.sum())
        c_max = float(err.max())
        err_min = min(err_min, float(err.min()))
        err_max = max(err_max, c_max)
        # Top-k by abs error: skip the partition when this chunk cannot compete.
        if worst_err.size < WORST_K or c_max > worst_err.min():
            k = min(WORST_K, err.size)
            part = np.argpartition(err, err.size - k)[err.size - k :]
            gidx = start + (part if idx is None else idx[part])
            worst_err = np.concatenate([worst_err, err[part]])
            worst_idx = np.concatenate([worst_idx, gidx.astype(np.int64)])
            order = np.lexsort((worst_idx, -worst_err))[:WORST_K]
            worst_err, worst_idx = worst_err[order], worst_idx[order]

    out: dict[str, Any] = {
        "shape": [int(d) for d in ref.shape],
        "ref_dtype": str(ref.dtype),
        "test_dtype": str(tst.dtype),
        "numel": numel,
        "n_compared": n,
    }

    r_absmax = max(-r_min, r_max) if n else _NAN
    if rel_floor is None:
        rel_floor = max(1e-6, 1e-3 * r_absmax) if n else 1e-6
    rel_floor = float(rel_floor)
    if not math.isfinite(rel_floor):  # r_absmax near float64 max
        rel_floor = _FMAX

    # ---- pass 2: second moments, relative error, histograms, atol/rtol
    exp2 = _pow2_exp(max(r_absmax, -t_min, t_max) if n else 0.0)
    scale, inv = math.ldexp(1.0, exp2), math.ldexp(1.0, -exp2)
    sum_r2 = sum_t2 = sum_rt = sum_e2 = 0.0
    sum_rel = 0.0
    max_rel = -math.inf
    within1 = within5 = 0
    ac_fail = 0
    ac_excess = -math.inf
    ac_ratio = 0.0
    e_lo, e_hi = (0.0, 0.0)
    v_lo, v_hi = (0.0, 0.0)
    err_counts = ref_counts = test_counts = None
    hist_values = False
    if n:
        if histograms:
            e_lo, e_hi = edges(
                math.log10(min(max(err_min, ERR_CLAMP), _FMAX)),
                math.log10(min(max(err_max, ERR_CLAMP), _FMAX)),
                hist_bins,
            )
            v_lo, v_hi = edges(min(r_min, t_min), max(r_max, t_max), hist_bins)
            hist_values = math.isfinite(v_hi - v_lo)  # a +/-1e308 span cannot be binned
            err_counts = np.zeros(hist_bins, dtype=np.int64)
            if hist_values:
                ref_counts = np.zeros(hist_bins, dtype=np.int64)
                test_counts = np.zeros(hist_bins, dtype=np.int64)
        for _start, rc, tc in arrays.chunks(ref, tst):
            rc, tc, _ = arrays.finite_pair(rc, tc)
            if rc.size == 0:
                continue
            err = np.subtract(tc, rc)
            np.abs(err, out=err)
            if scale == 1.0:
                rs, ts, es = rc, tc, err
            else:
                rs, ts, es = rc * inv, tc * inv, err * inv
            sum_r2 += float(np.dot(rs, rs))
            sum_t2 += float(np.dot(ts, ts))
            sum_rt += float(np.dot(rs, ts))
            sum_e2 += float(np.dot(es, es))
            del rs, ts, es
            buf = np.abs(rc)
            if allclose is not None:
                atol, rtol = allclose
                thr = buf * rtol
                thr += atol
                ac_fail += int(np.count_nonzero(err > thr))
                ac_excess = max(ac_excess, float(np.max(err - thr)))
                with np.errstate(divide="ignore", invalid="ignore"):
                    q = err / thr
                q[np.isnan(q)] = 0.0  # 0/0: exact match where the threshold is 0
                ac_ratio = max(ac_ratio, float(q.max()))
                del thr, q
            np.maximum(buf, rel_floor, out=buf)
            rel = np.divide(err, buf, out=buf)
            max_rel = max(max_rel, float(rel.max()))
            sum_rel += float(rel.sum())
            within1 += int(np.count_nonzero(rel <= 1e-3))
            within5 += int(np.count_nonzero(rel <= 5e-3))
            del rel, buf
            if err_counts is None:
                continue
            np.clip(err, ERR_CLAMP, _FMAX, out=err)
            np.log10(err, out=err)
            err_counts += np.histogram(err, bins=hist_bins, range=(e_lo, e_hi))[0]
            if hist_values:
                ref_counts += np.histogram(rc, bins=hist_bins, range=(v_lo, v_hi))[0]
                test_counts += np.histogram(tc, bins=hist_bins, range=(v_lo, v_hi))[0]

    out.update(figures(Sums(
        n=n, err_max=err_max, sum_err=sum_err, max_rel=max_rel, sum_rel=sum_rel, within1=within1,
        within5=within5, sum_r2=sum_r2, sum_t2=sum_t2, sum_rt=sum_rt, sum_e2=sum_e2, scale=scale,
        rel_floor=rel_floor)))
    out.update(
        nan_ref=nan_ref, inf_ref=inf_ref, nan_test=nan_test, inf_test=inf_test,
        nan_mismatch=nan_mismatch, inf_mismatch=inf_mismatch,
    )

    rf = ref.reshape(-1)
    tf = tst.reshape(-1)
    out["worst"] = [
        {
            "index": [int(i) for i in np.unravel_index(int(g), ref.shape)],
            "reference": float(rf[g]),
            "test": float(tf[g]),
            "abs_err": float(e),
        }
        for e, g in zip(worst_err, worst_idx)
    ]
    out["error_hist"] = hist_dict(err_counts, e_lo, e_hi, hist_bins)
    out["ref_hist"] = hist_dict(ref_counts, v_lo, v_hi, hist_bins)
    out["test_hist"] = hist_dict(test_counts, v_lo, v_hi, hist_bins)

    if topk is not None:
        out["topk"] = int(topk)
        out["top1_agreement"], out["topk_agreement"] = _topk_agreement(ref, tst, topk, class_axis)

    if allclose is not None:
        atol, rtol = allclose
        out.update(
            allclose_atol=float(atol),
            allclose_rtol=float(rtol),
            allclose_fail_count=ac_fail,
            allclose_fail_share=ac_fail / n if n else _NAN,
            allclose_worst_excess=float(ac_excess) if n else _NAN,
            allclose_max_ratio=float(ac_ratio) if n else _NAN,
        )
    return out


def _topk_agreement(
    ref: np.ndarray, tst: np.ndarray, k: int, class_axis: int
) -> tuple[float | None, float | None]:
    """Share of rows with the same argmax, and mean |topk(r) & topk(t)| / k.

    Rows are all positions along the other axes. (None, None) when there is no
    class axis of size >= 2, so the judge can tell "not applicable" from
    "not computed". NaN rows are left to the NaN/Inf check.
    """
    if ref.ndim == 0:
        return None, None
    if not -ref.ndim <= class_axis < ref.ndim:
        raise ValueError(f"class_axis {class_axis} out of range for shape {tuple(ref.shape)}")
    n_cls = ref.shape[class_axis]
    if n_cls < 2:
        return None, None
    r2 = np.moveaxis(ref, class_axis, -1).reshape(-1, n_cls)
    t2 = np.moveaxis(tst, class_axis, -1).reshape(-1, n_cls)
    rows = r2.shape[0]
    if rows == 0:
        return _NAN, _NAN
    kk = min(k, n_cls)
    top1 = 0
    hits = 0
    step = max(1, arrays.CHUNK // n_cls)
    for a in range(0, rows, step):
        rr = r2[a : a + step].astype(np.float64)
        tt = t2[a : a + step].astype(np.float64)
        top1 += int(np.count_nonzero(rr.argmax(axis=1) == tt.argmax(axis=1)))
        if kk >= n_cls:
            hits += rr.shape[0] * kk
            continue
        pr = np.argpartition(rr, n_cls - kk, axis=1)[:, n_cls - kk :]
        pt = np.argpartition(tt, n_cls - kk, axis=1)[:, n_cls - kk :]
        mark = np.zeros(rr.shape, dtype=bool)
        np.put_along_axis(mark, pr, True, axis=1)
        hits += int(np.take_along_axis(mark, pt, axis=1).sum())
    return top1 / rows, hits / (rows * kk)


