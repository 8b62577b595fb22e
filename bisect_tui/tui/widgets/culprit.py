"""The culprit panel of the bisection screen: what was found and the evidence for it.

It reads the BisectResult record, and hands the same record to the report's
search sections (workaround, keep-set, evidence, what was searched, the
bundle plan): the panel says what the report says."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.widgets import Static

from bisect_tui.core.report import (
    BISECT_VERDICT, distinct, evidence_lines, passes_text, precision_lines, workaround_section
)
from bisect_tui.core.bisect.records import BisectResult
from bisect_tui.core.report.search import searched_text
from bisect_tui.tui.format import fmt, shown


def export_hint(result: BisectResult, keepset_writer: bool) -> str:
    """The export keys' line, naming the repro bundle only when one will be written
    (the exporter plans the bundle from the same result)."""
    from bisect_tui.core.report.summary import bundle_plan, has_repro

    plan = bundle_plan(result, keepset_writer)
    what = ("report + repro bundle" if has_repro(plan) else
            "report + bundle (report and plots only: no culprit could be isolated)" if plan else "report")
    return f"e: export {what}   c: copy the Markdown report"


def culprit_text(result: Optional[BisectResult], status: str = "idle", fused_count: Optional[int] = None,
                 keepset_writer: bool = False) -> Text:
    """`fused_count`: the check's fused nodes (a passing engine is not searched);
    `keepset_writer`: the engine adds a keep-set repro to the bundle."""
    t = Text()
    if not result:
        if status == "running":
            t.append("Searching... the culprit appears here when the search has proved it.\n")
        elif status in ("cancelled", "interrupted"):
            t.append(f"The search was {status}. Press r to resume: recorded steps are reused, "
                     "so it continues where it stopped.\n")
        elif status == "error":
            t.append("The search stopped with an error (see the status line). Press r to retry.\n")
        else:
            t.append("No search yet. Press r to start the bisection.\n")
        return t
    verdict = result.final_verdict
    search = result.search
    # finding the culprit is the search succeeding; only an unexplained error is "?"
    mark = "✔" if verdict in ("pass", "culprits") else "?"
    t.append(f"{mark} {BISECT_VERDICT.get(verdict, verdict)}\n", style="bold")
    t.append(f"{result.engine_builds} engine build(s)"
             + (f", {search['reused_steps']} step(s) reused" if search.get("reused_steps") else "")
             + f", {searched_text(result, fused_count)}\n")
    rp = search.get("rest_proven_by")
    if rp:
        t.append(f"the other fusions pass together: step {rp['step']} ({shown(rp['kind'])}) keeps them all\n")
    for i, c in enumerate(result.culprits, 1):
        t.append("\n")
        t.append(f"Culprit {i}: {shown(c.op_type)}", style="bold")
        t.append((f"  (fused node '{shown(c.fused_node)}')" if c.fused_node else f"  ({c.kind})")
                 + ("  an interaction: these fuse wrong only together" if c.interaction else "") + "\n")
        if c.engine_error:
            t.append(f"  engine {c.engine_error['kind']}: {shown(c.engine_error['message'])}\n")
        if c.exposed_by:
            t.append(f"  exposed by disabling {', '.join(c.exposed_by)}\n")
        t.append("  original nodes: ", style="bold")
        t.append(shown(", ".join(c.original_nodes)) + "\n")
        confirmed = bool((c.attribution or {}).get("confirmed"))
        t.append("  optimizer(s): ", style="bold")
        t.append(passes_text(c))
        t.append(" (confirmed: disabling removes the fused node)\n" if confirmed else "\n")
        iso = c.isolated or {}
        for name, o in (iso.get("outputs") or {}).items():
            t.append(f"  isolated on the baseline's own inputs, {name}:\n", style="bold")
            fu = o["fused_vs_unfused"]
            t.append(f"    fused vs unfused FP32:   max abs {fmt(fu['max_abs'])}\n")
            if "fused_vs_truth" in o:
                t.append(f"    fused vs float64 truth:  max abs {fmt(o['fused_vs_truth']['max_abs'])}\n")
                t.append(f"    FP32 vs float64 truth:   max abs {fmt(o['unfused_vs_truth']['max_abs'])}\n")
                t.append(f"    fused error = {fmt(o['error_ratio'])}x the FP32 error"
                         + (" -> the fusion is worse than plain FP32\n" if o.get("fused_worse")
                            else " -> not worse than plain FP32\n"))
            if o.get("verdict"):
                t.append(f"    {o['verdict']}\n")
        worst = c.worst_elements or []
        if worst:
            t.append("  worst elements (truth / unfused / fused):\n", style="bold")
            for w in worst[:3]:
                idx = ",".join(str(x) for x in w["index"]) if isinstance(w["index"], list) else w["index"]
                truth, unfused, fused = distinct([w["truth"], w["unfused"], w["fused"]])
                t.append(f"    [{idx}] {truth} / {unfused} / {fused}\n")
    w = workaround_section(result)
    if w:
        d = w.data
        t.append("\nWorkaround: ", style="bold")
        if d["kind"] == "disable_optimizers":  # the engine's own words for applying it: `how`
            t.append(f"disable {', '.join(d['passes'])}: the full engine then passes "
                     f"(max abs {fmt(d['max_abs'])})\n  {d['how']}\n")
        else:
            t.append(f"{d['how'] or 'none found'}\n")
    err = search.get("engine_error")
    if err and not any(c.engine_error for c in result.culprits):
        t.append("\nThe fused engine's error: ", style="bold")
        t.append(f"{shown(err.get('message', ''))}\n")
    p = result.precision
    title = "Precision setting" if getattr(p, "kind", None) == "precision_setting" else "Keep-set: nodes to keep in FP32"
    _block(t, title, precision_lines(p))
    if search.get("explanation"):
        t.append(f"\n{search['explanation']}\n")
    _block(t, "Where the error starts", evidence_lines(search.get("evidence")))
    t.append("\n" + export_hint(result, keepset_writer) + "\n")
    return t


def _block(t: Text, title: str, lines: list[str]) -> None:
    """A titled block of the lines the CLI prints (already made safe for a terminal)."""
    if lines:
        t.append(f"\n{title}\n", style="bold")
        t.append("\n".join(lines) + "\n")


class CulpritPanel(Static):
    DEFAULT_CSS = """
    CulpritPanel { height: auto; padding: 0 1; }
    """

    def show(self, result: Optional[BisectResult], status: str, fused_count: Optional[int] = None,
             keepset_writer: bool = False) -> None:
        self.update(culprit_text(result, status, fused_count, keepset_writer))
