"""Judging an engine's final outputs against the baseline, the same way for
every build the search makes (and for the check command)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

from bisect_tui.core.tolerance import ToleranceSpec, Verdict, judge_arrays


@dataclass
class Judgement:
    passed: bool
    ratio: float  # worst over outputs; > 1 fails
    worst_output: Optional[str]
    max_abs: float
    summary: str
    outputs: dict  # name -> {passed, ratio, summary, metrics, tolerance, verdict}


class OutputJudge:
    """Holds the baseline outputs in memory once (they are small compared with
    activations) and judges many builds against them."""

    def __init__(self, references: dict[str, np.ndarray], tolerance: ToleranceSpec, topk=None):
        self.references = references
        self.tolerance = tolerance
        self.topk = topk

    @classmethod
    def for_triage(cls, triage) -> "OutputJudge":
        """The baseline's graph outputs, judged with the triage's tolerance."""
        from bisect_tui.core.baseline import reference_output

        refs = {name: reference_output(triage.info, triage.session, triage.baseline.manifest, triage.inputs, name)
                for name in triage.info.outputs}
        return cls(refs, triage.opts.tolerance, triage.opts.topk)

    def judge(self, per_sample: list[dict[str, np.ndarray]]) -> Judgement:
        outs = {}
        worst_name, worst_ratio, worst_abs = None, -1.0, 0.0
        summary = "PASS"
        for name, ref in self.references.items():
            test = np.stack([s[name] for s in per_sample])
            tol = self.tolerance.for_output(name)
            metrics, verdict = judge_arrays(ref, test, tol, topk=self.topk)
            verdict = near_zero_rule(ref, tol, verdict)
            r = verdict.ratio
            outs[name] = {
                "passed": verdict.passed,
                "ratio": r,
                "decided_by": decided_by(verdict),
                "summary": verdict.summary(),
                "metrics": metrics,
                "tolerance": tol.to_dict(),
                "verdict": verdict.to_dict(),
            }
            if r > worst_ratio:
                worst_name, worst_ratio, worst_abs = name, r, metrics["max_abs"]
                if not verdict.passed:
                    summary = f"{name}: {verdict.summary()}"
        passed = all(o["passed"] for o in outs.values())
        if passed:
            summary = "PASS"
        return Judgement(passed, worst_ratio, worst_name, worst_abs, summary, outs)


class TrialJudge(Protocol):
    """What the search asks of a judge: pass or fail for one built trial.

    `plan` is the trial as proposed (scheduler.Plan), `result` what its build
    produced (pool.BuildResult). The search learns only the verdict, so a
    scripted judge can drive it without any engine (tests/test_strategy.py)."""

    def judge_trial(self, plan, result) -> Judgement: ...


class BuildJudge:
    """The real judge: a build or run the engine refused fails the trial (with
    the engine's message); otherwise its outputs are judged against the baseline."""

    def __init__(self, outputs: OutputJudge):
        self.outputs = outputs

    def judge_trial(self, plan, result) -> Judgement:
        if result.failed_at == "build":
            # An engine that cannot even be built with this region enabled is
            # broken by it: the step fails, and the message says why.
            return Judgement(False, math.inf, None, math.nan, f"engine build failed: {result.build_message}", {})
        if result.outputs is None:
            return Judgement(False, math.inf, None, math.nan, f"engine run failed: {result.error}", {})
        return self.outputs.judge(result.outputs)


# criteria that compare directions/energies: meaningless on a reference that is essentially zero
_SCALE_FREE = ("min_cosine", "min_snr_db")


def near_zero_rule(ref: np.ndarray, tol, verdict: Verdict) -> Verdict:
    """A reference whose max |ref| is below atol is essentially zero (a
    near-empty detection map): its cosine and SNR measure rounding noise, so
    they do not fail it on their own; the absolute criteria decide. Seen on a
    real model: cosine 0.99977 at max abs error 1.5e-7."""
    atol = getattr(tol, "atol", None)
    if not atol or verdict.passed or ref.size == 0:
        return verdict
    finite = ref[np.isfinite(ref)]
    ref_max = float(np.max(np.abs(finite))) if finite.size else 0.0
    if ref_max >= atol or any(c.name not in _SCALE_FREE for c in verdict.failed):
        return verdict
    kept = [c for c in verdict.checked if c.name not in _SCALE_FREE]
    skipped = list(verdict.skipped) + [
        f"{c.name}: not deciding, the reference is essentially zero (max |ref| {ref_max:.3g} < atol {atol:g})"
        for c in verdict.checked if c.name in _SCALE_FREE]
    return Verdict(passed=all(c.ok for c in kept), checked=kept, skipped=skipped)


def elementwise_ratio(j: "Judgement") -> Optional[float]:
    """The worst |test - ref| / (atol + rtol*|ref|) over the outputs (None without
    atol/rtol). Unlike the verdict's ratio (the worst criterion: cosine's is
    (1 - cos) / (1 - min_cosine), which stops near 1000 once the output is
    unrelated) it grows with the error, so steps can be compared by it: a
    keep-set that halved the error read "x1000" beside the full engine's "x972.8"."""
    vals = [(o.get("metrics") or {}).get("allclose_max_ratio") for o in (j.outputs or {}).values()]
    vals = [math.inf if v != v else float(v) for v in vals if isinstance(v, (int, float))]
    return max(vals) if vals else None


def decided_by(verdict: Verdict) -> str:
    """Which criterion decided the verdict, in words for the report."""
    if verdict.failed:
        return ", ".join(c.name for c in verdict.failed)
    return "all criteria passed" + ("; " + "; ".join(verdict.skipped) if verdict.skipped else "")
