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


_NAN_INF_OK = "nan_inf: NaN/Inf positions match"


def _nan_inf_criterion(m: dict) -> Criterion:
    """NaN/Inf where the reference has none (or at other positions) always fails:
    a fused kernel that overflows is the bug we look for, whatever the tolerance."""
    extra = max(0, (m["nan_test"] + m["inf_test"]) - (m["nan_ref"] + m["inf_ref"]))
    bad = int(m["nan_mismatch"]) + int(m.get("inf_mismatch", 0)) + extra
    if not bad:
        return Criterion("nan_inf", 0.0, 0.0, "<=", _NAN_INF_OK, True, 0.0)
    text = (
        f"nan_inf: test has {m['nan_test']} NaN / {m['inf_test']} Inf vs reference "
        f"{m['nan_ref']} NaN / {m['inf_ref']} Inf ({m['nan_mismatch']} NaN positions differ"
        f", {m.get('inf_mismatch', 0)} Inf positions differ)"
    )
    return Criterion("nan_inf", float(bad), 0.0, "<=", text, False, math.inf)


class _Plan:
    """What judge() reads from a tolerance, once per tolerance instead of once
    per tensor (the probe judges 7,000 tensors with one): the bounds it sets, in
    BOUNDED's order, and the wording of its atol/rtol rule."""

    def __init__(self, tol: Tolerance):
        self.allclose = tol.checks_allclose
        self.atol, self.rtol = tol.atol or 0.0, tol.rtol or 0.0
        self.share_limit = tol.max_fail_share
        self.atol_text = lim(self.atol)
        self.rule = f"atol={self.atol_text} + rtol={lim(self.rtol)}*|ref|"
        self.allowed = f", allowed {pct(self.share_limit)}" if self.share_limit > 0 else ""
        self.none_outside = f"atol/rtol: {pct(0.0)} of elements outside {self.rule}{self.allowed}"
        self.k = tol.k
        self.check_floor = tol.rel_floor is not None and (tol.max_rel is not None or tol.mean_rel is not None)
        self.bounds = []  # (metric key, bound, limit, limit as a float, and the words of its text)
        for m in BOUNDED:
            limit = getattr(tol, m.bound.criterion)
            if limit is not None:
                words = m.bound.parts(float(limit), self.k)
                self.bounds.append((m.key, m.bound, limit, float(limit)) + words)


_LAST_PLAN: list = []  # [(tolerance, its plan)]: a Tolerance is frozen, so its plan never changes


def _plan(tol: Tolerance) -> _Plan:
    if _LAST_PLAN and _LAST_PLAN[0][0] is tol:
        return _LAST_PLAN[0][1]
    plan = _Plan(tol)
    if type(tol) is Tolerance:
        _LAST_PLAN[:] = [(tol, plan)]
    return plan


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


def _allclose_criterion(metrics: dict, tol: Tolerance, reference: Any, test: Any, plan: _Plan) -> Criterion:
    if reference is None or test is None:  # _allclose_stats's check, without its call
        if metrics.get("allclose_atol") != plan.atol or metrics.get("allclose_rtol") != plan.rtol:
            _allclose_stats(metrics, tol, reference, test)  # raises
        st = metrics
    else:
        st = _allclose_stats(metrics, tol, reference, test)
    atol = plan.atol
    share = st["allclose_fail_share"]
    limit = plan.share_limit
    ok = share <= limit  # holds(share, limit, "<="): NaN fails
    if limit > 0:
        ratio = le_ratio(share, limit)
    else:
        ratio = st["allclose_max_ratio"]
        ratio = math.inf if math.isnan(ratio) else ratio
    rule, allowed = plan.rule, plan.allowed
    if ok and share == 0 and math.copysign(1.0, share) == 1.0:  # most tensors: pct(0.0) is "0.0%"
        text = plan.none_outside
    elif math.isnan(share):
        text = f"atol/rtol: no positions where both are finite ({rule})"
    elif ok:
        text = f"atol/rtol: {pct(share)} of elements outside {rule}{allowed}"
    else:
        text = (
            f"max_abs {sci(metrics['max_abs'], atol)} > {plan.atol_text} "
            f"(atol/rtol: {pct(share)} of elements outside {rule}{allowed})"
        )
    return Criterion("atol/rtol", float(share), float(limit), "<=", text, ok, float(ratio))


def _check_inputs(metrics: dict, tol: Tolerance, plan: _Plan) -> None:
    """The figures must have been computed the way the tolerance judges them."""
    floor = metrics.get("rel_floor")
    if plan.check_floor and floor != tol.rel_floor:
        raise ValueError(
            f"tolerance sets rel_floor={tol.rel_floor:g} but the metrics used {floor}; "
            "pass rel_floor to compare() or use judge_arrays()"
        )
    if tol.min_topk is not None and metrics.get("topk") != plan.k:
        raise ValueError(
            f"tolerance checks top-{plan.k} agreement but the metrics were computed with "
            f"topk={metrics.get('topk')}; pass topk={plan.k} to compare() or use judge_arrays()"
        )


def judge(metrics: dict, tol: Tolerance, reference: Any = None, test: Any = None) -> Verdict:
    """Evaluate every criterion of ``tol`` on ``metrics`` (from compare()).

    The atol/rtol test is elementwise: it needs either the arrays
    (``reference``/``test``) or metrics from judge_arrays() made with the same
    atol/rtol; otherwise ValueError. Criteria that do not apply (min_topk on a
    tensor with no class axis) are listed in ``skipped``. An empty tensor passes.
    """
    first = _nan_inf_criterion(metrics)
    checked: list[Criterion] = [first]
    skipped: list[str] = []
    if metrics.get("numel", 1) == 0:
        return Verdict(passed=first.ok, checked=checked, skipped=["all: empty tensor"])

    plan = _plan(tol)
    if plan.allclose:
        checked.append(_allclose_criterion(metrics, tol, reference, test, plan))
    _check_inputs(metrics, tol, plan)
    floor = metrics.get("rel_floor")
    for key, bound, _, limit, word, limit_text in plan.bounds:
        if bound.missing and metrics.get(key) is None:
            skipped.append(bound.missing.format(shape=metrics.get("shape")))
            continue
        mv = float(metrics[key])
        ok = holds(mv, limit, bound.op)
        text = bound.compose(word, limit_text, mv, limit, ok, floor)
        checked.append(Criterion(bound.criterion, mv, limit, bound.op, text, ok, bound.ratio(mv, limit)))

    passed = True
    for c in checked:
        if c is not first and math.isnan(c.measured):
            c.text = f"{c.name}: nothing to measure (no positions where both are finite)"
        if not c.ok:
            passed = False
    return Verdict(passed=passed, checked=checked, skipped=skipped)


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

    nd = np.ndarray
    arrays = [(r if type(r) is nd else np.asarray(r), t if type(t) is nd else np.asarray(t)) for r, t in pairs]
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
