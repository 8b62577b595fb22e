"""What "within tolerance" means, and the verdict on one compared tensor.

A `Tolerance` is a set of optional criteria (None = not checked). Presets give
named, documented starting points; `parse_tolerance` turns CLI flags into a
`ToleranceSpec` (a global tolerance plus per-output overrides), and `judge`
turns the metrics of `metrics.compare` into a `Verdict` that names every
failing criterion with its measured value and limit.

Every criterion also gets a *ratio*: how many times over its limit it is (1.0
is the boundary, > 1 fails). The bisection ranks steps by the worst ratio, so
criteria with different units (dB, cosine, absolute error) are comparable.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from bisect_tui.core.errors import UserError
from bisect_tui.core.metrics import _compare

DEFAULT_PRESET = "fp32"
DEFAULT_TOPK = 5
"""k of the top-k agreement when `min_topk` is set without `topk`."""

_FLOAT_FIELDS = (
    "atol", "rtol", "max_abs", "mean_abs", "max_rel", "mean_rel",
    "min_cosine", "min_snr_db", "min_topk", "max_fail_share", "rel_floor",
)
_INT_FIELDS = ("topk",)
CRITERIA = _FLOAT_FIELDS + _INT_FIELDS
"""Keys accepted in overrides and `Tolerance.from_dict` (besides `name`/`preset`)."""


@dataclass(frozen=True)
class Tolerance:
    """Optional criteria; None means "not checked".

    atol/rtol: elementwise test like numpy.allclose, an element fails when
    ``|t - r| > atol + rtol * |r|`` (one of them unset counts as 0); at most
    ``max_fail_share`` of the compared elements may fail. The others bound the
    aggregate metrics of the same name; ``min_*`` are lower bounds.
    ``topk`` is k for ``min_topk`` (default 5); ``rel_floor`` is passed to
    compare() for the relative metrics (None = compare's default floor).
    """

    atol: float | None = None
    rtol: float | None = None
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    mean_rel: float | None = None
    min_cosine: float | None = None
    min_snr_db: float | None = None
    min_topk: float | None = None
    max_fail_share: float = 0.0
    topk: int | None = None
    rel_floor: float | None = None
    name: str = "custom"

    def __post_init__(self) -> None:
        for f in _FLOAT_FIELDS:
            v = getattr(self, f)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise UserError(f"tolerance {f}={v!r} is not a number")
            if f != "min_snr_db" and v < 0:
                raise UserError(f"tolerance {f}={v!r} must be >= 0")
        for f in ("min_cosine", "min_topk", "max_fail_share"):
            v = getattr(self, f)
            if v is not None and v > 1:
                raise UserError(f"tolerance {f}={v!r} must be <= 1")
        if self.rel_floor is not None and not self.rel_floor > 0:
            raise UserError(f"tolerance rel_floor={self.rel_floor!r} must be > 0")
        if self.topk is not None and (
            isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1
        ):
            raise UserError(f"tolerance topk={self.topk!r} must be an integer >= 1")

    @property
    def checks_allclose(self) -> bool:
        return self.atol is not None or self.rtol is not None

    @property
    def k(self) -> int | None:
        """k to compute top-k agreement with, or None when it is not checked."""
        if self.min_topk is None:
            return None
        return self.topk or DEFAULT_TOPK

    def replace(self, **changes: Any) -> "Tolerance":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line, e.g. ``fp16: atol=0.01 rtol=0.01 min_cosine=0.999``."""
        parts = [
            f"{f}={getattr(self, f):g}"
            for f in CRITERIA
            if getattr(self, f) is not None and not (f == "max_fail_share" and self.max_fail_share == 0)
        ]
        return f"{self.name}: {' '.join(parts) if parts else '(nothing checked)'}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Tolerance":
        unknown = set(data) - set(CRITERIA) - {"name"}
        if unknown:
            raise UserError(
                f"unknown tolerance field(s) {', '.join(sorted(unknown))}; valid: {', '.join(CRITERIA)}"
            )
        return cls(**data)


@dataclass(frozen=True)
class Preset:
    tolerance: Tolerance
    description: str


def _p(name: str, description: str, **criteria: Any) -> tuple[str, Preset]:
    return name, Preset(Tolerance(name=name, **criteria), description)


PRESETS: dict[str, Preset] = dict(
    [
        _p("fp32", "FP32 fused vs unfused kernels differ by ~1e-7..1e-6 (summation order); "
           "1e-4 ignores reordering and catches real bugs",
           atol=1e-4, rtol=1e-4, min_cosine=0.99999),
        _p("fp16", "FP16 has ~3 decimal digits (eps 9.8e-4); 1e-2 allows accumulated rounding",
           atol=1e-2, rtol=1e-2, min_cosine=0.999),
        _p("bf16", "BF16 has ~2 decimal digits (eps 7.8e-3); 5e-2 allows accumulated rounding",
           atol=5e-2, rtol=5e-2, min_cosine=0.99),
        _p("int8", "quantized: elementwise error is expected, judge the signal (cosine, SQNR)",
           min_cosine=0.99, min_snr_db=20.0),
        _p("article", "rule of thumb from the seed articles: MAE < 1e-3, relative error < 1%, "
           "cosine > 0.99",
           mean_abs=1e-3, mean_rel=1e-2, min_cosine=0.99),
        _p("msprobe", "Ascend msprobe's per-op rule: cosine >= 0.99 and max abs error <= 1",
           min_cosine=0.99, max_abs=1.0),
        _p("torch-fp32", "torch.testing.assert_close defaults for float32",
           atol=1e-5, rtol=1.3e-6),
        _p("torch-fp16", "torch.testing.assert_close defaults for float16",
           atol=1e-5, rtol=1e-3),
        _p("torch-bf16", "torch.testing.assert_close defaults for bfloat16",
           atol=1e-5, rtol=1.6e-2),
    ]
)


def get_preset(name: str) -> Tolerance:
    """The preset's Tolerance; UserError listing the valid names otherwise."""
    key = name.strip().lower().replace("_", "-")
    if key not in PRESETS:
        raise UserError(f"unknown tolerance preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[key].tolerance


# --------------------------------------------------------------------------- spec and parsing


@dataclass(frozen=True)
class ToleranceSpec:
    """A global tolerance plus per-output overrides.

    Override patterns are output names; an exact name wins, otherwise the
    first matching shell-style glob (``*/LayerNorm*``) in the given order.
    """

    default: Tolerance
    overrides: tuple[tuple[str, Tolerance], ...] = ()

    def override_pattern(self, name: str) -> Optional[str]:
        """The override that applies to `name`: an exact name wins over globs."""
        for pattern, _ in self.overrides:
            if pattern == name:
                return pattern
        for pattern, _ in self.overrides:
            if fnmatch.fnmatchcase(name, pattern):
                return pattern
        return None

    def for_output(self, name: str) -> Tolerance:
        pattern = self.override_pattern(name)
        return next((tol for p, tol in self.overrides if p == pattern), self.default)

    def unused(self, names: Iterable[str]) -> list[str]:
        """Override patterns that match none of ``names`` (likely typos)."""
        names = list(names)
        return [
            p for p, _ in self.overrides
            if not any(p == n or fnmatch.fnmatchcase(n, p) for n in names)
        ]

    def to_dict(self) -> dict:
        return {
            "default": self.default.to_dict(),
            "overrides": [{"output": p, "tolerance": t.to_dict()} for p, t in self.overrides],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "ToleranceSpec":
        return cls(
            default=Tolerance.from_dict(data["default"]),
            overrides=tuple(
                (o["output"], Tolerance.from_dict(o["tolerance"])) for o in data.get("overrides", ())
            ),
        )


def _parse_value(key: str, text: str, where: str) -> float | int | None:
    t = text.strip()
    if t.lower() in ("none", "off"):
        return None
    try:
        if key in _INT_FIELDS:
            return int(t)
        return float(t)
    except ValueError:
        kind = "an integer" if key in _INT_FIELDS else "a number"
        raise UserError(f"{where}: {key}={text!r} is not {kind} (or 'none')") from None


def _parse_override(text: str, base: Tolerance) -> tuple[str, Tolerance]:
    """``output:key=value,...`` -> (output, tolerance). The last ':' splits, so
    TF-style names like ``dense/BiasAdd:0`` work. Keys apply on top of ``base``
    or, with ``preset=NAME``, on top of that preset."""
    valid = ", ".join(("preset",) + CRITERIA)
    if ":" not in text:
        raise UserError(
            f"bad tolerance override {text!r}; expected OUTPUT:key=value[,key=value] with keys {valid}"
        )
    output, _, body = text.rpartition(":")
    output = output.strip()
    pairs: list[tuple[str, str]] = []
    for item in body.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not output or not eq or not key:
            raise UserError(
                f"bad tolerance override {text!r}; expected OUTPUT:key=value[,key=value] with keys {valid}"
            )
        if key != "preset" and key not in CRITERIA:
            raise UserError(f"unknown tolerance criterion {key!r} in {text!r}; valid: {valid}")
        pairs.append((key, value))
    tol = base
    presets = [v for k, v in pairs if k == "preset"]
    if len(presets) > 1:
        raise UserError(f"tolerance override {text!r} names more than one preset")
    if presets:
        tol = get_preset(presets[0])
    changes = {k: _parse_value(k, v, f"tolerance override {text!r}") for k, v in pairs if k != "preset"}
    if changes:
        if "max_fail_share" in changes and changes["max_fail_share"] is None:
            changes["max_fail_share"] = 0.0
        tol = tol.replace(**changes, name=f"{tol.name}+custom" if tol.name != "custom" else "custom")
    return output, tol


def parse_tolerance(
    preset: str | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    overrides: Iterable[str] = (),
) -> ToleranceSpec:
    """Build the spec from CLI flags.

    No preset means ``DEFAULT_PRESET`` (fp32). Explicit atol/rtol/min_cosine
    replace the preset's values. Overrides (``logits:atol=1e-3,min_cosine=0.999``
    or ``logits:preset=fp16``) start from the resulting global tolerance unless
    they name a preset. Bad input raises UserError listing the valid values.
    """
    base = get_preset(preset if preset is not None else DEFAULT_PRESET)
    explicit = {k: v for k, v in (("atol", atol), ("rtol", rtol), ("min_cosine", min_cosine)) if v is not None}
    if explicit:
        base = base.replace(**explicit, name=f"{base.name}+custom")
    parsed: dict[str, Tolerance] = {}
    for text in overrides:
        output, tol = _parse_override(text, base)
        if output in parsed:
            raise UserError(f"output {output!r} has more than one tolerance override; merge them")
        parsed[output] = tol
    return ToleranceSpec(default=base, overrides=tuple(parsed.items()))


# --------------------------------------------------------------------------- verdict


@dataclass
class Criterion:
    """One evaluated criterion. ``ratio`` is how many times over the limit the
    measurement is (<= 1 passes), comparable across criteria."""

    name: str
    measured: float
    limit: float
    op: str  # "<=" or ">=": the relation that must hold
    text: str
    ok: bool
    ratio: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Criterion":
        return cls(**data)


@dataclass
class Verdict:
    passed: bool
    checked: list[Criterion] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "min_topk: no class axis of size >= 2"

    @property
    def failed(self) -> list[Criterion]:
        return [c for c in self.checked if not c.ok]

    @property
    def ratio(self) -> float:
        """Worst ratio over the checked criteria (0.0 when nothing was checked)."""
        return max((c.ratio for c in self.checked), default=0.0)

    def summary(self) -> str:
        failed = self.failed
        if not failed:
            return "PASS"
        more = f"; +{len(failed) - 1} more" if len(failed) > 1 else ""
        return f"FAIL: {failed[0].text}{more}"

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "summary": self.summary(),
            "ratio": self.ratio,
            "failed": [c.name for c in self.failed],
            "checked": [c.to_dict() for c in self.checked],
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        return cls(
            passed=bool(data["passed"]),
            checked=[Criterion.from_dict(c) for c in data.get("checked", ())],
            skipped=list(data.get("skipped", ())),
        )


def _lim(v: float) -> str:
    """Shortest scientific form: 1e-04, 1.3e-06."""
    mant, _, exp = f"{v:.6e}".partition("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{exp}"


def _sci(m: float, limit: float) -> str:
    """Measured value with enough digits not to print equal to a different limit."""
    if not math.isfinite(m):
        return str(m)
    for p in range(1, 10):
        s = f"{m:.{p}e}"
        if m == limit or float(s) != limit:
            return s
    return repr(m)


def _fix(m: float, limit: float) -> str:
    if not math.isfinite(m):
        return str(m)
    for p in range(4, 13):
        s = f"{m:.{p}f}"
        if m == limit or float(s) != limit:
            return s
    return repr(m)


def _pct(share: float) -> str:
    pct = share * 100
    return f"{pct:.1f}%" if pct >= 0.1 or pct == 0 else f"{pct:.2g}%"


def _le_ratio(m: float, limit: float) -> float:
    if math.isnan(m):
        return math.inf
    if limit > 0:
        return m / limit
    return 0.0 if m <= limit else math.inf


def _one_minus_ratio(m: float, limit: float) -> float:
    """For cosine/top-k (best is 1): distance from 1 relative to the allowed one."""
    if math.isnan(m):
        return math.inf
    room = 1.0 - limit
    if room <= 0:
        return 0.0 if m >= limit else math.inf
    return max(0.0, (1.0 - m) / room)


def _snr_ratio(m: float, limit: float) -> float:
    """Error power relative to the allowed error power: 10^((limit - snr)/10)."""
    if math.isnan(m):
        return math.inf
    x = (limit - m) / 10.0
    return math.inf if x > 300 else 10.0**x


def _ok(m: float, limit: float, op: str) -> bool:
    return m <= limit if op == "<=" else m >= limit  # NaN compares False: fails


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
        m = _compare(reference, test, rel_floor=metrics.get("rel_floor"), hist_bins=1,
                     allclose=(atol, rtol))
        return {k: v for k, v in m.items() if k.startswith("allclose_")}
    if metrics.get("allclose_atol") != atol or metrics.get("allclose_rtol") != rtol:
        raise ValueError(
            f"tolerance checks atol={atol:g}/rtol={rtol:g} but the metrics hold no elementwise "
            "test for them; pass reference/test arrays or use judge_arrays()"
        )
    return metrics


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
        st = _allclose_stats(metrics, tol, reference, test)
        atol, rtol = tol.atol or 0.0, tol.rtol or 0.0
        share = st["allclose_fail_share"]
        lim = tol.max_fail_share
        ok = _ok(share, lim, "<=")
        if lim > 0:
            ratio = _le_ratio(share, lim)
        else:
            ratio = st["allclose_max_ratio"]
            ratio = math.inf if math.isnan(ratio) else ratio
        rule = f"atol={_lim(atol)} + rtol={_lim(rtol)}*|ref|"
        allowed = f", allowed {_pct(lim)}" if lim > 0 else ""
        if math.isnan(share):
            text = f"atol/rtol: no positions where both are finite ({rule})"
        elif ok:
            text = f"atol/rtol: {_pct(share)} of elements outside {rule}{allowed}"
        else:
            text = (
                f"max_abs {_sci(metrics['max_abs'], atol)} > {_lim(atol)} "
                f"(atol/rtol: {_pct(share)} of elements outside {rule}{allowed})"
            )
        checked.append(Criterion("atol/rtol", float(share), float(lim), "<=", text, ok, float(ratio)))

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
    for key in ("max_abs", "mean_abs", "max_rel", "mean_rel"):
        limit = getattr(tol, key)
        if limit is None:
            continue
        mv = float(metrics[key])
        ok = _ok(mv, limit, "<=")
        note = f" (rel. floor {_lim(floor)})" if key.endswith("_rel") and floor is not None else ""
        text = f"{key} {_sci(mv, limit)} {'<=' if ok else '>'} {_lim(limit)}{note}"
        checked.append(Criterion(key, mv, float(limit), "<=", text, ok, _le_ratio(mv, limit)))

    if tol.min_cosine is not None:
        mv, limit = float(metrics["cosine"]), float(tol.min_cosine)
        ok = _ok(mv, limit, ">=")
        text = f"cosine {_fix(mv, limit)} {'>=' if ok else '<'} {limit:g}"
        checked.append(Criterion("min_cosine", mv, limit, ">=", text, ok, _one_minus_ratio(mv, limit)))

    if tol.min_snr_db is not None:
        mv, limit = float(metrics["snr_db"]), float(tol.min_snr_db)
        ok = _ok(mv, limit, ">=")
        text = f"snr {mv:.1f} dB {'>=' if ok else '<'} {limit:g} dB"
        checked.append(Criterion("min_snr_db", mv, limit, ">=", text, ok, _snr_ratio(mv, limit)))

    if tol.min_topk is not None:
        k = tol.k
        if metrics.get("topk") != k:
            raise ValueError(
                f"tolerance checks top-{k} agreement but the metrics were computed with "
                f"topk={metrics.get('topk')}; pass topk={k} to compare() or use judge_arrays()"
            )
        if metrics.get("topk_agreement") is None:
            skipped.append(f"min_topk: no class axis of size >= 2 in shape {metrics.get('shape')}")
        else:
            mv, limit = float(metrics["topk_agreement"]), float(tol.min_topk)
            ok = _ok(mv, limit, ">=")
            text = f"top-{k} agreement {_fix(mv, limit)} {'>=' if ok else '<'} {limit:g}"
            checked.append(Criterion("min_topk", mv, limit, ">=", text, ok, _one_minus_ratio(mv, limit)))

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
    metrics = _compare(reference, test, allclose=allclose, **compare_kwargs)
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

    from bisect_tui.core.metrics import compare_many

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
