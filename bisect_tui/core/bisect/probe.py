"""The fused-graph probe: the error at every fusion boundary in one run.

The engine's observer sees the tensors the fused program itself computes,
without undoing a fusion (the engine's observer: for instance a saved
optimized graph reloaded unfused, which reproduces the fused session exactly
and whose surviving tensors can be marked, or extra outputs at a runtime
graph's own layer boundaries). Comparing each surviving tensor with its baseline twin tells, for
every fused node, whether its inputs were still within tolerance while its
outputs were not (its own error) or whether it only passes on error from
upstream (inherited).
"""

from __future__ import annotations

import heapq
from typing import Optional

import numpy as np

from bisect_tui.core.baseline_store import indexed, load_tensors
from bisect_tui.core.bisect.units import Unit
from bisect_tui.core.cancel import Progress
from bisect_tui.core.groups import plan_groups
from bisect_tui.core.memory import release_memory
from bisect_tui.core.tolerance import judge_many


_WIDEN: dict = {}  # dtype -> judged as FP32 (FP16, bfloat16); dtype.name costs 2 us a tensor


def _widened(dtype) -> bool:
    widen = _WIDEN.get(dtype)
    if widen is None:
        widen = _WIDEN[dtype] = bool(dtype == np.float16 or dtype.name == "bfloat16")
    return widen


class _ErrorSink:
    """Each tensor judged against the baseline; a group's tensors together at its
    end (tolerance.judge_many: thousands of small tensors, one pass), their
    baseline twins read in one batch (baseline_store.load_tensors)."""

    def __init__(self, triage, tol):
        self.t = triage
        self.tol = tol
        self.parts: dict[str, list[np.ndarray]] = {}
        self.errors: dict[str, dict] = {}
        self._ready: list[tuple[str, np.ndarray]] = []

    def write(self, tensor: str, sample: int, array: np.ndarray) -> None:
        if _widened(array.dtype):
            # an FP16 engine's own tensor, judged on its values: the baseline is FP32
            array = array.astype(np.float32)
        parts = self.parts.get(tensor)
        if parts is None:
            self.parts[tensor] = [array]
        else:
            parts.append(array)

    def end(self, tensor: str) -> None:
        parts = self.parts.pop(tensor)
        # one sample: the samples axis as a view (np.stack would copy the same values)
        one = parts[0] if len(parts) == 1 and type(parts[0]) is np.ndarray else None
        self._ready.append((tensor, one[np.newaxis] if one is not None else np.stack(parts)))

    def end_group(self) -> None:
        ready, self._ready = self._ready, []
        refs = load_tensors(self.t.session, self.t.baseline.manifest, [tensor for tensor, _ in ready])
        pairs, names = [], []
        for (tensor, test), ref in zip(ready, refs):
            ref = ref if type(ref) is np.ndarray else np.asarray(ref)
            if ref.shape != test.shape:
                continue  # a layout-changed twin (e.g. NCHWc) is not comparable element-wise
            pairs.append((ref, test))
            names.append(tensor)
        judged = judge_many(pairs, self.tol)
        errors = self.errors
        for tensor, (metrics, verdict) in zip(names, judged):
            errors[tensor] = {
                "ratio": min(verdict.ratio, 1e300),
                "passed": verdict.passed,
                "max_abs": metrics["max_abs"],
                "cosine": metrics["cosine"],
            }


def observed_names(observer, idx) -> dict[str, str]:
    """The observer's tensors that have a baseline twin: engine name -> baseline name.

    A converted engine (FP16) may compute a tensor under another name (a copy in
    another precision); the observer says which (`baseline_names`, optional).
    A tensor under its own name wins over a renamed copy of it."""
    names = list(dict.fromkeys(observer.tensors if observer is not None else []))
    aliases = dict(getattr(observer, "baseline_names", None) or {})
    twin: dict[str, str] = {t: t for t in names if t in idx}
    taken = set(twin.values())
    for t in names:
        b = aliases.get(t)
        if t not in twin and b is not None and b in idx and b not in taken:
            twin[t] = b
            taken.add(b)
    return {t: twin[t] for t in names if t in twin}


