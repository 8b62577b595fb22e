"""The bisection's sections as data: the steps, each culprit with its evidence,
the workaround, the keep-set, where the error starts when fusion is not the
cause. The terminal and the Markdown report both render these lines and rows;
the app's culprit panel reads the same culprit and workaround sections.

They read the search's records (BisectResult, Step, Culprit, Workaround, KeepSet
or PrecisionSetting); what the search keeps as plain JSON under
`BisectResult.search` (the evidence, the local judgement, the region isolation)
has no record and is read as the search wrote it."""

from __future__ import annotations

from typing import Optional

from bisect_tui.core.bisect.records import BisectResult, Culprit, PrecisionSetting, Step, Workaround
from bisect_tui.core.escape import term
from bisect_tui.core.report.sections import Section, Table
from bisect_tui.core.report.words import BISECT_VERDICT, distinct, fmt, passes_of


def _no_pass_text(c: Culprit) -> str:
    """The attribution's own words when the engine has no pass switches."""
    how = (c.attribution or {}).get("how") or ""
    return how if how.startswith("not attributed to a pass") else ""


def passes_text(c: Culprit) -> str:
    """The culprit's passes, or the attribution's words when there are none to name."""
    return ", ".join(c.optimizers) or _no_pass_text(c) or "unknown"


def culprit_lines(c: Culprit, i: int, engine: str = "") -> list[str]:
    """`engine`: the engine's registry name, naming its own log when it kept one."""
    iso = c.isolated
    if (c.attribution or {}).get("pass_search"):
        return pass_culprit_lines(c, i)
    if c.kind in ("build_error", "run_error") and not c.fused_node:
        what = "does not build" if c.kind == "build_error" else "fails while running"
        return [
            f"culprit {i} ({c.kind}): the fused engine {what}: {term(c.engine_error['message'])}",
            f"  caused by the precision of original node(s): {term(', '.join(c.original_nodes))} "
            f"({term(c.op_type)}); kept in FP32 the engine builds and passes (see keep-set)",
        ]
    lines = [
        f"culprit {i}: {term(c.op_type)} '{term(c.fused_node)}'"
        + (" (an interaction: these fusions fail only together)" if c.interaction else "")
        + (f" [{c.kind}]" if c.kind in ("build_error", "run_error") else ""),
        f"  replaces original nodes: {', '.join(term(n) for n in c.original_nodes)}",
        f"  made by optimizer(s): {term(', '.join(c.optimizers)) or _no_pass_text(c) or 'unknown'}"
        + (" (confirmed: disabling removes the fused node)" if c.attribution["confirmed"] else "")
        + (f"; found by {term(c.attribution['how'])}" if (c.attribution.get("group_test") or {}).get("found")
           else ""),
    ]
    gt = c.attribution.get("group_test") or {}
    if gt.get("engine_log_modified"):
        whose = f"{term(engine).upper()}'s" if engine else "the engine's"
        lines.append(f"  {whose} own log, passes that modified the subgraph: {', '.join(gt['engine_log_modified'])}"
                     + (" (agrees)" if gt.get("engine_log_agrees") else
                        f" ({gt['engine_log_note']})" if gt.get("engine_log_note") else
                        " (does not list the pass found)" if gt.get("found") else ""))
    if c.exposed_by:
        lines.insert(1, f"  exposed by disabling {', '.join(c.exposed_by)}: another pass then fuses "
                        "these nodes just as wrongly")
    if c.engine_error:
        lines.insert(1, f"  the engine's message: {term(c.engine_error['message'])}")
    if iso.get("build_error"):
        lines.append(f"  in isolation the fused subgraph does not even build: {term(iso['build_error'])}")
    if iso.get("run_error"):
        lines.append(f"  in isolation on the baseline's own inputs the fused subgraph fails the same way: "
                     f"{term(iso['run_error'])}")
    for name, o in iso["outputs"].items():
        fu = o["fused_vs_unfused"]
        line = f"  in isolation on the baseline's own inputs, {term(name)}: fused vs unfused max_abs {fmt(fu['max_abs'])}"
        if o.get("fused_nonfinite"):
            line += f"; the fused result has {o['fused_nonfinite']} NaN/Inf value(s) where the float64 truth is finite"
        elif "fused_vs_truth" in o:
            line += (f"; vs float64 truth: fused {fmt(o['fused_vs_truth']['max_abs'])}, "
                     f"unfused FP32 {fmt(o['unfused_vs_truth']['max_abs'])} "
                     f"({fmt(o['error_ratio'])}x the FP32 error{', fused is worse' if o['fused_worse'] else ''})")
        lines.append(line)
    if c.amplified:
        lines.append("  note: in isolation this fused op is no further from the float64 truth than the unfused "
                     "FP32 ops; its error is FP32 rounding that the rest of the model amplifies")
    if c.worst_elements:
        w = c.worst_elements[0]
        truth, unfused, fused = distinct([w["truth"], w["unfused"], w["fused"]])
        lines.append(f"  worst element {w['index']}: truth {truth}, unfused {unfused}, fused {fused}")
    return lines


