"""The unfused model run with chosen tensors marked, in memory-bounded groups.

Tensors are split, in topological order, into groups whose size fits the
budget (memory.py); each group gets a fresh session of the reference it is
handed (api/reference.py) and is streamed to a sink before the next one runs.
The loop is the same for every reference: a reference only opens sessions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import numpy as np
import onnx

from bisect_tui.api.reference import GroupRun, Sink
from bisect_tui.core.cancel import CancelToken, Progress, ProgressFn, no_progress
from bisect_tui.core.engine_log import log_engine_error
from bisect_tui.core.errors import UserError
from bisect_tui.core.graph import mark_outputs, tensor_types
from bisect_tui.core.inputs import InputSet, guessed_inputs_hint
from bisect_tui.core.memory import MB, RELEASE_AFTER_BYTES, release_memory, runs_within

if TYPE_CHECKING:
    from bisect_tui.api.reference import UnfusedReference, UnfusedSession


def with_fixed_inputs(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[vi.name]):
                d.Clear()
                d.dim_value = v
    return m


def estimate_sizes(
    model: onnx.ModelProto, shapes: dict[str, list[int]], tensors: Iterable[str]
) -> tuple[dict[str, Optional[int]], dict[str, onnx.TypeProto]]:
    """Bytes per sample of each tensor from shape inference (None when unknown).

    The item size is looked up once per element type and the dims multiplied as
    Python ints (np.dtype and np.prod per tensor were most of this at 21,000
    tensors); a product outside int64 takes np.prod, so it wraps as it did."""
    types = tensor_types(with_fixed_inputs(model, shapes))
    sizes: dict[str, Optional[int]] = {}
    items: dict[int, Optional[int]] = {}  # elem_type -> item size (None: numpy has no such type)
    get = types.get
    for t in tensors:
        tp = get(t)
        size = None
        if tp is not None and tp.HasField("tensor_type"):
            tt = tp.tensor_type
            elem = tt.elem_type
            if elem and tt.HasField("shape"):
                vals = []
                for d in tt.shape.dim:
                    if not d.HasField("dim_value"):
                        break
                    vals.append(d.dim_value)
                else:
                    size = _size(elem, vals, items)
        sizes[t] = size
    return sizes, types


def _size(elem: int, dims: list[int], items: dict[int, Optional[int]]) -> Optional[int]:
    """`int(np.prod(dims, dtype=np.int64)) * itemsize`, the item size memoised in `items`
    (None, as the old per-tensor try/except gave, for a type numpy cannot name)."""
    if elem in items:
        item = items[elem]
    else:
        try:
            item = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).itemsize
        except Exception:
            item = None
        items[elem] = item
    if item is None:
        return None
    n = math.prod(dims)
    if not -(1 << 63) <= n < (1 << 63):
        n = int(np.prod(dims, dtype=np.int64))
    return n * item


def model_sizes(info, shapes: dict[str, list[int]]):
    """`estimate_sizes` for every tensor of a loaded model, computed once per
    shapes (shape inference on a big model costs seconds; the baseline and the
    determinism run both need it)."""
    memo = info.__dict__.setdefault("_sizes_memo", {})
    key = repr(sorted(shapes.items()))
    if key not in memo:
        memo[key] = estimate_sizes(info.model, shapes, info.index.intermediate_tensors())
    return memo[key]


def plan_groups(
    tensors: list[str], sizes: dict[str, Optional[int]], budget: int
) -> list[list[str]]:
    """Greedy split in topological order; unknown sizes count as the largest known."""
    known = [s for s in sizes.values() if s]
    fallback = max(known) if known else 4 * MB
    return runs_within(tensors, lambda t: sizes.get(t) or fallback, budget)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def open_session(reference: "UnfusedReference", model: onnx.ModelProto) -> "UnfusedSession":
    """`reference.session(model)`, its failure one UserError (the whole text in engine.log)."""
    try:
        return reference.session(model)
    except UserError:
        raise
    except Exception as exc:
        where = log_engine_error(f"{reference.label} could not load the model", exc)
        raise UserError(f"{reference.label} could not load the model: {_first_line(exc)[:300]}{where}") from None


def run_groups(
    reference: "UnfusedReference",
    model: onnx.ModelProto,
    groups: list[list[str]],
    inputs: InputSet,
    sink: Sink,
    types: Optional[dict[str, onnx.TypeProto]] = None,
    cancel: Optional[CancelToken] = None,
    progress: ProgressFn = no_progress,
    stage: str = "baseline",
    on_group_done: Optional[Callable[[int, list[str]], None]] = None,
    last_session: Optional[Callable[[Any], None]] = None,
) -> GroupRun:
    """Run each group in a fresh session of `reference` and stream arrays to `sink`.

    `last_session`: called with the last group's session before it goes (another
    run on the same unfused model, without a session of its own)."""
    cancel = cancel or CancelToken()
    total = sum(len(g) for g in groups)
    done = 0
    skipped: list[str] = []
    held = 0  # bytes of arrays the group returned
    for gi, group in enumerate(groups):
        cancel.check()
        # no types given: marked without one, and the session types each output
        # at its creation from the node that makes it (shape inference of a
        # 2,000-node graph only for that cost 0.05 s)
        marked = mark_outputs(model, group, types=types if types is not None else {}, keep_original=False)
        sess = open_session(reference, marked)
        names = sess.output_names()
        write, ndarray = sink.write, np.ndarray  # looked up once: thousands of tensors a group
        for k in range(inputs.samples):
            cancel.check()
            try:
                values = sess.run(names, inputs.feeds(k))
            except Exception as exc:
                msg = _first_line(exc)
                where = log_engine_error(f"{reference.label} failed to run the model", exc)
                raise UserError(f"{reference.label} failed to run the model: {msg[:300]}"
                                f"{guessed_inputs_hint(inputs)}{where}") from None
            for name, value in zip(names, values):
                if isinstance(value, ndarray):
                    write(name, k, value)
                    held += value.nbytes
                elif k == 0:
                    skipped.append(name)
            del values
        end = sink.end
        if skipped:  # looked up in a set: in the list it was quadratic in the skipped tensors
            skip = set(skipped)
            for name in names:
                if name not in skip:
                    end(name)
        else:
            for name in names:
                end(name)
        end_group = getattr(sink, "end_group", None)  # a sink that writes per group (baseline packs)
        if end_group is not None:
            end_group()
        if last_session is not None and gi == len(groups) - 1:
            last_session(sess)
        del sess, marked
        if held >= RELEASE_AFTER_BYTES:  # a full collection costs 40 ms on a 5,000-node model
            release_memory()
        held = 0
        done += len(group)
        if on_group_done:
            on_group_done(gi, group)
        progress(
            Progress(
                stage,
                f"group {gi + 1}/{len(groups)}",
                done,
                total,
                {"group": gi + 1, "groups": len(groups)},
            )
        )
    return GroupRun(len(groups), total, skipped)
