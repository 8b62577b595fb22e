"""The references every comparison is judged against, in core's hands.

A *reference* computes tensors the fused engine is judged against
(`api.reference.Reference`: `run(feeds, tensors) -> {tensor: array}`). Core
has two of its own, built on what it is handed: `UnfusedModel`, the
baseline's own path (the `UnfusedReference` the triage holds, one model, one
sample) and `Float64Reference`, the same ONNX graph widened to double and run
by onnx's reference evaluator (numpy: no engine, so it stays in core), with
the unfused reference in double where the evaluator cannot run the graph. The
framework's own (PyTorch forward hooks) lives in `bisect_tui.frontends.torch`.
Each says by `name` (and the float64 one by `ran_with`) what really computed
its numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from bisect_tui.api.reference import Reference  # noqa: F401  (the protocol, where callers look for it)
from bisect_tui.core.errors import UserError
from bisect_tui.core.external_data import tensor_array
from bisect_tui.core.inputs import InputSet

if TYPE_CHECKING:
    from bisect_tui.api.reference import UnfusedReference


class _Collect:
    """A `Sink` that keeps what it is given (one sample, one group)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def write(self, tensor: str, sample: int, array: np.ndarray) -> None:
        self.arrays[tensor] = np.array(array)

    def end(self, tensor: str) -> None:
        pass


