"""The search's verdicts in words: what the report and the JSON say, and why.

Kept apart from the strategy so its decisions read as decisions; each text
here names no engine (the engine's own words for a setting come from its
`workaround_text`)."""

from __future__ import annotations


def not_fusion(reduced_precision: bool, keepset: bool) -> str:
    """The error stays with every fusion blocked."""
    if reduced_precision:
        causes = ("the reduced precision (the keep-set search below names the nodes to keep in FP32), a kernel "
                  "that differs without fusion, or a rewrite of a single op in place." if keepset else
                  "the reduced precision (the engine is rebuilt in FP32 below to prove it), a kernel that "
                  "differs without fusion, or a rewrite of a single op in place.")
    else:
        causes = ("a kernel that differs without fusion, a rewrite of a single op in place, or a layout "
                  "transform (the engine runs FP32, so precision is not the cause).")
    return ("the error stays with every fusion blocked (all tensors marked): it does not come from a fusion "
            "that marking can switch off. Likely causes: " + causes + " The evidence below shows where the "
            "error starts.")


NO_CULPRIT = ("every fused node passes on its own and together once marked; the failure needs the unmarked "
              "engine (e.g. a fusion spanning several marked tensors)")

REST_PROVEN = ("the full engine with the culprits' passes disabled passes and holds every other fused node "
               "unchanged, so the remaining fusions pass together without a build of their own")

AMPLIFIED_BEST_EFFORT = ("the model amplifies rounding: the fused nodes that only reorder FP32 arithmetic "
                         "still move the outputs past the tolerance")


def stopped(why: str, culprits: int, remaining: int, builds: int) -> str:
    """A search cut short by --max-culprits or --max-builds."""
    head = (f"stopped after {culprits} culprit(s) (--max-culprits) with the remaining {remaining} fused "
            "node(s) still failing together" if why == "max_culprits" else
            f"stopped after {builds} engine builds (--max-builds) with {culprits} culprit(s) found")
    return head + ("; when many fused nodes each break tolerance alone, the model is likely amplifying FP32 "
                   "rounding differences: see the sensitivity check and each culprit's isolated evidence")


def regions_isolated(unblocked: list[str], culprits: int) -> str:
    """Marking did not block some fusions: each region was judged alone."""
    return (f"marking every tensor did not switch off {len(unblocked)} fusion(s) ({', '.join(unblocked[:4])}"
            f"{', ...' if len(unblocked) > 4 else ''}): the engine kept them behind the marked outputs, so each "
            "fused region was run alone through the engine on the baseline's own tensors and judged there; "
            f"{culprits} break tolerance on their own")


def judged_locally(factor: float, worse: int, reorders_only: int) -> str:
    """A model that amplifies rounding: each fused node judged alone against float64."""
    return ("the model amplifies rounding (see sensitivity): every fusion breaks the output tolerance, so each "
            f"fused node was judged alone on the baseline's own inputs against float64; {worse} are more than "
            f"{factor:g}x further from it than the unfused FP32 ops, the other {reorders_only} reorder "
            "rounding only")


def engine_cannot_build(search: dict, precision) -> bool:
    """The engine never ran: it fails to build or run with every fusion blocked
    too, and no pass or precision setting made it build (nothing to blame)."""
    blocked = search.get("all_blocked") or {}
    return bool(search.get("engine_error") and blocked.get("error_kind")
                and not (precision is not None and getattr(precision, "passed", False)))


def engine_error(search: dict) -> str:
    err = search.get("engine_error") or {}
    what = "build" if err.get("kind") == "build_error" else "run"
    tried = search.get("pass_bisection") or {}
    passes = (f", nor with all {tried['candidates']} of its passes disabled" if tried.get("candidates") else "")
    iso = err.get("isolated") or {}
    where = ""
    if iso:
        where = (f"; built alone, node '{iso['node']}' ({iso['op_type']}) fails too: {iso['message']}"
                 if iso["alone"] else
                 f"; the graph up to node '{iso['node']}' ({iso['op_type']}) is the shortest part that fails: "
                 f"{iso['message']}")
    return (f"the engine cannot {what} this model: it fails with every fusion blocked (all tensors marked)"
            f"{passes}, so no fused node, pass or kernel is to blame; the engine's message: "
            f"{err.get('message') or 'none'}{where}")
