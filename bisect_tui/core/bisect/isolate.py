"""Isolation and proof: the culprit's original nodes as a standalone model.

The subgraph is fed the baseline's *own* tensors (so nothing upstream is
involved) and run three ways: unfused FP32 (the triage's unfused reference,
as the baseline), fused (the engine config under test) and a float64 ground
truth (onnx's reference evaluator on a float64 copy). Only then can a report say whether the fused op
is really further from the truth than the unfused FP32 ops, and by how much.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
from onnx import helper

from bisect_tui.core import atomic
from bisect_tui.core.baseline_store import load_tensor, manifest_index
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.errors import EngineRunError, EnvironmentFault, UserError
from bisect_tui.core.graph import node_inputs
from bisect_tui.core.metrics import compare
from bisect_tui.core.reference import Float64Reference, UnfusedModel
from bisect_tui.core.tolerance import judge_arrays
from bisect_tui.core.external_data import write_beside

# the torch minifier's rule: an optimized result is "worse" when its error
# against float64 is more than twice the FP32 reference's
WORSE_FACTOR = 2.0


def extract_subgraph(model: onnx.ModelProto, node_names: list[str], outputs: list[str],
                     value_types: dict[str, tuple[str, list[int]]]) -> tuple[onnx.ModelProto, list[str]]:
    """The nodes `node_names` as a model: external tensors become inputs,
    initializers they use are copied, `outputs` are its outputs."""
    keep = set(node_names)
    nodes = [n for n in model.graph.node if n.name in keep]
    produced = {o for n in nodes for o in n.output if o}
    inits = {t.name: t for t in model.graph.initializer}
    inputs: list[str] = []
    used_inits: list[str] = []
    for n in nodes:
        for i in node_inputs(n):
            if i in produced or i in inputs or i in used_inits:
                continue
            (used_inits if i in inits else inputs).append(i)

    def vi(name: str) -> onnx.ValueInfoProto:
        dtype, shape = value_types[name]
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape
        )

    graph = helper.make_graph(
        nodes, "culprit", [vi(i) for i in inputs], [vi(o) for o in outputs],
        [inits[i] for i in used_inits],
    )
    sub = helper.make_model(graph, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    return sub, inputs


def value_types(triage) -> dict[str, tuple[str, list[int]]]:
    """dtype and per-sample shape of every graph input and dumped tensor."""
    types: dict[str, tuple[str, list[int]]] = {}
    for name, arr in triage.inputs.arrays.items():
        types[name] = (arr.dtype.name, list(arr.shape[1:]))
    for t, e in manifest_index(triage.baseline.manifest).items():
        types[t] = (e["dtype"], e["shape"])
    return types


def float64_truth(sub: onnx.ModelProto, feeds: dict[str, np.ndarray],
                  fallback=None) -> tuple[Optional[dict], str]:
    """The float64 reference (core/reference.py) on one sample of a subgraph,
    `fallback` (the unfused reference) in double where the evaluator cannot run
    it: (outputs, what computed them), or (None, why not)."""
    ref = Float64Reference(sub, fallback)
    names = [o.name for o in sub.graph.output]
    try:
        return ref.run(feeds, names), ref.ran_with or "float64"
    except UserError as exc:
        return None, f"no float64 truth: {str(exc)[:160]}"


def _worst(truth: np.ndarray, unfused: np.ndarray, fused: np.ndarray, k: int = 5) -> list[dict]:
    ref = truth if truth is not None else unfused
    err = np.abs(fused.astype(np.float64) - ref.astype(np.float64)).reshape(-1)
    err = np.where(np.isnan(err), np.inf, err)
    k = min(k, err.size)
    idx = np.argpartition(-err, k - 1)[:k] if k else []
    idx = sorted(idx, key=lambda i: -err[i])
    rows = []
    for i in idx:
        pos = [int(x) for x in np.unravel_index(i, fused.shape)]
        rows.append({
            "index": pos,
            "truth": float(truth.reshape(-1)[i]) if truth is not None else None,
            "unfused": float(unfused.reshape(-1)[i]),
            "fused": float(fused.reshape(-1)[i]),
            "fused_err": float(abs(float(fused.reshape(-1)[i]) - float(ref.reshape(-1)[i]))),
            "unfused_err": float(abs(float(unfused.reshape(-1)[i]) - float(ref.reshape(-1)[i]))),
        })
    return rows


def isolate(triage, units: list[Unit], config, out_dir: Path) -> dict:
    """Extract the culprit (one unit or an interacting set), run it three ways, judge."""
    info = triage.info
    node_names = [n for u in units for n in u.original_nodes]
    outputs = [t for u in units for t in u.outputs]
    types = value_types(triage)
    sub, sub_inputs = extract_subgraph(info.model, node_names, outputs, types)
    out_dir.mkdir(parents=True, exist_ok=True)
    sub_path = out_dir / "subgraph.onnx"
    write_beside(sub, sub_path)  # external data: linked beside it

    def feed_array(name: str) -> np.ndarray:
        if name in triage.inputs.arrays:
            return triage.inputs.arrays[name]
        return np.asarray(load_tensor(triage.session, triage.baseline.manifest, name))

    stacked = {i: np.asarray(feed_array(i)) for i in sub_inputs}
    samples = triage.inputs.samples
    unfused = UnfusedModel(triage.reference, sub)  # the baseline's own path, on the extracted region
    res_unfused, res_truth = [], []
    truth_how = ""
    for k in range(samples):
        feeds = {i: np.asarray(a[k], order="C") for i, a in stacked.items()}
        res_unfused.append(unfused.run(feeds, outputs))
        truth, truth_how = float64_truth(sub, feeds, triage.reference)
        res_truth.append(truth)
    atomic.save_npz(out_dir / "inputs.npz", stacked)
    atomic.save_npz(out_dir / "expected.npz", {o: np.stack([r[o] for r in res_unfused]) for o in outputs})
    if all(res_truth):
        atomic.save_npz(out_dir / "truth_float64.npz", {o: np.stack([r[o] for r in res_truth]) for o in outputs})
    base = {
        "subgraph": str(sub_path),
        "subgraph_inputs": sub_inputs,
        "subgraph_outputs": outputs,
        "nodes": node_names,
        "truth": truth_how,
    }
    try:
        built = triage.engine.build(sub_path, config, (), None)
    except EnvironmentFault:
        raise  # the machine failed, not the fusion
    except UserError as exc:
        # The subgraph alone does not even build fused: that is the evidence.
        return {**base, "fused_in_isolation": [], "build_error": str(exc), "reproduces": True,
                "fused_worse_than_fp32": None, "outputs": {}}
    try:
        fused_map = [f.to_dict() for f in built.fused_nodes if f.is_fused]
        res_fused = [built.run({i: np.asarray(a[k], order="C") for i, a in stacked.items()})
                     for k in range(samples)]
    except EngineRunError as exc:
        # built, then failed on the baseline's own tensors: the run error reproduced in isolation
        return {**base, "fused_in_isolation": fused_map, "run_error": exc.engine_message, "reproduces": True,
                "fused_worse_than_fp32": None, "outputs": {}}
    finally:
        built.close()
    tol = triage.opts.tolerance.default
    per_output = {}
    reproduces = False
    worse = False
    for o in outputs:
        U = np.stack([r[o] for r in res_unfused])
        F = np.stack([r[o] for r in res_fused])
        T = np.stack([r[o] for r in res_truth]) if all(res_truth) else None
        m_fu, v_fu = judge_arrays(U, F, tol)
        row = {
            "fused_vs_unfused": _brief(m_fu),
            "verdict": v_fu.summary(),
            "breaks_tolerance": not v_fu.passed,
            "worst_elements": _worst(T if T is not None else None, U, F),
        }
        if T is not None:
            m_ft = compare(T, F)
            m_ut = compare(T, U)
            row["fused_vs_truth"] = _brief(m_ft)
            row["unfused_vs_truth"] = _brief(m_ut)
            denom = max(m_ut["rmse"], 1e-30)
            row["error_ratio"] = m_ft["rmse"] / denom
            row["fused_worse"] = m_ft["rmse"] > WORSE_FACTOR * m_ut["rmse"]
            # metrics skip non-finite positions; NaN/Inf where the truth is finite is the worst error
            lost = int(np.sum(np.isfinite(T) & ~np.isfinite(F)))
            if lost and not np.sum(np.isfinite(T) & ~np.isfinite(U)):
                row["fused_nonfinite"] = lost
                row["error_ratio"] = math.inf
                row["fused_worse"] = True
            worse |= row["fused_worse"]
        reproduces |= row["breaks_tolerance"]
        per_output[o] = row
    return {
        **base,
        "fused_in_isolation": fused_map,
        "reproduces": reproduces,
        "fused_worse_than_fp32": worse,
        "outputs": per_output,
    }


def _brief(m: dict) -> dict:
    return {k: m.get(k) for k in ("max_abs", "mean_abs", "rmse", "max_rel", "cosine", "snr_db")}