class UnfusedModel:
    """The baseline's own path (groups.run_groups on the unfused reference,
    requested tensors marked) for one model and one sample held in memory. The
    dump in the session stays the source of truth for the checklist; this is
    for callers that need a fresh value (a different input, a subset of
    tensors, an extracted region)."""

    def __init__(self, reference: "UnfusedReference", model: onnx.ModelProto):
        self.reference = reference
        self.model = model
        self.name = reference.name

    def run(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        from bisect_tui.core.groups import run_groups

        sink = _Collect()
        inputs = InputSet({k: np.asarray(v)[None] for k, v in feeds.items()})
        run_groups(self.reference, self.model, [list(tensors)], inputs, sink)
        return {t: sink.arrays[t] for t in tensors if t in sink.arrays}


_NARROW_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float64 copy: float initializers, I/O, Casts and Constants widened."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for i, t in enumerate(list(g.initializer)):
        if t.data_type in _NARROW_FLOATS:
            arr = tensor_array(t).astype(np.float64)  # external data read from its file
            g.initializer[i].CopyFrom(numpy_helper.from_array(arr, t.name))
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type in _NARROW_FLOATS:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    del g.value_info[:]
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i in _NARROW_FLOATS:
                a.i = TensorProto.DOUBLE
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in _NARROW_FLOATS:
                arr = tensor_array(a.t).astype(np.float64)
                a.t.CopyFrom(numpy_helper.from_array(arr, a.t.name))
    return m


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


class Truth(tuple):
    """(arrays by output name, what computed them, why the first evaluator did not),
    with `reference_check`: how the truth proved itself against the FP32 baseline
    (None where it was not checked) and `warnings`: what numpy said meanwhile."""

    reference_check: Optional[dict] = None
    warnings: tuple = ()

    @classmethod
    def of(cls, arrays, ran_with, fallback_reason, reference_check=None, warnings=()) -> "Truth":
        t = cls((arrays, ran_with, fallback_reason))
        t.reference_check = reference_check
        t.warnings = tuple(warnings)
        return t


class Float64Reference:
    """The ONNX graph in float64: onnx's reference evaluator first (numpy,
    every standard op, no kernel shortcuts); the unfused reference `fallback`
    in double where the evaluator cannot run the graph (contrib ops, an op it
    lacks). `ran_with` says which computed the last result, and
    `fallback_reason` why the first one did not.

    `fp32` (tensor, sample -> the FP32 baseline's array, or None): the
    evaluator's intermediates are then checked against it (reference_check.py),
    a node where the two part gets a fallback, and `check` holds the record.
    Nodes the evaluator is known to compute against the spec (reference_check.
    known_deviation: Paddle's BatchNormalization) run the spec's formula from the
    start, checked like any other (`known_fixes=False`: the evaluator as it is,
    left to the check to find).
    numpy's warnings (an exp overflowing in float64 on an FP16 model's range)
    are kept in `warnings`, for the session's log, never printed."""

    name = "float64 truth"

    def __init__(self, model: onnx.ModelProto, fallback: Optional["UnfusedReference"] = None,
                 fp32: Optional[Callable[[str, int], Optional[np.ndarray]]] = None, known_fixes: bool = True):
        self.model64 = to_float64(model)
        self.fallback = fallback
        self.ran_with: Optional[str] = None
        self.fallback_reason: Optional[str] = None
        self._evaluator = None
        self._session = None
        self.checker = None
        self.warnings: dict[str, int] = {}
        from bisect_tui.core.reference_check import ReferenceCheck
        from bisect_tui.core.reference_fixes import default_opset
        from bisect_tui.core.reference_fixes import known_fixes as find_known

        # nodes onnx.reference is known to compute against the spec: the spec's formula runs them
        self.known = find_known(self.model64, default_opset(self.model64)) if known_fixes else {}
        if fp32 is not None:
            self.checker = ReferenceCheck(self.model64, fp32, fallback, self.known)
        self._sample = 0

    @staticmethod
    def _widen(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: (np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
                for k, v in feeds.items()}

    @property
    def check(self) -> Optional[dict]:
        """The reference check's record (None: not checked, and why in `unchecked`)."""
        if self.checker is None:
            return None
        if self._session is not None:
            return {"checked": False, "reliable": None,
                    "why": f"the truth came from {self.ran_with or 'the fallback'} for the whole model, "
                           "whose intermediates are not compared"}
        return self.checker.to_dict()

    def _evaluate(self, names: list[str], f64: dict) -> list:
        """One evaluator run, checked: where the check installs a fallback at node i, the
        same run goes on from node i with it (the nodes before keep their values), not
        from the start."""
        from bisect_tui.core.reference_check import MAX_ROUNDS

        ev = self._evaluator
        if self.checker is None:
            if not self.known:
                return ev.run(names, f64)
            originals = ev.rt_nodes_
            ev.rt_nodes_ = self._with_overrides(originals)
            try:
                return ev.run(names, f64)
            finally:
                ev.rt_nodes_ = originals
        originals = list(ev.rt_nodes_)
        nodes = self._with_overrides(originals)
        ev.rt_nodes_ = nodes
        try:
            results = ev.run(None, f64, intermediate=True)
        finally:
            ev.rt_nodes_ = originals
        start = 0
        for round_ in range(MAX_ROUNDS + 1):
            if self.checker.unreliable is not None:
                break  # found unreliable on an earlier sample: no fallback to try again
            pending = self.checker.check_run(nodes, results, self._sample, start)
            if pending is None:
                break
            if round_ == MAX_ROUNDS:  # a fallback installed that no run used: the truth is not proven
                n = originals[pending].onnx_node
                self.checker.unreliable = {"node": n.name, "op_type": n.op_type, "tensor": n.output[0],
                                           "why": f"more than {MAX_ROUNDS} fallbacks"}
                break
            nodes = self._with_overrides(originals)
            _resume(nodes, results, pending)
            start = pending
        return [results[n] for n in names]

    def _with_overrides(self, originals: list) -> list:
        from bisect_tui.core.reference_check import NodeOverride, node_key

        over = self.checker.overrides if self.checker is not None else self.known
        return [NodeOverride(inst, over[node_key(i, inst.onnx_node)][1]) if node_key(i, inst.onnx_node) in over
                else inst for i, inst in enumerate(originals)]

    def run(self, feeds: dict[str, np.ndarray], tensors: Sequence[str], sample: int = 0) -> dict[str, np.ndarray]:
        """`sample`: which of the inputs' samples `feeds` is (the FP32 values the check reads)."""
        import warnings

        f64 = self._widen(feeds)
        names = list(tensors)
        self._sample = sample
        if self._session is None:
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if self._evaluator is None:
                        from onnx.reference import ReferenceEvaluator

                        self._evaluator = ReferenceEvaluator(self.model64)
                    outs = self._evaluate(names, f64)
                self._keep(caught)
                self.ran_with = "onnx.reference.ReferenceEvaluator (float64)"
                used = self.checker.overrides if self.checker is not None else self.known
                if used:
                    self.ran_with += ", with fallbacks: " + ", ".join(sorted({v[0] for v in used.values()}))
                return dict(zip(names, (np.asarray(o) for o in outs)))
            except Exception as exc:
                self.fallback_reason = f"onnx reference evaluator: {_first_line(exc)}"
        if self.fallback is None:
            raise UserError("no float64 truth for this model: " + (self.fallback_reason or "no evaluator"))
        try:
            from bisect_tui.core.graph import mark_outputs
            from bisect_tui.core.groups import open_session

            if self._session is None:
                extra = [t for t in names if t not in {o.name for o in self.model64.graph.output}]
                marked = mark_outputs(self.model64, extra) if extra else self.model64
                self._session = open_session(self.fallback, marked)
            outs = self._session.run(names, f64)
            self.ran_with = f"{self.fallback.library} in double ({self.fallback.mode})"
            return dict(zip(names, outs))
        except (UserError, Exception) as exc:
            raise UserError(
                "no float64 truth for this model: "
                + (self.fallback_reason + "; " if self.fallback_reason else "")
                + f"{self.fallback.library} in double: {_first_line(exc)}"
            ) from None

    def _keep(self, caught) -> None:
        """Counted, and each new text written to the session's engine log once (this
        process's: the second run's child has none, its parent logs what it reports)."""
        new = []
        for w in caught:
            text = f"{w.category.__name__}: {w.message}"
            if text not in self.warnings:
                new.append(text)
            self.warnings[text] = self.warnings.get(text, 0) + 1
        log_warnings(new)

    def warning_lines(self) -> list[str]:
        return [f"{text} (x{n})" if n > 1 else text for text, n in self.warnings.items()]


def _resume(nodes: list, results: dict, start: int) -> None:
    """The evaluator's own loop (onnx.reference's `run`), from node `start` on, into `results`."""
    for inst in nodes[start:]:
        inputs = [results[i] for i in inst.input]
        outs = inst.run(*inputs, context=results) if inst.need_context() else inst.run(*inputs)
        for name, value in zip(inst.output, outs):
            results[name] = value


def float64_outputs(model: onnx.ModelProto, inputs, outputs: Sequence[str],
                    fallback: Optional["UnfusedReference"] = None,
                    fp32: Optional[Callable[[str, int], Optional[np.ndarray]]] = None) -> Truth:
    """The graph `outputs` in float64 for every sample of `inputs`, stacked on a
    samples axis: (arrays by name, what computed them, why the first evaluator did not),
    a `Truth` whose `reference_check` says how it compared with `fp32` (the FP32
    baseline's values by tensor and sample), where given."""
    ref = Float64Reference(model, fallback, fp32)
    runs = [ref.run(inputs.feeds(k), outputs, sample=k) for k in range(inputs.samples)]
    return Truth.of({n: np.stack([np.asarray(r[n]) for r in runs]) for n in outputs}, ref.ran_with,
                    ref.fallback_reason, ref.check, ref.warning_lines())


def log_warnings(lines: Sequence[str]) -> None:
    """numpy's warnings of a float64 run, into the session's engine log (not the terminal)."""
    if not lines:
        return
    from bisect_tui.core.engine_log import log_engine_error

    log_engine_error("float64 truth (onnx reference evaluator): numpy warnings", RuntimeWarning("\n".join(lines)))


def dump_values(session, manifest: dict) -> Callable[[str, int], Optional[np.ndarray]]:
    """The FP32 baseline dump as the reference check's `fp32`: a tensor's array for one
    sample, read when asked (memory-mapped), None for a tensor the dump does not hold."""
    from bisect_tui.core.baseline_store import load_tensor, manifest_index

    idx = manifest_index(manifest)

    def get(tensor: str, sample: int) -> Optional[np.ndarray]:
        if tensor not in idx:
            return None
        try:
            return np.asarray(load_tensor(session, manifest, tensor)[sample])
        except (KeyError, OSError, ValueError, IndexError):
            return None

    return get
