"""The check's sections as data, computed once from the check's records: what
each says (verdict words, rows of numbers, notes), not how it is laid out. The
terminal text and the Markdown report render the same sections, and the app's
step views show the same lines, from the same records.

report.json's dict becomes a `Summary` once, where a renderer is handed it
(`summary_of`), and the result under its `bisect` key a `BisectResult`; the
sections read the records' attributes.

Model- and user-supplied names in `lines` and `notes` are already made safe
for a terminal (term()); cells of a `Table` are raw, each renderer escapes them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from bisect_tui.core.bisect.records import result_of
from bisect_tui.core.escape import term
from bisect_tui.core.report.words import cos_text, fmt, mb, passes_of
from bisect_tui.core.triage.records import ArbiterResult, CheckResult, DeterminismResult, RangeCheck, Summary


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class Section:
    """One part of a report: a title, prose lines, an optional table and notes."""

    title: str
    lines: tuple[str, ...] = ()
    table: Optional[Table] = None
    notes: tuple[str, ...] = ()
    data: dict = field(default_factory=dict)  # the values the renderers word differently


def summary_of(s: Union[Summary, Mapping[str, Any]]) -> Summary:
    """The report's one conversion from JSON: its callers hand report.json's dict
    (as written, or read back from a session); the keys beside the summary's
    (`bisect`, `plots`, `_bundle`) stay in its `extra`, the result under `bisect`
    as its BisectResult (an empty one as None). This view is rendered, never
    written: report.json is the dict the caller holds."""
    s = s if isinstance(s, Summary) else Summary.from_json(s)
    if not isinstance(s.extra.get("bisect"), Mapping):
        return s
    return dataclasses.replace(s, extra={**s.extra, "bisect": result_of(s.extra["bisect"])})


# --- baseline checks --------------------------------------------------------------------


def determinism_line(det: Optional[DeterminismResult]) -> str:
    if det is None or det.skipped:
        return "determinism: skipped (--no-determinism)"
    if det.deterministic:
        how = det.second_run or {}
        parts = f" (the second in {how['parts']} parts)" if how.get("parts") and "control" in how else ""
        return f"determinism: OK, {det.tensors_compared} tensors bit-identical over two fresh runs{parts}"
    f = det.first
    return (f"determinism: FAILED, {len(det.differing)} tensor(s) differ; first: {term(f['tensor'])} "
            f"(node {term(f['node'])}, {term(f['op_type'])})")


def range_lines(rc: Optional[RangeCheck]) -> list[str]:
    if rc is None:
        return []
    out = []
    if rc.nan_inf:
        o = rc.nan_inf_origin
        where = (f"; starts at {term(o['tensor'])} ({term(o['op_type'])} node {term(o['node'])}) whose inputs "
                 "are finite" if o else "")
        out.append(f"range: NaN/Inf in {len(rc.nan_inf)} tensor(s){where}")
    else:
        out.append("range: no NaN/Inf in the baseline")
    f16 = rc.fp16
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
    if rc.bf16["overflow"]:
        out.append(f"bf16: {len(rc.bf16['overflow'])} tensor(s) overflow BF16")
    for v in rc.user_ranges:
        out.append(f"range: {term(v['tensor'])} spans [{fmt(v['min'])}, {fmt(v['max'])}] outside {v['range']}")
    return out


def range_warnings(rc: Optional[RangeCheck]) -> list[str]:
    """The range findings that pass the check yet need reading: a reduced-precision
    engine will overflow (FP16, BF16) or flush values to zero (FP16), or a tensor
    leaves the range the user gave.
    The app shows the range step as a warning, not a plain pass, when there are any."""
    if rc is None:
        return []
    return [line for line in range_lines(rc)
            if line.startswith(("fp16 underflow: ", "bf16: ")) or
            (line.startswith(("fp16 headroom: ", "range: ")) and ("will overflow" in line or "outside" in line))]


def baseline_how(manifest_options: Optional[dict]) -> str:
    """How the baseline ran, in the reference's own words as its manifest keeps
    them (its optimization level, precision, CPU)."""
    o = manifest_options or {}
    return ", ".join(str(x) for x in (o.get("optimization"), str(o.get("precision", "fp32")).upper(), "CPU") if x)


def manifest_options(s: Summary) -> Optional[dict]:
    """The baseline manifest's options (how the reference ran), read from the
    session's baseline folder; None when the folder is not on this machine."""
    import json

    b = s.baseline or {}
    if isinstance(b.get("options"), dict):  # the summary carries them (sessions since this key)
        return b["options"]
    folder = b.get("dir")
    if not folder:
        return None
    try:
        return json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8")).get("options")
    except (OSError, ValueError, AttributeError):
        return None


