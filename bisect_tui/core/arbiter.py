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
make every engine infinitely "worse".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

FACTOR = {"bf16": 3.0}
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

    @property
    def too_tight(self) -> bool:
        """The tolerance fails a result that is as close to the truth as FP32 itself."""
        return self.tolerance_passed is False and self.not_worse

    def verdict_text(self) -> str:
        if self.not_worse:
            head = f"not worse than FP32 (fused error {fmt_ratio(self.ratio)} the baseline's, limit {self.factor:g}x)"
            if self.too_tight:
                head += ("; the tolerance fails it all the same: it is tighter than FP32's own error "
                         "against the float64 truth, so loosen it rather than blame a fusion")
            return head
        text = (f"worse than FP32: fused error {fmt_ratio(self.ratio)} the baseline's against the float64 truth "
                f"(limit {self.factor:g}x)")
        if self.tolerance_passed:
            return text + "; still within the tolerance, which decides whether that much matters"
        return text + "; the engine really loses accuracy here, the tolerance is not the problem"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["too_tight"] = self.too_tight
        d["verdict"] = "not_worse" if self.not_worse else "worse"
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

    @property
    def all_not_worse(self) -> bool:
        return all(o.not_worse for o in self.outputs)

    def to_dict(self) -> dict:
        return {
            "available": True,
            "truth_source": self.truth_source,
            "precision": self.precision,
            "factor": self.factor,
            "note": self.note,
            "all_not_worse": self.all_not_worse,
            "outputs": {o.output: o.to_dict() for o in self.outputs},
        }


def unavailable(reason: str) -> dict:
    """The arbiter could not run: said plainly, never an error of the check."""
    return {"available": False, "reason": reason, "outputs": {}}


def arbitrate(
    truth: dict[str, np.ndarray],
    baseline: dict[str, np.ndarray],
    fused: dict[str, np.ndarray],
    precision: str,
    truth_source: str,
    tolerance_passed: Optional[dict[str, bool]] = None,
    framework: Optional[dict[str, np.ndarray]] = None,
    note: Optional[str] = None,
) -> Arbitration:
    """Every array holds all samples (leading samples axis), the same for each side."""
    factor = factor_for(precision)
    result = Arbitration(truth_source, precision, factor, note=note)
    for name, t in truth.items():
        if name not in baseline or name not in fused:
            continue
        t64 = np.asarray(t, dtype=np.float64)
        base = ErrorVsTruth.of(t64, baseline[name])
        fu = ErrorVsTruth.of(t64, fused[name])
        rms = float(np.sqrt(np.mean(t64 * t64))) if t64.size else 0.0
        floor = max(_EPS32 * rms, 1e-30)
        ratio = fu.rmse / max(base.rmse, floor) if math.isfinite(fu.rmse) else math.inf
        result.outputs.append(OutputVerdict(
            output=name, baseline=base, fused=fu, ratio=float(ratio), factor=factor,
            not_worse=bool(ratio <= factor),
            tolerance_passed=None if tolerance_passed is None else tolerance_passed.get(name),
            framework=ErrorVsTruth.of(t64, framework[name]) if framework and name in framework else None,
        ))
    return result
