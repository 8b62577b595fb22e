"""Local judgement: every fused unit in isolation, against a float64 truth.

In a model that amplifies rounding (the sensitivity check: a 1-ulp input
change already moves the outputs past the tolerance), the final outputs
cannot tell a wrong fusion from one that only reorders FP32 arithmetic: every
fusion breaks the tolerance there. Each unit's own subgraph, fed the
baseline's own tensors, can: a fused op whose error against float64 is many
times the unfused FP32 ops' error is wrong; one within a small factor only
reorders rounding. The same ranking seeds the search.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from bisect_tui.core.baseline_store import load_tensor, manifest_index
from bisect_tui.core.bisect.isolate import extract_subgraph, float64_truth
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.cancel import Progress
from bisect_tui.core.errors import EngineBuildError
from bisect_tui.core.groups import open_session
from bisect_tui.core.external_data import write_beside

# a fused unit is wrong when its error vs float64 exceeds the unfused FP32
# error by this factor (reordering FP32 arithmetic stays within ~1-3x)
LOCAL_FACTOR = 10.0


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    """RMS error of `a` against the truth `b`; inf when `a` is NaN/Inf where `b` is finite."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if np.any(np.isfinite(b64) & ~np.isfinite(a64)):
        return math.inf
    d = a64 - b64
    return float(np.sqrt(np.mean(d * d))) if d.size else 0.0


def _verdict(row: dict, fused_err: float, unfused_err: float, scale: float, factor: float) -> dict:
    # exact ops (Relu) have no FP32 error at all: measure against one FP32 ulp of the values
    floor = max(unfused_err, 6e-8 * scale, 1e-30)
    ratio = fused_err / floor if math.isfinite(floor) else (1.0 if not math.isfinite(fused_err) else 0.0)
    return {**row, "fused_vs_truth_rmse": fused_err, "unfused_vs_truth_rmse": unfused_err,
            "ratio": ratio, "verdict": "worse" if ratio > factor else "reorders rounding only"}


def _summary(rows: list[dict], factor: float, how: str) -> dict:
    ranked = sorted((r for r in rows if r.get("ratio") is not None), key=lambda r: -r["ratio"])
    return {
        "factor": factor,
        "how": how,
        "units": rows,
        "ranking": [r["unit"] for r in ranked],
        "worse": [r["unit"] for r in ranked if r["verdict"] == "worse"],
        "reorders_only": [r["unit"] for r in rows if r["verdict"] == "reorders rounding only"],
    }


def _types(triage) -> dict[str, tuple[str, list[int]]]:
    idx = manifest_index(triage.baseline.manifest)
    types: dict[str, tuple[str, list[int]]] = {}
    for name, arr in triage.inputs.arrays.items():
        types[name] = (arr.dtype.name, list(arr.shape[1:]))
    for t, e in idx.items():
        types[t] = (e["dtype"], e["shape"])
    return types


def judge_units(triage, units: list[Unit], config, out_dir: Path,
                factor: float = LOCAL_FACTOR) -> dict:
    """One row per unit: fused and unfused FP32 error against float64, their
    ratio, and the verdict ("worse" or "reorders rounding only").

    Batched: every unit's subgraph, its tensors renamed apart, goes into one
    model, so the whole judgement is three runs (unfused, fused, float64)
    instead of three per unit. The units share no tensor in that model, so
    the engine fuses each exactly as it would alone. If the batch cannot be
    built, each unit is judged on its own."""
    try:
        return _judge_batched(triage, units, config, out_dir, factor)
    except Exception as exc:  # noqa: BLE001 - the per-unit path reports each failure precisely
        res = _judge_each(triage, units, config, out_dir, factor)
        res["batch_failed"] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return res