class _PartsDiffer(Exception):
    """An observer that runs the program in parts read a graph output other than the engine's."""


def _observe_groups(triage, observer, groups: list[list[str]], sink, twin: Optional[dict] = None,
                    control: Optional[dict] = None) -> None:
    """Each group of tensors through the observer for every sample, streamed to
    `sink` under their baseline names (`twin`). `control`: {graph output: the
    engine's own value per sample}, which an observer in parts must read bit for bit."""
    twin = twin or {}
    control = control or {}
    total = sum(len(g) for g in groups)
    done = 0
    for gi, group in enumerate(groups):
        triage.cancel.check()
        names: list[str] = []
        for k in range(triage.inputs.samples):
            triage.cancel.check()
            values = observer.observe(triage.inputs.feeds(k), group)
            if k == 0:
                names = list(values)
            for name in control.keys() & values.keys():
                if not np.array_equal(values[name], control[name][k], equal_nan=True):
                    raise _PartsDiffer(name)
            for name in names:
                if name in values:
                    sink.write(twin.get(name, name), k, values[name])
            del values
        for name in names:
            sink.end(twin.get(name, name))
        sink.end_group()
        if len(groups) > 1:  # memory given back for the next group; a full collection costs 40 ms at 5,000 nodes
            release_memory()
        done += len(group)
        triage.progress(Progress("probe", f"fused-graph probe: group {gi + 1}/{len(groups)}", done, total))


def _probe_key(triage, optimized_path: str, tol, config) -> Optional[tuple]:
    """Which probe an earlier one in this process can stand for: the same
    optimized graph file (by identity and content size, as read now), the same
    settings, tolerance and baseline."""
    import os

    try:
        st = os.lstat(optimized_path)
    except (OSError, TypeError, ValueError):
        return None
    return (str(optimized_path), st.st_ino, st.st_size, st.st_mtime_ns, repr(tol),
            repr(sorted(config.to_dict().items())), triage.baseline.manifest.get("key"))


def _topological_order(triage) -> dict[str, int]:
    """Each tensor's place in the graph's topological order; the probe asks on
    every call, and the 21,000 tensors of the index change only with its node list."""
    tensors = triage.info.index.intermediate_tensors()
    store = getattr(triage, "__dict__", {})  # a triage without one: no memo
    memo = store.get("_probe_order")
    if memo is None or memo[0] != tensors:  # the same strings: compared by identity, fast
        memo = store["_probe_order"] = (tensors, {t: i for i, t in enumerate(tensors)})
    return memo[1]


def _unit_row(u: Unit, errors: dict, graph_inputs: set) -> dict:
    """A unit's own vs inherited error: its outputs' worst ratio against its inputs'."""
    outs = [errors[t]["ratio"] for t in u.outputs if t in errors]
    out_ratio = max(outs) if outs else None
    # Error arriving at the pattern: its original input tensors. A graph
    # input carries none; an input fused away elsewhere cannot be observed.
    get = errors.get
    in_ratios = [0.0 if i in graph_inputs else (get(i) or _NO_ERROR).get("ratio") for i in u.inputs]
    in_ratio = None if None in in_ratios else max(in_ratios, default=0.0)
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
    return {"unit": u.index, "fused_node": u.fused_node, "op_type": u.op_type,
            "output_ratio": out_ratio, "input_ratio": in_ratio, "gain": gain, "class": cls}


_NO_ERROR: dict = {}


def _worst(errors: dict, n: int) -> list:
    """sorted(errors.items(), key=-ratio)[:n], which heapq.nsmallest is (ties in
    order too) when no ratio is NaN; without sorting all 7,000 tensors."""
    if any(e["ratio"] != e["ratio"] for e in errors.values()):
        return sorted(errors.items(), key=lambda kv: -kv[1]["ratio"])[:n]
    return heapq.nsmallest(n, errors.items(), key=lambda kv: -kv[1]["ratio"])


