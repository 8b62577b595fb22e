"""Is the ONNX export the same model as PyTorch? Module outputs vs ONNX tensors.

Each hooked module output is mapped to an ONNX tensor of the baseline, first
by the export's own metadata (the module path every node carries), then, for
what the metadata cannot place, by shape and value. Only metadata-mapped
tensors can prove an export wrong: a value match is found *because* the
numbers agree, so it adds coverage of "this value exists in the export", never
evidence against it. The coverage says how many modules landed where, and why
the rest did not.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
import onnx

from bisect_tui.core.baseline import load_tensor, manifest_index
from bisect_tui.core.graph import GraphIndex
from bisect_tui.core.tolerance import Tolerance, get_preset, judge_arrays

VALUE_CANDIDATES = 64  # same-shape tensors compared per unmapped output, closest statistics first

REASONS = {
    "no_nodes": "no ONNX node carries this module's path: the exporter folded it away (an identity in "
                "eval mode such as Dropout, a reshape that became a no-op) or merged its ops into a "
                "neighbour's",
    "no_shape": "none of the tensors leaving this module's ONNX nodes has its output shape",
    "shared": "the module runs more than once per forward; every call carries the same path in the export",
    "no_value": "no ONNX tensor of this shape holds these values",
    "not_float": "not a floating-point output",
    "merged": "the exporter merged this module into a later one (batch norm folded into the convolution, "
              "a bias into a Gemm): the ONNX tensor that carries its path holds the later module's output",
}


def node_scopes(node: onnx.NodeProto, known: set[str]) -> list[str]:
    """The module paths a node was exported from, outermost first."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes" and len(p.value) < 100_000:
            try:
                scopes = ast.literal_eval(p.value)  # a list literal; literal_eval never runs code
            except (ValueError, SyntaxError):
                return []
            if isinstance(scopes, list):
                return [s for s in scopes[1:-1] if isinstance(s, str) and s in known]
            return []
    if node.name.startswith("/"):  # the TorchScript tracer: /blocks/blocks.0/attn/q/MatMul
        chain, prev = [], ""
        for seg in node.name.strip("/").split("/")[:-1]:
            cand = f"{prev}.{seg}" if prev else seg
            if cand in known:
                prev = cand
            elif seg in known and (not prev or seg.startswith(prev + ".")):
                prev = seg
            else:
                break
            chain.append(prev)
        return chain
    return []


