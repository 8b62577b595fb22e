"""The "next:" advice: what to do after a check, from its verdict and evidence."""

from __future__ import annotations

from typing import Optional

from bisect_tui.core.escape import term
from bisect_tui.core.triage.records import FrameworkResult, Summary


def arbiter_all_too_tight(s: Summary) -> bool:
    """True when the arbiter ran and every output the tolerance fails is not worse than FP32."""
    arb = s.arbiter
    if arb is None or not arb.available:
        return False
    failing = s.check.failing_outputs if s.check is not None else ()
    outs = arb.outputs or {}
    unverified = bool((arb.judged.get("reference_check") or {}).get("unreliable_at"))  # never on an unverified truth
    return bool(failing and not unverified and all(n in outs and outs[n]["too_tight"] for n in failing))


def export_next_step(fw: FrameworkResult) -> str:
    f = (fw.crosscheck or {}).get("first_failing")
    if not f:
        return "make PyTorch's forward deterministic; no engine was judged"
    return (f"fix the export before judging any engine: module {term(f['module'])} is the first whose ONNX "
            f"tensor {term(f['onnx_tensor'])} differs from PyTorch (see the pitfalls above)")


def next_step(s: Summary) -> Optional[str]:
    """The one thing to do next, or None when the check passed."""
    v = s.verdict
    if v == "fail" and arbiter_all_too_tight(s):
        return ("every failing output is as close to the float64 truth as the FP32 baseline: loosen the "
                "tolerance to FP32's own error (see the arbiter) instead of bisecting rounding noise")
    if v == "fail":
        return "run `bisect-tui bisect` with the same options to name the fused op at fault"
    if v == "export_mismatch":
        return export_next_step(s.framework)
    if v == "nondeterministic" and s.framework is not None and not s.framework.golden["deterministic"]:
        return "make PyTorch's forward deterministic (see the pitfalls above); no engine was judged"
    if v == "nondeterministic":
        return term(s.determinism.advice or "make the baseline deterministic")
    if v == "nan_inf" and s.range_check.nan_inf_origin:
        return term(s.range_check.nan_inf_origin["advice"])
    return None
