"""The PyTorch front end's section as data: the export, the golden data, the
cross-check of the export against PyTorch and the golden-data pitfalls."""

from __future__ import annotations

from typing import Optional

from bisect_tui.core.escape import term
from bisect_tui.core.report.sections import Section, Table
from bisect_tui.core.report.words import cos_text, fmt, size_text, tolerance_text
from bisect_tui.core.triage.records import FrameworkResult


def coverage_text(cov: dict) -> str:
    return (f"{cov['mapped_modules']} of {cov['modules']} modules mapped to ONNX tensors "
            f"({cov['by_metadata']} outputs by export metadata, {cov['by_value']} by value); "
            f"{cov['unmapped']} output(s) unmapped")


def framework_section(fw: Optional[FrameworkResult]) -> Optional[Section]:
    if fw is None:
        return None
    ex, g, cc = fw.export, fw.golden, fw.crosscheck
    runs = ("bit-identical over two runs" if g["deterministic"] else f"{len(g['differing'])} differ between two runs")
    return Section("PyTorch model and its export", table=Table(
        ("pitfall", "state", "what was seen", "what to do"),
        tuple((p["title"], p["state"], p["detail"], p["why"], p["what_to_do"]) for p in fw.pitfalls)),
        data={"spec": fw.spec, "export": ex, "golden": g, "runs": runs, "crosscheck": cc,
              "coverage": coverage_text(cc["coverage"]),
              "unmapped": [(r["modules"], r["why"]) for r in cc["coverage"]["unmapped_reasons"].values()],
              "mismatches": [m for m in cc["matches"] if m["passed"] is False][:20]})


def framework_lines(fw: Optional[FrameworkResult]) -> list[str]:
    """Terminal lines for the torch front end; model names pass through term()."""
    sec = framework_section(fw)
    if sec is None:
        return []
    d = sec.data
    ex, g, cc = d["export"], d["golden"], d["crosscheck"]
    out = [f"pytorch: {term(d['spec'])} exported with the {ex['exporter']} exporter "
           f"(torch {ex['torch_version']}, opset {ex['opset']}; traced with {ex['traced_with']})"]
    if ex.get("fallback_reason"):
        out.append(f"  dynamo exporter not used: {term(ex['fallback_reason'])}")
    out.append(f"golden data: {g['tensors']} module outputs (PyTorch FP32, eval mode, forward hooks), "
               f"{size_text(g['bytes'])}, " + d["runs"])
    out.append("export cross-check: " + d["coverage"])
    for modules, why in d["unmapped"]:
        mods = ", ".join(term(m) for m in modules[:6]) + (" ..." if len(modules) > 6 else "")
        out.append(f"  unmapped ({len(modules)}): {mods}: {why}")
    if cc["passed"]:
        out.append(f"  every mapped output matches PyTorch within {tolerance_text({'default': cc['tolerance']})}")
    else:
        f = cc["first_failing"]
        out.append(f"  [FAIL] {cc['failing']} mapped output(s) differ from PyTorch; first: module "
                   f"{term(f['module'])} ({term(f['type'])}) vs ONNX tensor {term(f['onnx_tensor'])}: "
                   f"max_abs {fmt(f['max_abs'])}, cosine {cos_text(f['cosine'])}")
    for title, state, detail, why, what in sec.table.rows:
        mark = {"found": "FOUND", "clear": "ok", "not_checked": "n/a"}[state]
        out.append(f"  pitfall [{mark}] {title}: {term(detail)}")
        if state == "found":
            out.append(f"      why: {why}")
            out.append(f"      do: {what}")
    return out
