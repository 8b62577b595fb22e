"""Judging compared tensors against a tolerance.

`judge` turns the figures of `metrics.compare` into a `Verdict`: first the
NaN/Inf check and the elementwise atol/rtol test, which every tolerance has
its own way, then each bound that `metrics.catalog` declares, in its order.
`judge_arrays` compares and judges in one streamed pass pair; `judge_many`
does it for many small tensors at once.
"""

from __future__ import annotations

import math
from typing import Any

from bisect_tui.core.metrics.catalog import BOUNDED
from bisect_tui.core.metrics.limits import holds, le_ratio, lim, pct, sci
from bisect_tui.core.metrics.streamed import compare
from bisect_tui.core.tolerance.criteria import Tolerance
from bisect_tui.core.tolerance.verdict import Criterion, Verdict


def _nan_inf_criterion(m: dict) -> Criterion:
    """NaN/Inf where the reference has none (or at other positions) always fails:
    a fused kernel that overflows is the bug we look for, whatever the tolerance."""
    extra = max(0, (m["nan_test"] + m["inf_test"]) - (m["nan_ref"] + m["inf_ref"]))
    bad = int(m["nan_mismatch"]) + int(m.get("inf_mismatch", 0)) + extra
    if bad:
        text = (
            f"nan_inf: test has {m['nan_test']} NaN / {m['inf_test']} Inf vs reference "
            f"{m['nan_ref']} NaN / {m['inf_ref']} Inf ({m['nan_mismatch']} NaN positions differ"
            f", {m.get('inf_mismatch', 0)} Inf positions differ)"
        )
    else:
        text = "nan_inf: NaN/Inf positions match"
    return Criterion("nan_inf", float(bad), 0.0, "<=", text, bad == 0, math.inf if bad else 0.0)


def _allclose_stats(metrics: dict, tol: Tolerance, reference: Any, test: Any) -> dict:
    atol, rtol = tol.atol or 0.0, tol.rtol or 0.0
    if reference is not None and test is not None:
        m = compare(reference, test, rel_floor=metrics.get("rel_floor"), hist_bins=1,
                     allclose=(atol, rtol))
        return {k: v for k, v in m.items() if k.startswith("allclose_")}
    if metrics.get("allclose_atol") != atol or metrics.get("allclose_rtol") != rtol:
        raise ValueError(
            f"tolerance checks atol={atol:g}/rtol={rtol:g} but the metrics hold no elementwise "
            "test for them; pass reference/test arrays or use judge_arrays()"
        )
    return metrics


def _allclose_criterion(metrics: dict, tol: Tolerance, reference: Any, test: Any) -> Criterion:
    st = _allclose_stats(metrics, tol, reference, test)
    atol, rtol = tol.atol or 0.0, tol.rtol or 0.0
    share = st["allclose_fail_share"]
    limit = tol.max_fail_share
    ok = holds(share, limit, "<=")
    if limit > 0:
        ratio = le_ratio(share, limit)
    else:
        ratio = st["allclose_max_ratio"]
        ratio = math.inf if math.isnan(ratio) else ratio
    rule = f"atol={lim(atol)} + rtol={lim(rtol)}*|ref|"
    allowed = f", allowed {pct(limit)}" if limit > 0 else ""
    if math.isnan(share):
        text = f"atol/rtol: no positions where both are finite ({rule})"
    elif ok:
        text = f"atol/rtol: {pct(share)} of elements outside {rule}{allowed}"
    else:
        text = (
            f"max_abs {sci(metrics['max_abs'], atol)} > {lim(atol)} "
            f"(atol/rtol: {pct(share)} of elements outside {rule}{allowed})"
        )
    return Criterion("atol/rtol", float(share), float(limit), "<=", text, ok, float(ratio))


def _check_inputs(metrics: dict, tol: Tolerance) -> None:
    """The figures must have been computed the way the tolerance judges them."""
    floor = metrics.get("rel_floor")
    if (
        tol.rel_floor is not None
        and (tol.max_rel is not None or tol.mean_rel is not None)
        and floor != tol.rel_floor
    ):
        raise ValueError(
            f"tolerance sets rel_floor={tol.rel_floor:g} but the metrics used {floor}; "
            "pass rel_floor to compare() or use judge_arrays()"
        )
    if tol.min_topk is not None and metrics.get("topk") != tol.k:
        raise ValueError(
            f"tolerance checks top-{tol.k} agreement but the metrics were computed with "
            f"topk={metrics.get('topk')}; pass topk={tol.k} to compare() or use judge_arrays()"
        )


