"""The check's sections rendered as Markdown that can be pasted into a bug
tracker as is: paths relative to the report's folder, the settings as a
command line, plots referenced by file name (they travel in bundle.zip)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from bisect_tui.core.escape import md, md_code
from bisect_tui.core.report.framework import framework_section
from bisect_tui.core.report.mdtools import LONG_TABLE_ROWS, code_cell as _c, details, fenced, image, table, text as _t
from bisect_tui.core.report.sections import (
    arbiter_section, baseline_section, engine_section, outputs_section, ratio_words, shared_section, summary_of
)
from bisect_tui.core.triage.records import ArbiterResult, FrameworkResult, Summary
from bisect_tui.core.report.words import (
    cos_text, fmt, sensitivity_text, shown_path, size_text, tolerance_text, verdict_text
)

MAX_TABLE_ROWS = 300  # longer tables say how many rows are left and where they are


def environment_md(s: Summary) -> str:
    """Every library report.json's versions name (the engine adds its own, e.g.
    its version and build), then the machine's counts."""
    v = s.versions or {}
    lines = [f"- {k}: {_t(v[k])}" for k in v if isinstance(v[k], str)]
    machine = [f"{v['cpu_count']} CPU(s)" if v.get("cpu_count") else "",
               f"{size_text(v['memory_bytes'])} memory" if v.get("memory_bytes") else ""]
    if any(machine):
        lines.append("- machine: " + ", ".join(x for x in machine if x))
    return "\n".join(lines)


def arbiter_markdown(arb: Optional[ArbiterResult]) -> list[str]:
    sec = arbiter_section(arb)
    if sec is None:
        return []
    d = sec.data
    if not d["available"]:
        return [f"Float64 arbiter: not run ({md(d['reason'])}).", ""]
    rows = [[_c(name), "no verdict (truth unverified)" if unverified else
             ("not worse than FP32" if not_worse else "**worse than FP32**"), fmt(base_rmse),
             fmt(fused_rmse), ratio_words(ratio, floor), fmt(fw_rmse) if has_fw else "-",
             "FAIL (too tight)" if too_tight else ("PASS" if tol_passed else "FAIL")]
            for (name, not_worse, base_rmse, fused_rmse, ratio, fw_rmse, too_tight, tol_passed, _, _, floor,
                 unverified), has_fw in zip(sec.table.rows, d["has_framework"])]
    return [
        f"### {sec.title}",
        f"Truth: {md(d['truth_source'])}. The fused result is *not worse than FP32* when its RMSE against the "
        f"truth is within {d['factor']:g}x the FP32 baseline's (PyTorch minifier and msprobe use the same rule).",
        *(["Reference check: " + md(d["reference"]) + "."] if d.get("reference") else []),
        "",
        table(list(sec.table.headers), rows),
        "",
    ]


def framework_markdown(fw: Optional[FrameworkResult]) -> list[str]:
    sec = framework_section(fw)
    if sec is None:
        return []
    d = sec.data
    ex, cc = d["export"], d["crosscheck"]
    parts = [
        f"## {sec.title}",
        f"- model: {md_code(d['spec'])}, exported with the **{ex['exporter']}** exporter "
        f"(torch {md(ex['torch_version'])}, opset {ex['opset']}, traced with {md(ex['traced_with'])})",
    ]
    if ex.get("fallback_reason"):
        parts.append(f"- dynamo exporter not used: {md(ex['fallback_reason'])}")
    parts += [
        f"- golden data: {d['golden']['tensors']} module outputs from forward hooks (FP32, eval mode), "
        f"{size_text(d['golden']['bytes'])}, " + d["runs"],
        f"- export cross-check: {md(d['coverage'])}; "
        + ("**every mapped output matches PyTorch**" if cc["passed"] else
           f"**{cc['failing']} mapped output(s) differ from PyTorch**"),
        "",
    ]
    if d["unmapped"]:
        parts += [table(["unmapped", "modules", "why"],
                        [[len(modules), ", ".join(_c(m) for m in modules[:8]) + (" ..." if len(modules) > 8 else ""),
                          md(why)] for modules, why in d["unmapped"]]), ""]
    if d["mismatches"]:
        parts += [table(["golden file", "module", "type", "ONNX tensor", "max abs", "cosine"],
                        [[_c(m["name"]), _c(m["module"]), md(m["type"]), _c(m["onnx_tensor"]),
                          fmt(m["max_abs"]), cos_text(m["cosine"])] for m in d["mismatches"]]), ""]
    parts += ["### Golden-data pitfalls",
              table(list(sec.table.headers),
                    [[md(title), state.replace("_", " "), md(detail), md(what) if state == "found" else "-"]
                     for title, state, detail, _, what in sec.table.rows]), ""]
    return parts