def module_boundaries(index: GraphIndex, known: set[str]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """For each module path, the tensors its nodes produce that leave it
    (consumed outside or a graph output), latest first; and per-module node counts."""
    members: dict[str, set[str]] = {}
    for n in index.nodes:
        for s in node_scopes(n, known):
            members.setdefault(s, set()).add(n.name)
    outputs = set(index.graph_outputs)
    bounds: dict[str, list[str]] = {}
    for path, names in members.items():
        leaving = []
        for name in names:
            for t in index.by_name[name].output:
                if not t:
                    continue
                cons = index.consumers.get(t, [])
                if t in outputs or any(c not in names for c in cons):
                    leaving.append(t)
        leaving.sort(key=lambda t: -index.order[index.producer[t]])
        bounds[path] = leaving
    bounds[""] = list(index.graph_outputs)
    return bounds, {p: len(v) for p, v in members.items()}


def _same_shape(a: list, b: list) -> bool:
    if list(a) == list(b):
        return True
    na = [d for d in a if d != 1]
    nb = [d for d in b if d != 1]
    return na == nb and int(np.prod(a or [1])) == int(np.prod(b or [1]))


@dataclass
class ModuleMatch:
    name: str  # golden file stem, layer_<index>_<path>
    module: str
    type: str
    index: int
    method: Optional[str]  # "metadata", "metadata+value", "value" or None (unmapped)
    onnx_tensor: Optional[str] = None
    passed: Optional[bool] = None
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    cosine: Optional[float] = None
    summary: Optional[str] = None
    reason: Optional[str] = None  # key of REASONS when unmapped
    detail: Optional[str] = None
    dtypes: Optional[str] = None  # "float16 vs float32" when the sides differ (compared in float64)


@dataclass
class CrossCheck:
    tolerance: dict
    matches: list[ModuleMatch] = field(default_factory=list)

    @property
    def failing(self) -> list[ModuleMatch]:
        return [m for m in self.matches if m.passed is False]

    def coverage(self) -> dict:
        mods = {m.module for m in self.matches}
        by_meta = [m for m in self.matches if m.method in ("metadata", "metadata+value")]
        by_value = [m for m in self.matches if m.method == "value"]
        unmapped = [m for m in self.matches if m.method is None]
        reasons: dict[str, list[str]] = {}
        for m in unmapped:
            reasons.setdefault(m.reason or "no_value", []).append(m.module)
        mapped_modules = {m.module for m in self.matches if m.method}
        return {
            "modules": len(mods),
            "outputs": len(self.matches),
            "mapped_modules": len(mapped_modules),
            "by_metadata": len(by_meta),
            "by_value": len(by_value),
            "unmapped": len(unmapped),
            "unmapped_reasons": {k: {"why": REASONS.get(k, k), "modules": v} for k, v in reasons.items()},
        }

    def to_dict(self) -> dict:
        first = min(self.failing, key=lambda m: m.index, default=None)
        return {
            "tolerance": self.tolerance,
            "passed": not self.failing,
            "coverage": self.coverage(),
            "failing": len(self.failing),
            "first_failing": asdict(first) if first else None,
            "matches": [asdict(m) for m in self.matches],
        }


def export_tolerance() -> Tolerance:
    """PyTorch's CPU kernels vs ORT's unfused ones: both FP32, other summation
    orders; the fp32 preset ignores that and catches a wrong export."""
    return get_preset("fp32")


def _judge(golden: np.ndarray, onnx_arr: np.ndarray, tol: Tolerance):
    metrics, verdict = judge_arrays(golden, onnx_arr, tol)
    return metrics, verdict


def crosscheck(golden_entries: list[dict], load_golden, session, manifest: dict, index: GraphIndex,
               known_modules: set[str]) -> tuple[CrossCheck, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Map and compare every golden output. Returns the result and, for failing
    metadata matches, the two arrays (for the pitfall detectors)."""
    tol = export_tolerance()
    result = CrossCheck(tolerance=tol.to_dict())
    bounds, _ = module_boundaries(index, known_modules | {""})
    man = manifest_index(manifest)
    calls: dict[str, int] = {}
    for e in golden_entries:
        calls[e["module"]] = max(calls.get(e["module"], 0), e["call"] + 1)
    failing_arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    for e in golden_entries:
        path = "" if e["module"] == "(root)" else e["module"]
        m = ModuleMatch(e["name"], e["module"], e["type"], e["index"], None)
        result.matches.append(m)
        if e["dtype"] not in ("float32", "float64"):
            m.reason = "not_float"
            continue
        golden = load_golden(e)
        cands: list[str] = []
        if calls[e["module"]] > 1:
            m.reason = "shared"
        elif path not in bounds:
            m.reason = "no_nodes"
        else:
            cands = [t for t in bounds[path] if t in man and _same_shape(man[t]["shape"], e["shape"])]
            if path == "" and e["output"] < len(index.graph_outputs):
                out_t = index.graph_outputs[e["output"]]
                cands = [out_t] if out_t in man else cands
            if not cands:
                m.reason = "no_shape"
        if cands:
            best = None
            for t in cands:
                arr = np.asarray(load_tensor(session, manifest, t))
                metrics, verdict = _judge(golden, arr, tol)
                if best is None or metrics["max_abs"] < best[1]["max_abs"]:
                    best = (t, metrics, verdict, arr)
            t, metrics, verdict, arr = best
            m.method = "metadata" if len(cands) == 1 else "metadata+value"
            _fill(m, t, metrics, verdict, e, man[t])
            if not verdict.passed:
                failing_arrays[m.name] = (golden, arr)
            continue
        # value matching: same shape, closest statistics first
        mean = (e["stats"] or {}).get("mean") or 0.0
        pool = [t for t, me in man.items() if _same_shape(me["shape"], e["shape"])
                and me.get("dtype", "").startswith("float")]
        pool.sort(key=lambda t: abs(((man[t].get("stats") or {}).get("mean") or 0.0) - mean))
        best = None
        for t in pool[:VALUE_CANDIDATES]:
            arr = np.asarray(load_tensor(session, manifest, t))
            metrics, verdict = _judge(golden, arr, tol)
            if best is None or metrics["max_abs"] < best[1]["max_abs"]:
                best = (t, metrics, verdict)
        if best and best[2].passed:
            m.method = "value"
            _fill(m, best[0], best[1], best[2], e, man[best[0]])
            m.detail = REASONS.get(m.reason or "", None)
        elif best:
            m.detail = f"closest same-shape tensor {best[0]!r} is off by max abs {best[1]['max_abs']:.3g}"
            m.reason = m.reason if m.reason in ("shared", "no_nodes") else "no_value"
        else:
            m.reason = m.reason or "no_value"
            m.detail = f"no ONNX tensor has shape {'x'.join(map(str, e['shape'])) or 'scalar'}"
    _merged(result, failing_arrays)
    return result, failing_arrays


def _merged(result: CrossCheck, failing_arrays: dict) -> None:
    """A failing metadata match whose tensor equals a *later* module's output is
    not a wrong export: the exporter folded this module into that one."""
    passing: dict[str, list[ModuleMatch]] = {}
    for m in result.matches:
        if m.passed and m.onnx_tensor:
            passing.setdefault(m.onnx_tensor, []).append(m)
    for m in result.matches:
        if m.passed is not False or not m.onnx_tensor:
            continue
        later = [o for o in passing.get(m.onnx_tensor, []) if o.index > m.index]
        if not later:
            continue
        o = later[0]
        m.detail = (f"ONNX tensor {m.onnx_tensor!r}, named for this module, equals the output of {o.module} "
                    f"({o.type}); against this module it is off by max abs {m.max_abs:.3g}")
        m.method, m.passed, m.reason, m.summary = None, None, "merged", None
        m.onnx_tensor = m.max_abs = m.max_rel = m.cosine = None
        failing_arrays.pop(m.name, None)


def _fill(m: ModuleMatch, tensor: str, metrics: dict, verdict, entry: dict, onnx_entry: dict) -> None:
    m.onnx_tensor = tensor
    m.passed = bool(verdict.passed)
    m.max_abs = float(metrics["max_abs"])
    m.max_rel = float(metrics["max_rel"])
    m.cosine = float(metrics["cosine"]) if metrics.get("cosine") is not None else None
    m.summary = verdict.summary()
    model_dtype = entry.get("model_dtype") or entry["dtype"]
    if model_dtype != onnx_entry.get("dtype"):
        m.dtypes = f"{model_dtype} (PyTorch) vs {onnx_entry.get('dtype')} (ONNX), compared in float64"