def baseline_section(s: Summary) -> Section:
    b = s.baseline
    return Section("Baseline checks", data={
        "tensors": b["tensors"], "size": mb(b["bytes"]), "reused": b["reused"], "groups": b.get("groups"),
        "recomputed": len(b.get("recomputed") or []), "memory_warning": b.get("memory_warning"),
        "how": baseline_how(manifest_options(s)),
    }, lines=(determinism_line(s.determinism), *range_lines(s.range_check)))


# --- the fused engine against the baseline ----------------------------------------------


def engine_section(c: CheckResult) -> Section:
    """The engine and its settings as the comparison ran them; `lines` are the
    engine's own describe() rows, kept in report.json."""
    cfg = c.config
    return Section("Fused engine vs baseline", data={
        "engine": c.engine, "level": cfg["level"], "precision": cfg["precision"],
        "entries": list((cfg.get("config_entries") or {}).items()), "disabled": passes_of(cfg),
        "fused_nodes": len(c.fused_nodes),
    }, table=Table(("label", "value"), tuple(tuple(row) for row in c.engine_settings or ())))


def outputs_section(c: CheckResult) -> Section:
    rows = []
    for name, o in c.outputs.items():
        m = o.metrics
        decided = [note for note in (o.verdict or {}).get("skipped", [])
                   if "essentially zero" in note]  # which criterion decided when cosine was set aside
        rows.append((name, o.passed, m["max_abs"], m["mean_abs"], m["max_rel"], m["cosine"], m["snr_db"],
                     "" if o.passed else o.summary, tuple(decided)))
    return Section("Outputs", table=Table(
        ("output", "verdict", "max abs", "mean abs", "max rel", "cosine", "SNR dB", "failed criterion",
         "decided by"), tuple(rows)))


def output_line(row: tuple) -> str:
    name, passed, max_abs, mean_abs, max_rel, cosine, snr, summary, decided = row
    line = (f"  [{'PASS' if passed else 'FAIL'}] {term(name)}: max_abs {fmt(max_abs)}, mean_abs {fmt(mean_abs)}, "
            f"max_rel {fmt(max_rel)}, cosine {cos_text(cosine)}, snr {fmt(snr)} dB")
    if not passed:
        line += f"\n         {term(summary)}"
    for note in decided:
        line += f"\n         decided by atol/rtol: {term(note)}"
    return line


def shared_section(c: CheckResult) -> Optional[Section]:
    """The tensors the fused graph still has, compared with the baseline's."""
    sh = c.shared_tensors
    if not sh:
        return None
    first = sh.get("first_failing_tensor")
    maker = next((n for n in c.fused_nodes if first in n["outputs"]), None) if first else None
    return Section("Tensors inside the fused graph", data={
        "first": first, "failing": sh.get("failing", 0), "compared": sh.get("tensors_compared", 0),
        "maker": (maker["op_type"], maker["name"]) if maker else None})


def precision_used_line(c: CheckResult) -> str:
    """The precision the compiled engine really ran (an engine may choose its own
    by default, e.g. bf16 on a CPU with AVX-512 BF16); empty when it is what was
    asked and the engine's default agrees."""
    pu = c.precision_used or {}
    if not pu or (pu.get("used") == pu.get("asked") and pu.get("engine_default") in (None, pu.get("asked"))):
        return ""
    line = f"precision: asked {pu.get('asked')}, the compiled engine runs {pu.get('used')}"
    if pu.get("used") != pu.get("asked"):
        line += " (NOT what was asked: the comparison is of another precision)"
    if pu.get("engine_default") and pu["engine_default"] != pu.get("asked"):
        line += (f"; without an explicit precision this engine would run {pu['engine_default']} here, "
                 "so a plain run of it is not the precision you may think")
    return line


# --- the float64 arbiter ----------------------------------------------------------------