def pass_culprit_lines(c: Culprit, i: int) -> list[str]:
    """A culprit the pass bisection found: no fused node, the passes and the nodes they changed."""
    ps = c.attribution["pass_search"]
    err = c.engine_error or {}
    head = {"build_error": f"the fused engine does not build: {term(err.get('message') or '')}",
            "run_error": f"the fused engine fails while running: {term(err.get('message') or '')}"}.get(
        c.kind, "a pass breaks tolerance without a fused node to blame (it rewrites in place, or marking "
                   "cannot switch it off)")
    found = ps.get("found") or []
    lines = [f"culprit {i} ({c.kind}): {head}",
             f"  pass bisection over {ps['candidates']} passes ({ps['builds']} builds): disabling "
             f"{term(', '.join(found))} makes the full engine pass"]
    if ps.get("alternatives"):
        every = [", ".join(s) for s in [found, *ps["alternatives"]]]
        lines.append(f"  the failure needs each of: {term('; '.join(every))} (disabling any one of them makes the "
                     "full engine pass)")
    lines.append(f"  original nodes: {term(', '.join(c.original_nodes)) or 'none found'} ({term(c.op_type)}; "
                 f"from {term(ps.get('original_nodes_from') or '?')})")
    if err.get("names"):
        lines.append(f"  the engine's message names: {term(', '.join(err['names']))}")
    return lines


def ratio_text(o: dict) -> str:
    if "error_ratio" not in o:
        return "-"
    return f"{fmt(o['fused_vs_truth']['max_abs'])} / {fmt(o['unfused_vs_truth']['max_abs'])} ({fmt(o['error_ratio'])}x)"


def iso_abs(iso: dict) -> str:
    if iso.get("build_error"):
        return "build fails"
    first = next(iter(iso["outputs"].values()), None)
    return fmt(first["fused_vs_unfused"]["max_abs"]) if first else "-"


def culprits_section(b: BisectResult, engine: str = "") -> Section:
    """Each culprit's row (raw names, formatted numbers), evidence lines and worst elements."""
    culprits = b.culprits
    rows = tuple((i, c.fused_node or "-", c.op_type, tuple(c.original_nodes), ", ".join(c.optimizers) or "?",
                  iso_abs(c.isolated), ratio_text(next(iter(c.isolated["outputs"].values()), {})))
                 for i, c in enumerate(culprits, 1))
    return Section("Culprits", table=Table(
        ("#", "fused node", "op", "original nodes", "optimizer(s)", "isolated max abs (fused vs unfused)",
         "error vs float64 (fused / FP32)"), rows),
        data={"evidence": [culprit_lines(c, i, engine) for i, c in enumerate(culprits, 1)],
              "worst": [[(w["index"], *distinct([w["truth"], w["unfused"], w["fused"]]))
                         for w in c.worst_elements] for c in culprits]})


def step_ratio(st: Step) -> float:
    """The "x tolerance" a step shows: its elementwise atol/rtol ratio where it has
    one (comparable between steps: it grows with the error), else the verdict's
    worst criterion; also that when a step fails on another criterion alone."""
    e = st.elementwise_ratio
    if e is None or (not st.passed and e <= 1):
        return st.ratio
    return e


ENGINE_FAILED = {"build_error": "build error", "run_error": "run error"}


def step_failure(st: Step) -> Optional[str]:
    """"build error" / "run error" for a step whose engine failed: it has no
    error to show (its ratio is a 1e300 placeholder that sorts it last)."""
    return ENGINE_FAILED.get(st.error_kind or "")


def step_ratio_text(st: Step) -> str:
    return step_failure(st) or f"x{fmt(step_ratio(st))}"


def steps_section(b: BisectResult) -> Section:
    """Steps are numbered as the result's JSON numbers them: 1, 2, ... in order."""
    return Section("Steps", table=Table(
        ("step", "kind", "region", "marked", "builds", "x tolerance", "max abs", "verdict"),
        tuple((n, st.kind, st.region, st.marks, st.builds, step_failure(st) or step_ratio(st),
               None if step_failure(st) else st.max_abs, st.passed) for n, st in enumerate(b.steps, 1))))


def local_rows(lj: dict) -> list[dict]:
    """The fused nodes judged alone, the worst first."""
    return sorted((r for r in lj["units"] if r.get("ratio") is not None), key=lambda r: -r["ratio"])


def workaround_section(b: Optional[BisectResult]) -> Optional[Section]:
    """What makes the full engine pass; `how` is the engine's own workaround text,
    kept in report.json. `passes` are the switches it turns off, if any."""
    w: Optional[Workaround] = b.workaround if b is not None else None
    if w is None:
        return None
    fe = w.full_engine or {}
    be = w.best_effort
    return Section("Workaround", data={
        "kind": w.kind, "how": w.how, "passes": list(w.disabled_passes or []), "max_abs": fe.get("max_abs"),
        "fused_nodes": fe.get("fused_nodes"),
        "best_effort": ({"passes": passes_of(be), "before": be["ratio_before"], "ratio": be["ratio"],
                         "why": be["why_not_passing"]} if be else None)})


