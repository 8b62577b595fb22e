"""The pass bisection run on the full engine when no fused node can be blamed.

The search over fused nodes has nothing to split when a pass rewrites in place
(no fused node, or one that marking cannot block), when the failure needs the
unmarked engine, or when the engine fails to build with no optimized graph.
The engine's own list of passes is then group-tested (pass_search.py): each
set is a full build and run judged like any step, so the set found is also
the proven workaround. The original nodes the pass changed come from the
optimized graphs with and without it (graph_diff.py), or, when the engine
does not build with it, from the error region and the engine's message.
"""

from __future__ import annotations

from typing import Optional

from bisect_tui.api import DISABLED_KEY
from bisect_tui.core.bisect.graph_diff import changed_original_nodes
from bisect_tui.core.bisect.pass_search import search_passes
from bisect_tui.core.bisect.records import Culprit, Workaround
from bisect_tui.core.bisect.trials import BuildBudgetExceeded
from bisect_tui.core.cancel import Progress

# a search over fused nodes that named nothing, or found nothing marking can switch
FALLBACK_VERDICTS = ("no_culprit", "not_fusion")


def wanted(search: dict, culprits: list, amplifies: bool = False, precision: str = "fp32") -> bool:
    """Nothing blamed, and not a model that amplifies rounding (there disabling passes
    only restores the unfused FP32 order, which the local judgement already weighed:
    such passes are not switched off, as in the fixpoint). An engine error is searched
    whatever the sensitivity says. A reduced-precision engine whose error stays with
    every fusion blocked goes to the keep-set search instead (precision is the likely
    cause there, and the keep-set proves or refutes it)."""
    if culprits or search.get("verdict") not in FALLBACK_VERDICTS:
        return False
    if search.get("engine_error"):
        return True
    if search["verdict"] == "not_fusion" and precision != "fp32":
        return False
    return not (amplifies or "local_judgement" in search)


