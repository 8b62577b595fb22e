"""The float64 truth proves itself against the FP32 baseline, tensor by tensor.

The evaluator's kernels can be wrong (reference_fixes.py: why its BatchNormalization
is, on every Paddle export). How the check works, reusing what is already
computed: the evaluator's run
keeps every intermediate result anyway (`intermediate=True` costs nothing), and
the FP32 value of every tensor is at hand (the baseline dump, or the
determinism check's second run of the same FP32 baseline in the child). Each
floating-point tensor, in graph order, is screened: its float64 and FP32 values
may differ by FP32 rounding (`SCREEN` of the tensor's scale; the worst seen on
PP-OCR det/rec/cls with a right evaluator is 1e-5). A tensor past it is not yet
a fault: a model amplifies the rounding of earlier ops (a Sigmoid of
large-magnitude inputs parts by 50% legitimately). So its node is re-evaluated
alone, by the evaluator, on the FP32 values of its own inputs, and compared
with the FP32 kernel's output: on identical inputs two right kernels differ by
one op's rounding only (`LOCAL`). A node past that is where the two part. Its
fallbacks (the op's numpy formula where one is known, then the unfused
reference in double for the single node) are tried on the same inputs; the
first that agrees with FP32 replaces the evaluator for that node, and the run
goes on from that node and is checked from there. Where an independent double
kernel (the unfused reference's) agrees with the evaluator and FP32 does not,
the difference is FP32's own (a sum that cancels) and the truth stands. If
none agrees, the truth is unreliable at that node and the arbiter gives no
not-worse verdict.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import onnx

from bisect_tui.core.reference_fixes import FORMULAS, default_opset, node_key

if TYPE_CHECKING:
    from bisect_tui.api.reference import UnfusedReference

_EPS32 = float(np.finfo(np.float32).eps)
_TINY32 = float(np.finfo(np.float32).tiny)
SCREEN = 2.0 ** 10 * _EPS32  # 1.2e-4 of the tensor's scale: FP32 rounding accumulated over a model
LOCAL = 2.0 ** 10 * _EPS32  # one op on identical inputs: FP32 rounding of one kernel (1e-6 seen)
MAX_LOCAL = 64  # nodes re-evaluated alone per run (the screen's candidates), at most
MAX_ROUNDS = 4  # fallbacks installed (each a run again), at most
_SUBGRAPH_OPS = {"If", "Loop", "Scan", "SequenceMap"}

Fp32Values = Callable[[str, int], Optional[np.ndarray]]


def rel_diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(max |a - b|, the scale (max |b|), their ratio); inf when one is not finite where the
    other is. One subtraction and two reductions where everything is finite (the common case:
    this runs on every tensor of the model)."""
    x = np.atleast_1d(np.asarray(a))
    y = np.atleast_1d(np.asarray(b))
    if x.shape != y.shape:
        try:
            x = x.reshape(y.shape)
        except ValueError:
            return float("inf"), 0.0, float("inf")
    if not x.size:
        return 0.0, 0.0, 0.0
    d = np.subtract(x, y, dtype=np.float64)
    np.abs(d, out=d)
    worst = float(d.max())
    scale = float(max(y.max(), -y.min(), x.max(), -x.min()))
    if not (np.isfinite(worst) and np.isfinite(scale)):
        return _rel_diff_nonfinite(x.astype(np.float64), y.astype(np.float64))
    return worst, scale, _ratio(worst, scale)


BATCH_SIZE_MAX = 1 << 16  # elements of a tensor compared in a batch; larger ones alone
_BATCH_ELEMENTS = 1 << 21  # elements stacked at once (16 MiB of float64 differences)


