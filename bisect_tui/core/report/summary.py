"""The top of a report pasted into a bug tracker: what a maintainer reads first
(the engine, every library's version, the verdict, the culprit, the workaround,
one command to reproduce), and the repro section, written only when the bundle
it names really exists.

What the bundle holds is decided once, by `bundle_plan`, before the report is
rendered: the exporter writes the bundle from the same plan, and the report
(a view key `_bundle`, never in report.json) says only what is in it."""

from __future__ import annotations

import shlex
from typing import Any, Optional

from bisect_tui.core.bisect.records import BisectResult, PrecisionSetting, result_of
from bisect_tui.core.escape import md, md_code
from bisect_tui.core.report.mdtools import fenced, text as _t
from bisect_tui.core.report.search import passes_text, verdict_words, workaround_section
from bisect_tui.core.report.words import fmt, verdict_text
from bisect_tui.core.triage.records import Summary

BUNDLE_KEY = "_bundle"  # the view's key for bundle_plan's answer; report.json never holds it


def bundle_plan(result: Any, keepset_writer: bool) -> Optional[dict]:
    """What bundle.zip will hold, or None when no bundle is written: `repro` are
    the folders of the isolated culprits (repro/, repro_2/ ...), `keepset` says
    whether the engine adds its keep-set repro (`keepset_writer`: it can).

    `result`: the BisectResult, or the result's JSON the exporter holds (read
    here into its record, the exporter's edge)."""
    b = result_of(result)
    if b is None:
        return None
    p = b.precision
    passed = bool(p is not None and p.passed)
    if not (b.culprits or passed):
        return None
    isolated = [c for c in b.culprits if (c.isolated or {}).get("subgraph")]
    keepset = bool(keepset_writer and not isinstance(p, PrecisionSetting)
                   and (passed or b.search.get("engine_error")))
    return {"repro": ["repro" if i == 1 else f"repro_{i}" for i in range(1, len(isolated) + 1)],
            "keepset": keepset}


def has_repro(plan: Optional[dict]) -> bool:
    """True when the bundle holds a script to run (not only the report and its plots)."""
    return bool(plan and (plan.get("repro") or plan.get("keepset")))


def without_session(text: str, s: Summary) -> str:
    """An engine's message with this machine's session path as `<session>`: the
    reader has neither the path nor a use for it."""
    from pathlib import Path

    root = str(s.session or "")
    for p in {root, str(Path(root).resolve()) if root else ""} - {""}:
        text = text.replace(p.rstrip("/") + "/", "<session>/")
    return text


def versions_text(s: Summary) -> str:
    """Every library and the machine, as report.json's versions list them (the
    engine adds its own: its version, its build); counts are left out."""
    v = s.versions or {}
    return ", ".join(f"{k} {v[k]}" for k in v if isinstance(v[k], str))


def engine_text(s: Summary) -> str:
    """The engine in its own describe() words when report.json keeps them."""
    check = s.check
    c = check.config if check is not None else None
    if not c:
        return "not run: the baseline check stopped first"
    own = next((str(v) for k, v in check.engine_settings or () if str(k) == "engine"), None)
    how = f"{md_code(check.engine)}, level {md_code(c.get('level'))}, precision {md_code(c.get('precision'))}"
    return f"{md(own)} ({how})" if own else how


def _culprit_items(b: BisectResult) -> list[str]:
    out = []
    for c in b.culprits:
        if c.kind in ("build_error", "run_error") and not c.fused_node:
            what = "does not build" if c.kind == "build_error" else "fails while running"
            out.append(f"the engine {what} because of the precision of {len(c.original_nodes)} original "
                       f"node(s) ({_t(c.op_type)})")
        else:
            out.append(f"{_t(c.op_type)} {md_code(c.fused_node)} made by {_t(passes_text(c))}, "
                       f"replacing {len(c.original_nodes)} original node(s)"
                       + (" (an interaction: they fail only together)" if c.interaction else ""))
    return out


def _workaround_text(b: BisectResult) -> Optional[str]:
    w = workaround_section(b)
    p = b.precision
    if w and w.data["kind"] == "disable_optimizers":
        return (f"disable {', '.join(md_code(n) for n in w.data['passes'])}: the full engine then passes "
                f"(max abs {fmt(w.data['max_abs'])})")
    if p is not None and p.passed and p.setting:
        keep = getattr(p, "keep_fp32", None)  # a PrecisionSetting keeps no nodes
        kept = f"keep {len(keep)} node(s) in FP32: " if keep else ""
        return f"{kept}{md_code(p.setting)}"
    if w and w.data["how"]:
        return _t(w.data["how"])
    return None


def summary_md(s: Summary, command: str) -> list[str]:
    """The summary a maintainer reads first; every line plain text (no image, no link)."""
    b: Optional[BisectResult] = s.extra.get("bisect")  # summary_of made it the record
    verdict = verdict_text(s) + (f"; bisection: {md(verdict_words(b))}" if b is not None else "")
    lines = ["## Summary", f"- **verdict**: {verdict}", f"- **engine**: {engine_text(s)}",
             f"- **versions**: {_t(versions_text(s)) or 'not recorded'}"]
    check = s.check
    failing = [n for n, o in (check.outputs if check is not None else {}).items() if not o.passed]
    if failing:
        lines.append(f"- **failing output(s)**: {', '.join(md_code(n) for n in failing[:5])}"
                     + (f" and {len(failing) - 5} more" if len(failing) > 5 else ""))
    err = check.error if check is not None else None
    if err:
        what = "fails to build" if err["kind"] == "build_error" else "fails while running"
        lines.append(f"- **engine error**: the fused engine {what}: {md_code(without_session(err['message'], s)[:300])}")
    if b is not None:
        items = _culprit_items(b)
        if items:
            lines += [f"- **culprit**: {items[0]}", *[f"- **culprit {i}**: {x}" for i, x in enumerate(items[1:], 2)]]
        else:
            lines.append(f"- **culprit**: none: {md(verdict_words(b))}")
        w = _workaround_text(b)
        if w:
            lines.append(f"- **workaround**: {w}")
    cmd = (s.command or {}).get(command)
    if cmd:
        lines.append(f"- **reproduce**: {md_code(cmd)}")
    if has_repro(s.extra.get(BUNDLE_KEY)):
        lines.append("- **standalone repro**: in `bundle.zip`, see *How to reproduce* below")
    return [*lines, ""]


def reproduce_md(s: Summary) -> list[str]:
    """The repro section: only the scripts bundle.zip really holds, nothing
    when no bundle (or one with no script) was written."""
    plan = s.extra.get(BUNDLE_KEY)
    if not has_repro(plan):
        return []
    w = workaround_section(s.extra.get("bisect"))
    passes = w.data["passes"] if w else []
    lines = ["unzip bundle.zip"]
    for folder in plan["repro"]:
        lines.append(f"python {folder}/repro.py        # exits 1 while the bug is present")
        if passes:  # shell lines: every name quoted, so copying them never runs anything else
            lines.append(f"python {folder}/repro.py " + " ".join(f"--disable {shlex.quote(n)}" for n in passes)
                         + "   # exits 0 with the workaround")
    if plan.get("keepset"):
        lines += ["python keepset/repro_keepset.py          # exits 1 while the engine fails",
                  "python keepset/repro_keepset.py --keep   # exits 0 with the keep-set in FP32"]
    return ["### How to reproduce",
            "`bundle.zip` is in the session directory (and wherever `--bundle` copied it):", "",
            *fenced(lines), ""]
