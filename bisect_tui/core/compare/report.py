"""Terminal text and the Markdown report of a compare run.

Every name printed here came from someone's files: it goes through
`escape.term` for the terminal and `escape.md`/`md_code` for Markdown. The
Markdown report links one PNG per tensor (golden and test value histograms
overlaid, and the error histogram), drawn by core/plots.py from the
histograms the comparison already computed, so no tensor is read again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from bisect_tui.core import atomic
from bisect_tui.core.compare.pitfalls import ranking_applies
from bisect_tui.core.compare.records import CompareResult, TensorResult
from bisect_tui.core.escape import md, md_code, md_image, safe_filename, term
from bisect_tui.core.report import cos_text, fmt
from bisect_tui.core.tolerance import DEFAULT_TOPK


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{x:.1%}"


def shows_ranking(t: TensorResult) -> bool:
    """The ranking is reported only where it means something (pitfalls.ranking_applies):
    class scores, or where the user asked for it (--topk other than the default,
    min_topk in the tolerance, or a ranking finding)."""
    m = t.metrics
    if m.get("top1_agreement") is None:
        return False
    asked = (bool(t.tolerance.k) or m.get("topk") != DEFAULT_TOPK
             or any(f.kind == "ranking" for f in t.findings))
    return ranking_applies(t.pair.test.name, t.shape, asked)


def values_line(t: TensorResult) -> str:
    m = t.metrics
    line = (f"max_abs {fmt(m['max_abs'])}, mean_abs {fmt(m['mean_abs'])}, max_rel {fmt(m['max_rel'])}, "
            f"mean_rel {fmt(m['mean_rel'])}, cosine {cos_text(m['cosine'])}")
    if shows_ranking(t):
        line += f"; ranking: top-1 {_pct(m['top1_agreement'])}, top-{m['topk']} {_pct(m['topk_agreement'])}"
    return line


def shown(path, base: Optional[Path] = None) -> str:
    """A path as the reader can use it: relative to `base` (the working directory
    for the terminal, the report's folder for Markdown) when inside it; else as
    given on the command line for the terminal, only its name in a report."""
    p = Path(path)
    root = Path(base) if base is not None else Path.cwd()
    try:
        rel = os.path.relpath(p.resolve(), root.resolve())
    except ValueError:
        rel = ".."
    if not rel.startswith(".."):
        return rel.replace(os.sep, "/")
    return p.name if base is not None else str(path)


def verdict_line(r: CompareResult) -> str:
    n = len(r.tensors)
    if r.passed:
        return f"PASS: all {n} compared tensor(s) within tolerance (exit 0)"
    return f"FAIL: {len(r.failing)} of {n} tensor(s) break tolerance (exit 1)"


def text(r: CompareResult) -> str:
    lines = [
        f"golden: {term(shown(r.golden.path))} ({r.golden.note})",
        f"test:   {term(shown(r.test.path))} ({r.test.note})",
    ]
    if r.mapping_file:
        lines.append(f"mapping: {term(shown(r.mapping_file))}")
    for t in r.tensors:
        p = t.pair
        mark = "PASS" if t.passed else "FAIL"
        lines.append(f"  [{mark}] {term(p.test.name)} vs golden {term(p.golden.name)} ({term(p.how)}), "
                     f"shape {'x'.join(map(str, t.shape)) or 'scalar'}")
        for c in t.conversions:
            lines.append(f"         converted {term(c.text())}")
        if t.naive_max_abs is not None:
            lines.append(f"         naive |golden - test| on the stored values: max {fmt(t.naive_max_abs)} "
                         "(the dtype pitfall, not engine error)")
        lines.append(f"         tolerance {t.tolerance.describe()} (from {term(t.tolerance_from)})")
        lines.append(f"         {values_line(t)}")
        if not t.verdict.passed:
            lines.append(f"         {t.verdict.summary()}")
        for f in t.findings:
            lines.append(f"         finding ({f.kind}): {f.text}")
            lines.append(f"         fix: {f.fix}")
    for u in r.unmatched_test:
        lines.append(f"  skipped test tensor {term(u.text())}: no golden match")
    if r.unmatched_golden and r.golden.kind != "session":
        lines.append("  golden tensor(s) no test tensor uses: " + ", ".join(term(u.text()) for u in r.unmatched_golden))
    for n in r.notes:
        lines.append(f"note: {term(n)}")
    lines.append(verdict_line(r))
    return "\n".join(lines)


def _rel(path: Path, base: Path) -> str:
    return os.path.relpath(Path(path).resolve(), Path(base).resolve()).replace(os.sep, "/")


def write_plots(r: CompareResult, out_dir: Path) -> dict[int, str]:
    """PNG per tensor (index into r.tensors -> path), file names made safe and unique."""
    from bisect_tui.core.compare.plots import draw

    out_dir.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    written: dict[int, str] = {}
    for i, t in enumerate(r.tensors):
        path = out_dir / f"{safe_filename(t.pair.test.name, taken)}.png"
        if draw(t, path):
            written[i] = str(path)
    return written


def markdown(r: CompareResult, plots: Optional[dict[int, str]] = None, base: Optional[Path] = None) -> str:
    plots = plots or {}
    out = [
        "# bisect-tui compare",
        "",
        f"**{md(verdict_line(r))}**",
        "",
        f"- golden: {md_code(shown(r.golden.path, base or Path.cwd()))} ({md(r.golden.note)})",
        f"- test: {md_code(shown(r.test.path, base or Path.cwd()))} ({md(r.test.note)})",
    ]
    if r.mapping_file:
        out.append(f"- mapping file: {md_code(shown(r.mapping_file, base or Path.cwd()))}")
    out += ["", "| | test tensor | golden tensor | shape | max abs | mean abs | max rel | cosine | top-1 | tolerance |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for t in r.tensors:
        m = t.metrics
        out.append(
            f"| {'PASS' if t.passed else 'FAIL'} | {md(t.pair.test.name)} | {md(t.pair.golden.name)} | "
            f"{'x'.join(map(str, t.shape))} | {fmt(m['max_abs'])} | {fmt(m['mean_abs'])} | {fmt(m['max_rel'])} | "
            f"{cos_text(m['cosine'])} | {_pct(m.get('top1_agreement')) if shows_ranking(t) else '-'} | "
            f"{md(t.tolerance.name)} |")
    for i, t in enumerate(r.tensors):
        p = t.pair
        out += ["", f"## {'PASS' if t.passed else 'FAIL'}: {md(p.test.name)}", "",
                f"- matched to golden {md_code(p.golden.name)} by {md(p.how)} "
                f"(test {md_code(p.test.where)}, golden {md_code(p.golden.where)})",
                f"- tolerance: {md(t.tolerance.describe())} (from {md(t.tolerance_from)})",
                f"- values: {md(values_line(t))}"]
        if not t.verdict.passed:
            out.append(f"- verdict: {md(t.verdict.summary())}")
        if t.conversions:
            out.append("- converted before subtracting:")
            out += [f"  - {md(c.text())}" for c in t.conversions]
        if t.naive_max_abs is not None:
            out.append(f"- a naive `golden - test` on the stored values gives max |err| {fmt(t.naive_max_abs)}: "
                       "that is the dtype mix-up, not the engine")
        for f in t.findings:
            out.append(f"- **finding ({md(f.kind)})**: {md(f.text)}")
            out.append(f"  - fix: {md(f.fix)}")
        if i in plots and base is not None:
            out += ["", md_image(f"golden and test values overlaid, and the error histogram of {p.test.name}",
                                 _rel(plots[i], base))]
    extra = [term(u.text()) for u in r.unmatched_test]
    if extra:
        out += ["", "## Skipped test tensors (no golden match)", ""] + [f"- {md(x)}" for x in extra]
    if r.unmatched_golden and r.golden.kind != "session":
        out += ["", "## Golden tensors no test tensor uses", ""] + [f"- {md(u.text())}" for u in r.unmatched_golden]
    if r.notes:
        out += ["", "## Notes", ""] + [f"- {md(n)}" for n in r.notes]
    out += ["", "Exit codes: 0 within tolerance, 1 tolerance broken, 2 bad input.", ""]
    return "\n".join(out)


def write_report(r: CompareResult, path: Path) -> Path:
    """The Markdown report, with its PNGs in `<report>-plots/` beside it: the
    folder name check and bisect use for theirs (reports written before this
    release keep their `<report>_plots/` and its links; nothing reads it back)."""
    path = Path(path)
    plot_dir = path.parent / f"{safe_filename(path.stem)}-plots"
    plots = write_plots(r, plot_dir)
    atomic.write_text(path, markdown(r, plots, path.parent))
    return plot_dir