def judge(metrics: dict, tol: Tolerance, reference: Any = None, test: Any = None) -> Verdict:
    """Evaluate every criterion of ``tol`` on ``metrics`` (from compare()).

    The atol/rtol test is elementwise: it needs either the arrays
    (``reference``/``test``) or metrics from judge_arrays() made with the same
    atol/rtol; otherwise ValueError. Criteria that do not apply (min_topk on a
    tensor with no class axis) are listed in ``skipped``. An empty tensor passes.
    """
    checked: list[Criterion] = [_nan_inf_criterion(metrics)]
    skipped: list[str] = []
    if metrics.get("numel", 1) == 0:
        return Verdict(passed=checked[0].ok, checked=checked, skipped=["all: empty tensor"])

    if tol.checks_allclose:
        checked.append(_allclose_criterion(metrics, tol, reference, test))
    _check_inputs(metrics, tol)
    floor = metrics.get("rel_floor")
    for metric in BOUNDED:
        bound = metric.bound
        limit = getattr(tol, bound.criterion)
        if limit is None:
            continue
        if bound.missing and metrics.get(metric.key) is None:
            skipped.append(bound.missing.format(shape=metrics.get("shape")))
            continue
        mv, limit = float(metrics[metric.key]), float(limit)
        ok = holds(mv, limit, bound.op)
        text = bound.text(mv, limit, ok, k=tol.k, floor=floor)
        checked.append(Criterion(bound.criterion, mv, limit, bound.op, text, ok, bound.ratio(mv, limit)))

    for c in checked[1:]:
        if math.isnan(c.measured):
            c.text = f"{c.name}: nothing to measure (no positions where both are finite)"
    return Verdict(passed=all(c.ok for c in checked), checked=checked, skipped=skipped)


def judge_arrays(reference: Any, test: Any, tol: Tolerance, **compare_kwargs: Any) -> tuple[dict, Verdict]:
    """compare() + judge() in one streamed pass pair; the metrics gain the
    ``allclose_*`` fields (fail share, count, worst excess over the threshold,
    max ratio err/threshold) so the verdict can be recomputed from them later.
    ``topk`` and ``rel_floor`` default to the tolerance's."""
    if tol.k is not None:
        compare_kwargs.setdefault("topk", tol.k)
    if tol.rel_floor is not None:
        compare_kwargs.setdefault("rel_floor", tol.rel_floor)
    allclose = ((tol.atol or 0.0), (tol.rtol or 0.0)) if tol.checks_allclose else None
    metrics = compare(reference, test, allclose=allclose, **compare_kwargs)
    return metrics, judge(metrics, tol)


def worst_ratio(metrics: dict, tol: Tolerance) -> float:
    """How far beyond tolerance the worst criterion is; > 1 means failing.

    Per criterion: measured/limit for upper bounds; (1 - measured)/(1 - limit)
    for cosine and top-k (distance from a perfect 1); 10^((limit - snr)/10) for
    SNR (the error-power ratio); for atol/rtol the largest |t-r| / (atol +
    rtol|r|) over elements (or fail share / max_fail_share when some failures
    are allowed); inf for a NaN/Inf mismatch. The bisection ranks steps by it,
    so "3x over max_abs" and "cosine 0.9 vs 0.99" land on one scale.
    Needs the allclose_* fields (judge_arrays) when atol/rtol is set.
    """
    return judge(metrics, tol).ratio


def judge_many(pairs: list[tuple[Any, Any]], tol: Tolerance) -> list[tuple[dict, Verdict]]:
    """judge_arrays(ref, test, tol, histograms=False) for each pair, the small ones
    compared together (metrics.compare_many: the same figures, sums in another
    order); a tolerance with a top-k criterion, or a pair compare_many does not
    take, goes through judge_arrays alone."""
    import numpy as np

    from bisect_tui.core.metrics.batched import compare_many

    arrays = [(np.asarray(r), np.asarray(t)) for r, t in pairs]
    many: list = [None] * len(arrays)
    if tol.k is None:
        allclose = ((tol.atol or 0.0), (tol.rtol or 0.0)) if tol.checks_allclose else None
        many = compare_many(arrays, rel_floor=tol.rel_floor, allclose=allclose)
    out = []
    for (r, t), m in zip(arrays, many):
        if m is None:
            out.append(judge_arrays(r, t, tol, histograms=False))
        else:
            out.append((m, judge(m, tol)))
    return out
