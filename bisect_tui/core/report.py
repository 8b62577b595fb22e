"""Human text and Markdown renderings of the JSON results.

The JSON (`report.json`) is the contract; these are views of it. Each section
says what was found, why it matters and what to do next.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import quote

from bisect_tui.core.escape import is_safe_relative_target, md, md_code, term

VERDICT_TEXT = {
    "pass": "PASS: the fused engine is within tolerance",
    "fail": "FAIL: the fused engine breaks tolerance",
    "nondeterministic": "STOP: the baseline is not deterministic",
    "nan_inf": "STOP: the baseline already holds NaN/Inf",
    "export_mismatch": "STOP: the ONNX export does not compute what the PyTorch model computes",
}


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x in (float("inf"), float("-inf")):
            return "inf" if x > 0 else "-inf"
        if x == 0:
            return "0"
        if 1e-3 <= abs(x) < 1e4:
            return f"{x:.{digits + 1}g}"
        return f"{x:.{digits - 1}e}"
    return str(x)


def distinct(values: Sequence[Optional[float]], min_digits: int = 4, max_digits: int = 10) -> list[str]:
    """The values with just enough significant digits that the ones that differ
    also read differently ("2.694, 2.694, 2.694" hides the very difference shown)."""
    nums = [v for v in values if isinstance(v, (int, float)) and v is not None and math.isfinite(v)]
    digits = min_digits
    while digits < max_digits:
        shown = {}
        clash = False
        for v in nums:
            t = f"{v:.{digits}g}"
            if t in shown and shown[t] != v:
                clash = True
                break
            shown[t] = v
        if not clash:
            break
        digits += 1
    return [fmt(v) if not (isinstance(v, (int, float)) and v is not None and math.isfinite(v))
            else f"{v:.{digits}g}" for v in values]


def sensitivity_text(sens: Optional[dict]) -> str:
    """How much the FP32 outputs move under 1-ulp input noise, judged honestly:
    0.95 of the tolerance is close to it, not "well below"."""
    if not sens or "ratio" not in sens:
        return ""
    r = sens["ratio"]
    head = f"sensitivity: a 1-ulp input change moves the FP32 outputs to x{fmt(r)} of the tolerance"
    if sens.get("amplifies") or r > 1:
        return head + ": the model amplifies rounding noise, every reordering kernel will look guilty"
    if r >= 0.5:
        return head + (": close to it; rounding noise alone nearly breaks the tolerance, so a culprit may "
                       "be FP32 reordering the model amplifies (see each culprit's float64 evidence)")
    if r >= 0.1:
        return head + ": below it, not far; the check sees mostly fusion error, but a tighter tolerance would not"
    return head + " (well below it: fusion error is what the check sees)"


def shown_path(p: Any, base: Optional[Path] = None) -> str:
    """A path for a report another person reads: relative to `base` (the report's
    folder, or the working directory) when inside it, else only its last part."""
    if not p:
        return "-"
    path = Path(p)
    base = Path(base) if base else Path.cwd()
    try:
        rel = os.path.relpath(path.resolve(), base.resolve())
    except ValueError:
        return path.name
    return path.name if rel.startswith("..") else rel.replace(os.sep, "/")


def cos_text(c) -> str:
    """Cosine similarity with enough digits to see how far from 1 it is."""
    if c is None or c != c:
        return "-"
    return f"{c:.8f}"


def tolerance_text(spec: dict) -> str:
    from bisect_tui.core.tolerance import ToleranceSpec

    t = ToleranceSpec.from_dict(spec)
    text = t.default.describe()
    if t.overrides:
        text += "; " + "; ".join(f"{p} -> {tol.describe()}" for p, tol in t.overrides)
    return text


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"


def determinism_line(det: dict | None) -> str:
    if not det or det.get("skipped"):
        return "determinism: skipped (--no-determinism)"
    if det["deterministic"]:
        return f"determinism: OK, {det['tensors_compared']} tensors bit-identical over two fresh runs"
    f = det["first"]
    return (f"determinism: FAILED, {len(det['differing'])} tensor(s) differ; first: {term(f['tensor'])} "
            f"(node {term(f['node'])}, {term(f['op_type'])})")


def range_lines(rc: dict | None) -> list[str]:
    if not rc:
        return []
    out = []
    if rc["nan_inf"]:
        o = rc.get("nan_inf_origin")
        where = (f"; starts at {term(o['tensor'])} ({term(o['op_type'])} node {term(o['node'])}) whose inputs "
                 "are finite" if o else "")
        out.append(f"range: NaN/Inf in {len(rc['nan_inf'])} tensor(s){where}")
    else:
        out.append("range: no NaN/Inf in the baseline")
    f16 = rc["fp16"]
    if f16["overflow"]:
        worst = max(f16["overflow"], key=lambda r: r["abs_max"])
        out.append(f"fp16 headroom: {len(f16['overflow'])} tensor(s) exceed 65504 "
                   f"(worst {term(worst['tensor'])}, |x| up to {fmt(worst['abs_max'])}): an FP16 engine will overflow there")
    elif f16["near_overflow"]:
        t = f16["tightest"]
        out.append(f"fp16 headroom: tightest {term(t['tensor'])} at {fmt(t['headroom'])}x below 65504")
    else:
        out.append("fp16 headroom: every tensor fits FP16's range with >4x to spare")
    if f16["underflow"]:
        out.append(f"fp16 underflow: {len(f16['underflow'])} tensor(s) have >1% of values that round to zero in FP16")
    if rc["bf16"]["overflow"]:
        out.append(f"bf16: {len(rc['bf16']['overflow'])} tensor(s) overflow BF16")
    for v in rc.get("user_ranges", []):
        out.append(f"range: {term(v['tensor'])} spans [{fmt(v['min'])}, {fmt(v['max'])}] outside {v['range']}")
    return out


def output_line(name: str, o: dict) -> str:
    m = o["metrics"]
    mark = "PASS" if o["passed"] else "FAIL"
    line = (f"  [{mark}] {term(name)}: max_abs {fmt(m['max_abs'])}, mean_abs {fmt(m['mean_abs'])}, "
            f"max_rel {fmt(m['max_rel'])}, cosine {cos_text(m['cosine'])}, snr {fmt(m['snr_db'])} dB")
    if not o["passed"]:
        line += f"\n         {term(o['summary'])}"
    for note in (o.get("verdict") or {}).get("skipped", []):
        if "essentially zero" in note:  # say which criterion decided when cosine was set aside
            line += f"\n         decided by atol/rtol: {term(note)}"
    return line


def check_text(s: dict) -> str:
    lines = [
        f"model: {term(s['model']['path'])} ({s['model']['nodes']} nodes, sha256 {s['model']['sha256'][:12]})",
        f"session: {term(s['session'])}",
        f"baseline: {s['baseline']['tensors']} tensors, {_mb(s['baseline']['bytes'])}"
        + (" (reused)" if s["baseline"]["reused"] else f" in {s['baseline']['groups']} group(s)")
        + (f"; {len(s['baseline']['recomputed'])} saved tensor file(s) failed their digest check and were "
           "recomputed" if s["baseline"].get("recomputed") else ""),
        *([f"warning: {s['baseline']['memory_warning']}"] if s["baseline"].get("memory_warning") else []),
        determinism_line(s["determinism"]),
        *range_lines(s["range_check"]),
        *framework_lines(s.get("framework")),
    ]
    if s.get("config"):
        c = s["config"]
        extra = term(", ".join(f"{k}={v}" for k, v in (c.get("config_entries") or {}).items()))
        dis = term(", ".join(c.get("disabled_optimizers") or []))
        lines.append(
            f"fused engine: {s['engine']} level={c['level']} precision={c['precision']}"
            + (f" config: {extra}" if extra else "") + (f" disabled: {dis}" if dis else "")
            + f"; {len(s['fused_nodes'])} fused node(s)"
        )
        lines.append(f"tolerance: {term(tolerance_text(s['tolerance']))}")
        if precision_used_line(s):
            lines.append(precision_used_line(s))
        err = s.get("engine_error")
        if err:
            what = "failed to build" if err["kind"] == "build_error" else "failed while running"
            lines.append(f"fused engine {what} (the baseline runs): {term(err['message'])}")
        for name, o in s["outputs"].items():
            lines.append(output_line(name, o))
        sens_line = sensitivity_text(s.get("sensitivity"))
        if sens_line:
            lines.append(sens_line)
        sh = s.get("shared_tensors")
        if sh:
            if sh["first_failing_tensor"]:
                first = sh["first_failing_tensor"]
                maker = next((f"{term(n['op_type'])} '{term(n['name'])}'" for n in s["fused_nodes"]
                              if first in n["outputs"]), None)
                lines.append(f"tensors inside the fused graph: {sh['failing']} of {sh['tensors_compared']} "
                             f"out of tolerance, first: {term(first)}" + (f" (made by fused {maker})" if maker else ""))
            else:
                lines.append(f"tensors inside the fused graph: all {sh['tensors_compared']} within tolerance")
        lines += arbiter_lines(s.get("arbiter"))
    lines.append(VERDICT_TEXT[s["verdict"]] + f" (exit {s['exit_code']})")
    if s["verdict"] == "fail" and arbiter_all_too_tight(s):
        lines.append("next: every failing output is as close to the float64 truth as the FP32 baseline: loosen the "
                     "tolerance to FP32's own error (see the arbiter) instead of bisecting rounding noise")
    elif s["verdict"] == "fail":
        lines.append("next: run `bisect-tui bisect` with the same options to name the fused op at fault")
    elif s["verdict"] == "export_mismatch":
        lines.append("next: " + export_next_step(s["framework"]))
    elif s["verdict"] == "nondeterministic" and s.get("framework") and not s["framework"]["golden"]["deterministic"]:
        lines.append("next: make PyTorch's forward deterministic (see the pitfalls above); no engine was judged")
    elif s["verdict"] == "nondeterministic":
        lines.append("next: " + term(s["determinism"].get("advice") or "make the baseline deterministic"))
    elif s["verdict"] == "nan_inf" and s["range_check"].get("nan_inf_origin"):
        lines.append("next: " + term(s["range_check"]["nan_inf_origin"]["advice"]))
    return "\n".join(lines)


# Plain names (letters, digits, `.`, `/`, `-`, underscores inside words) read
# the same raw and escaped; anything else goes through md().
_PLAIN = re.compile(r"[A-Za-z0-9./-]+(?:_[A-Za-z0-9./-]+)*")


def _t(x: Any) -> str:
    """Model- or user-supplied text for Markdown: left as is when plain, else escaped."""
    s = str(x)
    return s if _PLAIN.fullmatch(s) else md(s)


def _c(x: Any) -> str:
    """A code span for a table cell (GFM splits cells at `|` even inside code)."""
    return md_code(x).replace("|", "\\|")


def _md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """Cells are already escaped by the caller (_t, _c, numbers we format)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(_cell(c) for c in r) + " |")
    return "\n".join(out)


