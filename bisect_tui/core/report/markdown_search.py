"""The bisection's sections rendered as Markdown, after the check's report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from bisect_tui.core.bisect.records import BisectResult, PrecisionSetting
from bisect_tui.core.escape import md, md_code
from bisect_tui.core.report.mdtools import LONG_TABLE_ROWS, code_cell as _c, details, fenced, table, text as _t
from bisect_tui.core.report.search import (
    culprits_section, evidence_lines, local_rows, precision_lines, region_lines, searched_text, steps_section,
    verdict_words,
    workaround_section,
)
from bisect_tui.core.report.words import BISECT_VERDICT, fmt


def bisect_title(b: BisectResult) -> str:
    names = "; ".join(f"{c.op_type} ({c.kind.replace('_', ' ')}: {', '.join(c.optimizers)})"
                      if (c.attribution or {}).get("pass_search") else
                      f"{c.op_type} ({c.kind.replace('_', ' ')} at this precision)"
                      if c.kind in ("build_error", "run_error") and not c.fused_node else
                      f"{c.op_type} ({', '.join(c.optimizers) or 'optimizer unknown'})"
                      for c in b.culprits)
    return f"# bisect-tui bisect: {md(verdict_words(b))}" + (f": {md(names)}" if names else "")


def _culprits_md(b: BisectResult, engine: str) -> list[str]:
    if not b.culprits:
        return []
    sec = culprits_section(b, engine)
    parts = [f"### {sec.title}", table(list(sec.table.headers), [
        [i, _c(node), _t(op), ", ".join(_c(n) for n in originals), _t(passes), iso, ratio]
        for i, node, op, originals, passes, iso, ratio in sec.table.rows]), ""]
    for i, (lines, worst) in enumerate(zip(sec.data["evidence"], sec.data["worst"]), 1):
        parts += [f"#### Culprit {i}: evidence in isolation", *fenced(lines), ""]
        if worst:
            parts += [table(["index", "float64 truth", "unfused FP32", "fused"],
                            [[_t(index), *values] for index, *values in worst]), ""]
    return parts


def _local_md(lj: dict) -> list[str]:
    from bisect_tui.core.bisect.local_judgement import summary_line

    return ["### Local judgement (each fused node alone vs float64)", summary_line(lj), "",
            table(["fused node", "op", "fused / FP32 error", "verdict"],
                  [[_c(r["fused_node"]), md(r["op_type"]), fmt(r["ratio"]), r["verdict"]]
                   for r in local_rows(lj)[:30]]), ""]


def _workaround_md(b: BisectResult) -> list[str]:
    sec = workaround_section(b)
    if sec is None:
        return []
    d = sec.data
    if d["kind"] == "disable_optimizers":
        line = (f"Disable {md_code(', '.join(d['passes']))}: the full engine then passes "
                f"(max abs {fmt(d['max_abs'])}, {d['fused_nodes']} fused nodes kept). {md_code(d['how'])}")
    else:
        line = _t(d["how"])
    return [f"### {sec.title}", line, ""]


def bisect_markdown(s, base: Optional[Path] = None) -> str:
    """`s`: report.json's dict (or its Summary) with the result under `bisect`:
    summary_of makes them the Summary and the BisectResult the sections read."""
    from bisect_tui.core.report.markdown import check_parts, plots_md
    from bisect_tui.core.report.sections import summary_of
    from bisect_tui.core.report.summary import reproduce_md, summary_md

    s = summary_of(s)
    b = s.extra["bisect"]
    search = b.search
    check = s.check
    engine = (check.engine if check is not None else "") or ""
    fused_count = len(check.fused_nodes) if check is not None else 0
    parts = [bisect_title(b), "", *summary_md(s, "bisect"), *check_parts(s, base, "bisect"),
             f"## Bisection: {BISECT_VERDICT[b.final_verdict]}",
             f"{b.engine_builds} engine builds; {md(searched_text(b, fused_count))}.", ""]
    parts += _culprits_md(b, engine)
    if search.get("explanation"):
        parts += [_t(search["explanation"]), ""]
    if search.get("region_isolation"):
        parts += ["### Regions judged alone (marking did not block their fusions)",
                  *fenced(region_lines(search["region_isolation"])), ""]
    if b.final_stopped_reason:
        parts += [f"**Stopped early:** {_t(b.final_stopped_reason)}", ""]
    if search.get("local_judgement"):
        parts += _local_md(search["local_judgement"])
    if (search.get("evidence") or {}).get("node"):
        parts += ["### Where the error starts", *fenced(evidence_lines(search["evidence"])), ""]
    p = b.precision
    if p is not None:
        setting = isinstance(p, PrecisionSetting)
        title = "Precision setting" if setting else "Keep-set: nodes to keep in FP32"
        parts += [f"### {title}", *fenced(precision_lines(p)), ""]
        if not setting and p.seeds:
            seeds = [table(["seed", "why"], [[_c(r["node"]), md(r["why"])] for r in p.seeds])]
            parts += [*details(f"{len(p.seeds)} seeds", seeds, fold=len(p.seeds) > LONG_TABLE_ROWS), ""]
    steps = steps_section(b)
    rows = [table(list(steps.table.headers), [
        [n, _t(kind), _t(region), marks, builds, ratio if isinstance(ratio, str) else fmt(ratio),
         "" if max_abs is None else fmt(max_abs), "pass" if passed else "FAIL"]
        for n, kind, region, marks, builds, ratio, max_abs, passed in steps.table.rows])]
    parts += [f"### {steps.title}", *details(f"{len(steps.table.rows)} steps", rows,
                                            fold=len(steps.table.rows) > LONG_TABLE_ROWS), ""]
    rp = search.get("rest_proven_by")
    if rp:
        parts += [f"The other fusions pass together: step {rp['step']} ({_t(rp['kind'])}, x{fmt(rp['ratio'])} of the "
                  "tolerance) holds every other fused node unchanged, so they need no build of their own.", ""]
    parts += _workaround_md(b)
    parts += reproduce_md(s)
    parts += [f"**Verdict: {_t(verdict_words(b))}**", "", *plots_md(s)]
    return "\n".join(parts).rstrip("\n") + "\n"