def _control(observer, twin: dict, graph_outputs, expected: Optional[list]) -> dict:
    """What an observer in parts is checked on: the graph outputs it reads, each as
    the engine computed it per sample (`expected`: the check's runs of this engine).
    An observer with none of them to check runs as one program."""
    if not expected or not getattr(observer, "in_parts", False):
        return {}
    return {o: [np.asarray(run[o]) for run in expected] for o in graph_outputs
            if twin.get(o) == o and all(o in run for run in expected)}


def _observe(triage, observer, groups, tol, twin: dict, expected: Optional[list]) -> tuple[dict, dict]:
    """The tensors' errors, and how the observer read them (in parts, checked on the
    engine's outputs, or whole)."""
    control = _control(observer, twin, triage.info.index.graph_outputs, expected)
    if not control and getattr(observer, "in_parts", False):
        observer.whole()  # no control to prove the parts on
    how: dict = {}
    sink = _ErrorSink(triage, tol)
    try:
        _observe_groups(triage, observer, groups, sink, twin, control)  # {} for one session
    except _PartsDiffer as exc:
        observer.whole()
        how["control_differed"] = str(exc)
        sink = _ErrorSink(triage, tol)
        _observe_groups(triage, observer, groups, sink, twin)
    how["parts"] = getattr(observer, "part_count", 1)  # 1 where a part fell back to the whole graph
    if how["parts"] > 1:
        how["control"] = f"graph outputs {', '.join(sorted(control))} bit-identical to the engine's"
    return sink.errors, how


def run_probe(triage, optimized_path: str, units: list[Unit], tolerance=None, config=None,
              expected: Optional[list] = None) -> dict:
    """Per-tensor error of the fused graph and each unit's own vs inherited error.

    `expected`: the engine's outputs per sample, where the caller ran it (the check),
    the control for an observer that runs the program in parts."""
    tol = tolerance or triage.opts.tolerance.default
    config = config or triage.opts.config
    idx = indexed(triage.baseline.manifest)  # read-only here
    key = _probe_key(triage, optimized_path, tol, config)
    kept = triage.probe_errors.get(key) if key is not None else None
    errors, how = kept if kept is not None else (None, {})
    if errors is None:
        observer = triage.engine.observer(triage.session.model_path, config, optimized_path)
        twin = observed_names(observer, idx)
        shared = list(twin)
        samples = max(triage.inputs.samples, 1)
        sizes = {t: idx[twin[t]]["bytes"] // samples for t in shared}
        groups = plan_groups(shared, sizes, max(triage.max_memory // max(2 * triage.inputs.samples, 1), 16 << 20))
        errors, how = {}, {}
        try:
            if observer is not None:
                errors, how = _observe(triage, observer, groups, tol, twin, expected)
        finally:
            if observer is not None:
                if getattr(triage, "search_ahead", False):  # the search's first wait on a build closes it
                    from bisect_tui.core import background

                    background.close_later(observer.close)
                else:
                    observer.close()
        if key is not None:
            triage.probe_errors[key] = (errors, how)
    order = _topological_order(triage)
    graph_inputs = set(triage.info.index.graph_inputs) | triage.info.index.initializers
    unit_rows = [_unit_row(u, errors, graph_inputs) for u in units]
    suspects = [r["unit"] for r in sorted(
        (r for r in unit_rows if r["class"] == "own"), key=lambda r: -(r["output_ratio"] or 0))]
    # the tensors in topological order, sorted once for the first failing one and the profile
    far = 1 << 30
    along = sorted(errors, key=lambda t: order.get(t, far))
    first_bad: Optional[str] = next((t for t in along if not errors[t]["passed"]), None)
    worst = _worst(errors, 20)
    # the error along the graph, in topological order: where it jumps is seen at a glance
    profile = [{"tensor": t, "op_type": idx[t].get("op_type"), "ratio": errors[t]["ratio"]} for t in along]
    return {
        "profile": profile,
        "tensors_compared": len(errors),
        "failing_count": sum(1 for e in errors.values() if not e["passed"]),
        "first_failing_tensor": first_bad,
        "units": unit_rows,
        "suspects": suspects,
        "worst_tensors": [{"tensor": t, **e} for t, e in worst],
        "observer": how,
    }
