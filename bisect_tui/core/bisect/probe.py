"""The fused-graph probe: the error at every fusion boundary in one run.

ORT saves its optimized graph; reloaded at ORT_DISABLE_ALL it reproduces the
fused session exactly, and *its* surviving tensors can be marked without
undoing any fusion (they are already fused). Comparing each surviving tensor
with its baseline twin tells, for every fused node, whether its inputs were
still within tolerance while its outputs were not (its own error) or whether
it only passes on error from upstream (inherited).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx

from bisect_tui.core.baseline import load_tensor, manifest_index
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.cancel import Progress
from bisect_tui.core.runner import plan_groups, run_groups
from bisect_tui.core.tolerance import judge_arrays


class _ErrorSink:
    def __init__(self, triage, tol):
        self.t = triage
        self.tol = tol
        self.parts: dict[str, list[np.ndarray]] = {}
        self.errors: dict[str, dict] = {}

    def write(self, tensor: str, sample: int, array: np.ndarray) -> None:
        self.parts.setdefault(tensor, []).append(array)

    def end(self, tensor: str) -> None:
        test = np.stack(self.parts.pop(tensor))
        ref = np.asarray(load_tensor(self.t.session, self.t.baseline.manifest, tensor))
        if ref.shape != test.shape:
            return  # a layout-changed twin (e.g. NCHWc) is not comparable element-wise
        metrics, verdict = judge_arrays(ref, test, self.tol)
        self.errors[tensor] = {
            "ratio": min(verdict.ratio, 1e300),
            "passed": verdict.passed,
            "max_abs": metrics["max_abs"],
            "cosine": metrics["cosine"],
        }


def run_probe(triage, optimized_path: str, units: list[Unit], tolerance=None) -> dict:
    """Per-tensor error of the fused graph and each unit's own vs inherited error."""
    tol = tolerance or triage.opts.tolerance.default
    optimized = onnx.load(optimized_path)
    idx = manifest_index(triage.baseline.manifest)
    shared: list[str] = []
    for node in optimized.graph.node:
        for o in node.output:
            if o in idx and o not in shared:
                shared.append(o)
    sizes = {t: idx[t]["bytes"] // max(triage.inputs.samples, 1) for t in shared}
    groups = plan_groups(shared, sizes, max(triage.max_memory // max(2 * triage.inputs.samples, 1), 16 << 20))
    sink = _ErrorSink(triage, tol)

    def relay(p: Progress) -> None:
        triage.progress(Progress("probe", f"fused-graph probe: {p.message}", p.done, p.total))

    run_groups(optimized, groups, triage.inputs, sink, None, triage.cancel, relay, "probe")
    errors = sink.errors
    order = {t: i for i, t in enumerate(triage.info.index.intermediate_tensors())}
    graph_inputs = set(triage.info.index.graph_inputs) | triage.info.index.initializers
    unit_rows = []
    for u in units:
        out_ratio = max((errors[t]["ratio"] for t in u.outputs if t in errors), default=None)
        # Error arriving at the pattern: its original input tensors. A graph
        # input carries none; an input fused away elsewhere cannot be observed.
        in_ratios = [0.0 if i in graph_inputs else errors.get(i, {}).get("ratio") for i in u.inputs]
        in_ratio = None if any(r is None for r in in_ratios) else max(in_ratios, default=0.0)
        if out_ratio is None:
            cls = "unknown"
        elif out_ratio <= 1:
            cls = "ok"
        elif in_ratio is not None and in_ratio <= 1:
            cls = "own"
        else:
            cls = "inherited"
        gain = None
        if out_ratio is not None and in_ratio is not None:
            gain = out_ratio / max(in_ratio, 1e-12)
        unit_rows.append({"unit": u.index, "fused_node": u.fused_node, "op_type": u.op_type,
                          "output_ratio": out_ratio, "input_ratio": in_ratio, "gain": gain,
                          "class": cls})
    suspects = [r["unit"] for r in sorted(
        (r for r in unit_rows if r["class"] == "own"), key=lambda r: -(r["output_ratio"] or 0))]
    first_bad: Optional[str] = None
    for t in sorted(errors, key=lambda t: order.get(t, 1 << 30)):
        if not errors[t]["passed"]:
            first_bad = t
            break
    worst = sorted(errors.items(), key=lambda kv: -kv[1]["ratio"])[:20]
    # the error along the graph, in topological order: where it jumps is seen at a glance
    profile = [{"tensor": t, "op_type": idx[t].get("op_type"), "ratio": errors[t]["ratio"]}
               for t in sorted(errors, key=lambda t: order.get(t, 1 << 30))]
    return {
        "profile": profile,
        "tensors_compared": len(errors),
        "failing_count": sum(1 for e in errors.values() if not e["passed"]),
        "first_failing_tensor": first_bad,
        "units": unit_rows,
        "suspects": suspects,
        "worst_tensors": [{"tensor": t, **e} for t, e in worst],
    }
