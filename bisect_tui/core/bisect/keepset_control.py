"""The keep-set's control: the instrument proves itself before its verdict counts.

A keep-set search concludes from builds in which some nodes are "kept in FP32".
That is only evidence if keeping a node really runs it in FP32 on FP32 inputs.
The control that proves it is the extreme case: with every node kept, the
reduced-precision engine must give what the same engine gives in FP32, to FP32
rounding. On real exports ORT's FP16 converter did not (issue 21: every kept
node's output and the graph input still went through FP16, weights in
`Constant` nodes were rounded anyway), and the search then told the user that
"the precision of single nodes is not the cause" from a control that had never
left FP16.

So the control compares two builds: every node kept, and the engine switched
to FP32 with the same passes. Both are judged against the FP32 baseline; the
control reproduces FP32 when its error is no larger than twice the FP32
engine's plus the FP32 rounding floor (how far a 1-ulp move of the inputs moves
the unfused FP32 outputs: the sensitivity run). Where no floor is known the
bound is the FP32 engine's error alone (times two), and a control that fails
to build, or builds when the FP32 engine does not, does not reproduce it.
"""

from __future__ import annotations

from typing import Optional

CONTROL_KIND = "control: keep every node in FP32"
FP32_KIND = "control: the same engine in FP32"


def rounding_floor(triage) -> Optional[float]:
    """The largest output move of the 1-ulp sensitivity run (None when not run)."""
    fused = getattr(triage, "fused", None)  # the check's JSON
    sens = (fused.get("sensitivity") if isinstance(fused, dict) else getattr(fused, "sensitivity", None)) or {}
    outs = sens.get("outputs") or {}
    moves = [o.get("max_abs") for o in outs.values() if isinstance(o.get("max_abs"), (int, float))]
    return max(moves) if moves else None


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and x == x and x not in (float("inf"), float("-inf"))


def run_control(bisector, every_node: list[str], floor: Optional[float]) -> dict:
    """Build both sides of the control and say whether the keep-set instrument
    reproduces FP32 (`reproduces_fp32`), with every figure it is judged on."""
    cfg = bisector.config
    kept = bisector.evaluate(CONTROL_KIND, None, cfg.with_keep_fp32(every_node))
    fp32 = bisector.evaluate(FP32_KIND, None, cfg.with_precision("fp32"))
    out = {
        "kept_nodes": len(every_node),
        "keep_all": {"passed": kept.passed, "ratio": kept.ratio, "max_abs": kept.max_abs,
                     "error_kind": kept.error_kind, "summary": kept.summary},
        "fp32_engine": {"passed": fp32.passed, "ratio": fp32.ratio, "max_abs": fp32.max_abs,
                        "error_kind": fp32.error_kind, "summary": fp32.summary},
        "rounding_floor": floor,
    }
    if kept.error_kind or fp32.error_kind:
        same = bool(kept.error_kind) == bool(fp32.error_kind)
        out.update(bound=None, reproduces_fp32=same and kept.passed == fp32.passed,
                   how="compared by build/run failure: "
                       + (f"keep-all {kept.error_kind or 'ran'}, FP32 engine {fp32.error_kind or 'ran'}"))
        return out
    bound = 2.0 * fp32.max_abs + (floor or 0.0)
    ok = _finite(kept.max_abs) and kept.max_abs <= bound
    out.update(bound=bound, reproduces_fp32=ok,
               how=(f"max_abs vs the FP32 baseline {kept.max_abs:.3g} (every node kept) "
                    f"{'<=' if ok else '>'} {bound:.3g} (2 x the FP32 engine's {fp32.max_abs:.3g}"
                    + (f" + the FP32 rounding floor {floor:.3g})" if floor is not None else ")")))
    return out


def failed_explanation(control: dict, engine_pin: str) -> str:
    """What the search says when its own control fails: nothing about the model."""
    k, f = control["keep_all"], control["fp32_engine"]
    if k.get("error_kind"):
        measured = f"with every node kept in FP32 the engine did not {'build' if k['error_kind'] == 'build_error' else 'run'}"
    else:
        measured = (f"with every node kept in FP32 the engine is still {k['max_abs']:.3g} off the FP32 baseline "
                    f"(x{k['ratio']:.3g} of the tolerance), the same engine in FP32 {f['max_abs']:.3g}")
    return (f"the keep-set instrument failed its control: {measured}. Keeping nodes in FP32 ({engine_pin}) "
            "does not run them in FP32 here, so no keep-set search can prove or refute anything, and nothing "
            "is concluded about single nodes. Next: check the reduced-precision conversion (casts left on the "
            "kept nodes' inputs and outputs, weights rounded before they reach a kept node), or compare the "
            "engine in FP32 with the precision setting instead")


__all__ = ["CONTROL_KIND", "FP32_KIND", "failed_explanation", "rounding_floor", "run_control"]
