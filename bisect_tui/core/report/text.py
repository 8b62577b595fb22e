"""The sections rendered for a terminal: one line per finding, model names
through term() so they never reach the terminal raw."""

from __future__ import annotations

from bisect_tui.core.escape import term
from bisect_tui.core.report.advice import arbiter_all_too_tight, next_step
from bisect_tui.core.report.framework import framework_lines
from bisect_tui.core.report.search import (
    culprit_lines, evidence_lines, local_rows, precision_lines, region_lines, searched_text, workaround_line,
    step_ratio, step_ratio_text, workaround_section,
)
from bisect_tui.core.report.sections import (
    arbiter_lines, baseline_section, engine_section, output_line, outputs_section, precision_used_line,
    shared_section, summary_of,
)
from bisect_tui.core.triage.records import Summary
from bisect_tui.core.report.words import (BISECT_VERDICT, fmt, sensitivity_text, tolerance_text,
                                          verdict_text)


def _baseline_lines(s: Summary) -> list[str]:
    sec = baseline_section(s)
    d = sec.data
    return [
        f"baseline: {d['tensors']} tensors, {d['size']}"
        + (" (reused)" if d["reused"] else f" in {d['groups']} group(s)")
        + (f"; {d['recomputed']} saved tensor file(s) failed their digest check and were "
           "recomputed" if d["recomputed"] else ""),
        *([f"warning: {d['memory_warning']}"] if d["memory_warning"] else []),
        *sec.lines,
    ]


def _engine_lines(s: Summary) -> list[str]:
    c = s.check
    d = engine_section(c).data
    extra = term(", ".join(f"{k}={v}" for k, v in d["entries"]))
    dis = term(", ".join(d["disabled"]))
    lines = [f"fused engine: {d['engine']} level={d['level']} precision={d['precision']}"
             + (f" config: {extra}" if extra else "") + (f" disabled: {dis}" if dis else "")
             + f"; {d['fused_nodes']} fused node(s)",
             f"tolerance: {term(tolerance_text(s.tolerance))}"]
    if precision_used_line(c):
        lines.append(precision_used_line(c))
    err = c.error
    if err:
        what = "failed to build" if err["kind"] == "build_error" else "failed while running"
        lines.append(f"fused engine {what} (the baseline runs): {term(err['message'])}")
        if err.get("detail_file") and (err.get("detail") or "").strip() != (err.get("message") or "").strip():
            lines.append(f"  the engine's full message ({len(err['detail'].splitlines())} lines): "
                         f"{term(err['detail_file'])} in the session, and `engine_error.detail` in check.json")
    lines += [output_line(row) for row in outputs_section(c).table.rows]
    sens_line = sensitivity_text(c.sensitivity)
    if sens_line:
        lines.append(sens_line)
    sh = shared_section(c)
    if sh:
        d = sh.data
        if d["first"]:
            maker = f"{term(d['maker'][0])} '{term(d['maker'][1])}'" if d["maker"] else None
            lines.append(f"tensors inside the fused graph: {d['failing']} of {d['compared']} "
                         f"out of tolerance, first: {term(d['first'])}" + (f" (made by fused {maker})" if maker else "")
                         + (INNER_ONLY if not c.failing_outputs and not c.error else ""))
        else:
            lines.append(f"tensors inside the fused graph: all {d['compared']} within tolerance")
    return lines + arbiter_lines(s.arbiter)


# An FP16 engine's inner tensors often break the outputs' tolerance while the outputs pass
# (PP-OCRv4 rec: 226 of 362): said plainly, so a PASS beside it does not read as a contradiction.
INNER_ONLY = ("; the outputs pass: inner tensors are judged at the outputs' tolerance, and this error "
              "does not reach the outputs beyond it")


def check_text(s, bisecting: bool = False) -> str:
    """The check's lines; `bisecting`: the bisection's own lines follow, so its
    "next:" (which would say to run the bisection) is left out. `s`: the
    Summary, or report.json's dict."""
    s = summary_of(s)
    m = s.model
    lines = [
        f"model: {term(m['path'])} ({m['nodes']} nodes, sha256 {m['sha256'][:12]})",
        f"session: {term(s.session)}",
        *_baseline_lines(s),
        *framework_lines(s.framework),
    ]
    if s.check is not None and s.check.config:
        lines += _engine_lines(s)
    lines.append(verdict_text(s) + f" (exit {s.exit_code})")
    advice = next_step(s)
    if advice and not (bisecting and s.verdict == "fail" and not arbiter_all_too_tight(s)):
        lines.append("next: " + advice)
    return "\n".join(lines)


def bisect_text(s) -> str:
    """The bisection's lines; `s`: report.json's dict (or its Summary) with the
    result under `bisect` (summary_of makes it the BisectResult record)."""
    s = summary_of(s)
    b = s.extra["bisect"]
    search = b.search
    check = s.check
    lines = [f"bisection: {BISECT_VERDICT[b.final_verdict]} ({b.engine_builds} engine builds"
             + (f" this run, {search['reused_steps']} steps reused from the session"
                if search.get("reused_steps") else "")
             + f"; {searched_text(b, len(check.fused_nodes) if check is not None else 0)})"]
    if b.untrusted_steps:
        lines.append(f"  {b.untrusted_steps} saved step(s) failed their digest check and were recomputed")
    for n, st in enumerate(b.steps, 1):  # numbered as the result's JSON numbers them
        lines.append(f"  {n:>3} {term(st.kind)[:30]:<30} {term(st.region)[:32]:<32} "
                     f"{'pass' if st.passed else 'FAIL'} {step_ratio_text(st)}")
    rp = search.get("rest_proven_by")
    if rp:
        lines.append(f"  the other fusions pass together: shown by step {rp['step']} ({term(rp['kind'])}, "
                     f"x{fmt(rp['ratio'])}), which holds every other fused node unchanged; no build of their own")
    for i, c in enumerate(b.culprits, 1):
        lines += culprit_lines(c, i, check.engine if check is not None else "")
    if b.probe_agrees is not None:
        lines.append("fused-graph probe: " + ("its own-error suspects match the culprits found by the search"
                     if b.probe_agrees else "its suspects differ from the search's culprits "
                     "(error amplified downstream or interactions); the search's builds decide"))
    w = workaround_line(workaround_section(b))
    if w:
        lines.append(w)
    if search.get("explanation"):
        lines.append(term(search["explanation"]))
    lines += region_lines(search.get("region_isolation"))
    lj = search.get("local_judgement")
    if lj:
        from bisect_tui.core.bisect.local_judgement import summary_line

        lines.append(summary_line(lj))
        for r in local_rows(lj)[:5]:
            lines.append(f"  {term(r['op_type'])} '{term(r['fused_node'])}': fused error {fmt(r['ratio'])}x the "
                         f"FP32 error -> {r['verdict']}")
    lines += evidence_lines(search.get("evidence"))
    lines += precision_lines(b.precision)
    if b.final_stopped_reason:
        lines.append(term(b.final_stopped_reason))
    return "\n".join(lines)