def workaround_line(sec: Optional[Section]) -> Optional[str]:
    if sec is None:
        return None
    d = sec.data
    if d["kind"] == "disable_optimizers":
        return (f"workaround: disable {term(', '.join(d['passes']))} -> full engine passes "
                f"(max_abs {fmt(d['max_abs'])}); {term(d['how'])}")
    if d["kind"] == "mark_outputs":
        return f"workaround: {term(d['how'])}"
    if d["best_effort"]:
        be = d["best_effort"]
        return (f"workaround: disable {term(', '.join(be['passes']))} -> the full engine goes "
                f"from x{fmt(be['before'])} to x{fmt(be['ratio'])} of tolerance; it still fails because "
                f"{term(be['why'])}")
    return f"workaround: none found ({term(d['how'])})"


def precision_lines(p) -> list[str]:
    """`p`: the result's KeepSet or PrecisionSetting, or None."""
    if p is None:
        return []
    if isinstance(p, PrecisionSetting):
        verdict = "passes" if p.passed else "still fails"
        return [f"precision setting: the full engine rebuilt in {p.precision.upper()} {verdict} "
                f"(x{fmt(p.ratio)} of tolerance)" + (f"; setting: {term(p.setting)}" if p.setting else ""),
                "  (this engine cannot keep single nodes in high precision, so no keep-set is searched)"]
    ctl = p.control
    ctl_lines = [f"  control (every node kept in FP32 vs the engine in FP32): "
                 f"{'reproduces FP32' if ctl.get('reproduces_fp32') else 'does NOT reproduce FP32'}; "
                 f"{term(ctl.get('how', ''))}"] if ctl else []
    if not p.passed:
        head = "keep-set: instrument failed" if p.instrument_failed else "keep-set: none found"
        why = p.explanation if p.explanation is not None else "see steps"  # None: the JSON has no key
        return [f"{head} in {p.builds} builds ({term(why)})", *ctl_lines]
    m = p.metrics
    return [
        f"keep-set: keep {len(p.keep_fp32)} of {p.candidates} original node(s) in FP32 -> full engine "
        f"passes (x{fmt(m['ratio'])} of tolerance, max_abs {fmt(m['max_abs'])}); {p.builds} builds",
        f"  nodes: {term(', '.join(p.keep_fp32))}",
        f"  setting: {term(p.setting)}",
        f"  bisect-tui: {term(p.cli)}",
        *([f"  minimality: {term(p.minimality)}"] if p.minimality else []),
        *ctl_lines,
    ]


def evidence_lines(ev) -> list[str]:
    """Where the error starts when fusion is not the cause (model text escaped)."""
    if not ev or not ev.get("node"):
        return []
    ins = "; ".join(
        f"{term(r['tensor'])} initializer" if r.get("initializer") else
        f"{term(r['tensor'])} in [{fmt(r['min'])}, {fmt(r['max'])}]" for r in ev.get("input_ranges", []))
    lines = [f"evidence: the first tensor out of tolerance is {term(ev['first_failing_tensor'])}, made by "
             f"{term(ev['op_type'])} '{term(ev['node'])}'" + (f"; its inputs: {ins}" if ins else "")]
    for w in ev.get("weight_findings", []):
        lines.append(f"  weight {term(w['initializer'])}: {w['finding']}")
    for r in ev.get("range_findings", []):
        lines.append(f"  range check: {term(r['tensor'])} abs max {fmt(r.get('abs_max'))}")
    return lines


def region_lines(ri) -> list[str]:
    """Each fused region run alone through the engine on the baseline's tensors (model text escaped)."""
    if not ri:
        return []
    out = [f"  region #{r['unit']} {term(r['op_type'])} '{term(r['fused_node'])}': "
           + ("engine build failed alone" if r.get("build_error") else
              f"{'breaks tolerance' if r['breaks_tolerance'] else 'within tolerance'} alone "
              f"(max_abs {fmt(r.get('max_abs'))})") for r in ri.get("units", [])[:20]]
    return ["region isolation (fusions that survived marking: "
            + term(", ".join(ri.get("unblocked") or [])) + ")", *out]


def searched_text(b: BisectResult, fused_count: Optional[int] = None) -> str:
    """What the search covered: a passing engine is not searched, so its fused
    nodes are the check's (`fused_count`), not the search's units (none)."""
    search = b.search
    if b.final_verdict == "pass" and not search.get("units"):
        n = f"all {fused_count} of its fused nodes" if fused_count is not None else "its fused nodes"
        return f"the full engine passes with {n} at level {search.get('level')}, so nothing was searched"
    if b.final_verdict == "engine_error":
        return "nothing to search: the engine did not build or run the model in any configuration tried"
    er = search.get("error_region")
    if er and not search.get("units"):
        return (f"searched at level {search.get('level')} over {er['searched']} original nodes by marking "
                "(no optimized graph)")
    return f"searched at level {search.get('level')} over {len(search.get('units') or [])} fused nodes"


def verdict_words(b: BisectResult) -> str:
    return BISECT_VERDICT.get(b.final_verdict, b.final_verdict)
