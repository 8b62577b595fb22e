"""Numerical comparison of a fused-engine tensor against its FP32 baseline.

Pure numpy. Everything is computed in float64 so that the comparison itself
adds no error: an fp16 or bfloat16 result is judged by what it holds, not by
how badly a float32 accumulator would sum it.

Tensors can hold tens of millions of elements, so the work streams over the
flattened arrays in chunks of ``CHUNK`` elements: at most a handful of
chunk-sized float64 temporaries exist at once, never a full-size copy. Two
passes are made: the first finds ranges and the scale (needed to place the
histogram edges and the relative-error floor), the second accumulates the rest.

Every returned value is a plain Python ``int``/``float``/``list``/``str`` so
that the dict can go straight to ``json.dumps``. NaN and +/-inf are kept as
Python floats; ``json.dumps`` writes them as ``NaN``/``Infinity`` (valid for
Python's and JavaScript's lenient parsers, not for strict JSON ones).
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

CHUNK = 1 << 20
"""Elements per streamed chunk: 8 MiB per float64 temporary."""

WORST_K = 5
ERR_CLAMP = 1e-12
"""Zero errors are drawn at log10(1e-12) so the error histogram has a floor."""

_FMAX = float(np.finfo(np.float64).max)
_NAN = float("nan")


# --------------------------------------------------------------------------- input alignment


def _as_array(x: Any, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind == "c":
        raise ValueError(f"{what}: complex dtype {arr.dtype} is not supported")
    if arr.dtype.kind not in "biuf":
        # ml_dtypes' bfloat16/float8 have kind 'V' but cast fine; strings do not.
        try:
            np.zeros(1, dtype=arr.dtype).astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what}: dtype {arr.dtype} cannot be compared numerically") from exc
    return arr


def align(reference: Any, test: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return both arrays with the reference's shape (original dtypes kept).

    Engines often drop or add a leading batch dim of 1 (``(1, 1000)`` vs
    ``(1000,)``); that is the same tensor, so test is reshaped. Anything else
    is a real mismatch and raises ValueError naming both shapes.
    """
    ref = _as_array(reference, "reference")
    tst = _as_array(test, "test")
    if ref.shape != tst.shape:
        squeezable = ref.size == tst.size and tuple(d for d in ref.shape if d != 1) == tuple(
            d for d in tst.shape if d != 1
        )
        if not squeezable:
            raise ValueError(
                f"shape mismatch: reference {tuple(ref.shape)} vs test {tuple(tst.shape)}"
            )
        tst = tst.reshape(ref.shape)
    return ref, tst


