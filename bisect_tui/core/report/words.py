"""The report's words for numbers, paths and verdicts, shared by both renderers
and by the app (one number format everywhere the user reads one)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from bisect_tui.core.triage.records import Summary

VERDICT_TEXT = {
    "pass": "PASS: the fused engine is within tolerance",
    "fail": "FAIL: the fused engine breaks tolerance",
    "nondeterministic": "STOP: the baseline is not deterministic",
    "nan_inf": "STOP: the baseline already holds NaN/Inf",
    "export_mismatch": "STOP: the ONNX export does not compute what the PyTorch model computes",
}

ENGINE_FAILED_TEXT = {
    "build_error": "FAIL: the fused engine could not be built (the baseline runs)",
    "run_error": "FAIL: the fused engine could not run on these inputs (it built; the baseline runs)",
}


def verdict_text(s: Summary) -> str:
    """The verdict's words: an engine that never ran did not "break tolerance"."""
    err = s.check.error if s.verdict == "fail" and s.check is not None else None
    if err and err.get("kind") in ENGINE_FAILED_TEXT:
        return ENGINE_FAILED_TEXT[err["kind"]]
    return VERDICT_TEXT[s.verdict]


BISECT_VERDICT = {
    "pass": "nothing to find: the fused engine is within tolerance",
    "culprits": "culprit(s) found",
    "not_fusion": "the error is not caused by a fusion that marking can switch off",
    "no_culprit": "no single fused node could be blamed",
    "engine_error": "the engine cannot build or run this model at all (not a fused node's fault)",
}


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x in (float("inf"), float("-inf")):
            return "inf" if x > 0 else "-inf"
        if x == 0:
            return "0"
        if 1e-3 <= abs(x) < 1e4:
            return f"{x:.{digits + 1}g}"
        return f"{x:.{digits - 1}e}"
    return str(x)


def distinct(values: Sequence[Optional[float]], min_digits: int = 4, max_digits: int = 10) -> list[str]:
    """The values with just enough significant digits that the ones that differ
    also read differently ("2.694, 2.694, 2.694" hides the very difference shown)."""
    nums = [v for v in values if isinstance(v, (int, float)) and v is not None and math.isfinite(v)]
    digits = min_digits
    while digits < max_digits:
        shown = {}
        clash = False
        for v in nums:
            t = f"{v:.{digits}g}"
            if t in shown and shown[t] != v:
                clash = True
                break
            shown[t] = v
        if not clash:
            break
        digits += 1
    return [fmt(v) if not (isinstance(v, (int, float)) and v is not None and math.isfinite(v))
            else f"{v:.{digits}g}" for v in values]


def cos_text(c) -> str:
    """Cosine similarity with enough digits to see how far from 1 it is."""
    if c is None or c != c:
        return "-"
    return f"{c:.8f}"


def mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"


def size_text(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n < (1 << 20) else mb(n)


def shown_path(p: Any, base: Optional[Path] = None) -> str:
    """A path for a report another person reads: relative to `base` (the report's
    folder, or the working directory) when inside it, else only its last part."""
    if not p:
        return "-"
    path = Path(p)
    base = Path(base) if base else Path.cwd()
    try:
        rel = os.path.relpath(path.resolve(), base.resolve())
    except ValueError:
        return path.name
    return path.name if rel.startswith("..") else rel.replace(os.sep, "/")


def tolerance_text(spec: dict) -> str:
    from bisect_tui.core.tolerance import ToleranceSpec

    t = ToleranceSpec.from_dict(spec)
    text = t.default.describe()
    if t.overrides:
        text += "; " + "; ".join(f"{p} -> {tol.describe()}" for p, tol in t.overrides)
    return text


def sensitivity_text(sens: Optional[dict]) -> str:
    """How much the FP32 outputs move under 1-ulp input noise, judged honestly:
    0.95 of the tolerance is close to it, not "well below"."""
    if not sens or "ratio" not in sens:
        return ""
    r = sens["ratio"]
    head = f"sensitivity: a 1-ulp input change moves the FP32 outputs to x{fmt(r)} of the tolerance"
    if sens.get("amplifies") or r > 1:
        return head + ": the model amplifies rounding noise, every reordering kernel will look guilty"
    if r >= 0.5:
        return head + (": close to it; rounding noise alone nearly breaks the tolerance, so a culprit may "
                       "be FP32 reordering the model amplifies (see each culprit's float64 evidence)")
    if r >= 0.1:
        return head + ": below it, not far; the check sees mostly fusion error, but a tighter tolerance would not"
    return head + " (well below it: fusion error is what the check sees)"


def passes_of(record: Optional[dict]) -> list[str]:
    """The passes a config or a workaround switches off. The JSON names that list
    after the engine's own word (docs/bisect.md keeps it); the report only knows
    it is the `disabled_*` entry."""
    for key, value in (record or {}).items():
        if key.startswith("disabled_"):
            return list(value or [])
    return []