def rel_diffs(pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[float, float, float]]:
    """`rel_diff` of each pair, the same numbers: small tensors of one shape and dtype
    are stacked and reduced together (each max is exact, so a row's max is the
    tensor's), and a row that is not finite everywhere goes to `rel_diff` alone. One
    call per tensor cost about 25 us of numpy overhead: 0.5 s for the 21,000 tensors of
    a 21,000-node model, checked in the second run while the parent dumps."""
    out: list = [None] * len(pairs)
    groups: dict[tuple, list[int]] = {}
    for k, (a, b) in enumerate(pairs):
        if (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and a.ndim
                and 0 < a.size <= BATCH_SIZE_MAX):
            groups.setdefault((a.shape, a.dtype.str, b.dtype.str), []).append(k)
        else:
            out[k] = rel_diff(a, b)
    for ks in groups.values():
        step = max(1, _BATCH_ELEMENTS // pairs[ks[0]][0].size)
        for lo in range(0, len(ks), step):
            rows = ks[lo:lo + step]
            x = np.stack([pairs[k][0] for k in rows]).reshape(len(rows), -1)
            y = np.stack([pairs[k][1] for k in rows]).reshape(len(rows), -1)
            with np.errstate(all="ignore"):  # a row not finite is redone alone, warnings and all
                d = np.subtract(x, y, dtype=np.float64)
                np.abs(d, out=d)
                worst = d.max(axis=1)
                scale = np.maximum(np.maximum(y.max(axis=1), -y.min(axis=1)).astype(np.float64),
                                   np.maximum(x.max(axis=1), -x.min(axis=1)))
            ok = (np.isfinite(worst) & np.isfinite(scale) & (scale > 0)).tolist()
            for k, w, sc, fine in zip(rows, worst.tolist(), scale.tolist(), ok):
                # not finite, or all zeros (whose sign rel_diff's max keeps): alone
                out[k] = (w, sc, _ratio(w, sc)) if fine else rel_diff(*pairs[k])
    return out


def _ratio(worst: float, scale: float) -> float:
    """The difference over the scale of both sides; none below FP32's least normal value."""
    if worst <= _TINY32:
        return 0.0
    return worst / scale if scale > 0 else float("inf")


def _rel_diff_nonfinite(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """rel_diff where a value is NaN or infinite: equal non-finite values agree."""
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore"):
        d = np.where(same, 0.0, np.abs(x - y))
    both = np.abs(np.concatenate([x[np.isfinite(x)], y[np.isfinite(y)]]))
    scale = float(both.max()) if both.size else 0.0
    if np.isnan(d).any() or not np.isfinite(d).all():
        return float("inf"), scale, float("inf")
    worst = float(d.max())
    return worst, scale, _ratio(worst, scale)


def is_float(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def single_node_model(node: onnx.NodeProto, inputs: list, model: onnx.ModelProto) -> onnx.ModelProto:
    """`node` alone, its inputs graph inputs of their arrays' types, its outputs untyped
    (the session types them), the model's opsets: for a kernel of the unfused reference."""
    from onnx import helper

    g_inputs = []
    for name, arr in zip(node.input, inputs):
        if name and arr is not None:
            elem = helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype)
            g_inputs.append(helper.make_tensor_value_info(name, elem, list(np.shape(arr))))
    outs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    g = helper.make_graph([node], "single_node", g_inputs, outs)
    m = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return m


class ReferenceCheck:
    """The checker of one Float64Reference: screens a run's intermediates against
    FP32 values, finds where the two part, and holds the fallbacks it installed
    (`overrides`: node name -> (label, fn)), which the reference's evaluator uses."""

    def __init__(self, model64: onnx.ModelProto, fp32: Fp32Values,
                 fallback: Optional["UnfusedReference"] = None,
                 known: Optional[dict[str, tuple[str, Callable, str]]] = None):
        self.model64 = model64
        self.fp32 = fp32
        self.fallback = fallback
        self.opset = default_opset(model64)
        # the known deviations, replaced from the start (their evidence shown once per op type)
        self.known = dict(known or {})
        self.overrides: dict[str, tuple[str, Callable]] = {k: (v[0], v[1]) for k, v in self.known.items()}
        self._evidence_types: set[str] = set()
        self.parted: list[dict] = []  # every node found wrong, with what happened
        self.unreliable: Optional[dict] = None
        self.first_screened: Optional[dict] = None  # the first tensor past the screen (not yet a fault)
        self.worst: Optional[dict] = None  # the largest screen ratio of the last run
        self._compared: set[str] = set()
        self._fp32_own: set[str] = set()
        self._local_run = 0
        self._worst_run: Optional[dict] = None
        self.local_checks = 0
        self.local_capped = False
        self.seconds = 0.0
        self.error: Optional[str] = None  # the check itself failed (then the truth is unchecked)
        self.inits = {t.name for t in model64.graph.initializer}

    # one run -----------------------------------------------------------------------------
    def check_run(self, nodes: list, results: dict, sample: int, start: int = 0) -> Optional[int]:
        """Screen one run (`nodes`: the evaluator's `rt_nodes_`, in graph order) from node
        `start` (the nodes before it were screened already, in this run or before a fallback
        changed what follows them). Returns the index of a node a fallback was just
        installed for (recompute from there), else None (the run stands, or the truth is
        unreliable: `self.unreliable`)."""
        t0 = time.perf_counter()
        try:
            return self._check_run(nodes, results, sample, start)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - the check failing is said, never the check's error
            self.error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return None
        finally:
            self.seconds += time.perf_counter() - t0

    def _check_run(self, nodes: list, results: dict, sample: int, start: int) -> Optional[int]:
        if start == 0:
            self._local_run = 0
            self._worst_run = None
        screened = self._screen(nodes, results, sample, start)
        for i in range(start, len(nodes)):
            node = nodes[i].onnx_node
            past = None
            for out in node.output:
                got = screened.get(out) if out else None
                if got is None:
                    continue
                self._compared.add(out)
                d, scale, rel = got
                ratio = rel / SCREEN
                if self._worst_run is None or ratio > self._worst_run["ratio"]:
                    self._worst_run = {"tensor": out, "node": node.name, "op_type": node.op_type, "max_abs": d,
                                       "scale": scale, "ratio": ratio}
                if rel > SCREEN and past is None:
                    past = {"tensor": out, "max_abs": d, "scale": scale, "rel": rel}
            key = node_key(i, node)
            if key in self.known and node.op_type not in self._evidence_types:
                self._evidence_types.add(node.op_type)
                self._evidence(i, nodes, results, sample)
            if past is None:
                continue
            if self.first_screened is None:
                self.first_screened = {**past, "node": node.name, "op_type": node.op_type}
            if node.op_type in _SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
                continue  # no single kernel to re-evaluate: the output-level check stands behind it
            if node_key(i, node) in self._fp32_own:
                continue  # FP32's own kernel differs here, shown on an earlier sample
            if self._local_run >= MAX_LOCAL:
                self.local_capped = True
                continue
            self._local_run += 1
            self.local_checks += 1
            found = self._local(i, nodes, results, sample, past)
            if found is not None:
                return found if self.unreliable is None else None
        self.worst = self._worst_run
        return None

    def _screen(self, nodes: list, results: dict, sample: int, start: int) -> dict:
        """Every float output from node `start` on that FP32 has too, compared at once
        (`rel_diffs`): tensor -> (max |float64 - FP32|, scale, their ratio)."""
        names: list[str] = []
        pairs: list[tuple[np.ndarray, np.ndarray]] = []
        for inst in nodes[start:]:
            for out in inst.onnx_node.output:
                v64 = results.get(out) if out else None
                if not is_float(v64):
                    continue
                v32 = self.fp32(out, sample)
                if v32 is None or not is_float(v32):
                    continue
                names.append(out)
                pairs.append((v64, v32))
        return dict(zip(names, rel_diffs(pairs)))

    def _inputs32(self, node: onnx.NodeProto, results: dict, sample: int) -> list:
        """The node's inputs as FP32 computed them (widened), where FP32 has them."""
        out = []
        for name in node.input:
            v = results.get(name) if name else None
            if name and name not in self.inits and is_float(v):
                v32 = self.fp32(name, sample)
                if is_float(v32):
                    v = np.asarray(v32, dtype=v.dtype).reshape(np.shape(v))
            out.append(v)
        return out

    def _local(self, i: int, nodes: list, results: dict, sample: int, past: dict) -> Optional[int]:
        """Node `i` alone on FP32's inputs: does its kernel (the evaluator's, or the
        fallback already in its place) part from FP32's?"""
        inst = nodes[i]
        node = inst.onnx_node
        key = node_key(i, node)
        current = self.overrides.get(key)
        inputs = self._inputs32(node, results, sample)
        outs = [o for o in node.output if o]
        expect = [self.fp32(o, sample) for o in outs]
        try:
            got = inst.run(*inputs)
        except Exception:  # noqa: BLE001 - a kernel that cannot run alone: judged by its fallbacks
            got = None
        ev = self._worst_of(got, outs, expect)
        if ev is not None and ev["rel"] <= LOCAL:
            return None  # the kernel agrees on its own inputs: rounding amplified, not a fault
        record = {"node": node.name, "op_type": node.op_type, "index": i, "tensor": past["tensor"],
                  "sample": sample, "max_abs": past["max_abs"], "scale": past["scale"], "rel": past["rel"],
                  "kernel": current[0] if current else "onnx.reference", "kernel_local": ev, "tried": []}
        for label, fn, by_type in self._fallbacks(node, inputs):
            if current is not None and label == current[0]:
                continue
            try:
                res = fn(*inputs)
                res = res if isinstance(res, (list, tuple)) else (res,)
            except Exception as exc:  # noqa: BLE001 - a fallback that cannot run: the next one
                record["tried"].append({"with": label, "error": str(exc).strip().splitlines()[0][:200]
                                        if str(exc).strip() else type(exc).__name__})
                continue
            fb = self._worst_of(res, outs, expect)
            vs_kernel = self._worst_of(res, outs, list(got)) if got is not None else None
            record["tried"].append({"with": label, "local": fb, "independent": not by_type,
                                    "agrees_with_kernel": bool(vs_kernel is not None and vs_kernel["rel"] <= LOCAL)})
            if fb is not None and fb["rel"] <= LOCAL:
                self.overrides[key] = (label, fn)
                record["fallback"] = label
                record["outcome"] = "fallback"
                if by_type:  # the spec's formula: every node of this type it applies to, checked on the next run
                    record["same_type_nodes"] = self._spread(node.op_type, nodes, label, i)
                self.parted.append(record)
                return i
        if self._confirmed(record, got, outs):
            record["outcome"] = "fp32_own"
            self._fp32_own.add(key)
            self.parted.append(record)
            return None
        record["outcome"] = "unreliable"
        self.parted.append(record)
        self.unreliable = {"node": node.name, "op_type": node.op_type, "tensor": past["tensor"]}
        return i

    def _confirmed(self, record: dict, got, outs: list) -> bool:
        """An independent double kernel (the unfused reference's) agrees with the evaluator
        on FP32's own inputs: the two float64 kernels stand, and the difference is FP32's
        own rounding at this op (a sum that cancels), not a fault of the truth."""
        if got is None:
            return False
        for t in record["tried"]:
            if t.get("independent") and t.get("agrees_with_kernel"):
                return True
        return False

    def _evidence(self, i: int, nodes: list, results: dict, sample: int) -> None:
        """A node of a known deviation: the evaluator's own kernel run alone on FP32's
        inputs, beside the spec's formula now in its place, both against FP32's kernel."""
        inst = nodes[i]
        node = inst.onnx_node
        own = getattr(inst, "_inst", None)
        inputs = self._inputs32(node, results, sample)
        outs = [o for o in node.output if o]
        expect = [self.fp32(o, sample) for o in outs]
        try:
            ev = self._worst_of(own.run(*inputs), outs, expect) if own is not None else None
            fb = self._worst_of(inst.run(*inputs), outs, expect)
        except Exception:  # noqa: BLE001 - evidence only: the screen judges the node all the same
            return
        if ev is None or fb is None:
            return
        label, _, why = self.known[node_key(i, node)]
        self.parted.append({
            "node": node.name, "op_type": node.op_type, "index": i, "tensor": ev["tensor"], "sample": sample,
            "max_abs": ev["max_abs"], "scale": ev["scale"], "rel": ev["rel"], "kernel": "onnx.reference",
            "kernel_local": ev, "tried": [{"with": label, "local": fb, "independent": False,
                                           "agrees_with_kernel": False}],
            "fallback": label, "outcome": "known", "why": why,
            "same_type_nodes": sum(1 for k, v in self.known.items() if v[0] == label) - 1,
        })

    def _spread(self, op_type: str, nodes: list, label: str, after: int) -> int:
        """The formula in place of the evaluator at every later node of `op_type` it
        applies to (what is recomputed from `after` on is screened like any other node;
        the earlier ones agreed with FP32 as they were)."""
        maker = FORMULAS[op_type][1]
        count = 0
        for j in range(after + 1, len(nodes)):
            n = nodes[j].onnx_node
            if n.op_type != op_type or n.domain not in ("", "ai.onnx") or node_key(j, n) in self.overrides:
                continue
            fn = maker(n, self.opset)
            if fn is not None:
                self.overrides[node_key(j, n)] = (label, fn)
                count += 1
        return count

    @staticmethod
    def _worst_of(got, outs: list, expect: list) -> Optional[dict]:
        if got is None:
            return None
        worst = None
        for name, g, e in zip(outs, got, expect):
            if not is_float(e) or not isinstance(g, np.ndarray):
                continue
            d, scale, rel = rel_diff(g, e)
            if worst is None or rel > worst["rel"]:
                worst = {"tensor": name, "max_abs": d, "scale": scale, "rel": rel}
        return worst

    def _fallbacks(self, node: onnx.NodeProto, inputs: list):
        formula = FORMULAS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if formula is not None:
            fn = formula[1](node, self.opset)
            if fn is not None:
                yield formula[0], fn, True
        if self.fallback is not None:
            try:
                fn = self._unfused_double(node, inputs)
            except Exception as exc:  # noqa: BLE001 - no double kernel there: the node stays unresolved
                fn = _raiser(exc)
            yield f"{self.fallback.library} in double (this node alone)", fn, False

    def _unfused_double(self, node: onnx.NodeProto, inputs: list) -> Callable:
        """The unfused reference's kernel for this node, in double (a session made once)."""
        from bisect_tui.core.groups import open_session

        sess = open_session(self.fallback, single_node_model(node, inputs, self.model64))
        names = [o for o in node.output if o]
        feed_names = [n for n, a in zip(node.input, inputs) if n and a is not None]

        def run(*args):
            feeds = {n: np.asarray(a) for n, a in zip(node.input, args) if n in feed_names}
            return sess.run(names, feeds)

        return run

    def fallback_counts(self) -> list[dict]:
        """Which fallback replaced the evaluator at how many nodes."""
        counts: dict[str, int] = {}
        for label, _ in self.overrides.values():
            counts[label] = counts.get(label, 0) + 1
        return [{"with": label, "nodes": n} for label, n in counts.items()]

    # the record ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        if self.error is not None:
            return {"checked": False, "reliable": None, "why": f"the check failed: {self.error}"}
        return {
            "checked": True,
            "against": "the FP32 baseline, tensor by tensor",
            "screen": SCREEN,
            "local": LOCAL,
            "tensors_compared": len(self._compared),
            "local_checks": self.local_checks,
            "local_capped": self.local_capped,
            "first_screened": self.first_screened,
            "worst": self.worst,
            "parted": self.parted,
            "fallbacks": self.fallback_counts(),
            "unreliable_at": self.unreliable,
            "reliable": self.unreliable is None,
            "seconds": self.seconds,
        }


def _raiser(exc: BaseException) -> Callable:
    def run(*_args):
        raise exc

    return run


class NodeOverride:
    """An evaluator node whose kernel is replaced by a fallback (everything else its own)."""

    has_linked_attribute = False

    def __init__(self, inst, fn: Callable):
        self._inst = inst
        self._fn = fn

    def __getattr__(self, name):
        return getattr(self._inst, name)

    def need_context(self) -> bool:
        return False

    def run(self, *inputs, **_kw):
        res = self._fn(*inputs)
        return tuple(res) if isinstance(res, (list, tuple)) else (res,)
