"""The whole bisection for one triage: search, probe, isolation, attribution,
workaround. Shared by `bisect-tui bisect`, `resume --headless` and the app."""

from __future__ import annotations


from typing import Optional

from bisect_tui.core.bisect import engine_errors, pass_fallback, verdicts
from bisect_tui.core.bisect.attribution import find_workaround
from bisect_tui.core.bisect.findings import Findings, amplified
from bisect_tui.core.bisect.precision import precision_search, rank_candidates
from bisect_tui.core.bisect.probe import run_probe
from bisect_tui.core.bisect.records import BisectResult, Culprit, KeepSet, PrecisionSetting, Workaround
from bisect_tui.core.bisect.search import Bisector, BuildBudgetExceeded
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.cancel import Progress
from bisect_tui.core.errors import Cancelled
from bisect_tui.core.session import now_iso


MAX_LAYERS = 4  # fixpoint rounds: each disables the passes found so far and searches again


def _culprits_of(triage, bis, search: dict, layer: int, exposed_by: list[str], first_index: int):
    """Isolate and attribute the culprits of one search; returns (culprits, groups, attributions)."""
    units = [Unit.from_dict(u) for u in search.get("units", [])]
    by_idx = {u.index: u for u in units}
    level_cfg = bis.config.with_level(search.get("level", bis.config.level))
    findings = bis.findings or Findings(triage, bis, first_index)
    culprits, attributions = [], []
    groups = [[by_idx[i] for i in c] for c in search.get("culprits", [])]
    error_kind = (search.get("engine_error") or {}).get("kind")
    for k, group in enumerate(groups):
        ci = first_index + k
        triage.progress(Progress("isolate", f"proving culprit {ci} in isolation", k, len(groups)))
        iso = findings.isolation(group, level_cfg, ci)  # made once: the search may have asked already
        triage.progress(Progress("attribute", f"confirming the pass of culprit {ci}", k, len(groups)))
        try:
            attr = findings.attribution(group, level_cfg, ci)
        except BuildBudgetExceeded as exc:
            attr = {"tags": sorted({t for u in group for t in u.optimizers}), "candidates": [], "confirmed": [],
                    "group_test": None, "how": f"not attributed: {exc}"}
        attributions.append(attr)
        culprits.append(_fusion_culprit(group, attr, iso, layer, exposed_by,
                                        search["engine_error"] if error_kind else None))
    return culprits, groups, attributions


def _fusion_culprit(group: list[Unit], attr: dict, iso: dict, layer: int, exposed_by: list[str],
                    engine_error: Optional[dict]) -> Culprit:
    """A culprit the search found: one fused node, or a set that only fails together."""
    lead = group[-1]
    first_out = next(iter(iso["outputs"].values()), {})
    worse = [o.get("fused_worse") for o in iso["outputs"].values() if "fused_worse" in o]
    kind = engine_error["kind"] if engine_error and not worse else ("interaction" if len(group) > 1 else "fusion")
    return Culprit(
        kind=kind, layer=layer, exposed_by=list(exposed_by) or None,
        # no further from float64 than FP32: the model amplifies rounding, the kernel is fine
        amplified=amplified(iso),
        fused_node=lead.fused_node if len(group) == 1 else " + ".join(u.fused_node for u in group),
        op_type=lead.op_type if len(group) == 1 else " + ".join(u.op_type for u in group),
        original_nodes=[n for u in group for n in u.original_nodes],
        optimizers=attr["confirmed"] or attr["tags"], interaction=len(group) > 1,
        units=[u.index for u in group], attribution=attr, isolated=iso,
        worst_elements=first_out.get("worst_elements", []), engine_error=engine_error,
    )


def _precision_culprit(triage, keep: KeepSet, err: dict) -> Culprit:
    """The engine's build or run failure itself, bisected to nodes by their precision."""
    return Culprit(
        kind=err["kind"], layer=1, exposed_by=None, amplified=False, fused_node=None,
        op_type=", ".join(sorted({triage.info.index.by_name[n].op_type for n in keep.keep_fp32})),
        original_nodes=keep.keep_fp32, optimizers=[], interaction=False, units=[],
        attribution={"confirmed": [], "tags": [], "candidates": [], "how": "precision bisection (keep-set)"},
        isolated={"outputs": {}}, worst_elements=[], engine_error=err,
    )