def arbiter_section(arb: Optional[ArbiterResult]) -> Optional[Section]:
    """Each output against the float64 truth; `notes` per row say what a WORSE
    or a too-tight verdict means for this precision."""
    if arb is None:
        return None
    if not arb.available:
        return Section("Float64 arbiter", data={"available": False, "reason": arb.reason})
    j = arb.judged
    rows, notes = [], []
    for name, o in arb.outputs.items():
        rows.append((name, o["not_worse"], o["baseline"]["rmse"], o["fused"]["rmse"], o["ratio"],
                     o["framework"]["rmse"] if o.get("framework") else None,
                     o["too_tight"], o["tolerance_passed"], o["baseline"]["max_abs"], o["fused"]["max_abs"],
                     o.get("floor") if o.get("floored") else None, o.get("verdict") == "unverified"))
        row_notes = []
        if o.get("unverified"):
            row_notes.append(o["unverified"] + "; no not-worse verdict on an unverified truth")
        if o.get("verdict") == "unverified":
            pass
        elif not o["not_worse"] and o["tolerance_passed"] and j.get("precision") not in ("fp16", "bf16"):
            row_notes.append("more error than FP32 itself, yet within the tolerance: it matters only if "
                             "your tolerance should be as tight as FP32's own error")
        if not o["not_worse"] and j.get("precision") in ("fp16", "bf16") and o.get("verdict") != "unverified":
            row_notes.append(f"expected for a {j['precision']} engine: its own rounding is far above FP32's; "
                             "the tolerance, not this ratio, says whether it is good enough")
        if o["too_tight"]:
            row_notes.append("the tolerance fails this output, yet the fused engine is as close to the truth as "
                             "FP32 itself: the tolerance is tighter than FP32's own error; loosen it")
        notes.append(tuple(row_notes))
    return Section("Float64 arbiter", table=Table(
        ("output", "arbiter", "baseline RMSE vs float64", "fused RMSE vs float64", "ratio",
         "PyTorch FP32 RMSE", "tolerance"), tuple(rows)), notes=tuple(notes),
        data={"available": True, "truth_source": j["truth_source"], "factor": j["factor"],
              "note": j.get("note"), "has_framework": [bool(o.get("framework")) for o in arb.outputs.values()],
              "reference": reference_check_line(j.get("reference_check"))})


def reference_check_line(rc: dict | None) -> Optional[str]:
    """How the truth proved itself against the FP32 baseline, in one line (None: no record)."""
    if not rc:
        return None
    if not rc.get("checked"):
        return f"truth not checked tensor by tensor ({rc.get('why') or 'no FP32 values'})"
    head = f"truth checked against the FP32 baseline: {rc.get('tensors_compared', 0)} tensors"
    for p in rc.get("parted") or ():
        where = f"{p['tensor']} ({p['op_type']}, node {p['node']}): {fmt(p['max_abs'])} off on a scale of {fmt(p['scale'])}"
        if p.get("outcome") == "fp32_own":
            head += (f"; FP32 parts from two float64 kernels at {where}: FP32's own rounding there "
                     "(the truth stands)")
            continue
        head += f"; the evaluator parts from FP32 at {where}"
        if p.get("outcome") == "known":
            head += f" ({p['why']})"
        if p.get("fallback"):
            more = p.get("same_type_nodes") or 0
            head += f", replaced by {p['fallback']}" + (f" (and at {more} more {p['op_type']} nodes)" if more else "")
        else:
            head += ", and no fallback agrees"
    at = rc.get("unreliable_at")
    if at:
        return head + f"; reference unreliable at op {at['tensor']} ({at['op_type']}, node {at['node']})"
    if rc.get("outputs") and not all(o["within"] for o in rc["outputs"].values()):
        return head + "; an output's baseline error vs the truth is beyond FP32 rounding: truth unverified"
    return head + "; agrees within FP32 rounding"


def arbiter_lines(arb: Optional[ArbiterResult]) -> list[str]:
    sec = arbiter_section(arb)
    if sec is None:
        return []
    d = sec.data
    if not d["available"]:
        return [f"float64 arbiter: not run ({term(d['reason'])})"]
    out = [f"float64 arbiter ({d['truth_source']}): fused is 'not worse than FP32' when its RMSE vs float64 "
           f"is within {d['factor']:g}x the FP32 baseline's"]
    if d["note"]:
        out.append(f"  ({term(d['note'])})")
    if d.get("reference"):
        out.append(f"  ({term(d['reference'])})")
    for row, notes, has_fw in zip(sec.table.rows, sec.notes, d["has_framework"]):
        name, not_worse, base_rmse, fused_rmse, ratio, fw_rmse, _, _, base_abs, fused_abs, floor, unverified = row
        tag = "no verdict" if unverified else ("not worse" if not_worse else "WORSE")
        line = (f"  [{tag}] {term(name)}: vs float64 RMSE baseline "
                f"{fmt(base_rmse)}, fused {fmt(fused_rmse)} ({ratio_words(ratio, floor)}); max_abs baseline "
                f"{fmt(base_abs)}, fused {fmt(fused_abs)}")
        if has_fw:
            line += f"; PyTorch FP32 RMSE {fmt(fw_rmse)}"
        out.append(line)
        out += [f"         {n}" for n in notes]
    return out


def ratio_words(ratio: float, floor: Optional[float]) -> str:
    """fused/baseline as printed, or fused/floor said as such (a baseline below one FP32 epsilon)."""
    if floor is None:
        return f"{fmt(ratio)}x"
    return f"{fmt(ratio)}x the FP32 floor {fmt(floor)}, which the baseline is below"