def _short(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 3 else f"{len(names)} passes ({', '.join(names[:2])}, ...)"


def run_pass_fallback(triage, bis, search: dict) -> Optional[dict]:
    """Group-test the engine's passes; returns {"record": the search's account
    (for result.json), "culprit": Culprit, "workaround": Workaround} or None
    when the engine lists no passes. The culprit and workaround are None when no
    set of passes makes the full engine pass."""
    engine = triage.engine
    plan = engine.pass_plan(triage.session.model_path, bis.config)
    if not plan or not plan.get("passes"):
        return None
    triage.progress(Progress("bisect", f"no fused node to blame: bisecting the engine's {len(plan['passes'])} "
                                       "passes (the full engine with a set of them disabled)"))
    steps: dict = {}

    def passes(disabled) -> bool:
        step = bis.evaluate(f"pass bisection: disable {_short(list(disabled))}", None,
                            bis.config.with_disabled(disabled))
        steps[frozenset(disabled)] = step
        return step.passed

    stopped = None
    try:
        r = search_passes(passes, plan["passes"], plan.get("groups") or {})
    except BuildBudgetExceeded as exc:
        stopped = str(exc)
        r = {"found": None, "alternatives": [], "candidates": len(plan["passes"]), "tried": []}
    record = {"candidates": r["candidates"], "source": plan.get("source"), "ran": plan.get("ran"),
              "found": r["found"], "alternatives": r["alternatives"], "builds": len(steps),
              "tried": [{**t, "ratio": steps[frozenset(t["disabled"])].ratio} for t in r.get("tried", [])
                        if frozenset(t["disabled"]) in steps]}
    if stopped:
        record["stopped"] = stopped
    if not r["found"]:
        return {"record": record, "culprit": None, "workaround": None}
    found = list(r["found"])
    proof = steps[frozenset(found)]
    err = search.get("engine_error")
    nodes, how_nodes = _nodes_changed(bis, search, proof, err)
    record["original_nodes_from"] = how_nodes
    index = triage.info.index
    passes_all = [found] + [a for a in r["alternatives"]]
    names = list(dict.fromkeys(n for s in passes_all for n in s))
    culprit = Culprit(
        kind=err["kind"] if err else "pass", layer=1, exposed_by=None, amplified=False, fused_node=None,
        op_type=", ".join(dict.fromkeys(index.by_name[n].op_type for n in nodes if n in index.by_name)) or "?",
        original_nodes=nodes, optimizers=names, interaction=len(found) > 1, units=[],
        attribution={"confirmed": names, "tags": [], "candidates": [],
                     "how": f"pass bisection (group testing over {r['candidates']} passes, {len(steps)} builds)",
                     "pass_search": record},
        isolated=_whole_model_repro(triage), worst_elements=[], engine_error=err,
    )
    disabled = sorted(set(bis.config.disabled_passes) | set(found))
    full = {DISABLED_KEY: disabled, "passed": True, "ratio": proof.ratio, "max_abs": proof.max_abs,
            "fused_nodes": proof.fused_in_build, "summary": proof.summary}
    shaped = {"kind": "disable_optimizers", DISABLED_KEY: disabled, "full_engine": full}
    workaround = Workaround(kind="disable_optimizers", disabled_passes=disabled, full_engine=full,
                           tried=[{DISABLED_KEY: t["disabled"], "passed": t["passed"], "ratio": t["ratio"]}
                                  for t in record["tried"]],
                           how=engine.workaround_text(shaped))
    return {"record": record, "culprit": culprit, "workaround": workaround}


def _nodes_changed(bis, search: dict, proof, err: Optional[dict]) -> tuple[list[str], str]:
    """The original nodes the pass changed: the optimized graphs with and without it
    compared, else (it does not build with the pass) the error region and the names
    in the engine's message."""
    index = bis.index
    with_pass = (search.get("full_engine") or {}).get("optimized")
    without = proof.optimized
    if with_pass and without and bis.trusted_file(with_pass) and bis.trusted_file(without):
        nodes = changed_original_nodes(with_pass, without, index)
        if nodes:
            return nodes, "optimized graphs with and without the pass compared"
    region = (search.get("error_region") or {}).get("original_nodes") or []
    named = (err or {}).get("original_nodes") or []
    nodes = sorted(dict.fromkeys(region + named), key=lambda n: index.order.get(n, 0))
    if nodes:
        return nodes, ("the smallest failing region of marks and the nodes the engine's message names"
                       if region and named else "the smallest failing region of marks" if region
                       else "the nodes the engine's message names")
    return [], "not found: the engine's optimized graphs show no change that maps to original nodes"


MAX_REPRO_MODEL = 256 << 20  # a bigger model is named in the report, not copied into the bundle


def _whole_model_repro(triage) -> dict:
    """A pass culprit has no region to extract: the bundle's repro runs the whole
    prepared model on the session's inputs against the baseline's outputs (the
    engine's repro script, with the workaround as its switch). Without the files
    (a large model, a baseline tensor missing) the bundle holds the report only."""
    import numpy as np

    from bisect_tui.core import atomic
    from bisect_tui.core.baseline_store import load_tensor

    src = triage.session.model_path
    out_dir = triage.session.bisect_dir / "pass_culprit"
    outputs = list(triage.info.outputs)
    try:
        if src.stat().st_size > MAX_REPRO_MODEL:
            return {"outputs": {}, "whole_model": "not copied: over 256 MB"}
        expected = {o: np.asarray(load_tensor(triage.session, triage.baseline.manifest, o)) for o in outputs}
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(out_dir / "subgraph.onnx", src.read_bytes())
        atomic.save_npz(out_dir / "inputs.npz", dict(triage.inputs.arrays))
        atomic.save_npz(out_dir / "expected.npz", expected)
    except (OSError, KeyError, ValueError) as exc:
        return {"outputs": {}, "whole_model": f"not written: {exc}"}
    return {"subgraph": str(out_dir / "subgraph.onnx"), "subgraph_inputs": list(triage.inputs.arrays),
            "subgraph_outputs": outputs, "nodes": [], "outputs": {}, "whole_model": True}