def run_bisection(triage, max_builds: int = 200, config=None, max_culprits: int = 5,
                  workers: int = 1, fanout: int = 1, use_probe: bool = True, pool=None) -> dict:
    """Run (or resume) the bisection; writes bisect/result.json and returns it.

    A fixpoint: after each round's culprits are attributed, the full engine is
    rebuilt with every pass found so far disabled; when it still fails, the
    search runs again under that configuration and its culprits are marked as
    exposed by the passes disabled. It ends when the engine passes, nothing
    new is found, or the build budget is spent."""
    if triage.fused is None:
        triage.run_fused()
    triage.session.mark_step("bisect", "running")
    from bisect_tui.core.bisect.pool import pool_for

    own_pool = pool is None  # `pool`: started by the caller before the checklist (the bisect command)
    pool = pool_for(triage, workers, pool)
    if own_pool and fanout > 1:
        pool.start()  # rounds of several builds will come: the workers' imports overlap the first steps
    # (with fanout 1 only the attribution has such rounds: the pool starts there, when it does)
    bis = Bisector(triage, config, max_builds, max_culprits, fanout=fanout, pool=pool)
    bis.findings = Findings(triage, bis, 1)

    probes: dict[tuple, dict] = {}

    def probe(optimized: str, units: list[Unit]) -> dict:
        """The probe of one fused graph, run once: each round asks twice (its suspect,
        then its seeds), and a run of it reads every tensor of the graph."""
        key = (optimized, tuple((u.index, u.fused_node) for u in units))
        if key not in probes:
            probes[key] = run_probe(triage, optimized, units)
        return probes[key]

    try:
        # without the probe the search runs on builds alone (no suspects tried first)
        result = _run(triage, bis, probe if use_probe else None, max_builds, max_culprits)
    except Cancelled:
        triage.session.mark_step("bisect", "cancelled", steps=len(bis.steps))
        raise
    finally:
        if own_pool:
            pool.close()
    return result


def _run(triage, bis, probe, max_builds: int, max_culprits: int) -> dict:
    search = bis.run(probe)
    culprits, groups, attributions = _culprits_of(triage, bis, search, 1, [], 1)
    all_groups, all_attr = list(groups), list(attributions)
    layers = [{"layer": 1, "disabled": [], "verdict": search["verdict"], "culprits": len(culprits)}]
    extra_steps: list = []
    extra_builds = 0
    extra_subgraph = 0
    disabled: list[str] = []
    stopped = None
    layer_culprits, layer_search = culprits, search
    try:
        for layer in range(2, MAX_LAYERS + 1):
            if layer_search.get("stopped"):
                break  # a search cut short (budget, or an amplifying model) is not a layer to build on
            # culprits no worse than FP32 in isolation are amplified rounding, not passes to switch off
            found = [n for a, c in zip(attributions, layer_culprits) if not c.amplified for n in a["confirmed"]]
            new = [n for n in dict.fromkeys(found) if n not in disabled]
            if not new:
                break
            disabled = sorted(set(disabled) | set(new))
            cfg = bis.config.with_disabled(disabled)
            step = bis.evaluate("fixpoint: disable found passes", None, cfg)
            layers[-1]["after_disabling"] = {"disabled": disabled, "passed": step.passed, "ratio": step.ratio}
            if step.passed:
                break
            triage.progress(Progress("bisect", f"fixpoint round {layer}: the engine still fails with "
                                     f"{', '.join(disabled)} disabled; searching again"))
            used = bis.builds + extra_builds
            sub = Bisector(triage, cfg, max(max_builds - used, 1), max_culprits, fanout=bis.fanout, pool=bis.pool)
            sub.seed_from_check = None
            sub.findings = Findings(triage, sub, len(culprits) + 1)
            sub.follow(bis)  # round 2 starts from round 1's verdicts, maps and blocked build
            sub.workaround_base = bis.config
            sub.exposed = frozenset(n for g in all_groups for u in g for n in u.original_nodes)
            sub.adopt_full_engine(step)
            s2 = sub.run(probe)
            extra_steps += [st.replace(kind=f"round {layer}: {st.kind}") for st in sub.steps]
            extra_builds += sub.builds
            extra_subgraph += sub.subgraph_builds
            c2, g2, a2 = _culprits_of(triage, sub, s2, layer, disabled, len(culprits) + 1)
            layers.append({"layer": layer, "disabled": disabled, "verdict": s2["verdict"], "culprits": len(c2)})
            if not c2:
                break
            culprits += c2
            all_groups += g2
            all_attr += a2
            attributions, layer_culprits, layer_search = a2, c2, s2
    except BuildBudgetExceeded as exc:
        stopped = str(exc)
    workaround: Optional[Workaround] = None
    fallback = None
    if pass_fallback.wanted(search, culprits, bis.amplifies(), bis.config.precision) and not stopped:
        try:
            fallback = pass_fallback.run_pass_fallback(triage, bis, search)
        except BuildBudgetExceeded as exc:
            stopped = str(exc)
        if fallback is not None:
            search["pass_bisection"] = fallback["record"]
            if fallback["culprit"] is not None:
                culprits.append(fallback["culprit"])
                workaround = fallback["workaround"]
    if culprits and workaround is None:
        triage.progress(Progress("workaround", "testing the full engine with passes disabled"))
        try:
            workaround = Workaround.from_json(find_workaround(bis, all_groups, all_attr))
        except BuildBudgetExceeded as exc:
            workaround = Workaround(kind=None, how=str(exc))
    if workaround is not None and bis.amplifies():
        workaround = workaround.with_best_effort((search.get("full_engine") or {}).get("ratio"),
                                                 verdicts.AMPLIFIED_BEST_EFFORT)
    precision = None
    proven_by_passes = bool((fallback or {}).get("culprit"))
    want_precision = bis.config.precision != "fp32" and not proven_by_passes and (
        search["verdict"] == "not_fusion" or (workaround is not None and workaround.kind is None))
    caps = triage.engine.capabilities
    keepset = caps is None or caps.keep_high_precision
    if want_precision and not keepset:
        # no per-node precision pinning: prove (or refute) the precision setting itself
        triage.progress(Progress("precision", "rebuilding the full engine in FP32"))
        try:
            step = bis.evaluate("precision setting: fp32", None, bis.config.with_precision("fp32"))
            precision = PrecisionSetting(passed=step.passed, summary=step.summary, ratio=step.ratio,
                                         max_abs=step.max_abs, setting=triage.engine.workaround_text(
                                             {"kind": "precision", "precision": "fp32"}))
        except BuildBudgetExceeded as exc:
            precision = PrecisionSetting(passed=False, summary=str(exc))
    elif want_precision:
        triage.progress(Progress("precision", "searching the smallest set of nodes to keep in FP32"))
        from bisect_tui.core.bisect.keepset_control import rounding_floor

        precision = precision_search(bis, rank_candidates(triage, search), rounding_floor(triage))
        if precision.passed and search.get("engine_error"):
            culprits.append(_precision_culprit(triage, precision, search["engine_error"]))
    if search["verdict"] == "not_fusion":
        search["evidence"] = not_fusion_evidence(triage, search)
    suspects = set((search.get("probe") or {}).get("suspects", []))
    found_idx = {i for c in search.get("culprits", []) for i in c}
    verdict = None
    if culprits and search["verdict"] in ("no_culprit", "not_fusion") and (
            search.get("engine_error") or (fallback or {}).get("culprit")):
        verdict = "culprits"
    elif not culprits and verdicts.engine_cannot_build(search, precision):
        verdict = "engine_error"
        triage.progress(Progress("bisect", "the engine fails with every fusion blocked: building parts of the "
                                           "graph alone to find the node it cannot take"))
        iso = engine_errors.isolate_failing_node(triage, bis.config, triage.session.bisect_dir / "engine_error",
                                                 search["engine_error"]["kind"])
        if iso is not None:
            search["engine_error"]["isolated"] = iso
            bis.subgraph_builds += iso["builds"]
        search["explanation"] = verdicts.engine_error(search)
    record = BisectResult(
        search=search, culprits=tuple(culprits), layers=layers, workaround=workaround, precision=precision,
        steps=tuple(bis.steps) + tuple(extra_steps), engine_builds=bis.builds + extra_builds,
        subgraph_builds=bis.subgraph_builds + extra_subgraph,
        parallel={"workers": bis.pool.workers, "fanout": bis.fanout, "pool": bis.pool.kind,
                  **({"devices": bis.pool.devices} if getattr(bis.pool, "devices", None) else {})},
        untrusted_steps=bis.untrusted_steps, finished=now_iso(), tolerance=triage.opts.tolerance.to_dict(),
        probe_agrees=(suspects == found_idx) if search.get("probe") and found_idx else None,
        verdict=verdict, stopped_reason=stopped,
    )
    # the report, the app and the summary read the result as JSON (its keys: docs/bisect.md)
    result = record.to_json()
    triage.session.write_json("bisect/result.json", result)
    state = {"pass": "passed", "culprits": "failed", "not_fusion": "failed", "no_culprit": "failed",
             "engine_error": "failed"}
    triage.session.mark_step("bisect", state.get(result["verdict"], "failed"), verdict=result["verdict"],
                             culprits=len(culprits))
    return result