def _cell(c: Any) -> str:
    if isinstance(c, (int, float)) or c is None:
        return fmt(c) if c is not None else ""
    if isinstance(c, list):
        return _t(", ".join(str(x) for x in c))
    return str(c).replace("\n", " ")


def _fenced(lines: list[str]) -> list[str]:
    """A code block no backtick run inside can close early, controls shown."""
    body = [term(line) for line in lines]
    longest = max((len(r) for line in body for r in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *body, fence]


def _image(alt: str, target: str) -> str:
    """An image link to a plot we wrote: the path is relative to the report
    (it may climb with `..` to the session's plots folder) and percent-encoded;
    anything with a scheme or an absolute path is not linked."""
    rel = str(target).replace("\\", "/")
    if rel.startswith("/") or ":" in rel or not rel:
        return md(alt)
    url = rel if is_safe_relative_target(rel) else quote(rel, safe="/._-")
    return f"![{md(alt)}]({url})"


def environment_md(s: dict) -> str:
    v = s.get("versions", {})
    return "\n".join(f"- {k}: {_t(v[k])}" for k in
                     ("bisect_tui", "onnxruntime", "onnx", "numpy", "python", "platform", "cpu")
                     if k in v)


MAX_TABLE_ROWS = 300  # longer tables say how many rows are left and where they are


def check_markdown(s: dict, title: Optional[str] = None, base: Optional[Path] = None,
                   command: str = "check") -> str:
    """The report as Markdown that can be pasted into a bug tracker as is: paths
    relative to `base` (the report's folder), the settings as a command line,
    plots referenced by file name (they travel in bundle.zip under plots/)."""
    m = s["model"]
    parts = [
        title or f"# bisect-tui check: {VERDICT_TEXT[s['verdict']]}",
        "",
        f"- model: {md_code(Path(m['path']).name)} ({m['nodes']} nodes, opset {m['opset']}, "
        f"sha256 {md_code(m['sha256'][:16])})",
        f"- inputs: {_inputs_md(s['inputs'])}",
        *[f"  - {line}" for line in _input_lines(s["inputs"])],
        f"- session directory: {md_code(shown_path(s['session'], base))}",
        f"- tolerance: {_t(tolerance_text(s['tolerance']))}",
        "",
    ]
    cmd = (s.get("command") or {}).get(command)
    if cmd:
        parts += ["How it was run (the same command reproduces it; the session is reused):", "",
                  *_fenced([cmd]), ""]
    parts += [
        "## Environment",
        environment_md(s),
        "",
        "## Baseline checks",
        f"- baseline: {s['baseline']['tensors']} tensors dumped ({_mb(s['baseline']['bytes'])}), "
        "ORT_DISABLE_ALL, FP32, CPU",
        *([f"- warning: {_t(s['baseline']['memory_warning'])}"] if s["baseline"].get("memory_warning") else []),
        f"- {_t(determinism_line(s['determinism']))}",
        *[f"- {_t(line)}" for line in range_lines(s["range_check"])],
        "",
        *framework_markdown(s.get("framework")),
    ]
    if s.get("config"):
        c = s["config"]
        entries = ", ".join(md_code(f"{k}={v}") for k, v in (c.get("config_entries") or {}).items()) or "none"
        disabled = ", ".join(md_code(n) for n in c.get("disabled_optimizers") or []) or "none"
        parts += [
            "## Fused engine vs baseline",
            f"engine {md_code(s['engine'])}, level {md_code(c['level'])}, precision {md_code(c['precision'])}; "
            f"config entries: {entries}; disabled optimizers: {disabled}",
            "",
            *[f"- {md(str(k))}: {md(str(v))}" for k, v in s.get("engine_settings") or []],
            *([""] if s.get("engine_settings") else []),
            _md_table(
                ["output", "verdict", "max abs", "mean abs", "max rel", "cosine", "SNR dB", "failed criterion"],
                [[_t(n), "PASS" if o["passed"] else "FAIL", fmt(o["metrics"]["max_abs"]),
                  fmt(o["metrics"]["mean_abs"]), fmt(o["metrics"]["max_rel"]),
                  cos_text(o["metrics"]["cosine"]), fmt(o["metrics"]["snr_db"]),
                  "" if o["passed"] else _t(o["summary"])] for n, o in s["outputs"].items()],
            ),
            "",
        ]
        parts += arbiter_markdown(s.get("arbiter"))
        sens_line = sensitivity_text(s.get("sensitivity"))
        if sens_line:
            parts += [_t(sens_line), ""]
        plots = dict(s.get("plots") or {})
        from bisect_tui.core.plots import PROFILE_FILE

        profile = plots.pop(PROFILE_FILE, None)
        sh = s.get("shared_tensors") or {}
        if sh:
            first = sh.get("first_failing_tensor")
            parts += [f"Tensors inside the fused graph: {sh.get('failing', 0)} of {sh.get('tensors_compared', 0)} "
                      "out of tolerance" + (f", the first in topological order: {md_code(first)}" if first else ""), ""]
        if profile:
            parts += [_image("error along the graph: each tensor's error / tolerance in topological order, "
                             "log scale", profile),
                      f"*{md(Path(profile).name)}: each tensor's error as a multiple of the tolerance, in "
                      "topological order (log scale); the dashed line is the tolerance, the orange line the "
                      "first crossing, triangles the culprit's tensors.*", ""]
        for name, path in plots.items():
            parts += [_image(f"{name}: baseline vs fused values and error", path),
                      f"*{md(Path(path).name)}: {md(name)}, baseline and fused values overlaid (left), "
                      "the error's distribution (right).*", ""]
        if s["fused_nodes"]:
            nodes = s["fused_nodes"]
            parts += [
                f"### Fused nodes ({len(nodes)})",
                _md_table(
                    ["fused node", "op", "original nodes", "optimizers"],
                    [[_c(n["name"]), _t(n["op_type"]), _t(", ".join(n["original_nodes"])),
                      _t(", ".join(n["optimizers"]) or "-")] for n in nodes[:MAX_TABLE_ROWS]],
                ),
            ]
            if len(nodes) > MAX_TABLE_ROWS:
                parts.append(f"\n{len(nodes) - MAX_TABLE_ROWS} more fused node(s) not shown: all {len(nodes)} "
                             "are in report.json under `fused_nodes`.")
            parts.append("")
    parts.append(f"**Verdict: {VERDICT_TEXT[s['verdict']]}** (exit code {s['exit_code']})")
    return "\n".join(parts) + "\n"


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


BISECT_VERDICT = {
    "pass": "nothing to find: the fused engine is within tolerance",
    "culprits": "culprit(s) found",
    "not_fusion": "the error is not caused by a fusion that marking can switch off",
    "no_culprit": "no single fused node could be blamed",
}


def culprit_lines(c: dict, i: int) -> list[str]:
    iso = c["isolated"]
    if c.get("kind") in ("build_error", "run_error") and not c.get("fused_node"):
        what = "does not build" if c["kind"] == "build_error" else "fails while running"
        return [
            f"culprit {i} ({c['kind']}): the fused engine {what}: {term(c['engine_error']['message'])}",
            f"  caused by the precision of original node(s): {term(', '.join(c['original_nodes']))} "
            f"({term(c['op_type'])}); kept in FP32 the engine builds and passes (see keep-set)",
        ]
    lines = [
        f"culprit {i}: {term(c['op_type'])} '{term(c['fused_node'])}'"
        + (" (an interaction: these fusions fail only together)" if c["interaction"] else "")
        + (f" [{c['kind']}]" if c.get("kind") in ("build_error", "run_error") else ""),
        f"  replaces original nodes: {', '.join(term(n) for n in c['original_nodes'])}",
        f"  made by optimizer(s): {term(', '.join(c['optimizers'])) or _no_pass_text(c) or 'unknown'}"
        + (" (confirmed: disabling removes the fused node)" if c["attribution"]["confirmed"] else "")
        + (f"; found by {term(c['attribution']['how'])}" if (c["attribution"].get("group_test") or {}).get("found")
           else ""),
    ]
    gt = c["attribution"].get("group_test") or {}
    if gt.get("engine_log_modified"):
        lines.append(f"  ORT's own log, passes that modified the subgraph: {', '.join(gt['engine_log_modified'])}"
                     + (" (agrees)" if gt.get("engine_log_agrees") else
                        f" ({gt['engine_log_note']})" if gt.get("engine_log_note") else
                        " (does not list the pass found)" if gt.get("found") else ""))
    if c.get("exposed_by"):
        lines.insert(1, f"  exposed by disabling {', '.join(c['exposed_by'])}: another pass then fuses "
                        "these nodes just as wrongly")
    if c.get("engine_error"):
        lines.insert(1, f"  the engine's message: {term(c['engine_error']['message'])}")
    if iso.get("build_error"):
        lines.append(f"  in isolation the fused subgraph does not even build: {term(iso['build_error'])}")
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
    if c.get("amplified"):
        lines.append("  note: in isolation this fused op is no further from the float64 truth than the unfused "
                     "FP32 ops; its error is FP32 rounding that the rest of the model amplifies")
    if c["worst_elements"]:
        w = c["worst_elements"][0]
        truth, unfused, fused = distinct([w["truth"], w["unfused"], w["fused"]])
        lines.append(f"  worst element {w['index']}: truth {truth}, unfused {unfused}, fused {fused}")
    return lines


def bisect_text(s: dict) -> str:
    b = s["bisect"]
    lines = []
    lines.append(f"bisection: {BISECT_VERDICT[b['verdict']]} ({b['engine_builds']} engine builds"
                 + (f" this run, {b['reused_steps']} steps reused from the session" if b.get("reused_steps") else "")
                 + f", searched at level {b.get('level')}, {len(b.get('units', []))} fused nodes)")
    if b.get("untrusted_steps"):
        lines.append(f"  {b['untrusted_steps']} saved step(s) failed their digest check and were recomputed")
    for st in b["steps"]:
        lines.append(f"  {st['n']:>3} {term(st['kind'])[:30]:<30} {term(st['region'])[:32]:<32} "
                     f"{'pass' if st['passed'] else 'FAIL'} x{fmt(st['ratio'])}")
    rp = b.get("rest_proven_by")
    if rp:
        lines.append(f"  the other fusions pass together: shown by step {rp['step']} ({term(rp['kind'])}, "
                     f"x{fmt(rp['ratio'])}), which holds every other fused node unchanged; no build of their own")
    for i, c in enumerate(b["culprits"], 1):
        lines += culprit_lines(c, i)
    if b.get("probe_agrees") is not None:
        lines.append("fused-graph probe: " + ("its own-error suspects match the culprits found by the search"
                     if b["probe_agrees"] else "its suspects differ from the search's culprits "
                     "(error amplified downstream or interactions); the search's builds decide"))
    w = b.get("workaround")
    if w and w.get("kind") == "disable_optimizers":
        fe = w["full_engine"]
        lines.append(f"workaround: disable {term(', '.join(w['disabled_optimizers']))} -> full engine passes "
                     f"(max_abs {fmt(fe['max_abs'])}); {term(w['how'])}")
    elif w and w.get("kind") == "mark_outputs":
        lines.append(f"workaround: {term(w['how'])}")
    elif w and w.get("best_effort"):
        be = w["best_effort"]
        lines.append(f"workaround: disable {term(', '.join(be['disabled_optimizers']))} -> the full engine goes "
                     f"from x{fmt(be['ratio_before'])} to x{fmt(be['ratio'])} of tolerance; it still fails because "
                     f"{term(be['why_not_passing'])}")
    elif w:
        lines.append(f"workaround: none found ({term(w['how'])})")
    if b.get("explanation"):
        lines.append(term(b["explanation"]))
    lines += region_lines(b.get("region_isolation"))
    lj = b.get("local_judgement")
    if lj:
        from bisect_tui.core.bisect.local_judgement import summary_line

        lines.append(summary_line(lj))
        for r in sorted((r for r in lj["units"] if r.get("ratio") is not None), key=lambda r: -r["ratio"])[:5]:
            lines.append(f"  {term(r['op_type'])} '{term(r['fused_node'])}': fused error {fmt(r['ratio'])}x the "
                         f"FP32 error -> {r['verdict']}")
    lines += evidence_lines(b.get("evidence"))
    lines += precision_lines(b.get("precision"))
    if b.get("stopped_reason"):
        lines.append(term(b["stopped_reason"]))
    return "\n".join(lines)


def bisect_title(b: dict) -> str:
    words = BISECT_VERDICT.get(b["verdict"], b["verdict"])
    names = "; ".join(f"{c['op_type']} ({', '.join(c['optimizers']) or 'optimizer unknown'})"
                      for c in b.get("culprits") or [])
    return f"# bisect-tui bisect: {md(words)}" + (f": {md(names)}" if names else "")


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


def _no_pass_text(c: dict) -> str:
    """The attribution's own words when the engine has no pass switches."""
    how = (c.get("attribution") or {}).get("how") or ""
    return how if how.startswith("not attributed to a pass") else ""


def precision_used_line(s: dict) -> str:
    """The precision the compiled engine really ran (engines choose their own: OpenVINO picks bf16 by
    default on a CPU with AVX-512 BF16); empty when it is what was asked and the engine's default agrees."""
    pu = s.get("precision_used") or {}
    if not pu or (pu.get("used") == pu.get("asked") and pu.get("engine_default") in (None, pu.get("asked"))):
        return ""
    line = f"precision: asked {pu.get('asked')}, the compiled engine runs {pu.get('used')}"
    if pu.get("used") != pu.get("asked"):
        line += " (NOT what was asked: the comparison is of another precision)"
    if pu.get("engine_default") and pu["engine_default"] != pu.get("asked"):
        line += (f"; without an explicit precision this engine would run {pu['engine_default']} here, "
                 "so a plain run of it is not the precision you may think")
    return line


def precision_lines(p) -> list[str]:
    if not p:
        return []
    if p.get("kind") == "precision_setting":
        verdict = "passes" if p.get("passed") else "still fails"
        return [f"precision setting: the full engine rebuilt in {p['precision'].upper()} {verdict} "
                f"(x{fmt(p.get('ratio'))} of tolerance)" + (f"; setting: {term(p['setting'])}" if p.get("setting") else ""),
                "  (this engine cannot keep single nodes in high precision, so no keep-set is searched)"]
    if not p.get("passed"):
        return [f"keep-set: none found in {p['builds']} builds ({p.get('explanation', 'see steps')})"]
    m = p["metrics"]
    return [
        f"keep-set: keep {len(p['keep_fp32'])} of {p['candidates']} original node(s) in FP32 -> full engine "
        f"passes (x{fmt(m['ratio'])} of tolerance, max_abs {fmt(m['max_abs'])}); {p['builds']} builds",
        f"  nodes: {term(', '.join(p['keep_fp32']))}",
        f"  setting: {term(p['setting'])}",
        f"  bisect-tui: {term(p['cli'])}",
    ]


def bisect_markdown(s: dict, base: Optional[Path] = None) -> str:
    b = s["bisect"]
    parts = [check_markdown(s, title=bisect_title(b), base=base, command="bisect").rstrip().rsplit("\n**Verdict", 1)[0],
             "",
             f"## Bisection: {BISECT_VERDICT[b['verdict']]}",
             f"{b['engine_builds']} engine builds, searched at optimization level {md_code(b.get('level'))} "
             f"over {len(b.get('units', []))} fused nodes.", ""]
    if b["culprits"]:
        parts += ["### Culprits", _md_table(
            ["#", "fused node", "op", "original nodes", "optimizer(s)", "isolated max abs (fused vs unfused)",
             "error vs float64 (fused / FP32)"],
            [[i, _c(c['fused_node']), _t(c["op_type"]), ", ".join(_c(n) for n in c["original_nodes"]),
              _t(", ".join(c["optimizers"]) or "?"),
              _iso_abs(c["isolated"]), _ratio_text(next(iter(c["isolated"]["outputs"].values()), {}))]
             for i, c in enumerate(b["culprits"], 1)]), ""]
        for i, c in enumerate(b["culprits"], 1):
            parts += [f"#### Culprit {i}: evidence in isolation", *_fenced(culprit_lines(c, i)), ""]
            if c["worst_elements"]:
                parts += [_md_table(["index", "float64 truth", "unfused FP32", "fused"],
                                    [[_t(w["index"]), *distinct([w["truth"], w["unfused"], w["fused"]])]
                                     for w in c["worst_elements"]]), ""]
    if b.get("explanation"):
        parts += [_t(b["explanation"]), ""]
    if b.get("region_isolation"):
        parts += ["### Regions judged alone (marking did not block their fusions)",
                  *_fenced(region_lines(b["region_isolation"])), ""]
    if b.get("stopped_reason"):
        parts += [f"**Stopped early:** {_t(b['stopped_reason'])}", ""]
    lj = b.get("local_judgement")
    if lj:
        from bisect_tui.core.bisect.local_judgement import summary_line

        rows = sorted((r for r in lj["units"] if r.get("ratio") is not None), key=lambda r: -r["ratio"])
        parts += ["### Local judgement (each fused node alone vs float64)", summary_line(lj), "",
                  _md_table(["fused node", "op", "fused / FP32 error", "verdict"],
                            [[_c(r["fused_node"]), md(r["op_type"]), fmt(r["ratio"]), r["verdict"]]
                             for r in rows[:30]]), ""]
    if (b.get("evidence") or {}).get("node"):
        parts += ["### Where the error starts", *_fenced(evidence_lines(b["evidence"])), ""]
    p = b.get("precision")
    if p:
        title = "Precision setting" if p.get("kind") == "precision_setting" else "Keep-set: nodes to keep in FP32"
        parts += [f"### {title}", *_fenced(precision_lines(p)), ""]
        if p.get("seeds"):
            parts += [_md_table(["seed", "why"], [[_c(r["node"]), md(r["why"])] for r in p["seeds"]]), ""]
    parts += ["### Steps", _md_table(
        ["step", "kind", "region", "marked", "builds", "x tolerance", "max abs", "verdict"],
        [[st["n"], _t(st["kind"]), _t(st["region"]), st["marks"], st["builds"], fmt(st["ratio"]), fmt(st["max_abs"]),
          "pass" if st["passed"] else "FAIL"] for st in b["steps"]]), ""]
    rp = b.get("rest_proven_by")
    if rp:
        parts += [f"The other fusions pass together: step {rp['step']} ({_t(rp['kind'])}, x{fmt(rp['ratio'])} of the "
                  "tolerance) holds every other fused node unchanged, so they need no build of their own.", ""]
    w = b.get("workaround")
    if w:
        parts.append("### Workaround")
        if w.get("kind") == "disable_optimizers":
            fe = w["full_engine"]
            parts.append(f"Disable {md_code(', '.join(w['disabled_optimizers']))}: the full engine then passes "
                         f"(max abs {fmt(fe['max_abs'])}, {fe.get('fused_nodes')} fused nodes kept). "
                         f"{md_code(w['how'])}")
        else:
            parts.append(_t(w["how"]))
        parts.append("")
    # shell lines: every name quoted, so copying them never runs anything else
    parts += ["### How to reproduce", *_fenced([
              "unzip bundle.zip && python repro/repro.py        # exits 1 while the bug is present",
              *(["python repro/repro.py " + " ".join(f"--disable {shlex.quote(n)}" for n in w["disabled_optimizers"])
                 + "   # exits 0 with the workaround"] if w and w.get("disabled_optimizers") else [])]),
              "", f"**Verdict: {_t(BISECT_VERDICT.get(b['verdict'], b['verdict']))}**"]
    return "\n".join(parts) + "\n"


def _ratio_text(o: dict) -> str:
    if "error_ratio" not in o:
        return "-"
    return f"{fmt(o['fused_vs_truth']['max_abs'])} / {fmt(o['unfused_vs_truth']['max_abs'])} ({fmt(o['error_ratio'])}x)"


def _iso_abs(iso: dict) -> str:
    if iso.get("build_error"):
        return "build fails"
    first = next(iter(iso["outputs"].values()), None)
    return fmt(first["fused_vs_unfused"]["max_abs"]) if first else "-"


# --- PyTorch front end and float64 arbiter ------------------------------------------------


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KB" if n < (1 << 20) else _mb(n)


def _coverage_text(cov: dict) -> str:
    text = (f"{cov['mapped_modules']} of {cov['modules']} modules mapped to ONNX tensors "
            f"({cov['by_metadata']} outputs by export metadata, {cov['by_value']} by value); "
            f"{cov['unmapped']} output(s) unmapped")
    return text


def framework_lines(fw: dict | None) -> list[str]:
    """Terminal lines for the torch front end; model names pass through term()."""
    if not fw:
        return []
    ex = fw["export"]
    out = [f"pytorch: {term(fw['spec'])} exported with the {ex['exporter']} exporter "
           f"(torch {ex['torch_version']}, opset {ex['opset']}; traced with {ex['traced_with']})"]
    if ex.get("fallback_reason"):
        out.append(f"  dynamo exporter not used: {term(ex['fallback_reason'])}")
    g = fw["golden"]
    out.append(f"golden data: {g['tensors']} module outputs (PyTorch FP32, eval mode, forward hooks), "
               f"{_size(g['bytes'])}, " + ("bit-identical over two runs" if g["deterministic"] else
                                          f"{len(g['differing'])} differ between two runs"))
    cc = fw["crosscheck"]
    cov = cc["coverage"]
    out.append("export cross-check: " + _coverage_text(cov))
    for key, r in cov["unmapped_reasons"].items():
        mods = ", ".join(term(m) for m in r["modules"][:6]) + (" ..." if len(r["modules"]) > 6 else "")
        out.append(f"  unmapped ({len(r['modules'])}): {mods}: {r['why']}")
    if cc["passed"]:
        out.append(f"  every mapped output matches PyTorch within {tolerance_text({'default': cc['tolerance']})}")
    else:
        f = cc["first_failing"]
        out.append(f"  [FAIL] {cc['failing']} mapped output(s) differ from PyTorch; first: module "
                   f"{term(f['module'])} ({term(f['type'])}) vs ONNX tensor {term(f['onnx_tensor'])}: "
                   f"max_abs {fmt(f['max_abs'])}, cosine {cos_text(f['cosine'])}")
    for p in fw["pitfalls"]:
        mark = {"found": "FOUND", "clear": "ok", "not_checked": "n/a"}[p["state"]]
        out.append(f"  pitfall [{mark}] {p['title']}: {term(p['detail'])}")
        if p["state"] == "found":
            out.append(f"      why: {p['why']}")
            out.append(f"      do: {p['what_to_do']}")
    return out


def arbiter_all_too_tight(s: dict) -> bool:
    """True when the arbiter ran and every output the tolerance fails is not worse than FP32."""
    arb = s.get("arbiter") or {}
    failing = s.get("failing_outputs") or []
    outs = arb.get("outputs") or {}
    return bool(arb.get("available") and failing and all(n in outs and outs[n]["too_tight"] for n in failing))


def export_next_step(fw: dict) -> str:
    f = (fw.get("crosscheck") or {}).get("first_failing")
    if not f:
        return "make PyTorch's forward deterministic; no engine was judged"
    return (f"fix the export before judging any engine: module {term(f['module'])} is the first whose ONNX "
            f"tensor {term(f['onnx_tensor'])} differs from PyTorch (see the pitfalls above)")


def arbiter_lines(arb: dict | None) -> list[str]:
    if not arb:
        return []
    if not arb.get("available"):
        return [f"float64 arbiter: not run ({term(arb.get('reason'))})"]
    out = [f"float64 arbiter ({arb['truth_source']}): fused is 'not worse than FP32' when its RMSE vs float64 "
           f"is within {arb['factor']:g}x the FP32 baseline's"]
    if arb.get("note"):
        out.append(f"  ({term(arb['note'])})")
    for name, o in arb["outputs"].items():
        mark = "not worse" if o["not_worse"] else "WORSE"
        line = (f"  [{mark}] {term(name)}: vs float64 RMSE baseline {fmt(o['baseline']['rmse'])}, fused "
                f"{fmt(o['fused']['rmse'])} ({fmt(o['ratio'])}x); max_abs baseline {fmt(o['baseline']['max_abs'])}, "
                f"fused {fmt(o['fused']['max_abs'])}")
        if o.get("framework"):
            line += f"; PyTorch FP32 RMSE {fmt(o['framework']['rmse'])}"
        out.append(line)
        if not o["not_worse"] and o["tolerance_passed"] and arb.get("precision") not in ("fp16", "bf16"):
            out.append("         more error than FP32 itself, yet within the tolerance: it matters only if "
                       "your tolerance should be as tight as FP32's own error")
        if not o["not_worse"] and arb.get("precision") in ("fp16", "bf16"):
            out.append(f"         expected for a {arb['precision']} engine: its own rounding is far above FP32's; "
                       "the tolerance, not this ratio, says whether it is good enough")
        if o["too_tight"]:
            out.append("         the tolerance fails this output, yet the fused engine is as close to the truth as "
                       "FP32 itself: the tolerance is tighter than FP32's own error; loosen it")
    return out


def framework_markdown(fw: dict | None) -> list[str]:
    if not fw:
        return []
    ex = fw["export"]
    cc = fw["crosscheck"]
    cov = cc["coverage"]
    g = fw["golden"]
    parts = [
        "## PyTorch model and its export",
        f"- model: {md_code(fw['spec'])}, exported with the **{ex['exporter']}** exporter "
        f"(torch {md(ex['torch_version'])}, opset {ex['opset']}, traced with {md(ex['traced_with'])})",
    ]
    if ex.get("fallback_reason"):
        parts.append(f"- dynamo exporter not used: {md(ex['fallback_reason'])}")
    parts += [
        f"- golden data: {g['tensors']} module outputs from forward hooks (FP32, eval mode), {_size(g['bytes'])}, "
        + ("bit-identical over two runs" if g["deterministic"] else f"{len(g['differing'])} differ between two runs"),
        f"- export cross-check: {md(_coverage_text(cov))}; "
        + ("**every mapped output matches PyTorch**" if cc["passed"] else
           f"**{cc['failing']} mapped output(s) differ from PyTorch**"),
        "",
    ]
    if cov["unmapped_reasons"]:
        parts += [_md_table(["unmapped", "modules", "why"],
                            [[len(r["modules"]), ", ".join(_c(m) for m in r["modules"][:8])
                              + (" ..." if len(r["modules"]) > 8 else ""), md(r["why"])]
                             for r in cov["unmapped_reasons"].values()]), ""]
    bad = [m for m in cc["matches"] if m["passed"] is False][:20]
    if bad:
        parts += [_md_table(["golden file", "module", "type", "ONNX tensor", "max abs", "cosine"],
                            [[_c(m["name"]), _c(m["module"]), md(m["type"]), _c(m["onnx_tensor"]),
                              fmt(m["max_abs"]), cos_text(m["cosine"])] for m in bad]), ""]
    parts += ["### Golden-data pitfalls",
              _md_table(["pitfall", "state", "what was seen", "what to do"],
                        [[md(p["title"]), p["state"].replace("_", " "), md(p["detail"]),
                          md(p["what_to_do"]) if p["state"] == "found" else "-"] for p in fw["pitfalls"]]), ""]
    return parts


def arbiter_markdown(arb: dict | None) -> list[str]:
    if not arb:
        return []
    if not arb.get("available"):
        return [f"Float64 arbiter: not run ({md(arb.get('reason'))}).", ""]
    rows = []
    for name, o in arb["outputs"].items():
        rows.append([_c(name), "not worse than FP32" if o["not_worse"] else "**worse than FP32**",
                     fmt(o["baseline"]["rmse"]), fmt(o["fused"]["rmse"]), f"{fmt(o['ratio'])}x",
                     fmt(o["framework"]["rmse"]) if o.get("framework") else "-",
                     "FAIL (too tight)" if o["too_tight"] else ("PASS" if o["tolerance_passed"] else "FAIL")])
    return [
        "### Float64 arbiter",
        f"Truth: {md(arb['truth_source'])}. The fused result is *not worse than FP32* when its RMSE against the "
        f"truth is within {arb['factor']:g}x the FP32 baseline's (PyTorch minifier and msprobe use the same rule).",
        "",
        _md_table(["output", "arbiter", "baseline RMSE vs float64", "fused RMSE vs float64", "ratio",
                   "PyTorch FP32 RMSE", "tolerance"], rows),
        "",
    ]
