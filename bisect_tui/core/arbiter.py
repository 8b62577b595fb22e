"""The float64 arbiter: is the fused result really worse, or are the FP32
baseline and the engine equally far from the true value?

An absolute tolerance compares the fused engine with the FP32 baseline, and
the baseline is itself only an FP32 approximation. With a float64 run of the
whole model as the truth, each output gets two errors: the baseline's and the
fused engine's. The rule is the one PyTorch's minifier (`same(..., fp64_ref)`)
and msprobe use: the fused result is *not worse than FP32* when its RMSE
against the truth is within `factor` times the baseline's RMSE against the
truth (2x; 3x for bfloat16, whose 8-bit mantissa rounds far more). A tolerance
tighter than FP32's own error fails such a result; the arbiter says so, so the
user loosens the tolerance instead of hunting a fusion that is not there.

The baseline's error is floored at one FP32 epsilon of the output's RMS: an
output that FP32 happens to hit exactly (a ReLU of zeros, a constant) must not
make every engine infinitely "worse". The ratio is then the fused error over
that floor, and the text says so (a printed "baseline 3.56e-08, fused 4.25e-08
(0.4665x)" read as a wrong division).

The truth must prove itself first: a float64 evaluator with a wrong kernel
makes the FP32 baseline look far from the "truth", and every engine "not worse"
than it. reference_check.py compares the truth with the FP32 baseline tensor
by tensor and falls back where they part; here, each output's baseline error
against the truth must also stay within FP32 rounding as the sensitivity check
measured it (a 1-ulp input change moves the output by that much: FP32's own
rounding of the model is of that order, 1-2x on PP-OCR). An unverified truth
gives no not-worse verdict and never the advice to loosen the tolerance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

FACTOR = {"bf16": 3.0}
# the baseline's max error vs the truth, over FP32 rounding (the larger of the 1-ulp
# sensitivity's movement and one epsilon of the output's scale); 1-8x seen on a right truth
ROUNDING_FACTOR = 256.0
DEFAULT_FACTOR = 2.0
_EPS32 = float(np.finfo(np.float32).eps)


def factor_for(precision: str) -> float:
    return FACTOR.get(precision, DEFAULT_FACTOR)


@dataclass
class ErrorVsTruth:
    rmse: float
    max_abs: float

    @classmethod
    def of(cls, truth: np.ndarray, test: np.ndarray) -> "ErrorVsTruth":
        t = np.asarray(truth, dtype=np.float64)
        x = np.asarray(test, dtype=np.float64).reshape(t.shape)
        d = np.abs(x - t)
        if not np.all(np.isfinite(d)):
            return cls(math.inf, math.inf)
        return cls(float(np.sqrt(np.mean(d * d))) if d.size else 0.0, float(d.max()) if d.size else 0.0)


@dataclass
class OutputVerdict:
    output: str
    baseline: ErrorVsTruth  # the unfused FP32 run vs float64
    fused: ErrorVsTruth  # the fused engine vs float64
    ratio: float  # fused RMSE / baseline RMSE (floored)
    factor: float
    not_worse: bool
    tolerance_passed: Optional[bool]  # the check's own verdict on this output (vs the baseline)
    framework: Optional[ErrorVsTruth] = None  # the framework's FP32 run vs float64 (torch models)
    floor: float = 0.0  # one FP32 epsilon of the output's RMS: the least baseline error the ratio divides by
    floored: bool = False  # the baseline's own error was below the floor: the ratio is fused / floor
    unverified: Optional[str] = None  # why the truth cannot judge this output (then no verdict)

    @property
    def too_tight(self) -> bool:
        """The tolerance fails a result that is as close to the truth as FP32 itself."""
        return self.tolerance_passed is False and self.not_worse

    def ratio_text(self) -> str:
        """What the ratio divides by, as printed."""
        if self.floored:
            return (f"{fmt_ratio(self.ratio)} the FP32 floor ({self.floor:.3g}, one FP32 epsilon of the output's RMS; "
                    f"the baseline's own error {self.baseline.rmse:.3g} is below it)")
        return f"{fmt_ratio(self.ratio)} the baseline's"

    def verdict_text(self) -> str:
        if self.unverified:
            return f"no verdict: {self.unverified}"
        if self.not_worse:
            head = f"not worse than FP32 (fused error {self.ratio_text()}, limit {self.factor:g}x)"
            if self.too_tight:
                head += ("; the tolerance fails it all the same: it is tighter than FP32's own error "
                         "against the float64 truth, so loosen it rather than blame a fusion")
            return head
        text = (f"worse than FP32: fused error {self.ratio_text()} against the float64 truth "
                f"(limit {self.factor:g}x)")
        if self.tolerance_passed:
            return text + "; still within the tolerance, which decides whether that much matters"
        return text + "; the engine really loses accuracy here, the tolerance is not the problem"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["too_tight"] = self.too_tight
        d["verdict"] = "unverified" if self.unverified else ("not_worse" if self.not_worse else "worse")
        d["summary"] = self.verdict_text()
        return d


def fmt_ratio(r: float) -> str:
    if math.isinf(r):
        return "inf x"
    return f"{r:.3g}x"


@dataclass
class Arbitration:
    truth_source: str  # what computed the float64 truth
    precision: str
    factor: float
    outputs: list[OutputVerdict] = field(default_factory=list)
    note: Optional[str] = None  # e.g. why the first float64 path could not run
    reference_check: Optional[dict] = None  # how the truth proved itself (None: not checked)

    @property
    def all_not_worse(self) -> bool:
        return all(o.not_worse for o in self.outputs)

    @property
    def reliable(self) -> bool:
        return not (self.reference_check or {}).get("unreliable_at") and not any(o.unverified for o in self.outputs)

    def to_dict(self) -> dict:
        return {
            "available": True,
            "truth_source": self.truth_source,
            "precision": self.precision,
            "factor": self.factor,
            "note": self.note,
            "all_not_worse": self.all_not_worse,
            "outputs": {o.output: o.to_dict() for o in self.outputs},
            "reference_check": self.reference_check,
        }


def unavailable(reason: str) -> dict:
    """The arbiter could not run: said plainly, never an error of the check."""
    return {"available": False, "reason": reason, "outputs": {}}


def unreliable_text(at: dict) -> str:
    return (f"reference unreliable at op {at.get('tensor')} ({at.get('op_type')}, node {at.get('node')}): "
            "the float64 evaluator parts from the FP32 baseline there and no fallback agrees")


def output_rounding_check(name: str, base: ErrorVsTruth, t64: np.ndarray, sensitivity: Optional[dict]) -> Optional[dict]:
    """The baseline's max error vs the truth against FP32 rounding at this output (the
    sensitivity's 1-ulp movement, or one epsilon of its scale); None without a sensitivity run."""
    sens = ((sensitivity or {}).get("outputs") or {}).get(name)
    if not sens or sens.get("max_abs") is None:
        return None
    scale = float(np.max(np.abs(t64[np.isfinite(t64)]))) if t64.size and np.isfinite(t64).any() else 0.0
    rounding = max(float(sens["max_abs"]), _EPS32 * scale)
    bound = ROUNDING_FACTOR * rounding
    return {"baseline_max_abs": base.max_abs, "sensitivity_max_abs": float(sens["max_abs"]), "scale": scale,
            "bound": bound, "within": bool(base.max_abs <= bound),
            "x_rounding": base.max_abs / rounding if rounding > 0 else (0.0 if base.max_abs == 0 else math.inf)}