def _judge_batched(triage, units: list[Unit], config, out_dir: Path, factor: float) -> dict:
    from onnx import compose, helper

    types = _types(triage)
    out_dir.mkdir(parents=True, exist_ok=True)
    nodes, inits, ins, outs = [], [], [], []
    feeds_of: dict[str, str] = {}  # batched input name -> baseline tensor
    for u in units:
        sub, sub_inputs = extract_subgraph(triage.info.model, u.original_nodes, u.outputs, types)
        pre = compose.add_prefix(sub, f"u{u.index}__")
        nodes += list(pre.graph.node)
        inits += list(pre.graph.initializer)
        ins += list(pre.graph.input)
        outs += list(pre.graph.output)
        for i in sub_inputs:
            feeds_of[f"u{u.index}__{i}"] = i
    graph = helper.make_graph(nodes, "local_judgement", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=list(triage.info.model.opset_import))
    model.ir_version = triage.info.model.ir_version
    path = out_dir / "units_batched.onnx"
    write_beside(model, path)
    triage.progress(Progress("local", f"judging {len(units)} fused nodes alone against float64 (one batch)"))
    feed = _baseline_feeder(triage)

    built = triage.engine.build(path, config, (), None)
    unfused = open_session(triage.reference, model)
    names = unfused.output_names()
    err = {u.index: [0.0, 0.0, 0.0] for u in units}
    try:
        for k in range(triage.inputs.samples):
            triage.cancel.check()
            feeds = {b: np.ascontiguousarray(feed(t)[k]) for b, t in feeds_of.items()}
            uo = dict(zip(names, unfused.run(names, feeds)))
            fo = built.run(feeds)
            truth, how = float64_truth(model, feeds, triage.reference)
            if truth is None:
                raise RuntimeError(how)
            for u in units:
                e = err[u.index]
                for o in u.outputs:
                    t = f"u{u.index}__{o}"
                    e[0] = max(e[0], _rmse(fo[t], truth[t]))
                    e[1] = max(e[1], _rmse(uo[t], truth[t]))
                    e[2] = max(e[2], float(np.sqrt(np.mean(np.square(truth[t].astype(np.float64))))))
    finally:
        built.close()
    rows = [_verdict({"unit": u.index, "fused_node": u.fused_node, "op_type": u.op_type,
                      "original_nodes": list(u.original_nodes)}, *err[u.index], factor) for u in units]
    res = _summary(rows, factor, "batched: every unit's subgraph side by side in one model, 3 runs")
    res["engine_builds"] = 1  # the fused build of the batch (plus one unfused session and the float64 run)
    return res


def _baseline_feeder(triage):
    """Graph inputs from the exact input set, other tensors from the baseline
    dump, each loaded once however many units read it."""
    cache: dict[str, np.ndarray] = {}

    def feed(name: str) -> np.ndarray:
        if name in triage.inputs.arrays:
            return triage.inputs.arrays[name]
        if name not in cache:
            cache[name] = np.asarray(load_tensor(triage.session, triage.baseline.manifest, name))
        return cache[name]

    return feed


def _judge_each(triage, units: list[Unit], config, out_dir: Path, factor: float) -> dict:
    types = _types(triage)
    out_dir.mkdir(parents=True, exist_ok=True)
    feed = _baseline_feeder(triage)

    rows = []
    for n, u in enumerate(units):
        triage.cancel.check()
        triage.progress(Progress("local", f"judging fused node {n + 1}/{len(units)} against float64", n, len(units)))
        row: dict = {"unit": u.index, "fused_node": u.fused_node, "op_type": u.op_type,
                     "original_nodes": list(u.original_nodes)}
        try:
            sub, sub_inputs = extract_subgraph(triage.info.model, u.original_nodes, u.outputs, types)
        except Exception as exc:  # noqa: BLE001 - a unit we cannot cut out is reported, not guessed
            rows.append({**row, "verdict": "not isolable", "why": str(exc).splitlines()[0][:160]})
            continue
        path = out_dir / f"unit_{u.index}.onnx"
        write_beside(sub, path)
        stacked = {i: np.asarray(feed(i)) for i in sub_inputs}
        try:
            built = triage.engine.build(path, config, (), None)
        except EngineBuildError as exc:
            rows.append({**row, "verdict": "worse", "ratio": math.inf, "why": f"fused subgraph does not build: {exc}"})
            continue
        unfused = open_session(triage.reference, sub)
        names = unfused.output_names()
        fused_err = unfused_err = scale = 0.0
        truth_how = ""
        try:
            for k in range(triage.inputs.samples):
                feeds = {i: np.ascontiguousarray(a[k]) for i, a in stacked.items()}
                uo = dict(zip(names, unfused.run(names, feeds)))
                fo = built.run(feeds)
                truth, truth_how = float64_truth(sub, feeds, triage.reference)
                if truth is None:
                    break
                for o in u.outputs:
                    fused_err = max(fused_err, _rmse(fo[o], truth[o]))
                    unfused_err = max(unfused_err, _rmse(uo[o], truth[o]))
                    scale = max(scale, float(np.sqrt(np.mean(np.square(truth[o].astype(np.float64))))))
        except EngineBuildError as exc:
            rows.append({**row, "verdict": "worse", "ratio": math.inf, "why": f"fused subgraph fails: {exc}"})
            continue
        finally:
            built.close()
        if truth is None:
            rows.append({**row, "verdict": "not isolable", "why": truth_how})
            continue
        rows.append(_verdict(row, fused_err, unfused_err, scale, factor))
    res = _summary(rows, factor, "one unit at a time")
    res["engine_builds"] = sum(1 for r in rows if r["verdict"] != "not isolable")
    return res


def summary_line(local: Optional[dict]) -> Optional[str]:
    if not local:
        return None
    return (f"local judgement ({len(local['units'])} fused nodes, each alone vs float64, factor "
            f"{local['factor']:g}): {len(local['worse'])} worse than FP32, "
            f"{len(local['reorders_only'])} reorder rounding only")


__all__ = ["LOCAL_FACTOR", "judge_units", "summary_line"]
