"""The unfused side of every comparison, behind one small interface.

A *reference* computes tensors the fused engine is judged against. The tool
has three: the ORT baseline (ORT_DISABLE_ALL, FP32: what the checklist dumps),
a float64 truth (the same ONNX graph widened to double), and the framework
itself (PyTorch forward hooks, in `bisect_tui.frontends.torch`). They share
`run(feeds, tensors) -> {tensor: array}` so the arbiter and the cross-checks
do not care which one they hold; each says by `name` (and, for the float64
one, `ran_with`) what really computed its numbers.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence, runtime_checkable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from bisect_tui.core.errors import UserError
from bisect_tui.core.inputs import InputSet


@runtime_checkable
class Reference(Protocol):
    name: str

    def run(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        """One sample: graph inputs by name -> the requested tensors (no samples axis)."""
        ...


class _Collect:
    """A `runner.Sink` that keeps what it is given (one sample, one group)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def write(self, tensor: str, sample: int, array: np.ndarray) -> None:
        self.arrays[tensor] = np.array(array)

    def end(self, tensor: str) -> None:
        pass


class OrtUnfusedReference:
    """The baseline's own path (runner.run_groups: ORT_DISABLE_ALL, CPU, FP32,
    requested tensors marked) for one sample held in memory. The dump in the
    session stays the source of truth for the checklist; this is for callers
    that need a fresh value (a different input, a subset of tensors)."""

    name = "onnxruntime unfused (ORT_DISABLE_ALL, FP32)"

    def __init__(self, model: onnx.ModelProto):
        self.model = model

    def run(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        from bisect_tui.core.runner import run_groups

        sink = _Collect()
        inputs = InputSet({k: np.asarray(v)[None] for k, v in feeds.items()})
        run_groups(self.model, [list(tensors)], inputs, sink)
        return {t: sink.arrays[t] for t in tensors if t in sink.arrays}


_NARROW_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float64 copy: float initializers, I/O, Casts and Constants widened."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for i, t in enumerate(list(g.initializer)):
        if t.data_type in _NARROW_FLOATS:
            arr = numpy_helper.to_array(t).astype(np.float64)
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
                arr = numpy_helper.to_array(a.t).astype(np.float64)
                a.t.CopyFrom(numpy_helper.from_array(arr, a.t.name))
    return m


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


class Float64Reference:
    """The ONNX graph in float64: onnx's reference evaluator first (numpy,
    every standard op, no kernel shortcuts); ORT in double where the evaluator
    cannot run the graph (contrib ops, an op it lacks). `ran_with` says which
    computed the last result, and `fallback_reason` why the first one did not."""

    name = "float64 truth"

    def __init__(self, model: onnx.ModelProto):
        self.model64 = to_float64(model)
        self.ran_with: Optional[str] = None
        self.fallback_reason: Optional[str] = None
        self._evaluator = None
        self._ort = None

    @staticmethod
    def _widen(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: (np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
                for k, v in feeds.items()}

    def run(self, feeds: dict[str, np.ndarray], tensors: Sequence[str]) -> dict[str, np.ndarray]:
        f64 = self._widen(feeds)
        names = list(tensors)
        if self._ort is None:
            try:
                if self._evaluator is None:
                    from onnx.reference import ReferenceEvaluator

                    self._evaluator = ReferenceEvaluator(self.model64)
                outs = self._evaluator.run(names, f64)
                self.ran_with = "onnx.reference.ReferenceEvaluator (float64)"
                return dict(zip(names, (np.asarray(o) for o in outs)))
            except Exception as exc:
                self.fallback_reason = f"onnx reference evaluator: {_first_line(exc)}"
        try:
            from bisect_tui.core.graph import mark_outputs
            from bisect_tui.engines.ort.unfused import make_session

            if self._ort is None:
                extra = [t for t in names if t not in {o.name for o in self.model64.graph.output}]
                marked = mark_outputs(self.model64, extra) if extra else self.model64
                self._ort = make_session(marked, "disable")
            outs = self._ort.run(names, f64)
            self.ran_with = "onnxruntime in double (ORT_DISABLE_ALL)"
            return dict(zip(names, outs))
        except (UserError, Exception) as exc:
            raise UserError(
                "no float64 truth for this model: "
                + (self.fallback_reason + "; " if self.fallback_reason else "")
                + f"onnxruntime in double: {_first_line(exc)}"
            ) from None


def float64_outputs(model: onnx.ModelProto, inputs, outputs: Sequence[str]):
    """The graph `outputs` in float64 for every sample of `inputs`, stacked on a
    samples axis: (arrays by name, what computed them, why the first evaluator did not)."""
    ref = Float64Reference(model)
    runs = [ref.run(inputs.feeds(k), outputs) for k in range(inputs.samples)]
    return ({n: np.stack([np.asarray(r[n]) for r in runs]) for n in outputs}, ref.ran_with,
            ref.fallback_reason)