def arbitrate(
    truth: dict[str, np.ndarray],
    baseline: dict[str, np.ndarray],
    fused: dict[str, np.ndarray],
    precision: str,
    truth_source: str,
    tolerance_passed: Optional[dict[str, bool]] = None,
    framework: Optional[dict[str, np.ndarray]] = None,
    note: Optional[str] = None,
    reference_check: Optional[dict] = None,
    sensitivity: Optional[dict] = None,
) -> Arbitration:
    """Every array holds all samples (leading samples axis), the same for each side.

    `reference_check`: how the truth compared with the FP32 baseline tensor by tensor
    (reference_check.py); `sensitivity`: the check's 1-ulp run, whose movement of
    each output bounds the baseline's own error against a right truth."""
    factor = factor_for(precision)
    unchecked = {"checked": False, "reliable": None,
                 "why": "computed without the FP32 baseline's tensors at hand; the outputs' check against "
                        "the 1-ulp sensitivity still applies"}
    check = dict(reference_check) if reference_check else unchecked
    result = Arbitration(truth_source, precision, factor, note=note, reference_check=check)
    at = check.get("unreliable_at")
    # FP32 parts from two independent float64 kernels somewhere: its own error, which the
    # outputs then show beyond the 1-ulp sensitivity; that does not unverify the truth
    fp32_own = any(p.get("outcome") == "fp32_own" for p in check.get("parted") or ())
    rounding: dict[str, dict] = {}
    for name, t in truth.items():
        if name not in baseline or name not in fused:
            continue
        t64 = np.asarray(t, dtype=np.float64)
        base = ErrorVsTruth.of(t64, baseline[name])
        fu = ErrorVsTruth.of(t64, fused[name])
        rms = float(np.sqrt(np.mean(t64 * t64))) if t64.size else 0.0
        floor = max(_EPS32 * rms, 1e-30)
        ratio = fu.rmse / max(base.rmse, floor) if math.isfinite(fu.rmse) else math.inf
        unverified = unreliable_text(at) if at else None
        out_check = output_rounding_check(name, base, t64, sensitivity)
        if out_check is not None:
            rounding[name] = out_check
            if not out_check["within"] and unverified is None and not fp32_own:
                unverified = (f"the FP32 baseline is {out_check['x_rounding']:.3g}x FP32 rounding (the 1-ulp "
                              f"sensitivity) away from the float64 truth at this output: the truth is unverified")
        result.outputs.append(OutputVerdict(
            output=name, baseline=base, fused=fu, ratio=float(ratio), factor=factor,
            not_worse=bool(ratio <= factor) and unverified is None,
            tolerance_passed=None if tolerance_passed is None else tolerance_passed.get(name),
            framework=ErrorVsTruth.of(t64, framework[name]) if framework and name in framework else None,
            floor=floor, floored=bool(base.rmse < floor), unverified=unverified,
        ))
    check["outputs"] = rounding
    check["verified"] = bool(result.reliable and (check.get("checked") or rounding))
    return result