def _inputs_md(inp: dict) -> str:
    arrays = ", ".join(f"{md_code(a['name'])} {'x'.join(map(str, a['shape'])) or 'scalar'} {_t(a['dtype'])}"
                       for a in inp.get("arrays", []))
    if inp.get("kind") == "file":
        src = f"from file {md_code(Path(inp.get('file') or '').name)}"
    else:
        src = f"generated with seed {inp.get('seed')}"
    return f"{arrays}; {inp.get('samples', 1)} sample(s), {src}"


def _input_lines(inp: dict) -> list[str]:
    """How each input was made; integer and bool inputs also with their values,
    since they decide what the model computes (a sample rate, a mask)."""
    out = []
    for a in inp.get("arrays", []):
        how = a.get("how")
        vals = a.get("values")
        if not how and vals is None:
            continue
        line = f"{md_code(a['name'])}: {md(how or '')}"
        if vals is not None:
            line += f"; values: {', '.join(str(v).lower() if isinstance(v, bool) else str(v) for v in vals)}"
        elif a.get("min") is not None and a["dtype"].startswith(("int", "uint")):
            line += f"; range {fmt(a['min'])}..{fmt(a['max'])}"
        out.append(line)
    return out


def _baseline_md(s: Summary) -> list[str]:
    sec = baseline_section(s)
    d = sec.data
    return [
        f"## {sec.title}",
        f"- baseline: {d['tensors']} tensors dumped ({d['size']}), {d['how']}",
        *([f"- warning: {_t(d['memory_warning'])}"] if d["memory_warning"] else []),
        *[f"- {_t(line)}" for line in sec.lines],
        "",
    ]


def _engine_md(s: Summary) -> list[str]:
    c = s.check
    sec = engine_section(c)
    d = sec.data
    entries = ", ".join(md_code(f"{k}={v}") for k, v in d["entries"]) or "none"
    disabled = ", ".join(md_code(n) for n in d["disabled"]) or "none"
    settings = sec.table.rows
    outputs = outputs_section(c).table
    return [
        f"## {sec.title}",
        f"engine {md_code(d['engine'])}, level {md_code(d['level'])}, precision {md_code(d['precision'])}; "
        f"config entries: {entries}; disabled optimizers: {disabled}",
        "",
        *[f"- {md(str(k))}: {md(str(v))}" for k, v in settings],
        *([""] if settings else []),
        *_engine_error_md(c.error, s),
        *([] if c.error and not outputs.rows else [table(list(outputs.headers[:-1]),
              [[_t(n), "PASS" if passed else "FAIL", fmt(max_abs), fmt(mean_abs), fmt(max_rel), cos_text(cosine),
                fmt(snr), "" if passed else _t(summary)]
               for n, passed, max_abs, mean_abs, max_rel, cosine, snr, summary, _ in outputs.rows])]),
        "",
    ]


def _engine_error_md(err: Optional[dict], s: Summary) -> list[str]:
    """The engine's own full message, fenced (escaped, bounded in check.json):
    its first line alone can stop at "failed with OpConversionFailure:"."""
    if not err:
        return []
    from bisect_tui.core.report.summary import without_session

    what = "could not be built" if err["kind"] == "build_error" else "could not run on these inputs"
    detail = without_session(err.get("detail") or err.get("message") or "", s).rstrip("\n")
    where = f" (also in {md_code(err['detail_file'])} in the session)" if err.get("detail_file") else ""
    return [f"The fused engine {what}, so no output was compared. The engine's full message{where}:", "",
            *details("the engine's message", fenced(detail.splitlines() or [""]),
                     fold=len(detail.splitlines()) > LONG_TABLE_ROWS)]


def _evidence_md(s: Summary) -> list[str]:
    """The pictures' evidence as text (a pasted report shows no image): the
    tensors inside the fused graph, the error along it, each output's histograms."""
    from bisect_tui.core.plots import ErrorProfile, culprit_tensors
    from bisect_tui.core.report.textplots import histogram_lines, profile_lines

    c = s.check
    parts = []
    sh = shared_section(c)
    if sh:
        first = sh.data["first"]
        parts += [f"Tensors inside the fused graph: {sh.data['failing']} of {sh.data['compared']} "
                  "out of tolerance" + (f", the first in topological order: {md_code(first)}" if first else ""), ""]
    prof = profile_lines(ErrorProfile.from_summary(c.shared_tensors, culprit_tensors(s.extra.get("bisect"))))
    if prof:
        parts += ["### Error along the graph",
                  "Each tensor's error as a multiple of the tolerance, in topological order, log scale "
                  "(the worst tensor of each column):", "", *fenced(prof), ""]
    hists = [line for name, o in c.outputs.items() for line in histogram_lines(name, o)]
    if hists:
        n = len(c.outputs)
        parts += ["### Output histograms",
                  "Baseline and fused values over the same bins, then log10 |fused - baseline|:", "",
                  *details(f"histograms of {n} outputs", fenced(hists), fold=n > 4), ""]
    return parts