def not_fusion_evidence(triage, search: dict) -> dict:
    """Where the error starts when fusion is not the cause: the first node whose
    own output breaks tolerance, its op, its inputs' ranges in the baseline and
    what the range check says about them."""
    from bisect_tui.core.baseline import manifest_index

    probe = search.get("probe") or {}
    first = probe.get("first_failing_tensor")
    index = triage.info.index
    out: dict = {"first_failing_tensor": first}
    if not first or first not in index.producer:
        return out
    node = index.by_name[index.producer[first]]
    idx = manifest_index(triage.baseline.manifest)
    ranges = []
    for i in node.input:
        e = idx.get(i)
        if e and e.get("stats"):
            ranges.append({"tensor": i, "min": e["stats"].get("min"), "max": e["stats"].get("max"),
                           "abs_max": e["stats"].get("abs_max")})
        elif i in index.initializers:
            ranges.append({"tensor": i, "initializer": True})
    fp16 = (triage.range_check or {}).get("fp16") or {}
    related = [r for r in fp16.get("overflow", []) + fp16.get("underflow", []) + fp16.get("near_overflow", [])
               if r.get("node") == node.name or r.get("tensor") in node.input]
    from bisect_tui.core.bisect.precision import weight_findings

    weights = [w for w in weight_findings(triage.info.model) if node.name in w["nodes"]]
    out.update(node=node.name, op_type=node.op_type, input_ranges=ranges, range_findings=related,
               weight_findings=weights,
               precision=triage.opts.config.precision)
    return out