def _chunks(ref: np.ndarray, tst: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (start, ref64, test64) over the flattened arrays, chunk by chunk."""
    rf = ref.reshape(-1)
    tf = tst.reshape(-1)
    for start in range(0, rf.size, CHUNK):
        stop = min(start + CHUNK, rf.size)
        yield start, rf[start:stop].astype(np.float64), tf[start:stop].astype(np.float64)


def _finite_pair(
    rc: np.ndarray, tc: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Keep only positions where both are finite; also return their local indices
    (None when every position is finite, the common fast path)."""
    both = np.isfinite(rc)
    both &= np.isfinite(tc)
    if both.all():
        return rc, tc, None
    idx = np.flatnonzero(both)
    return rc[idx], tc[idx], idx


def _pow2_exp(amax: float) -> int:
    """Exponent e such that values * 2**-e are near 1, when squaring amax would
    overflow or underflow float64 (sums of squares feed cosine/SNR/RMSE).
    Scaling by a power of two is exact; 0 (no scaling) in every ordinary case."""
    if not math.isfinite(amax) or amax == 0.0 or 1e-150 < amax < 1e150:
        return 0
    return min(1023, max(-1000, math.frexp(amax)[1] - 1))


def _edges(lo: float, hi: float, bins: int) -> tuple[float, float]:
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


def _hist_dict(counts: np.ndarray | None, lo: float, hi: float, bins: int) -> dict:
    if counts is None:
        return {"edges": [], "counts": []}
    edges = np.linspace(lo, hi, bins + 1)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


# --------------------------------------------------------------------------- compare


def compare(
    reference: Any,
    test: Any,
    *,
    rel_floor: float | None = None,
    topk: int | None = None,
    class_axis: int = -1,
    hist_bins: int = 20,
) -> dict:
    """Compare ``test`` against ``reference`` and return JSON-able metrics.

    Relative error is ``|t - r| / max(|r|, floor)``. Without a floor, elements
    whose reference is ~0 (ReLU outputs, padding, residual sums that cancel)
    produce relative errors of 1e6 and more that say nothing about the kernel:
    Polygraphy's known weakness, where max_rel is dominated by near-zero
    references. The default floor is ``max(1e-6, 1e-3 * max|r|)``: errors on
    elements 1000x smaller than the tensor's scale are judged against that
    scale instead. Pass ``rel_floor`` (> 0) to choose it; the one used is
    reported as ``rel_floor``.

    Metrics other than the NaN/Inf counts are over positions where both sides
    are finite (``n_compared``); when there is none they are NaN. ``snr_db`` is
    +inf for an exact match (JSON: ``Infinity``). ``topk`` adds ``topk``,
    ``top1_agreement`` and ``topk_agreement`` (both None when there is no class
    axis of size >= 2).
    """
    return _compare(
        reference, test, rel_floor=rel_floor, topk=topk, class_axis=class_axis, hist_bins=hist_bins
    )


def _compare(
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
    """compare(), optionally also doing the elementwise atol/rtol test in the
    same pass (used by tolerance.judge_arrays so arrays are read only twice).
    ``histograms=False`` leaves the three histograms empty: the fused-graph
    probe judges thousands of tensors nobody plots, and binning was most of
    its cost; every other figure is the same.
    Float64 overflow (|t - r| beyond 1.8e308) is not an error here: it yields
    inf metrics, which fail any tolerance."""
    with np.errstate(over="ignore"):
        return _compare_impl(
            reference, test, rel_floor=rel_floor, topk=topk, class_axis=class_axis,
            hist_bins=hist_bins, allclose=allclose, histograms=histograms,
        )


def _compare_impl(
    reference: Any,
    test: Any,
    *,
    rel_floor: float | None,
    topk: int | None,
    class_axis: int,
    hist_bins: int,
    allclose: tuple[float, float] | None,
    histograms: bool = True,
) -> dict:
    if hist_bins < 1:
        raise ValueError(f"hist_bins must be >= 1, got {hist_bins}")
    if rel_floor is not None and not (rel_floor > 0 and math.isfinite(rel_floor)):
        raise ValueError(f"rel_floor must be a finite number > 0, got {rel_floor}")
    if topk is not None and topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    ref, tst = align(reference, test)
    numel = int(ref.size)

    # ---- pass 1: counts, ranges, first moments, worst elements
    nan_ref = inf_ref = nan_test = inf_test = nan_mismatch = inf_mismatch = 0
    n = 0
    sum_err = 0.0
    err_min, err_max = math.inf, -math.inf
    r_min, r_max, t_min, t_max = math.inf, -math.inf, math.inf, -math.inf
    worst_err = np.empty(0)
    worst_idx = np.empty(0, dtype=np.int64)
    for start, rc, tc in _chunks(ref, tst):
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
        rc, tc, idx = _finite_pair(rc, tc)
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
            e_lo, e_hi = _edges(
                math.log10(min(max(err_min, ERR_CLAMP), _FMAX)),
                math.log10(min(max(err_max, ERR_CLAMP), _FMAX)),
                hist_bins,
            )
            v_lo, v_hi = _edges(min(r_min, t_min), max(r_max, t_max), hist_bins)
            hist_values = math.isfinite(v_hi - v_lo)  # a +/-1e308 span cannot be binned
            err_counts = np.zeros(hist_bins, dtype=np.int64)
            if hist_values:
                ref_counts = np.zeros(hist_bins, dtype=np.int64)
                test_counts = np.zeros(hist_bins, dtype=np.int64)
        for _start, rc, tc in _chunks(ref, tst):
            rc, tc, _ = _finite_pair(rc, tc)
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

    if n:
        cosine, snr = _cosine_snr(sum_r2, sum_t2, sum_rt, sum_e2)
        out.update(
            max_abs=float(err_max),
            mean_abs=sum_err / n,
            rmse=math.sqrt(sum_e2 / n) * scale,
            max_rel=float(max_rel),
            mean_rel=sum_rel / n,
            rel_floor=rel_floor,
            cosine=float(cosine),
            **{"within_0.1pct": within1 / n, "within_0.5pct": within5 / n},
            snr_db=float(snr),
        )
    else:
        out.update(
            max_abs=_NAN, mean_abs=_NAN, rmse=_NAN, max_rel=_NAN, mean_rel=_NAN,
            rel_floor=rel_floor, cosine=_NAN,
            **{"within_0.1pct": _NAN, "within_0.5pct": _NAN},
            snr_db=_NAN,
        )
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
    out["error_hist"] = _hist_dict(err_counts, e_lo, e_hi, hist_bins)
    out["ref_hist"] = _hist_dict(ref_counts, v_lo, v_hi, hist_bins)
    out["test_hist"] = _hist_dict(test_counts, v_lo, v_hi, hist_bins)

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


def _cosine_snr(sum_r2: float, sum_t2: float, sum_rt: float, sum_e2: float) -> tuple[float, float]:
    """Cosine and SNR (dB) from the sums of r*r, t*t, r*t and (t-r)^2 (compare and compare_many)."""
    zero_r, zero_t = sum_r2 == 0.0, sum_t2 == 0.0
    if zero_r and zero_t:
        cosine = 1.0
    elif zero_r or zero_t:
        cosine = 0.0
    else:
        cosine = min(1.0, max(-1.0, sum_rt / math.sqrt(sum_r2) / math.sqrt(sum_t2)))
    if sum_e2 == 0.0:
        snr = math.inf
    elif sum_r2 == 0.0:
        snr = -math.inf
    else:
        ratio = sum_r2 / sum_e2
        snr = 10.0 * math.log10(ratio) if ratio > 0 else -math.inf
    return cosine, snr


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
    step = max(1, CHUNK // n_cls)
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


# --------------------------------------------------------------------------- baseline stats


def summarize(array: Any) -> dict:
    """Stats of one tensor for baseline dumps (min/max/mean/std over finite
    values; NaN when none is finite). Streams in chunks; std uses Chan's
    pairwise merge so it stays accurate when mean >> std."""
    arr = _as_array(array, "array")
    flat = arr.reshape(-1)
    nan = inf = zeros = 0
    n = 0
    mean = m2 = 0.0
    lo, hi = math.inf, -math.inf
    for start in range(0, flat.size, CHUNK):
        c = flat[start : start + CHUNK].astype(np.float64)
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


def hist_counts(array: Any, bins: int, lo: float, hi: float) -> list[int]:
    """Counts of the finite values of ``array`` in ``bins`` equal bins over
    [lo, hi] (values outside are dropped). Fixed edges let a UI overlay the
    histograms of several tensors, e.g. one per bisection step."""
    arr = _as_array(array, "array").reshape(-1)
    lo, hi = _edges(float(lo), float(hi), bins)
    counts = np.zeros(bins, dtype=np.int64)
    for start in range(0, arr.size, CHUNK):
        c = arr[start : start + CHUNK].astype(np.float64)
        counts += np.histogram(c[np.isfinite(c)], bins=bins, range=(lo, hi))[0]
    return [int(x) for x in counts]


# --------------------------------------------------------------------------- many small tensors at once

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
    if not take:
        return out
    with np.errstate(over="ignore", invalid="ignore"):  # the pairs that overflow are left out below
        return _compare_many(pairs, take, out, rel_floor, allclose)


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
        e2 = float(sum_e2[j])
        cosine, snr = _cosine_snr(float(sum_r2[j]), float(sum_t2[j]), float(sum_rt[j]), e2)
        ref, tst = pairs[i]
        m = {
            "shape": [int(d) for d in ref.shape], "ref_dtype": str(ref.dtype), "test_dtype": str(tst.dtype),
            "numel": n, "n_compared": n,
            "max_abs": float(max_abs[j]), "mean_abs": float(sum_err[j]) / n, "rmse": math.sqrt(e2 / n),
            "max_rel": float(max_rel[j]), "mean_rel": float(sum_rel[j]) / n, "rel_floor": float(floors[j]),
            "cosine": float(cosine), "within_0.1pct": int(within1[j]) / n, "within_0.5pct": int(within5[j]) / n,
            "snr_db": float(snr),
            "nan_ref": 0, "inf_ref": 0, "nan_test": 0, "inf_test": 0, "nan_mismatch": 0, "inf_mismatch": 0,
            "worst": [], "error_hist": _hist_dict(None, 0.0, 0.0, 1), "ref_hist": _hist_dict(None, 0.0, 0.0, 1),
            "test_hist": _hist_dict(None, 0.0, 0.0, 1),
        }
        if allclose is not None:
            m.update(allclose_atol=float(allclose[0]), allclose_rtol=float(allclose[1]),
                     allclose_fail_count=int(ac_fail[j]), allclose_fail_share=int(ac_fail[j]) / n,
                     allclose_worst_excess=float(ac_excess[j]), allclose_max_ratio=float(ac_ratio[j]))
        out[i] = m
    return out