def plots_md(s: Summary) -> list[str]:
    """The plots as images, last and optional: they are files beside the report
    (or in bundle.zip), so a pasted report loses them and reads complete without."""
    from bisect_tui.core.plots import PROFILE_FILE

    plots = dict(s.extra.get("plots") or {})
    if not plots:
        return []
    folder = Path(next(iter(plots.values()))).parent.as_posix()
    parts = ["## Plots (optional)",
             f"Image files beside this report, in {md_code(folder)}; attach them to an issue to show them. "
             "The text above already holds their evidence.", ""]
    profile = plots.pop(PROFILE_FILE, None)
    if profile:
        parts += [image("error along the graph: each tensor's error / tolerance in topological order, "
                        "log scale", profile),
                  f"*{md(Path(profile).name)}: each tensor's error as a multiple of the tolerance, in "
                  "topological order (log scale); the dashed line is the tolerance, the orange line the "
                  "first crossing, triangles the culprit's tensors.*", ""]
    for name, path in plots.items():
        parts += [image(f"{name}: baseline vs fused values and error", path),
                  f"*{md(Path(path).name)}: {md(name)}, baseline and fused values overlaid (left), "
                  "the error's distribution (right).*", ""]
    return parts


def _fused_nodes_md(nodes) -> list[str]:
    if not nodes:
        return []
    rows = [table(["fused node", "op", "original nodes", "optimizers"],
                  [[_c(n["name"]), _t(n["op_type"]), _t(", ".join(n["original_nodes"])),
                    _t(", ".join(n["optimizers"]) or "-")] for n in nodes[:MAX_TABLE_ROWS]])]
    if len(nodes) > MAX_TABLE_ROWS:
        rows.append(f"\n{len(nodes) - MAX_TABLE_ROWS} more fused node(s) not shown: all {len(nodes)} "
                    "are in report.json under `fused_nodes`.")
    return [f"### Fused nodes ({len(nodes)})",
            *details(f"{len(nodes)} fused nodes", rows, fold=len(nodes) > LONG_TABLE_ROWS), ""]


def check_parts(s: Summary, base: Optional[Path] = None, command: str = "check") -> list[str]:
    """The check's evidence, after the summary: the run, the environment, the
    baseline, the engine against it, the text plots and the fused nodes."""
    m = s.model
    parts = [
        "## Model and run",
        f"- model: {md_code(Path(m['path']).name)} ({m['nodes']} nodes, opset {m['opset']}, "
        f"sha256 {md_code(m['sha256'][:16])})",
        f"- inputs: {_inputs_md(s.inputs)}",
        *[f"  - {line}" for line in _input_lines(s.inputs)],
        f"- session directory: {md_code(shown_path(s.session, base))}",
        f"- tolerance: {_t(tolerance_text(s.tolerance))}",
        "",
    ]
    cmd = (s.command or {}).get(command)
    if cmd:
        parts += ["How it was run (the same command reproduces it; the session is reused):", "",
                  *fenced([cmd]), ""]
    parts += ["## Environment", environment_md(s), "", *_baseline_md(s), *framework_markdown(s.framework)]
    if s.check is not None and s.check.config:
        parts += _engine_md(s)
        parts += arbiter_markdown(s.arbiter)
        sens_line = sensitivity_text(s.check.sensitivity)
        if sens_line:
            parts += [_t(sens_line), ""]
        parts += _evidence_md(s)
        parts += _fused_nodes_md(s.check.fused_nodes)
    return parts


def check_markdown(s, title: Optional[str] = None, base: Optional[Path] = None,
                   command: str = "check") -> str:
    """The report as Markdown: the summary first, paths relative to `base` (the
    report's folder). `s`: the Summary, or report.json's dict."""
    from bisect_tui.core.report.summary import summary_md

    s = summary_of(s)
    parts = [title or f"# bisect-tui check: {verdict_text(s)}", "", *summary_md(s, command),
             *check_parts(s, base, command),
             f"**Verdict: {verdict_text(s)}** (exit code {s.exit_code})", "", *plots_md(s)]
    return "\n".join(parts).rstrip("\n") + "\n"
