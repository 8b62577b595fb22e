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

from typing import TYPE_CHECKING, Optional, Sequence

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


class Float64Reference:
    """The ONNX graph in float64: onnx's reference evaluator first (numpy,
    every standard op, no kernel shortcuts); the unfused reference `fallback`
    in double where the evaluator cannot run the graph (contrib ops, an op it
    lacks). `ran_with` says which computed the last result, and
    `fallback_reason` why the first one did not."""

    name = "float64 truth"

    def __init__(self, model: onnx.ModelProto, fallback: Optional["UnfusedReference"] = None):
        self.model64 = to_float64(model)
        self.fallback = fallback
        self.ran_with: Optional[str] = None
        self.fallback_reason: Optional[str] = None
        self._evaluator = None
        self._session = None

    @staticmethod
    def _widen(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: (np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
                for k, v in feeds.items()}

    def run(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        f64 = self._widen(feeds)
        names = list(tensors)
        if self._session is None:
            try:
                if self._evaluator is None:
                    from onnx.reference import ReferenceEvaluator

                    self._evaluator = ReferenceEvaluator(self.model64)
                outs = self._evaluator.run(names, f64)
                self.ran_with = "onnx.reference.ReferenceEvaluator (float64)"
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


def float64_outputs(model: onnx.ModelProto, inputs, outputs: Sequence[str],
                    fallback: Optional["UnfusedReference"] = None):
    """The graph `outputs` in float64 for every sample of `inputs`, stacked on a
    samples axis: (arrays by name, what computed them, why the first evaluator did not)."""
    ref = Float64Reference(model, fallback)
    runs = [ref.run(inputs.feeds(k), outputs) for k in range(inputs.samples)]
    return ({n: np.stack([np.asarray(r[n]) for r in runs]) for n in outputs}, ref.ran_with,
            ref.fallback_reason)
