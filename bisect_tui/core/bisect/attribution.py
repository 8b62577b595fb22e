"""Which optimizer made the culprit, and which optimizers to disable to pass.

Node-name tags say which fusions ORT applied, but tags are not always the
names ORT accepts for disabling (the tag `LayerNormFusion` is disabled as
`LayerNormFusionL1` on 1.32), names changed between releases, and unknown
names are ignored silently. So every candidate is *confirmed* by rebuilding
with it disabled and checking that the culprit fused node is gone, and a
workaround is only proven by rebuilding the full engine and judging it.
"""

from __future__ import annotations

import re
from typing import Optional

from bisect_tui.core.bisect.units import Unit

_CAMEL = re.compile(r"[A-Z][a-z0-9]+|[A-Z]+(?![a-z])")


def candidate_optimizers(units: list[Unit], known: set[str]) -> list[str]:
    """Names worth confirming for a culprit: its tags (mapped onto the names the
    installed engine accepts), else names sharing a word with its op type."""
    out: list[str] = []
    for u in units:
        for tag in u.optimizers:
            matches = sorted(k for k in known if k == tag or (k.startswith(tag) and re.fullmatch(r"L\d", k[len(tag):])))
            out.extend(matches or [tag])
    if not out:
        words = {w for u in units for w in _CAMEL.findall(u.op_type) if len(w) >= 3}
        words |= {"LayerNorm"} if any("LayerNorm" in u.op_type for u in units) else set()
        for w in sorted(words):
            out.extend(sorted(k for k in known if w in k))
    return list(dict.fromkeys(out))[:8]


def _culprit_present(fused, units: list[Unit]) -> Optional[str]:
    """The op type of a fused node that still swallows the culprit's nodes, if any.

    Matched by the original nodes covered, not by output tensor names: engines
    rename outputs (fp16 casts, layout rewrites)."""
    ops = {u.op_type for u in units}
    covered = {n for u in units for n in u.original_nodes}
    for f in fused:
        if f.is_fused and f.op_type in ops and covered & set(f.original_nodes):
            return f.op_type
    return None


def _now_made_by(fused, units: list[Unit]) -> Optional[str]:
    last = units[-1].original_nodes[-1]
    for f in fused:
        if last in f.original_nodes:
            return f.op_type
    return None


def _fused_map(bisector, cfg):
    """The fused-node map of the full engine built with `cfg` (a step of the
    search, so the workaround reuses it), or the build error as a string."""
    fused, _, step = bisector.fused_map(cfg)
    return fused if fused is not None else step.summary


def attribute(bisector, units: list[Unit]) -> dict:
    """Confirm the candidate optimizers of one culprit by rebuilding without each."""
    engine = bisector.engine
    known = engine.known_optimizers()
    cands = candidate_optimizers(units, known)
    confirmed, rows = [], []
    for name in cands:
        bisector.t.cancel.check()
        # a step of the search: shared by every culprit and by the workaround, reused on resume
        fused = _fused_map(bisector, bisector.config.with_disabled([name]))
        if isinstance(fused, str):
            rows.append({"optimizer": name, "known_to_engine": name in known,
                         "culprit_gone_when_disabled": None, "output_now_made_by": None,
                         "error": fused})
            continue
        gone = _culprit_present(fused, units) is None
        replaced = _now_made_by(fused, units)
        rows.append({"optimizer": name, "known_to_engine": name in known,
                     "culprit_gone_when_disabled": gone, "output_now_made_by": replaced})
        if gone:
            confirmed.append(name)
    return {"tags": sorted({t for u in units for t in u.optimizers}), "candidates": rows,
            "confirmed": confirmed}


def find_workaround(bisector, culprits: list[list[Unit]], attributions: list[dict]) -> dict:
    """Smallest set of disabled optimizers with which the full engine passes."""
    tried = []

    def test(names: list[str]):
        cfg = bisector.config.with_disabled(names)
        step = bisector.evaluate("workaround", None, cfg)
        tried.append({"disabled_optimizers": sorted(names), "passed": step.passed,
                      "ratio": step.ratio, "max_abs": step.max_abs,
                      "fused_nodes": step.fused_in_build, "summary": step.summary})
        return step

    confirmed = list(dict.fromkeys(n for a in attributions for n in a["confirmed"]))
    passing = []
    for name in confirmed:
        s = test([name])
        if s.passed:
            passing.append(([name], s))
    if not passing and len(confirmed) > 1:
        names = list(confirmed)
        s = test(names)
        if s.passed:
            for n in list(names):  # shrink greedily
                trial = [x for x in names if x != n]
                if trial and test(trial).passed:
                    names = trial
            passing.append((names, None))
    if passing:
        best_names, _ = max(passing, key=lambda p: (-len(p[0]), (p[1].fused_in_build or 0) if p[1] else 0))
        best = next(t for t in tried if t["disabled_optimizers"] == sorted(best_names) and t["passed"])
        return {"kind": "disable_optimizers", "disabled_optimizers": sorted(best_names),
                "full_engine": best, "tried": tried,
                "how": "SessionOptions: InferenceSession(..., disabled_optimizers=[%s])"
                       % ", ".join(repr(n) for n in sorted(best_names))}
    # No optimizer switch helps: keep the culprits unfused by marking one interior tensor each.
    interior = [u.interior[0] for c in culprits for u in c if u.interior]
    if interior:
        step = bisector.evaluate("workaround", None, marks=interior)
        entry = {"marked": interior, "passed": step.passed, "ratio": step.ratio,
                 "max_abs": step.max_abs, "summary": step.summary}
        tried.append(entry)
        if step.passed:
            return {"kind": "mark_outputs", "disabled_optimizers": [], "marked_tensors": interior,
                    "full_engine": entry, "tried": tried,
                    "how": "add these tensors to the model's outputs to block the fusion: "
                           + ", ".join(interior)}
    return {"kind": None, "disabled_optimizers": [], "full_engine": None, "tried": tried,
            "how": "no optimizer switch or marking restored tolerance; see the steps"}


__all__ = ["attribute", "candidate_optimizers", "find_workaround"]
