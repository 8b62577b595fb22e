"""The whole bisection for one triage: search, probe, isolation, attribution,
workaround. Shared by `bisect-tui bisect`, `resume --headless` and the app."""

from __future__ import annotations


from bisect_tui.core.bisect.attribution import attribute, find_workaround
from bisect_tui.core.bisect.isolate import isolate
from bisect_tui.core.bisect.probe import run_probe
from bisect_tui.core.bisect.search import Bisector, BuildBudgetExceeded
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.cancel import Progress
from bisect_tui.core.errors import Cancelled
from bisect_tui.core.session import now_iso


def run_bisection(triage, max_builds: int = 200, config=None, max_culprits: int = 5) -> dict:
    """Run (or resume) the bisection; writes bisect/result.json and returns it.

    A cancel at any point (search, isolation, attribution) is recorded as
    "cancelled", so `resume` and the app's reopen see where it stopped."""
    try:
        return _run_bisection(triage, max_builds, config, max_culprits)
    except Cancelled:
        if triage.session.step_state("bisect") == "running":
            triage.session.mark_step("bisect", "cancelled")
        raise


def _run_bisection(triage, max_builds: int, config, max_culprits: int) -> dict:
    if triage.fused is None:
        triage.run_fused()
    triage.session.mark_step("bisect", "running")
    bis = Bisector(triage, config, max_builds, max_culprits)

    def probe(optimized: str, units: list[Unit]) -> dict:
        return run_probe(triage, optimized, units)

    try:
        search = bis.run(probe)
    except Cancelled:
        triage.session.mark_step("bisect", "cancelled", steps=len(bis.steps))
        raise
    units = [Unit.from_dict(u) for u in search.get("units", [])]
    by_idx = {u.index: u for u in units}
    level_cfg = bis.config.with_level(search.get("level", bis.config.level))
    culprits = []
    attributions = []
    groups = [[by_idx[i] for i in c] for c in search.get("culprits", [])]
    for ci, group in enumerate(groups, 1):
        triage.progress(Progress("isolate", f"proving culprit {ci}/{len(groups)} in isolation", ci - 1, len(groups)))
        iso = isolate(triage, group, level_cfg, triage.session.bisect_dir / f"culprit_{ci}")
        triage.progress(Progress("attribute", f"confirming the optimizer of culprit {ci}", ci - 1, len(groups)))
        attr = attribute(bis, group)
        attributions.append(attr)
        lead = group[-1]
        first_out = next(iter(iso["outputs"].values()), {})
        worse = [o.get("fused_worse") for o in iso["outputs"].values() if "fused_worse" in o]
        culprits.append({
            # no further from float64 than FP32: the model amplifies rounding, the kernel is fine
            "amplified": bool(worse) and not any(worse),
            "fused_node": lead.fused_node if len(group) == 1 else " + ".join(u.fused_node for u in group),
            "op_type": lead.op_type if len(group) == 1 else " + ".join(u.op_type for u in group),
            "original_nodes": [n for u in group for n in u.original_nodes],
            "optimizers": attr["confirmed"] or attr["tags"],
            "interaction": len(group) > 1,
            "units": [u.index for u in group],
            "attribution": attr,
            "isolated": iso,
            "worst_elements": first_out.get("worst_elements", []),
        })
    workaround = None
    if culprits:
        triage.progress(Progress("workaround", "testing the full engine with optimizers disabled"))
        try:
            workaround = find_workaround(bis, groups, attributions)
        except BuildBudgetExceeded as exc:
            workaround = {"kind": None, "disabled_optimizers": [], "full_engine": None, "tried": [],
                          "how": str(exc)}
    suspects = set((search.get("probe") or {}).get("suspects", []))
    found = {i for c in search.get("culprits", []) for i in c}
    result = {
        **search,
        # cross-check: did the one-run probe point at what the builds proved?
        "probe_agrees": (suspects == found) if search.get("probe") and found else None,
        "culprits": culprits,
        "workaround": workaround,
        "steps": [s.to_dict() for s in bis.steps],
        "engine_builds": bis.builds,
        "finished": now_iso(),
        "tolerance": triage.opts.tolerance.to_dict(),
    }
    triage.session.write_json("bisect/result.json", result)
    state = {"pass": "passed", "culprits": "failed", "not_fusion": "failed", "no_culprit": "failed"}
    triage.session.mark_step("bisect", state.get(result["verdict"], "failed"), verdict=result["verdict"],
                             culprits=len(culprits))
    return result
